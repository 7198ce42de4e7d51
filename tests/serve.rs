//! `broca serve` as a real process: serve.json and the listen line, the owner-only state dir,
//! the management methods against aimock as the provider, bad input answered with 4xx codes
//! and no WAL touched, the Unix socket, session.read beside a writer in another process, and
//! shutdown on SIGTERM (admission stops, an active run is sealed interrupted after the grace
//! period, and the process dies of the signal).

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use support::serve::{
    http, metric, open_sse, open_sse_ready, post, read_events, read_events_for, read_response, rpc,
    start, wait_for, Serve,
};
use support::{broca, dump_all, fixture, Aimock};

fn wal_files(state: &Path) -> usize {
    broca::wal::listing::wal_dir_files(&state.join("wal")).map_or(0, |w| w.len())
}

#[test]
fn the_management_methods_work_end_to_end() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let s = start(&state, &peer, &[]);
    for (path, mode) in [
        (state.clone(), 0o700),
        (state.join("wal"), 0o700),
        (state.join("serve.json"), 0o600),
        (state.join("serve.handle"), 0o600),
    ] {
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            mode,
            "{}",
            path.display()
        );
    }

    let send = json!({"prompt": "hello there", "model": "anthropic/m", "send_id": "k1"});
    let (status, r) = rpc(&s, "session.send", send.clone());
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["result"]["state"], "active");
    let run_id = r["result"]["run_id"].as_str().unwrap().to_string();
    wait_for("the run to complete", || {
        rpc(&s, "run.status", json!({"run_id": run_id})).1["result"]["state"] == "completed"
    });
    let (_, st) = rpc(&s, "run.status", json!({}));
    // The role's usage (uncached input, by model), and broca's metered totals beside it.
    assert_eq!(
        (
            &st["result"]["usage"]["steps"],
            &st["result"]["usage"]["input_tokens"],
            &st["result"]["usage"]["output_tokens"]
        ),
        (&json!(1), &json!(12), &json!(9)),
        "{st}"
    );
    assert_eq!(
        st["result"]["metered_usage"],
        json!({"input": 12, "output": 9})
    );
    assert_eq!(st["result"]["indeterminate_tool_calls"], json!([]));

    // The same send_id: the same run, nothing written; other inputs: refused.
    let appends = |s: &Serve| metric(s, "broca_wal_appends_total");
    let before = appends(&s);
    let (status, again) = rpc(&s, "session.send", send.clone());
    assert_eq!(
        (status, again["result"]["run_id"].as_str()),
        (200, Some(run_id.as_str()))
    );
    assert_eq!(
        (
            again["result"]["state"].as_str(),
            again["result"]["reason"].as_str()
        ),
        (Some("finished"), Some("completed"))
    );
    assert_eq!(appends(&s), before, "a repeated send writes nothing");
    let (status, reused) = rpc(
        &s,
        "session.send",
        json!({"prompt": "other", "model": "anthropic/m", "send_id": "k1"}),
    );
    assert_eq!(
        (status, reused["error"]["code"].as_str()),
        (409, Some("send_id_reuse")),
        "{reused}"
    );

    let (_, res) = rpc(&s, "run.result", json!({"run_id": run_id}));
    assert_eq!(
        res["result"]["final_message"]["text"],
        "Hello! How can I help you today?"
    );
    assert_eq!(res["result"]["state"], "completed");
    let (_, c) = rpc(&s, "run.cancel", json!({"run_id": run_id}));
    assert_eq!(c["result"], "not_active");

    // session.read pages the transcript by ordinal, from 1.
    let (_, page) = rpc(&s, "session.read", json!({"from_ordinal": 1, "limit": 1}));
    let page = &page["result"];
    assert_eq!(page["next_from_ordinal"].as_u64(), Some(2), "{page}");
    assert_eq!(page["messages"][0]["ordinal"], 1);
    assert_eq!(page["messages"][0]["role"], "user");
    assert_eq!(page["messages"][0]["message"]["role"], "user");
    assert_eq!(page["incarnation"].as_str().unwrap().len(), 32);
    let (_, page) = rpc(&s, "session.read", json!({"from_ordinal": 2}));
    assert_eq!(
        page["result"]["messages"][0]["message"]["content"][0]["text"]["text"],
        "Hello! How can I help you today?"
    );
    assert!(page["result"].get("next_from_ordinal").is_none());

    // Health, and the Unix socket without a handle.
    let (status, _) = http(
        &s.addr,
        format!(
            "GET /healthz HTTP/1.1\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
            s.handle
        )
        .as_bytes(),
    );
    assert_eq!(status, 200);
    let mut u = std::os::unix::net::UnixStream::connect(&s.socket).unwrap();
    u.write_all(b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&mut u), (200, br#"{"status":"ok"}"#.to_vec()));
}

#[test]
fn bad_input_gets_a_4xx_with_a_code_and_touches_no_wal() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let config = dir.path().join("serve.json5");
    std::fs::write(
        &config,
        r#"{"body_limit_bytes": 1024, "request_timeout_ms": 300}"#,
    )
    .unwrap();
    let s = start(&state, &peer, &["--config", config.to_str().unwrap()]);
    let cases: Vec<(&str, u16, &str)> = vec![
        ("{not json", 400, "invalid_request"),
        (
            r#"{"method":"session.fly","params":{}}"#,
            404,
            "unknown_method",
        ),
        (
            r#"{"method":"session.send","params":{"harness":"h","session":"s","prompt":"x","model":"anthropic/m"}}"#,
            400,
            "invalid_params",
        ),
        (
            r#"{"method":"session.send","params":{"project_root":7,"harness":"h","session":"s","prompt":"x","model":"anthropic/m"}}"#,
            400,
            "invalid_params",
        ),
        (
            r#"{"method":"session.send","params":{"project_root":"/p","harness":"h","session":"s","prompt":"x","model":"anthropic/m","colour":"red"}}"#,
            400,
            "invalid_params",
        ),
        (
            r#"{"method":"session.send","params":{"project_root":"/p","harness":"h","session":"s","prompt":"x","model":"nope/m"}}"#,
            400,
            "invalid_params",
        ),
        (
            r#"{"method":"session.read","params":{"project_root":"/p","harness":"h","session":"s","limit":0}}"#,
            400,
            "invalid_params",
        ),
        (
            r#"{"method":"run.result","params":{"project_root":"/p","harness":"h","session":"s"}}"#,
            400,
            "invalid_params",
        ),
    ];
    for (body, status, code) in cases {
        let (got, r) = post(&s, body);
        assert_eq!(
            (got, r["error"]["code"].as_str()),
            (status, Some(code)),
            "{body}: {r}"
        );
        assert!(
            r["error"]["class"].is_string() && r["error"]["message"].is_string(),
            "{r}"
        );
    }
    // An oversized body, a wrong handle, a missing handle, a chunked body.
    let big = format!(
        "POST /v1/rpc HTTP/1.1\r\nAuthorization: Bearer {}\r\nContent-Length: 5000\r\n\r\n",
        s.handle
    );
    assert_eq!(http(&s.addr, big.as_bytes()).0, 413);
    // The scheme's name is case-insensitive (RFC 9110, 11.1), the handle is not.
    for scheme in ["bearer", "BEARER", "beaRer"] {
        let req = format!(
            "GET /healthz HTTP/1.1\r\nAuthorization: {scheme} {}\r\nConnection: close\r\n\r\n",
            s.handle
        );
        assert_eq!(http(&s.addr, req.as_bytes()).0, 200, "{scheme}");
    }
    let upper = format!(
        "GET /healthz HTTP/1.1\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
        s.handle.to_ascii_uppercase()
    );
    assert_eq!(http(&s.addr, upper.as_bytes()).0, 401);
    let wrong = b"GET /healthz HTTP/1.1\r\nAuthorization: Bearer 00\r\nConnection: close\r\n\r\n";
    let (status, body) = http(&s.addr, wrong);
    assert_eq!(status, 401);
    assert!(!String::from_utf8_lossy(&body).contains(&s.handle));
    assert_eq!(
        http(
            &s.addr,
            b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n"
        )
        .0,
        401
    );
    let chunked = format!(
        "POST /v1/rpc HTTP/1.1\r\nAuthorization: Bearer {}\r\nTransfer-Encoding: chunked\r\n\r\n",
        s.handle
    );
    assert_eq!(http(&s.addr, chunked.as_bytes()).0, 411);
    // A half-open request: the head starts and stops.
    assert_eq!(http(&s.addr, b"POST /v1/rpc HTTP/1.1\r\nContent-Le").0, 408);
    // Garbage.
    assert_eq!(http(&s.addr, b"\x16\x03\x01 not http\r\n\r\n").0, 400);
    assert_eq!(
        wal_files(&state),
        0,
        "no WAL was created by bad input: {:?}",
        dump_all(&state)
    );
    // And the server still serves.
    let (status, r) = rpc(&s, "run.status", json!({}));
    assert_eq!(
        (status, r["error"]["code"].as_str()),
        (404, Some("unknown_run"))
    );
}

#[test]
fn serve_refuses_a_state_dir_others_can_write() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
    let o = broca(&state)
        .env("BROCA_BASE_URL_ANTHROPIC", peer.url())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("writable by group or others") && err.contains("chmod 700"),
        "{err}"
    );
    assert!(!state.join("serve.json").exists());
}

#[test]
fn serve_refuses_a_socket_in_a_folder_others_can_write() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    // A shared folder like /tmp: anyone may create, and with the sticky bit only rename
    // their own files, yet a socket there can still be raced before it is bound.
    for mode in [0o777, 0o1777, 0o770] {
        let shared = dir.path().join(format!("shared-{mode:o}"));
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(mode)).unwrap();
        let sock = shared.join("b.sock");
        let o = broca(&state)
            .env("BROCA_BASE_URL_ANTHROPIC", peer.url())
            .args(["serve", "--listen", "127.0.0.1:0", "--socket"])
            .arg(&sock)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "mode {mode:o}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(&shared.display().to_string())
                && err.contains("writable by group or others"),
            "{err}"
        );
        assert!(!sock.exists(), "no socket was made in {}", shared.display());
        assert!(!state.join("serve.json").exists());
    }
}

#[test]
fn session_read_works_while_another_process_holds_the_wal() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let s = start(&state, &peer, &[]);
    // A standalone run on the same session writes (and holds the lease) for a few seconds.
    let mut run = broca(&state)
        .env("ANTHROPIC_API_KEY", "sk-serve-test-0123456789")
        .args(["run", "--model", "anthropic/m", "--base-url", &peer.url()])
        .args(support::serve::CLI_SESSION)
        .arg("slow please")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the run's first records", || {
        rpc(&s, "session.head", json!({})).1["result"]["last_ordinal"].as_u64() == Some(1)
    });
    let (status, page) = rpc(&s, "session.read", json!({}));
    assert_eq!(status, 200);
    assert_eq!(
        page["result"]["messages"][0]["message"]["content"][0]["text"]["text"],
        "slow please"
    );
    assert!(
        run.try_wait().unwrap().is_none(),
        "the writer is still running"
    );
    assert!(run.wait().unwrap().success());
    let (_, head) = rpc(&s, "session.head", json!({}));
    assert_eq!(head["result"]["last_ordinal"], 2);
}

#[test]
fn sigterm_stops_admission_seals_active_runs_interrupted_and_dies_of_the_signal() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (mut s, run_id) = slow_run(&state, &peer, "1");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
    wait_for("admission to stop", || healthz(&s) == 503);
    let mut other = json!({"project_root": "/proj", "harness": "h", "session": "s2", "prompt": "hello", "model": "anthropic/m"});
    let (status, refused) = post(
        &s,
        &json!({"method": "session.send", "params": other.take()}).to_string(),
    );
    assert_eq!(
        (
            status,
            refused["error"]["code"].as_str(),
            refused["error"]["class"].as_str()
        ),
        (503, Some("shutting_down"), Some("transient"))
    );
    let status = s.child.wait().unwrap();
    assert_eq!(
        status.signal(),
        Some(libc::SIGTERM),
        "broca dies of the signal it got"
    );
    assert!(!state.join("serve.json").exists());
    let finished = terminals(&state, &run_id);
    assert_eq!(finished.len(), 1, "exactly one terminal");
    assert_eq!(
        finished[0]["record"]["reason"], "interrupted",
        "{}",
        finished[0]
    );
}

/// A serve with `grace` seconds of grace, and a run in flight on it (the slow answer).
fn slow_run(state: &Path, peer: &Aimock, grace: &str) -> (Serve, String) {
    let s = start(state, peer, &["--grace-secs", grace]);
    let (_, r) = rpc(
        &s,
        "session.send",
        json!({"prompt": "slow please", "model": "anthropic/m"}),
    );
    let run_id = r["result"]["run_id"].as_str().unwrap().to_string();
    (s, run_id)
}

/// The terminal records of `run_id` in the state dir's WALs.
fn terminals(state: &Path, run_id: &str) -> Vec<Value> {
    dump_all(state)
        .into_iter()
        .filter(|r| r["kind"] == "run_finished" && r["record"]["run_id"] == run_id)
        .collect()
}

/// `/healthz`'s status on the TCP surface (503 once admission stopped).
fn healthz(s: &Serve) -> u16 {
    http(
        &s.addr,
        format!(
            "GET /healthz HTTP/1.1\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
            s.handle
        )
        .as_bytes(),
    )
    .0
}

#[test]
fn sighup_stops_serve_as_sigterm_does() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (mut s, run_id) = slow_run(&state, &peer, "1");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGHUP) };
    let status = s.child.wait().unwrap();
    assert_eq!(
        status.signal(),
        Some(libc::SIGHUP),
        "broca dies of the SIGHUP"
    );
    assert!(!state.join("serve.json").exists(), "serve.json is removed");
    let finished = terminals(&state, &run_id);
    assert_eq!(finished.len(), 1, "the run is sealed once: {finished:?}");
    assert_eq!(finished[0]["record"]["reason"], "interrupted");
}

#[test]
fn a_second_sigint_during_the_grace_period_exits_at_once_and_recovery_takes_the_run() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (mut s, run_id) = slow_run(&state, &peer, "600");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGINT) };
    wait_for("admission to stop", || healthz(&s) == 503);
    // SAFETY: as above.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGINT) };
    let status = s.child.wait().unwrap();
    assert_eq!(
        status.signal(),
        Some(libc::SIGINT),
        "broca dies of the SIGINT"
    );
    assert!(
        terminals(&state, &run_id).is_empty(),
        "the second signal did not wait out the grace period to seal the run"
    );
    // The next start's recovery takes the open run: it ends exactly once.
    let _again = start(&state, &peer, &[]);
    wait_for("the resumed run to end", || {
        terminals(&state, &run_id).len() == 1
    });
}

fn is_finish(ev: &(Option<String>, Option<String>, String)) -> bool {
    ev.2.contains("\"type\":\"run_finished\"")
}

#[test]
fn subscribers_get_the_control_lane_with_cursors_and_resume_without_gap_or_duplicate() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let q = "project_root=%2Fproj&harness=h&session=s1&from=start";
    let (control, ids) = {
        let s = start(&state, &peer, &[]);
        // A stuck subscriber that never reads: the run must not wait for it.
        let _stuck = open_sse(&s, q, None);
        // Subscribed before the send: the display lane is live only.
        let sub = open_sse_ready(&s, q);
        let (_, r) = rpc(
            &s,
            "session.send",
            json!({"prompt": "slow please", "model": "anthropic/m"}),
        );
        let run_id = r["result"]["run_id"].as_str().unwrap().to_string();
        let events = read_events(sub, is_finish);
        let control: Vec<_> = events.iter().filter(|e| e.0.is_some()).cloned().collect();
        let display: String = events
            .iter()
            .filter(|e| e.1.as_deref() == Some("display"))
            .map(|e| {
                serde_json::from_str::<Value>(&e.2).unwrap()["text"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert!(
            display.starts_with("This answer arrives slowly"),
            "display lane: {display:?} {events:?}"
        );
        let kinds: Vec<String> = control
            .iter()
            .map(|e| {
                serde_json::from_str::<Value>(&e.2).unwrap()["type"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "run_started",
                "message_started",
                "message",
                "step_started",
                "message_started",
                "message",
                "run_finished"
            ],
            "{control:?}"
        );
        assert!(control.iter().all(|e| e.2.contains(&run_id)));
        let ids: Vec<String> = control.iter().map(|e| e.0.clone().unwrap()).collect();
        // Resume after each cursor: exactly the units after it.
        for (i, id) in ids.iter().enumerate() {
            let want = control[i + 1..].to_vec();
            let last = want.last().and_then(|e| e.0.clone());
            // The stream stays open (live): stop at the last unit expected, or after a short
            // wait when none is.
            let wait = if last.is_some() {
                Duration::from_secs(20)
            } else {
                Duration::from_millis(700)
            };
            let again = read_events_for(
                open_sse(&s, "project_root=%2Fproj&harness=h&session=s1", Some(id)),
                wait,
                &mut |e| e.0.is_some() && e.0 == last,
            );
            let got: Vec<_> = again.into_iter().filter(|e| e.0.is_some()).collect();
            assert_eq!(got, want, "resume after {id}");
        }
        (control, ids)
    };
    // Across a restart of serve: the same units under the same cursors.
    let s = start(&state, &peer, &[]);
    let last = ids.last().unwrap().clone();
    let events = read_events(open_sse(&s, q, None), |e| {
        e.0.as_deref() == Some(last.as_str())
    });
    let again: Vec<_> = events.into_iter().filter(|e| e.0.is_some()).collect();
    assert_eq!(again, control);
}

#[test]
fn the_subscription_is_also_a_websocket() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let s = start(&state, &peer, &[]);
    let (_, r) = rpc(
        &s,
        "session.send",
        json!({"prompt": "hello there", "model": "anthropic/m"}),
    );
    let run_id = r["result"]["run_id"].as_str().unwrap().to_string();
    let url = format!(
        "ws://{}/v1/subscribe?project_root=%2Fproj&harness=h&session=s1&from=start",
        s.addr
    );
    let mut req =
        tungstenite::client::IntoClientRequest::into_client_request(url.as_str()).unwrap();
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", s.handle).parse().unwrap(),
    );
    let tcp = TcpStream::connect(&s.addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let (mut ws, _) = tungstenite::client(req, tcp).unwrap();
    let mut ids = Vec::new();
    loop {
        let msg = ws.read().unwrap();
        let v: Value = serde_json::from_str(msg.to_text().unwrap()).unwrap();
        if let Some(id) = v["id"].as_str() {
            ids.push(id.to_string());
            assert_eq!(v["unit"]["run_id"], run_id.as_str());
            if v["unit"]["type"] == "run_finished" {
                assert_eq!(v["unit"]["reason"], "completed");
                break;
            }
        }
    }
    assert!(
        ids.len() >= 4
            && ids
                .windows(2)
                .all(|w| w[0] < w[1] || w[0].len() < w[1].len()),
        "{ids:?}"
    );
    ws.close(None).unwrap();
}

#[test]
fn a_send_behind_an_active_run_is_queued_durably_runs_next_and_can_be_retracted() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let s = start(&dir.path().join("state"), &peer, &[]);
    let send = |prompt: &str, send_id: &str| {
        rpc(
            &s,
            "session.send",
            json!({"prompt": prompt, "model": "anthropic/m", "send_id": send_id}),
        )
    };
    let (_, a) = send("slow please", "a");
    assert_eq!(a["result"]["state"], "active", "{a}");
    let first = a["result"]["run_id"].as_str().unwrap().to_string();
    // Behind the running run: queued, durable before the answer, and the same answer again.
    let (status, b) = send("hello there", "b");
    assert_eq!(
        (status, b["result"]["state"].as_str()),
        (200, Some("pending")),
        "{b}"
    );
    let sub_b = b["result"]["submission_id"].as_str().unwrap().to_string();
    let (_, again) = send("hello there", "b");
    assert_eq!(again["result"]["submission_id"], sub_b.as_str(), "{again}");
    let (status, other) = send("something else", "b");
    assert_eq!(
        (status, other["error"]["code"].as_str()),
        (409, Some("send_id_reuse")),
        "{other}"
    );
    // Another queued send, withdrawn before it starts: it never runs, and a re-send says so.
    let (_, c) = send("hello again", "c");
    let sub_c = c["result"]["submission_id"].as_str().unwrap().to_string();
    let (_, r) = rpc(&s, "session.retract", json!({"submission_id": sub_c}));
    assert_eq!(r["result"], "retracted", "{r}");
    let (_, r) = rpc(&s, "session.retract", json!({"submission_id": sub_c}));
    assert_eq!(r["result"], "not_pending", "{r}");
    let (status, c2) = send("hello again", "c");
    assert_eq!(
        (status, c2["error"]["code"].as_str()),
        (409, Some("send_retracted")),
        "{c2}"
    );
    // The first run ends, then the queued send runs as the next turn.
    wait_for("the queued send's run to complete", || {
        let (_, st) = rpc(&s, "session.send_status", json!({"send_id": "b"}));
        st["result"]["state"] == "finished"
    });
    let (_, st) = rpc(&s, "session.send_status", json!({"send_id": "b"}));
    let second = st["result"]["run_id"].as_str().unwrap().to_string();
    assert_ne!(second, first);
    assert_eq!(
        st["result"]["delivered"],
        json!({"as": "turn", "ref": second}),
        "{st}"
    );
    assert_eq!(st["result"]["reason"], "completed", "{st}");
    let (_, r) = rpc(&s, "session.retract", json!({"submission_id": sub_b}));
    assert_eq!(r["result"], "already_started", "{r}");
    let (_, r) = rpc(&s, "run.result", json!({"run_id": second}));
    assert_eq!(
        r["result"]["final_message"]["text"],
        "Hello! How can I help you today?"
    );
    // The transcript holds both runs in order, and nothing of the retracted send.
    let (_, page) = rpc(&s, "session.read", json!({"from_ordinal": 1}));
    let texts: Vec<String> = page["result"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            m["message"]["content"][0]["text"]["text"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(texts.len(), 4, "{page}");
    assert_eq!(
        (texts[0].as_str(), texts[2].as_str()),
        ("slow please", "hello there")
    );
    let (status, unknown) = rpc(&s, "send.status", json!({"send_id": "nope"}));
    assert_eq!(
        (status, unknown["error"]["code"].as_str()),
        (404, Some("unknown_send"))
    );
}

/// The diagnostics an operator reads when broca is slow: the blocking pool's jobs by kind, the
/// queues' depths, and each shard's traffic by origin, in /metrics.
#[test]
fn diagnostics_count_the_blocking_pool_the_queues_and_the_traffic_by_origin() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let s = start(&state, &peer, &[]);
    support::serve::send_until_completed(
        &s,
        json!({"prompt": "hello there", "model": "anthropic/m"}),
    );
    assert_eq!(rpc(&s, "session.read", json!({})).0, 200);
    let jobs = |kind: &str| {
        support::serve::metric_with(&s, "broca_blocking_jobs_total", &format!("kind=\"{kind}\""))
    };
    // The session's WAL was replayed as it opened, and read whole by the read.
    assert!(jobs("wal_replay") >= 1);
    assert!(jobs("wal_read") >= 1);
    // The provider's origin, as the run's model call reached it.
    let origin = format!("origin=\"{}\"", peer.url().trim_end_matches('/'));
    let at =
        |name: &str, more: &str| support::serve::metric_with(&s, name, &format!("{origin}{more}"));
    assert!(at("broca_egress_bytes_total", ",direction=\"out\"") > 0);
    assert!(at("broca_egress_bytes_total", ",direction=\"in\"") > 0);
    assert!(at("broca_egress_connects_total", "") >= 1);
    // The queues, idle now.
    let (_, text) = support::serve::get(&s, "/metrics");
    let text = String::from_utf8(text).unwrap();
    for family in [
        "broca_mesh_queue_depth{shard=\"0\"} 0",
        "broca_mesh_queue_depth{shard=\"1\"} 0",
        "broca_session_commands_waiting{shard=\"0\"} 0",
        "broca_store_queue_depth ",
        "broca_blocking_jobs_under_way{kind=\"wal_replay\"} 0",
    ] {
        assert!(text.contains(family), "{family} in {text}");
    }
}
