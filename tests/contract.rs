//! The run's contract where a host meets it: reads never write, runs a crash left open are
//! resumed at start without any command, a resumed run goes where its frozen catalog entry
//! says (whatever the catalog says now), and the catalog is refreshed for new sends only.

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::serve::{command, metric, result_when_ended, rpc, spawn, start_env, wait_for, Serve};
use support::{broca, dump_all, fixture, Aimock, CountingTools};

fn kill(s: &mut Serve) {
    let _ = s.child.kill();
    let _ = s.child.wait();
}

#[test]
fn a_thousand_status_reads_of_an_idle_session_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let config = dir.path().join("serve.json");
    std::fs::write(&config, r#"{"idle_secs": 1}"#).unwrap();
    let peer = Aimock::start(&fixture("aimock.json"));
    let mut s = start_env(&state, &peer, &["--config", config.to_str().unwrap()], &[]);
    let run_id = support::serve::send_until_completed(
        &s,
        json!({"prompt": "hello there", "model": "anthropic/m"}),
    );
    wait_for("the idle actor to close", || {
        metric(&s, "broca_sessions_live") == 0
    });
    let before = std::fs::read(
        state
            .join("wal")
            .read_dir()
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path(),
    )
    .unwrap();
    for _ in 0..1000 {
        let (status, r) = rpc(&s, "run.status", json!({"run_id": run_id}));
        assert_eq!(
            (status, r["result"]["state"].as_str()),
            (200, Some("completed"))
        );
    }
    let (status, _) = rpc(&s, "run.result", json!({"run_id": run_id}));
    assert_eq!(status, 200);
    let after = std::fs::read(
        state
            .join("wal")
            .read_dir()
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path(),
    )
    .unwrap();
    assert_eq!(after.len(), before.len(), "a read wrote to the WAL");
    assert_eq!(after, before, "a read changed the WAL");
    assert_eq!(
        metric(&s, "broca_sessions_live"),
        0,
        "a read opened the session"
    );
    kill(&mut s);
    let check = broca(&state).args(["store", "check"]).output().unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
}

#[test]
fn runs_a_crash_left_open_are_resumed_at_start_without_any_command() {
    const SESSIONS: usize = 50;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let tools = CountingTools::new(dir.path(), json!({"max_concurrency": 64}));
    let peer = Aimock::start(&fixture("tools.json"));
    let extra = ["--tools-config", tools.config.to_str().unwrap()];
    let mut s = start_env(&state, &peer, &extra, &[]);
    for i in 0..SESSIONS {
        let (status, r) = rpc(
            &s,
            "session.send",
            json!({"session": format!("s{i}"), "prompt": "hang call", "model": "anthropic/m"}),
        );
        assert_eq!(status, 200, "{r}");
    }
    let count = || tools.dispatched();
    wait_for("every hanging call to reach the tool server", || {
        count() == SESSIONS
    });
    kill(&mut s); // SIGKILL: every run is open, its call delivered and unanswered
    let delivered = count();

    // A restart, and not one command: the open runs are found and resumed.
    let started = Instant::now();
    let mut s = start_env(&state, &peer, &extra, &[]);
    let until = Instant::now() + Duration::from_secs(60);
    let ends = loop {
        let records = dump_all(&state);
        let ends: Vec<Value> = records
            .into_iter()
            .filter(|r| r["kind"] == "run_finished")
            .collect();
        if ends.len() >= SESSIONS {
            break ends;
        }
        assert!(
            Instant::now() < until,
            "{} of {SESSIONS} runs resumed after {:?}",
            ends.len(),
            started.elapsed()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let took = started.elapsed();
    assert_eq!(ends.len(), SESSIONS, "one terminal per run");
    for e in &ends {
        assert_eq!(e["record"]["reason"], "interrupted", "{e}");
        assert_eq!(
            e["record"]["indeterminate_tool_calls"],
            json!(["call_hang_1"]),
            "{e}"
        );
    }
    assert_eq!(count(), delivered, "a resumed run sent a call again");
    println!("{SESSIONS} open runs resumed {took:?} after the restart began");
    kill(&mut s);
}

#[test]
fn a_resumed_run_goes_where_its_frozen_catalog_entry_says() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let peer = Aimock::start(&fixture("aimock.json"));
    let catalog = dir.path().join("catalog.json");
    let write_catalog = |base_url: &str| {
        let c = json!({"providers": [{"id": "frozen", "family": "anthropic-messages",
            "base_url": base_url, "credential_env": "ANTHROPIC_API_KEY"}], "models": []});
        std::fs::write(&catalog, c.to_string()).unwrap();
    };
    write_catalog(&peer.url());
    let run = |crash: Option<&str>| {
        let mut c = broca(&state);
        c.env("ANTHROPIC_API_KEY", "sk-frozen-test-0123456789")
            .env("BROCA_CATALOG_FILE", &catalog)
            .args([
                "run",
                "--model",
                "frozen/m",
                "--send-id",
                "k1",
                "--json",
                "hello there",
            ]);
        if let Some(at) = crash {
            c.env("BROCA_CRASH_AT", at);
        }
        c.stderr(Stdio::piped()).output().unwrap()
    };
    let first = run(Some("step_started:1"));
    assert!(!first.status.success(), "the first life was cut");
    // The provider moves (the catalog now says a port where nothing listens); the run
    // admitted before keeps the entry it froze.
    write_catalog("http://127.0.0.1:1");
    let again = run(None);
    let stdout = String::from_utf8_lossy(&again.stdout);
    let result: Value = serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|_| panic!("no run.result: {}", String::from_utf8_lossy(&again.stderr)));
    assert_eq!(result["state"], "completed", "{result}");
    let started: Vec<Value> = dump_all(&state)
        .into_iter()
        .filter(|r| r["kind"] == "run_started")
        .collect();
    assert_eq!(started.len(), 1, "the send_id answered the run it admitted");
    assert_eq!(
        started[0]["record"]["config"]["catalog"]["provider"]["base_url"],
        peer.url().as_str()
    );
}

#[test]
fn the_catalog_is_read_again_for_new_sends_only() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let peer = Aimock::start(&fixture("aimock.json"));
    let catalog = dir.path().join("catalog.json");
    let write_catalog = |window: u64| {
        let c = json!({"models": [{"provider": "anthropic", "model": "refreshed",
            "context_window": window}]});
        std::fs::write(&catalog, c.to_string()).unwrap();
    };
    write_catalog(1000);
    let config = dir.path().join("serve.json");
    std::fs::write(
        &config,
        json!({"catalog_file": catalog, "catalog_refresh_secs": 1}).to_string(),
    )
    .unwrap();
    let mut cmd = command(&state, &peer.url(), &["--config", config.to_str().unwrap()]);
    let mut s = spawn(cmd.stderr(Stdio::inherit()), &state);
    let send = |s: &Serve, session: &str| {
        let (status, r) = rpc(
            s,
            "session.send",
            json!({"session": session, "prompt": "hello there", "model": "anthropic/refreshed"}),
        );
        assert_eq!(status, 200, "{r}");
    };
    send(&s, "a");
    write_catalog(2000);
    std::thread::sleep(Duration::from_millis(2500));
    send(&s, "b");
    std::thread::sleep(Duration::from_millis(500));
    kill(&mut s);
    let windows: Vec<(String, u64)> = dump_all(&state)
        .into_iter()
        .filter(|r| r["kind"] == "run_started")
        .map(|r| {
            (
                r["record"]["prompt"].as_str().unwrap().to_string(),
                r["record"]["config"]["catalog"]["context_window"]
                    .as_u64()
                    .unwrap(),
            )
        })
        .collect();
    let mut got: Vec<u64> = windows.iter().map(|w| w.1).collect();
    got.sort();
    assert_eq!(
        got,
        [1000, 2000],
        "the second send saw the refreshed entry: {windows:?}"
    );
}

#[test]
fn a_priced_model_runs_until_its_cost_budget_is_spent() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let tools = CountingTools::new(dir.path(), json!({}));
    // Six steps (five ask for `record`), each reporting 10,000 input and 1,000 output tokens:
    // 45,000 micro-USD a step at claude-sonnet-4-5's built-in prices ($3 and $15 a million).
    let peer = Aimock::start(&fixture("budget.json"));
    let mut s = start_env(
        &state,
        &peer,
        &["--tools-config", tools.config.to_str().unwrap()],
        &[],
    );
    let send = |session: &str, budget: Value| {
        let (status, r) = rpc(
            &s,
            "session.send",
            json!({"session": session, "prompt": "spend", "model": "anthropic/claude-sonnet-4-5",
                   "stop_when": budget}),
        );
        assert_eq!(status, 200, "{r}");
        let run_id = r["result"]["run_id"].as_str().unwrap().to_string();
        result_when_ended(&s, session, &run_id)
    };
    let dispatched = || tools.dispatched();
    // Unbounded, the run takes its six steps and measures what they cost.
    let whole = send("whole", json!({"max_total_tokens": 1_000_000}));
    assert_eq!(whole["state"], "completed", "{whole}");
    assert_eq!(whole["metered_usage"]["input"], 60_000, "{whole}");
    assert_eq!(whole["cost"], json!({"micros": 270_000, "currency": "USD"}));
    assert_eq!(dispatched(), 5);
    // Capped at 92,000 micro-USD: after two steps (90,000) the next request resends at least
    // the last step's 10,000 input tokens, 3,000 micro-USD more even if all of it were read
    // from the cache at $0.30: the run stops before it overspends, before dispatching the
    // second step's tool call.
    let capped = send("capped", json!({"max_cost_micros": 92_000}));
    assert_eq!(capped["state"], "budget_exhausted", "{capped}");
    assert_eq!(capped["cost"], json!({"micros": 90_000, "currency": "USD"}));
    let detail = capped["stop_detail"].as_str().unwrap();
    assert!(
        detail.contains("cost 90000 micro-USD of a 92000 micro-USD budget")
            && detail.contains("at least 3000 more"),
        "{detail}"
    );
    assert_eq!(
        dispatched(),
        5 + 1,
        "the stopped run dispatched past its budget"
    );
    // Capped at 100,000: the third step starts under the budget (90,000 + at least 3,000) and
    // ends above it (135,000); its tool call is not dispatched, and no fourth step starts.
    let spent = send("spent", json!({"max_cost_micros": 100_000}));
    assert_eq!(spent["state"], "budget_exhausted", "{spent}");
    assert_eq!(spent["cost"], json!({"micros": 135_000, "currency": "USD"}));
    assert!(
        spent["stop_detail"]
            .as_str()
            .unwrap()
            .contains("cost 135000 micro-USD of a 100000 micro-USD budget"),
        "{spent}"
    );
    assert_eq!(dispatched(), 5 + 1 + 2);
    // run.status tells the same cost as run.result.
    let status = rpc(
        &s,
        "run.status",
        json!({"session": "spent", "run_id": spent["run_id"]}),
    )
    .1;
    assert_eq!(status["result"]["cost"]["micros"], 135_000, "{status}");
    kill(&mut s);
}

/// Every file under `dir` with its bytes, sorted by path.
fn tree(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        for e in std::fs::read_dir(&p).unwrap() {
            let path = e.unwrap().path();
            let kind = std::fs::symlink_metadata(&path).unwrap().file_type();
            // Empty files made ahead for new WALs: none is a session's until renamed.
            let spares = path.file_name() == Some(broca::wal::writer::spares::SPARES_DIR.as_ref());
            if kind.is_dir() && spares {
                continue;
            }
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() {
                let bytes = std::fs::read(&path).unwrap();
                out.push((path, bytes));
            } else {
                out.push((path, b"(not a file)".to_vec())); // the serve socket
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_send_admission_refuses_writes_nothing_in_serve_or_run() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let peer = Aimock::start(&fixture("aimock.json"));
    // A provider the catalog knows whose wire family this build does not speak.
    let catalog = dir.path().join("catalog.json");
    std::fs::write(
        &catalog,
        r#"{"providers": [{"id": "future", "family": "future-wire",
            "base_url": "https://future.example", "credential_env": "FUTURE_KEY"}]}"#,
    )
    .unwrap();
    let catalog_env = [
        ("BROCA_CATALOG_FILE", catalog.to_str().unwrap()),
        ("FUTURE_KEY", "k-0123456789"),
    ];
    let mut s = start_env(&state, &peer, &[], &catalog_env);
    let (status, r) = rpc(
        &s,
        "session.send",
        json!({"session": "used", "prompt": "hello there", "model": "anthropic/m"}),
    );
    assert_eq!(status, 200, "{r}");
    let run_id = r["result"]["run_id"].as_str().unwrap().to_string();
    assert_eq!(result_when_ended(&s, "used", &run_id)["state"], "completed");
    let wal = state.join("wal");
    let before = tree(&wal);
    assert_eq!(before.len(), 1);
    let refusals = [
        (
            json!({"credential_id": "env:BROCA_TEST_UNSET"}),
            "auth_required",
            "BROCA_TEST_UNSET",
        ),
        (
            json!({"credential_id": "file:nope"}),
            "auth_required",
            "credentials.json",
        ),
        (
            json!({"model": "gemini/gemini-2.5-pro"}),
            "auth_required",
            "GEMINI_API_KEY",
        ),
        (
            json!({"model": "bedrock/anthropic.claude"}),
            "auth_required",
            "AWS_ACCESS_KEY_ID",
        ),
        (
            json!({"model": "future/m"}),
            "unsupported_provider",
            "future-wire",
        ),
        (
            json!({"stop_when": {"max_cost_micros": 1000}}),
            "budget_unpriced",
            "anthropic/m",
        ),
        (
            json!({"stop_when": {"max_total_tokens": 0}}),
            "invalid_params",
            "max_total_tokens",
        ),
        // The run's budgets are stop conditions; the role's closed `budget` says where.
        (
            json!({"budget": {"max_total_tokens": 1000}}),
            "invalid_params",
            "stop_when.max_total_tokens",
        ),
        (
            json!({"budget": {"max_input_tokens": 0}}),
            "invalid_params",
            "budget.max_input_tokens",
        ),
    ];
    for session in ["used", "fresh"] {
        for (extra, code, names) in &refusals {
            let mut params = json!({"session": session, "prompt": "hello", "model": "anthropic/m",
                                    "send_id": format!("refused-{code}")});
            for (k, v) in extra.as_object().unwrap() {
                params[k] = v.clone();
            }
            let (status, r) = rpc(&s, "session.send", params.clone());
            assert_eq!(
                (status, r["error"]["code"].as_str()),
                (400, Some(*code)),
                "{params}: {r}"
            );
            let message = r["error"]["message"].as_str().unwrap();
            assert!(message.contains(names), "{params}: {message}");
            assert_eq!(tree(&wal), before, "{params} was refused and wrote");
        }
    }
    kill(&mut s);
    // `broca run` refuses the same way, before the session's WAL is touched.
    let before = tree(&state);
    for (args, code) in [
        (vec!["--model", "future/m"], "unsupported_provider"),
        (
            vec!["--model", "anthropic/m", "--base-url", peer.url().as_str()],
            "auth_required",
        ),
    ] {
        let o = broca(&state)
            .env_remove("ANTHROPIC_API_KEY")
            .envs(catalog_env)
            .args([
                "run",
                "--project-root",
                "/proj",
                "--harness",
                "h",
                "--session",
                "used",
                "--json",
            ])
            .args(&args)
            .arg("hello")
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        let last: Value = serde_json::from_slice(
            o.stdout
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .last()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(last["error"]["code"], *code, "{args:?}: {last}");
        assert_eq!(tree(&state), before, "{args:?} was refused and wrote");
    }
}
