//! `broca serve`'s open sessions as a real process: an idle session dropped from memory, read
//! from its WAL and rebuilt by its next send (also under a subscriber), and the sessions kept
//! open within `open_sessions_max`, idle ones closed first and a new one waiting for room
//! while every open one runs.

mod support;

use serde_json::{json, Value};
use support::serve::{metric, open_sse, read_events, rpc, start, wait_for, Serve};
use support::{fixture, Aimock};

/// serve on aimock's fixture with `idle_secs` 1 (the peer and the folder live as long as it).
fn idle_after_a_second() -> (Aimock, tempfile::TempDir, Serve) {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let config = dir.path().join("serve.json5");
    std::fs::write(&config, r#"{"idle_secs": 1}"#).unwrap();
    let s = start(&state, &peer, &["--config", config.to_str().unwrap()]);
    (peer, dir, s)
}

#[test]
fn an_idle_session_is_dropped_from_memory_read_from_its_wal_and_rebuilt_by_a_send() {
    let (_peer, _dir, s) = idle_after_a_second();
    let live = |s: &Serve| metric(s, "broca_sessions_live");
    let (_, r) = rpc(
        &s,
        "session.send",
        json!({"prompt": "hello there", "model": "anthropic/m"}),
    );
    let run_id = r["result"]["run_id"].as_str().unwrap().to_string();
    wait_for("the run to complete", || {
        rpc(&s, "run.status", json!({"run_id": run_id})).1["result"]["state"] == "completed"
    });
    assert_eq!(live(&s), 1);
    wait_for("the idle session to be dropped", || live(&s) == 0);
    let (_, res) = rpc(&s, "run.result", json!({"run_id": run_id}));
    assert_eq!(
        res["result"]["final_message"]["text"],
        "Hello! How can I help you today?"
    );
    assert_eq!(
        live(&s),
        0,
        "a read is answered from the WAL without opening the session"
    );
    // The next send rebuilds the session from its WAL and continues its conversation.
    let (status, r) = rpc(
        &s,
        "session.send",
        json!({"prompt": "hello there", "model": "anthropic/m"}),
    );
    assert_eq!(status, 200, "{r}");
    assert_eq!(live(&s), 1, "rebuilt from the WAL on the next send");
    let second = r["result"]["run_id"].as_str().unwrap().to_string();
    wait_for("the second run to complete", || {
        rpc(&s, "run.status", json!({"run_id": second})).1["result"]["state"] == "completed"
    });
    let (_, head) = rpc(&s, "session.head", json!({}));
    assert_eq!(head["result"]["last_ordinal"], 4, "{head}");
}

#[test]
fn a_session_that_went_idle_under_a_subscriber_takes_the_next_send() {
    // The subscriber's hub outlives the session's actor: it must not keep the WAL (and the
    // lease its descriptor holds) open, or the next send could never open the session again.
    let (_peer, _dir, s) = idle_after_a_second();
    let sub = open_sse(
        &s,
        "project_root=%2Fproj&harness=h&session=s1&from=live",
        None,
    );
    let send = || {
        let (status, r) = rpc(
            &s,
            "session.send",
            json!({"prompt": "hello there", "model": "anthropic/m"}),
        );
        assert_eq!(status, 200, "{r}");
        r["result"]["run_id"].as_str().unwrap().to_string()
    };
    let first = send();
    wait_for("the run to complete", || {
        rpc(&s, "run.status", json!({"run_id": first})).1["result"]["state"] == "completed"
    });
    wait_for("the idle session to be dropped", || {
        metric(&s, "broca_sessions_live") == 0
    });
    let second = send();
    let mut finished = Vec::new();
    read_events(sub, |(_, _, data)| {
        if data.contains("\"type\":\"run_finished\"") {
            let v: Value = serde_json::from_str(data).unwrap();
            finished.push(v["run_id"].as_str().unwrap().to_string());
        }
        finished.len() == 2
    });
    assert_eq!(
        finished,
        [first, second],
        "the subscriber saw both runs end"
    );
}

#[test]
fn open_sessions_stay_within_the_limit_idle_ones_closed_first_and_a_new_one_waits_for_room() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let config = dir.path().join("serve.json5");
    std::fs::write(&config, r#"{"open_sessions_max": 2}"#).unwrap();
    let s = start(
        &state,
        &peer,
        &["--config", config.to_str().unwrap(), "--shards", "1"],
    );
    let in_session = |name: &str, method: &str, params: Value| {
        let mut p = params;
        p["session"] = json!(name);
        rpc(&s, method, p)
    };
    let mut runs = Vec::new();
    for name in ["a", "b", "c"] {
        let (status, r) = in_session(
            name,
            "session.send",
            json!({"prompt": "hello there", "model": "anthropic/m"}),
        );
        assert_eq!(status, 200, "{r}");
        let run_id = r["result"]["run_id"].as_str().unwrap().to_string();
        wait_for("the run to complete", || {
            in_session(name, "run.status", json!({"run_id": run_id})).1["result"]["state"]
                == "completed"
        });
        runs.push((name, run_id));
    }
    wait_for("the least recently used session to close", || {
        metric(&s, "broca_sessions_live") <= 2
    });
    assert!(metric(&s, "broca_sessions_evicted_total") >= 1);
    // A closed session is rebuilt from its WAL on its next command.
    let (name, run_id) = &runs[0];
    let (_, res) = in_session(name, "run.result", json!({"run_id": run_id}));
    assert_eq!(
        res["result"]["final_message"]["text"],
        "Hello! How can I help you today?"
    );

    // Two sessions with runs in flight fill the limit: a third session's send waits for one
    // of them to close, and is then admitted (nothing is refused while room will come).
    for name in ["a", "b"] {
        let (status, r) = in_session(
            name,
            "session.send",
            json!({"prompt": "slow please", "model": "anthropic/m"}),
        );
        assert_eq!(status, 200, "{r}");
    }
    wait_for("both slow runs to be running", || {
        metric(&s, "broca_runs_active") == 2 && metric(&s, "broca_sessions_live") == 2
    });
    let waited_before = metric(&s, "broca_sessions_waited_for_room_total");
    let waiting = std::thread::scope(|scope| {
        let third = scope.spawn(|| {
            in_session(
                "c",
                "session.send",
                json!({"prompt": "hello there", "model": "anthropic/m"}),
            )
        });
        wait_for("the third session's send to wait for room", || {
            metric(&s, "broca_sessions_waiting_for_room") == 1
        });
        assert_eq!(metric(&s, "broca_runs_active"), 2, "the slow runs go on");
        assert!(
            !third.is_finished(),
            "the send waits while both sessions run"
        );
        third.join().unwrap()
    });
    let (status, r) = waiting;
    assert_eq!(status, 200, "admitted once a session closed: {r}");
    assert_eq!(metric(&s, "broca_sessions_waiting_for_room"), 0);
    assert_eq!(
        metric(&s, "broca_sessions_waited_for_room_total"),
        waited_before + 1
    );
    assert_eq!(metric(&s, "broca_sessions_refused_at_limit_total"), 0);
    let run_id = r["result"]["run_id"].as_str().unwrap().to_string();
    wait_for("the waiting session's run to complete", || {
        in_session("c", "run.status", json!({"run_id": run_id})).1["result"]["state"] == "completed"
    });
}

/// A send waits for room at most `wait_for_room_secs`: past it, it is refused 503
/// `session_limit` naming the wait, counted, and nothing of it was written (the session's
/// next send runs as its first).
#[test]
fn a_send_that_waits_too_long_for_room_is_refused_and_wrote_nothing() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let config = dir.path().join("serve.json5");
    std::fs::write(
        &config,
        r#"{"open_sessions_max": 1, "wait_for_room_secs": 1}"#,
    )
    .unwrap();
    let s = start(
        &state,
        &peer,
        &["--config", config.to_str().unwrap(), "--shards", "1"],
    );
    let in_session = |name: &str, method: &str, p: Value| {
        let mut p = p;
        p["session"] = json!(name);
        rpc(&s, method, p)
    };
    let (status, r) = in_session(
        "busy",
        "session.send",
        json!({"prompt": "slow please", "model": "anthropic/m"}),
    );
    assert_eq!(status, 200, "{r}");
    let slow = r["result"]["run_id"].as_str().unwrap().to_string();
    wait_for("the slow run to be running", || {
        metric(&s, "broca_runs_active") == 1
    });
    let began = std::time::Instant::now();
    let (status, r) = in_session(
        "late",
        "session.send",
        json!({"prompt": "hello there", "model": "anthropic/m", "send_id": "late-1"}),
    );
    assert_eq!(status, 503, "{r}");
    assert_eq!(r["error"]["code"], "session_limit", "{r}");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(message.contains("waited 1 s"), "{message}");
    assert!(began.elapsed() >= std::time::Duration::from_secs(1));
    assert_eq!(metric(&s, "broca_sessions_waited_too_long_total"), 1);
    assert_eq!(metric(&s, "broca_sessions_waiting_for_room"), 0);
    assert_eq!(
        in_session("busy", "run.status", json!({"run_id": slow})).1["result"]["state"],
        "active",
        "the refusal came while the other session still ran"
    );
    // Nothing of the refused send was kept: no WAL but the busy session's, and the same
    // send_id later starts a run of its own.
    let wals = broca::wal::listing::wal_dir_files(&state.join("wal")).unwrap();
    assert_eq!(wals.len(), 1, "{wals:?}");
    wait_for("the slow run to complete", || {
        in_session("busy", "run.status", json!({"run_id": slow})).1["result"]["state"]
            == "completed"
    });
    let (status, r) = in_session(
        "late",
        "session.send",
        json!({"prompt": "hello there", "model": "anthropic/m", "send_id": "late-1"}),
    );
    assert_eq!(status, 200, "{r}");
    let run_id = r["result"]["run_id"].as_str().unwrap().to_string();
    wait_for("the late session's run to complete", || {
        in_session("late", "run.status", json!({"run_id": run_id})).1["result"]["state"]
            == "completed"
    });
}
