//! Module mode: the real `broca module` (and `ck-broca`) binary registered with a stand-in
//! daemon (tests/support/daemon.rs: a real connection file, the daemon's side of the
//! handshake and the frames by subc-transport's own code), with aimock as the provider.

#[path = "support/daemon.rs"]
#[allow(dead_code)]
mod daemon;
#[path = "support/module.rs"]
mod module_support;
mod support;

use module_support::*;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use daemon::{Answer, Daemon};
use serde_json::{json, Value};
use subc_protocol::FrameType;
use support::{broca, fixture, Aimock};

#[test]
fn a_module_registers_and_serves_the_management_methods_on_its_routes() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let peer = Aimock::start(&fixture("aimock.json"));
    let mut d = Daemon::start(dir.path());
    let mut child = module(
        &state,
        &d,
        &peer,
        &[("SUBC_LAUNCH_NONCE", "nonce-for-this-launch")],
    )
    .spawn_quiet();
    let hello = d.accept(Answer::Accept).expect("broca's HELLO");
    let m = &hello["manifest"];
    assert_eq!(m["module_id"], "ck-broca");
    assert_eq!(hello["launch_nonce"], "nonce-for-this-launch");
    assert_eq!(hello["control_ops"], json!(["health.check"]));
    // Registered warming; ready (for route binds) once the store, the catalog, the tools and
    // every shard are up, said with a `catalog.update` on channel 0 that keeps the roles.
    assert_eq!(m["ready"], false, "{m}");
    let update = d.answer(0, 1 << 62);
    assert_eq!(update.header.ty, FrameType::Request);
    let update: Value = serde_json::from_slice(&update.body).unwrap();
    assert_eq!(update["op"], "catalog.update", "{update}");
    assert_eq!(update["ready"], true, "{update}");
    assert_eq!(update["provides"], m["provides"], "{update}");
    let surface = &m["provides"][0];
    assert_eq!(surface["role"], "management_surface");
    let ops = each(&surface["operations"], "name");
    assert!(
        ops.contains(&"session.send") && ops.contains(&"session.read"),
        "{ops:?}"
    );

    // A route bound to a session; its requests name none.
    let (ty, ack) = d.bind(3, 1, "/proj/mod", "h", "s1");
    assert_eq!(
        (ty, &ack),
        (FrameType::Response, &json!({"op": "route.bind"}))
    );
    // The llm-runner/v1 role: declared, and its required ops answered as the role's own crate
    // reads them.
    assert!(
        m["capabilities"]["provides"]
            .as_array()
            .unwrap()
            .contains(&json!("llm-runner/v1")),
        "{m}"
    );
    let (ty, described) = d.request(3, 1, "role.describe", json!({}));
    assert_eq!(ty, FrameType::Response, "{described}");
    let role = cortexkit_role_llm_runner::wire::read_reply::<
        cortexkit_role_llm_runner::describe::RoleDescribe,
    >(&serde_json::to_vec(&described).unwrap())
    .unwrap_or_else(|e| panic!("{e:?}: {described}"));
    cortexkit_role_llm_runner::describe::check_describe(&serde_json::to_value(&role).unwrap())
        .unwrap_or_else(|p| panic!("{p:?}"));
    let (_, before) = d.request(3, 1, "session.baseline", json!({}));
    assert_eq!(
        result_of(&mut d, &before),
        json!({"state": "not_yet"}),
        "nothing reached the session yet"
    );
    let (ty, sent) = d.request(
        3,
        1,
        "session.send",
        json!({"prompt": "hello", "model": "anthropic/m"}),
    );
    assert_eq!(ty, FrameType::Response, "{sent}");
    let run_id = result_of(&mut d, &sent)["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    let status = wait_ended(&mut d, 3, 1, &run_id);
    assert_eq!(status["state"], "completed", "{status}");
    let (_, r) = d.request(3, 1, "run.result", json!({"run_id": run_id}));
    assert_eq!(
        result_of(&mut d, &r)["final_message"]["text"],
        "Hello! How can I help you today?"
    );
    let (_, page) = d.request(3, 1, "session.read", json!({}));
    assert_eq!(
        result_of(&mut d, &page)["messages"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    let (_, after) = d.request(3, 1, "session.baseline", json!({}));
    let after = result_of(&mut d, &after);
    assert_eq!(after["state"], "ready", "{after}");
    assert_eq!(
        after["baseline"]["items"],
        json!([]),
        "a plan-less session: {after}"
    );
    // A session first sent by an attested principal is that principal's: another one is
    // refused its baseline (and its sends), the owner is answered.
    let bind_as = |d: &mut Daemon, channel: u16, module: &str| {
        let (ty, _) = d.control(&json!({
            "op": "route.bind", "route_channel": channel, "epoch": 1,
            "target": {"kind": "management_surface", "module_id": "ck-broca"},
            "identity": {"harness": "h", "session": "owned"},
            "principal": {"kind": "reserved", "module_id": module},
            "scope": {"owner": {"kind": "direct"}, "ref": "scope-owned", "scope_epoch": 1,
                      "kind": "head", "workdir": "/proj/mod", "owner_authorized": false},
        }));
        assert_eq!(ty, FrameType::Response);
    };
    bind_as(&mut d, 13, "the-owner");
    let (ty, sent) = d.request(
        13,
        1,
        "session.send",
        json!({"prompt": "hello", "model": "anthropic/m", "send_id": "own-1"}),
    );
    assert_eq!(ty, FrameType::Response, "{sent}");
    let owned_run = sent["result"]["run_id"].as_str().unwrap().to_string();
    wait_ended(&mut d, 13, 1, &owned_run);
    bind_as(&mut d, 12, "someone-else");
    let (ty, refused) = d.request(12, 1, "session.baseline", json!({}));
    assert_eq!(ty, FrameType::Error, "{refused}");
    assert_eq!(refused["code"], "scope_owner_mismatch", "{refused}");
    let (ty, refused) = d.request(
        12,
        1,
        "session.send",
        json!({"prompt": "mine now", "model": "anthropic/m", "send_id": "other-1"}),
    );
    assert_eq!(ty, FrameType::Error, "{refused}");
    assert_eq!(refused["code"], "scope_owner_mismatch", "{refused}");
    // Cancelling is the owner's too, also for a run that has ended.
    let (ty, refused) = d.request(12, 1, "run.cancel", json!({"run_id": owned_run}));
    assert_eq!(ty, FrameType::Error, "{refused}");
    assert_eq!(refused["code"], "scope_owner_mismatch", "{refused}");
    let (ty, owner) = d.request(13, 1, "run.cancel", json!({"run_id": owned_run}));
    assert_eq!(
        (ty, owner["result"].clone()),
        (FrameType::Response, json!("not_active")),
        "{owner}"
    );
    let (ty, owner) = d.request(13, 1, "session.baseline", json!({}));
    assert_eq!(ty, FrameType::Response, "{owner}");
    d.send_corr(FrameType::Goodbye, 12, 1, 0);
    d.send_corr(FrameType::Goodbye, 13, 1, 0);
    // The route's session is the session on disk: the WAL of (/proj/mod, h, s1).
    let triple = broca::wal::SessionTriple::new("/proj/mod", "h", "s1").unwrap();
    assert!(broca::wal::writer::wal_path(&state.join("wal"), &triple).exists());

    // session.subscribe holds the request open: STREAM_DATA per control unit, each with its
    // durable cursor, from the start; a CANCEL ends it with STREAM_END.
    let corr = d.send(
        FrameType::Request,
        3,
        1,
        &json!({"method": "session.subscribe", "params": {"from": "start"}}),
    );
    let units = d.frames_for(3, corr, |f| {
        serde_json::from_slice::<Value>(&f.body).is_ok_and(|v| v["unit"]["type"] == "run_finished")
    });
    let kinds: Vec<String> = units
        .iter()
        .map(|f| {
            assert_eq!(f.header.ty, FrameType::StreamData);
            let v: Value = serde_json::from_slice(&f.body).unwrap();
            assert_eq!(v["kind"], "control", "{v}");
            assert!(v["cursor"]["after"].as_str().unwrap().contains('.'), "{v}");
            v["unit"]["type"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(
        kinds.first().map(String::as_str),
        Some("run_started"),
        "{kinds:?}"
    );
    assert!(kinds.iter().any(|k| k == "message"), "{kinds:?}");
    d.send_corr(FrameType::Cancel, 3, 1, corr);
    let end = d.frames_for(3, corr, |f| f.header.ty == FrameType::StreamEnd);
    assert_eq!(end.last().unwrap().header.ty, FrameType::StreamEnd);
    // From a cursor: only what follows it.
    let second: Value = serde_json::from_slice(&units[1].body).unwrap();
    let corr = d.send(
        FrameType::Request,
        3,
        1,
        &json!({"method": "session.subscribe", "params": {"from": second["cursor"]}}),
    );
    let first = d.answer(3, corr);
    let v: Value = serde_json::from_slice(&first.body).unwrap();
    assert_eq!(
        v["unit"]["type"].as_str(),
        kinds.get(2).map(String::as_str),
        "{v}"
    );
    d.send_corr(FrameType::Cancel, 3, 1, corr);
    d.frames_for(3, corr, |f| f.header.ty == FrameType::StreamEnd);
    let corr = d.send(
        FrameType::Request,
        3,
        1,
        &json!({"method": "session.subscribe", "params": {"from": "999999.0"}}),
    );
    assert_eq!(
        d.answer(3, corr).header.ty,
        FrameType::Error,
        "a cursor beyond the head"
    );

    // Live: the display lane's deltas come marked SHEDDABLE, the control lane's units not.
    let live = d.send(
        FrameType::Request,
        3,
        1,
        &json!({"method": "session.subscribe", "params": {}}),
    );
    let (_, sent) = d.request(
        3,
        1,
        "session.send",
        json!({"prompt": "slow", "model": "anthropic/m"}),
    );
    assert!(sent.get("result").is_some(), "{sent}");
    let frames = d.frames_for(3, live, |f| {
        serde_json::from_slice::<Value>(&f.body).is_ok_and(|v| v["unit"]["type"] == "run_finished")
    });
    let sheddable = |f: &subc_protocol::Frame| f.header.flags.0 & 0x30 == 0x20;
    let display: Vec<&subc_protocol::Frame> = frames
        .iter()
        .filter(|f| serde_json::from_slice::<Value>(&f.body).is_ok_and(|v| v["type"] == "display"))
        .collect();
    assert!(
        !display.is_empty(),
        "display deltas while the answer streams"
    );
    assert!(
        display.iter().all(|f| sheddable(f)),
        "display deltas are sheddable"
    );
    assert!(frames
        .iter()
        .filter(|f| !display.iter().any(|d| std::ptr::eq(*d, *f)))
        .all(|f| !sheddable(f)));
    d.send_corr(FrameType::Cancel, 3, 1, live);
    d.frames_for(3, live, |f| f.header.ty == FrameType::StreamEnd);

    // Refusals are ERROR frames {code, message, detail: {class}}.
    let (ty, e) = d.request(3, 1, "run.status", json!({"session": "other"}));
    assert_eq!(
        (ty, e["code"].as_str()),
        (FrameType::Error, Some("invalid_params")),
        "{e}"
    );
    assert_eq!(e["detail"]["class"], "permanent");
    let (ty, e) = d.request(3, 1, "session.nope", json!({}));
    assert_eq!(
        (ty, e["code"].as_str()),
        (FrameType::Error, Some("unknown_method")),
        "{e}"
    );
    let (ty, e) = d.request(9, 1, "run.status", json!({}));
    assert_eq!(
        (ty, e["code"].as_str()),
        (FrameType::Error, Some("unknown_channel")),
        "{e}"
    );
    let (ty, e) = d.request(3, 7, "run.status", json!({}));
    assert_eq!(
        (ty, e["code"].as_str()),
        (FrameType::Error, Some("stale_route_epoch")),
        "{e}"
    );
    // A bind at an epoch not above the installed one is refused; a higher one replaces it.
    let (ty, _) = d.bind(3, 1, "/proj/mod", "h", "s1");
    assert_eq!(ty, FrameType::Error);
    let (ty, _) = d.bind(3, 2, "/proj/mod", "h", "s2");
    assert_eq!(ty, FrameType::Response);
    let (_, e) = d.request(3, 2, "run.status", json!({}));
    assert_eq!(
        e["code"], "unknown_run",
        "the route now names s2, which has no run: {e}"
    );

    // health.check through the same connection, with the shards' gauges.
    let (ty, h) = d.control(&json!({"op": "health.check"}));
    assert_eq!(ty, FrameType::Response);
    assert_eq!(
        (h["op"].as_str(), h["status"].as_str()),
        (Some("health.check"), Some("ok")),
        "{h}"
    );
    assert_eq!(h["metrics"]["shards"], 2);
    assert_eq!(h["metrics"]["routes"], 1);
    // The machine id the daemon's HELLO_ACK named.
    assert_eq!(h["metrics"]["machine_id"], daemon::MACHINE_ID, "{h}");
    // Where time and bytes went: the sessions' WALs replayed on the blocking pool, the
    // provider's origin with the bytes sent to it, the queues.
    let diag = &h["metrics"]["diagnostics"];
    assert!(
        diag["blocking"]["wal_replay"]["jobs"].as_u64() >= Some(1),
        "{diag}"
    );
    let to_peer = diag["egress"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["origin"] == peer.url().as_str())
        .unwrap_or_else(|| panic!("no egress to {}: {diag}", peer.url()));
    assert!(to_peer["bytes_out"].as_u64() > Some(0), "{diag}");
    assert_eq!(
        diag["queues"]["mesh"].as_array().map(Vec::len),
        Some(2),
        "{diag}"
    );
    // PING is answered PONG with its corr.
    let corr = d.send(FrameType::Ping, 0, 0, &Value::Null);
    assert_eq!(d.answer(0, corr).header.ty, FrameType::Pong);

    // A drain: admission stops, broca says GOODBYE, closes and exits 0.
    drain(&mut d, &mut child);
    let err = stderr_of(&mut child);
    assert!(
        !err.contains("nonce-for-this-launch"),
        "the nonce is never logged: {err}"
    );
}

#[test]
fn a_daemon_that_is_not_there_or_not_the_files_is_a_loud_exit_within_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let peer = Aimock::start(&fixture("aimock.json"));
    let run = |state: &Path, file: &Path| {
        let t = Instant::now();
        let out = broca(state)
            .env("ANTHROPIC_API_KEY", KEY)
            .args(["module", "--subc"])
            .arg(file)
            .output()
            .unwrap();
        (out, t.elapsed())
    };
    // Nobody listens at the file's endpoint any more.
    let d = Daemon::start(&dir.path().join("gone"));
    let file = d.file.clone();
    drop(d);
    let (out, took) = run(&dir.path().join("s1"), &file);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("the daemon cannot be reached"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(took < Duration::from_secs(10), "{took:?}");

    // A daemon that proves itself with another key: broca proves nothing and exits.
    let mut wrong = Daemon::start(&dir.path().join("wrong"));
    let state = dir.path().join("s2");
    let mut child = module(&state, &wrong, &peer, &[])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let failed = wrong.accept(Answer::WrongKey).unwrap_err();
    assert!(
        !failed.contains("InvalidClientAuth"),
        "broca proved itself to a daemon that had not proven itself: {failed}"
    );
    let status = wait_exit(&mut child, Duration::from_secs(10));
    let err = stderr_of(&mut child);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("does not match the connection file's key"),
        "{err}"
    );

    // A daemon that settles on a wire version broca does not speak: one line, exit 1.
    let mut other = Daemon::start(&dir.path().join("version"));
    let mut child = module(&dir.path().join("s6"), &other, &peer, &[])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    other.accept(Answer::Version(3)).unwrap();
    let status = wait_exit(&mut child, Duration::from_secs(10));
    let err = stderr_of(&mut child);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("negotiated wire protocol version 3; broca speaks version 2"),
        "{err}"
    );

    // A connection file others can read is refused before anything is sent.
    let open = Daemon::start(&dir.path().join("open"));
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&open.file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (out, took) = run(&dir.path().join("s3"), &open.file);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("connection file") && err.contains(open.file.to_str().unwrap()),
        "{err}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    // No --subc: usage.
    let out = broca(&dir.path().join("s4"))
        .arg("module")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    // A nonce descriptor named but not there: refused, never a fall back to the environment.
    let good = Daemon::start(&dir.path().join("nonce"));
    let out = broca(&dir.path().join("s5"))
        .env("SUBC_LAUNCH_NONCE_FD", "3:1")
        .env("SUBC_LAUNCH_NONCE", "env-copy")
        .args(["module", "--subc"])
        .arg(&good.file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("launch nonce"), "{err}");
    assert!(!err.contains("env-copy"), "{err}");
}

#[test]
fn losing_the_daemon_stops_broca_and_it_exits_non_zero_and_sigterm_is_re_raised() {
    let dir = tempfile::tempdir().unwrap();
    let peer = Aimock::start(&fixture("aimock.json"));
    let mut d = Daemon::start(&dir.path().join("d1"));
    let mut child = module(&dir.path().join("s1"), &d, &peer, &[]).spawn_quiet();
    d.accept(Answer::Accept).unwrap();
    d.drop_connection();
    let status = wait_exit(&mut child, Duration::from_secs(15));
    let err = stderr_of(&mut child);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("ended unannounced"), "{err}");

    // As ck-broca, the daemon's name for it; SIGTERM says GOODBYE and dies of the signal.
    let mut d = Daemon::start(&dir.path().join("d2"));
    let ck = support::broca_bin().with_file_name("ck-broca");
    let mut child = Command::new(&ck)
        .env("ANTHROPIC_API_KEY", KEY)
        .arg("--state-dir")
        .arg(dir.path().join("s2"))
        .arg("--subc")
        .arg(&d.file)
        .spawn_quiet();
    assert_eq!(
        d.accept(Answer::Accept).unwrap()["manifest"]["module_id"],
        "ck-broca"
    );
    // SAFETY: a signal to the child we started. It comes at once, while broca may still be
    // starting: a signal before the daemon is ready is kept for it, not lost.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let frames = d.until_closed();
    assert!(frames.iter().any(|f| f.header.ty == FrameType::Goodbye));
    let status = wait_exit(&mut child, Duration::from_secs(15));
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(libc::SIGTERM),
        "{}",
        stderr_of(&mut child)
    );
}

/// Kills broca at each durable boundary of a send made over a daemon route, restarts it as
/// the supervisor would (a new process, a new registration, the route bound again), retries
/// the send with its send_id, and checks what a client of the daemon relies on: the retried
/// send answers the run that was durable, the run ends once (one terminal record), a durable
/// model step is never redone, and nothing that was written is lost.
#[test]
fn killed_at_each_durable_boundary_under_the_daemon_a_restart_keeps_the_run() {
    let peer = Aimock::start(&fixture("aimock.json"));
    for point in ["admitted", "step_started", "step", "terminal"] {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let mut d = Daemon::start(&dir.path().join("d1"));
        let mut child = module(
            &state,
            &d,
            &peer,
            &[("BROCA_CRASH_AT", &format!("{point}:1"))],
        )
        .spawn_quiet();
        d.accept(Answer::Accept).unwrap();
        assert_eq!(d.bind(1, 1, "/crash", "h", "s").0, FrameType::Response);
        let send = json!({"prompt": "hello", "model": "anthropic/m", "send_id": "k1"});
        let corr = d.send(
            FrameType::Request,
            1,
            1,
            &json!({"method": "session.send", "params": send}),
        );
        // Answered before the kill (step, terminal) or not at all (admitted).
        let first = d.until_closed();
        let answered: Vec<Value> = first
            .iter()
            .filter(|f| f.header.corr == corr)
            .map(|f| serde_json::from_slice(&f.body).unwrap())
            .collect();
        assert_aborted(&mut child, point);
        // The answer goes out once the run is admitted; the step's start races it.
        match point {
            "admitted" => assert!(answered.is_empty(), "{point}: {answered:?}"),
            "step_started" => {}
            _ => assert!(!answered.is_empty(), "{point}: the answer came first"),
        }

        // The supervisor starts it again; the client binds again and retries.
        let mut d = Daemon::start(&dir.path().join("d2"));
        let mut child = module(&state, &d, &peer, &[]).spawn_quiet();
        d.accept(Answer::Accept).unwrap();
        assert_eq!(d.bind(1, 1, "/crash", "h", "s").0, FrameType::Response);
        let (_, again) = d.request(1, 1, "session.send", send.clone());
        let run_id = again["result"]["run_id"]
            .as_str()
            .unwrap_or_else(|| panic!("{point}: {again}"))
            .to_string();
        if let Some(a) = answered.first() {
            assert_eq!(
                a["result"]["run_id"], run_id,
                "{point}: the retried send_id answers the acknowledged run"
            );
        }
        let s = wait_ended(&mut d, 1, 1, &run_id);
        assert_eq!(s["state"], "completed", "{point}: {s}");
        drain(&mut d, &mut child);
        let records = support::dump_all(&state);
        let count = |kind: &str| records.iter().filter(|r| r["kind"] == kind).count();
        assert_eq!(count("run_started"), 1, "{point}: one run");
        assert_eq!(
            count("run_finished") + count("run_paused"),
            1,
            "{point}: one terminal record"
        );
        assert_eq!(
            count("model_step_finished"),
            1,
            "{point}: a durable model step is never redone"
        );
    }
}

/// A module with the tool module `ck-tools` (and `ck-missing`, which the daemon does not
/// know) in its tools config; answers the child and the module stand-in, being served.

/// A provider that takes connections and never answers: a run on it stays in its model step.
fn silent_provider() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().flatten() {
            held.push(conn);
        }
    });
    url
}

#[test]
fn a_drain_ends_by_its_deadline_with_goodbye_on_each_route_and_subscriptions_ended_last() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut d = Daemon::start(dir.path());
    // A grace period far longer than the drain's deadline: the deadline must win.
    let mut child = broca(&state)
        .env("ANTHROPIC_API_KEY", KEY)
        .env("BROCA_BASE_URL_ANTHROPIC", silent_provider())
        .args(["module", "--subc"])
        .arg(&d.file)
        .args(["--shards", "2", "--grace-secs", "60"])
        .spawn_quiet();
    d.accept(Answer::Accept).expect("broca's HELLO");
    d.bind(3, 1, "/proj/drain", "h", "s1");
    d.bind(5, 2, "/proj/drain", "h", "s2");
    let (_, sent) = d.request(
        3,
        1,
        "session.send",
        json!({"prompt": "hello", "model": "anthropic/m", "send_id": "d-1"}),
    );
    let run_id = result_of(&mut d, &sent)["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    let sub = d.send(
        FrameType::Request,
        3,
        1,
        &json!({"method": "session.subscribe", "params": {"from": "start"}}),
    );
    d.frames_for(3, sub, |f| {
        serde_json::from_slice::<Value>(&f.body).is_ok_and(|v| v["unit"]["type"] == "step_started")
    });

    let now_ms = unix_ms();
    let began = Instant::now();
    d.send(
        FrameType::Push,
        0,
        0,
        &json!({"op": "module.draining", "reason": "restart", "deadline_ms": now_ms + 2_000}),
    );
    let frames = d.until_closed();
    let status = wait_exit(&mut child, Duration::from_secs(30));
    let took = began.elapsed();
    assert_eq!(status.code(), Some(0), "{}", stderr_of(&mut child));
    // Within the deadline, not the 60 s grace (a second of slack for a loaded machine).
    assert!(took < Duration::from_secs(3), "the drain took {took:?}");
    // GOODBYE on each bound route, then on channel 0, last.
    let byes: Vec<(u16, u32)> = frames
        .iter()
        .filter(|f| f.header.ty == FrameType::Goodbye)
        .map(|f| (f.header.channel, f.header.epoch))
        .collect();
    // (The routes' frames take turns, so their GOODBYEs come in either order.)
    let mut routes_byes = byes[..byes.len().saturating_sub(1)].to_vec();
    routes_byes.sort_unstable();
    assert_eq!(
        (routes_byes, byes.last()),
        (vec![(3, 1), (5, 2)], Some(&(0, 0))),
        "{byes:?}"
    );
    // The subscription ended with its STREAM_END, marked LAST.
    let end = frames
        .iter()
        .find(|f| f.header.ty == FrameType::StreamEnd && f.header.corr == sub)
        .unwrap_or_else(|| {
            let seen: Vec<_> = frames
                .iter()
                .map(|f| (f.header.ty, f.header.channel, f.header.corr))
                .collect();
            panic!("no STREAM_END for the subscription {sub}: {seen:?}")
        });
    assert!(end.header.flags.is_last(), "{:?}", end.header.flags);
    // The run that could not finish in time is sealed interrupted by the shutdown.
    let started = run_started(&state, &run_id);
    assert_eq!(started["send_id"], "d-1");
    let finished = support::dump_all(&state)
        .into_iter()
        .find(|r| r["kind"] == "run_finished" && r["record"]["run_id"] == run_id.as_str())
        .expect("the run is sealed");
    assert_eq!(finished["record"]["reason"], "interrupted", "{finished}");
    assert_eq!(finished["record"]["cause"], "runner_shutdown", "{finished}");
}

#[test]
fn a_route_whose_frames_are_not_taken_is_closed_and_the_others_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let peer = Aimock::start(&fixture("aimock.json"));
    let mut d = Daemon::start(dir.path());
    // A daemon slow to take what broca writes, and a route bound of 64 KiB.
    d.small_receive_buffer(4096);
    let mut child = module(
        &state,
        &d,
        &peer,
        &[("BROCA_TEST_ROUTE_EGRESS_BYTES", "65536")],
    )
    .spawn_quiet();
    d.accept(Answer::Accept).unwrap();
    assert_eq!(d.bind(1, 1, "/egress", "h", "big").0, FrameType::Response);
    assert_eq!(d.bind(2, 1, "/egress", "h", "small").0, FrameType::Response);
    let (_, status) = run_on(&mut d, 1, "hello", "e1");
    assert_eq!(status["state"], "completed", "{status}");
    // The daemon stops reading while it asks route 1 for far more than the route may hold,
    // then route 2 and channel 0 for a little each: broca reads on (its reader never waits
    // on the socket), and the answers wait in broca, per route.
    let asks = 400;
    for _ in 0..asks {
        d.send(
            FrameType::Request,
            1,
            1,
            &json!({"method": "session.read", "params": {}}),
        );
    }
    let small = d.send(
        FrameType::Request,
        2,
        1,
        &json!({"method": "run.status", "params": {}}),
    );
    let health = d.send(FrameType::Request, 0, 0, &json!({"op": "health.check"}));
    // Reading again: route 2's answer and channel 0's come; route 1 was closed by the
    // policy (a GOODBYE) with most of its answers dropped, not sent ahead of the others.
    let small_answer = d.answer(2, small);
    assert!(matches!(
        small_answer.header.ty,
        FrameType::Response | FrameType::Error
    ));
    let health_answer = d.answer(0, health);
    let h: Value = serde_json::from_slice(&health_answer.body).unwrap();
    assert_eq!(h["metrics"]["egress_routes_closed"], 1, "{h}");
    let seen = std::mem::take(&mut d.seen);
    let goodbye = seen
        .iter()
        .any(|f| f.header.ty == FrameType::Goodbye && f.header.channel == 1);
    let big_answers = seen
        .iter()
        .filter(|f| f.header.channel == 1 && f.header.ty == FrameType::Response)
        .count();
    assert!(goodbye, "route 1 closed with a GOODBYE");
    assert!(
        big_answers < asks,
        "{big_answers} of {asks} answered on the closed route"
    );
    // The connection goes on: route 2 answers, and route 1 bound again answers too.
    let (ty, _) = d.request(2, 1, "run.status", json!({}));
    assert!(matches!(ty, FrameType::Response | FrameType::Error));
    assert_eq!(d.bind(1, 2, "/egress", "h", "big").0, FrameType::Response);
    let (ty, read) = d.request(1, 2, "session.read", json!({}));
    assert_eq!(ty, FrameType::Response, "{read}");
    drain(&mut d, &mut child);
    let err = stderr_of(&mut child);
    assert!(err.contains("shed-then-close"), "{err}");
}
