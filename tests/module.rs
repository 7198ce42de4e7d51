//! Module mode: the real `broca module` (and `ck-broca`) binary registered with a stand-in
//! daemon (tests/support/daemon.rs: a real connection file, the daemon's side of the
//! handshake and the frames by subc-transport's own code), with aimock as the provider.

#[path = "support/daemon.rs"]
mod daemon;
mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use daemon::{Answer, CatalogModule, Daemon, Services, ToolModule};
use serde_json::{json, Value};
use subc_protocol::FrameType;
use support::{broca, fixture, Aimock};

const KEY: &str = "sk-module-test-0123456789";

fn module(state: &Path, d: &Daemon, peer: &Aimock, extra: &[(&str, &str)]) -> Command {
    let mut c = broca(state);
    c.env("ANTHROPIC_API_KEY", KEY)
        .env("BROCA_BASE_URL_ANTHROPIC", peer.url())
        .envs(extra.iter().copied())
        .args(["module", "--subc"])
        .arg(&d.file)
        .args(["--shards", "2", "--grace-secs", "2"]);
    c
}

/// Spawns with stdout dropped and stderr kept for the assertions.
trait SpawnQuiet {
    fn spawn_quiet(&mut self) -> Child;
}

impl SpawnQuiet for Command {
    fn spawn_quiet(&mut self) -> Child {
        self.stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let until = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < until,
            "broca did not exit within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stderr_of(child: &mut Child) -> String {
    let mut s = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut s);
    }
    s
}

/// Polls run.status on route (channel, epoch) until the run is no longer active; answers the
/// status.
fn wait_ended(d: &mut Daemon, channel: u16, epoch: u32, run_id: &str) -> Value {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, s) = d.request(channel, epoch, "run.status", json!({"run_id": run_id}));
        if s["result"]["state"] != "active" {
            return s["result"].clone();
        }
        assert!(Instant::now() < until, "the run did not end: {s}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Drains broca as the daemon does (by a deadline 10 s ahead); it says GOODBYE, closes, and
/// exits 0.
fn drain(d: &mut Daemon, child: &mut Child) {
    let deadline_ms = unix_ms() + 10_000;
    d.send(
        FrameType::Push,
        0,
        0,
        &json!({"op": "module.draining", "reason": "restart", "deadline_ms": deadline_ms}),
    );
    let frames = d.until_closed();
    assert!(
        frames
            .iter()
            .any(|f| f.header.ty == FrameType::Goodbye && f.header.channel == 0),
        "a GOODBYE before the close"
    );
    assert_eq!(
        wait_exit(child, Duration::from_secs(15)).code(),
        Some(0),
        "{}",
        stderr_of(child)
    );
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// broca aborted at its crash point (BROCA_CRASH_AT) within 20 s.
fn assert_aborted(child: &mut Child, point: &str) {
    use std::os::unix::process::ExitStatusExt;
    let status = wait_exit(child, Duration::from_secs(20));
    assert_eq!(
        status.signal(),
        Some(libc::SIGABRT),
        "{point}: {}",
        stderr_of(child)
    );
}

/// The `key` member of each object in the array `list`.
fn each<'a>(list: &'a Value, key: &str) -> Vec<&'a str> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|o| o[key].as_str().unwrap())
        .collect()
}

/// The RunStarted record of `run_id` in the WALs under `state`.
fn run_started(state: &Path, run_id: &str) -> Value {
    support::dump_all(state)
        .into_iter()
        .find(|r| r["kind"] == "run_started" && r["record"]["run_id"] == run_id)
        .unwrap_or_else(|| panic!("no run_started for {run_id}"))["record"]
        .clone()
}

fn result_of(d: &mut Daemon, body: &Value) -> Value {
    body.get("result")
        .cloned()
        .unwrap_or_else(|| panic!("not a result: {body} ({:?})", d.seen.len()))
}

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
fn vault_credentials_resolve_through_claustrum_under_the_modules_identity() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let peer = Aimock::start(&fixture("aimock.json"));
    let mut d = Daemon::start(dir.path());
    let secret = "sk-ant-from-the-vault-0123456789abcdef";
    // The nonce as the daemon hands it: a pipe at descriptor 3, named by SUBC_LAUNCH_NONCE_FD
    // (subc-os's own handoff); the environment copy must lose to it.
    let handoff = subc_os::launch_nonce::LaunchNonceHandoff::new("nonce-v").unwrap();
    let mut cmd = module(
        &state,
        &d,
        &peer,
        &[
            ("SUBC_LAUNCH_NONCE", "not-this-one"),
            ("ANTHROPIC_API_KEY", ""),
        ],
    );
    cmd.env(
        subc_os::launch_nonce::LAUNCH_NONCE_FD_ENV,
        handoff.fd_env_value(),
    );
    handoff.install_last(&mut cmd);
    let mut child = cmd.spawn_quiet();
    d.accept(Answer::Accept).unwrap();
    let handle = "ckh_dev_handle_0123456789";
    let handle_secret = "sk-ant-behind-a-handle-0123456789";
    let vault = d.serve_vault(vec![
        ("anthropic-team".into(), secret.into()),
        (handle.into(), handle_secret.into()),
    ]);
    assert_eq!(d.bind(1, 1, "/vault", "h", "s").0, FrameType::Response);
    let (_, status) = run_with(
        &mut d,
        1,
        json!({"prompt": "hello", "model": "anthropic/m", "credential_id": "vault:anthropic-team"}),
    );
    assert_eq!(
        status["state"], "completed",
        "the run used the vault's key: {status}"
    );
    // One route to the vault, opened with broca's module id and launch nonce.
    let opens = vault.opens.lock().unwrap().clone();
    assert_eq!(opens.len(), 1, "{opens:?}");
    assert_eq!(
        opens[0]["target"],
        json!({"kind": "management_surface", "module_id": "claustrum"})
    );
    assert_eq!(
        opens[0]["consumer_identity"],
        json!({"module_id": "ck-broca", "launch_nonce": "nonce-v"})
    );
    let asked = vault.calls.load(std::sync::atomic::Ordering::SeqCst);
    assert!(asked >= 1, "the vault was asked");
    // A second send reuses the secret kept in memory.
    let (_, status) = run_with(
        &mut d,
        1,
        json!({"prompt": "hello", "model": "anthropic/m", "credential_id": "vault:anthropic-team", "send_id": "second"}),
    );
    assert_eq!(status["state"], "completed");
    // The provider refuses the vault's key (aimock answers `err-401` with a 401): the run
    // pauses auth_required and the vault hears of it, with the record version it gave.
    let (_, status) = run_with(
        &mut d,
        1,
        json!({"prompt": "err-401", "model": "anthropic/m", "credential_id": "vault:anthropic-team", "send_id": "third"}),
    );
    assert_eq!(status["state"], "paused", "{status}");
    // The report goes off the shard's thread: it may land just after the run paused.
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while vault.reports.lock().unwrap().is_empty() && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let reports = vault.reports.lock().unwrap().clone();
    assert_eq!(
        reports,
        [json!({"credential_id": "anthropic-team", "provider_status": 401, "record_version": 3})],
        "the vault is told of the refused key"
    );
    // A credential the vault does not hold is refused before anything is written.
    let (ty, e) = d.request(
        1,
        1,
        "session.send",
        json!({"prompt": "x", "model": "anthropic/m", "credential_id": "vault:nope"}),
    );
    assert_eq!(ty, FrameType::Error, "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("not_found")
            || e["message"].as_str().unwrap().contains("nope"),
        "{e}"
    );
    assert_eq!(
        e["detail"]["class"], "auth_required",
        "a verdict on the credential: {e}"
    );
    // A developer's bearer handle, kept in the owner-only credentials file: the vault is asked
    // with the handle (possession authorizes); the run freezes the id, never the handle.
    broca::owner_only::write_file(
        &state.join("credentials.json"),
        json!({"dev": {"vault_handle": handle}})
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    let (_, status) = run_with(
        &mut d,
        1,
        json!({"prompt": "hello", "model": "anthropic/m", "credential_id": "vault:dev", "send_id": "fourth"}),
    );
    assert_eq!(status["state"], "completed");
    assert_eq!(vault.handles.lock().unwrap().clone(), [handle.to_string()]);
    // The vault out (its route relayed away, no new route to it): an outage, not a verdict:
    // the send is refused for now, transiently, and nothing is written.
    vault.down.store(true, std::sync::atomic::Ordering::SeqCst);
    let (ty, e) = d.request(
        1,
        1,
        "session.send",
        json!({"prompt": "x", "model": "anthropic/m", "credential_id": "vault:other"}),
    );
    assert_eq!(ty, FrameType::Error, "{e}");
    assert_eq!(e["code"], "credential_unavailable", "{e}");
    assert_eq!(e["detail"]["class"], "transient", "{e}");
    vault.down.store(false, std::sync::atomic::Ordering::SeqCst);
    drain(&mut d, &mut child);
    // The secret is nowhere broca writes: not in the WAL, the store, or its logs.
    let err = stderr_of(&mut child);
    assert!(
        !err.contains(secret) && !err.contains(handle_secret) && !err.contains(handle),
        "{err}"
    );
    support::assert_no_file_holds(&state, secret);
    support::assert_no_file_holds(&state, handle_secret);
    support::assert_no_file_holds(&state.join("wal"), handle);
    support::assert_no_file_holds(&state.join("store"), handle);
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
fn with_tools(
    dir: &Path,
    d: &mut Daemon,
    peer: &Aimock,
    extra: &[(&str, &str)],
) -> (Child, ToolModule) {
    let tools = ToolModule::new("ck-tools");
    (with_these_tools(dir, d, peer, extra, &tools), tools)
}

fn with_these_tools(
    dir: &Path,
    d: &mut Daemon,
    peer: &Aimock,
    extra: &[(&str, &str)],
    tools: &ToolModule,
) -> Child {
    let cfg = dir.join("tools.json");
    std::fs::write(
        &cfg,
        json!({"modules": [{"module": "ck-tools", "call_timeout_ms": 1500}, {"module": "ck-missing"}]})
            .to_string(),
    )
    .unwrap();
    let child = module(&dir.join("state"), d, peer, extra)
        .arg("--tools-config")
        .arg(&cfg)
        .spawn_quiet();
    d.accept(Answer::Accept).unwrap();
    d.serve(Services {
        vault: None,
        tools: Some(tools.clone()),
        catalog: None,
        bus: None,
    });
    child
}

/// Sends `prompt` on route `channel` (epoch 1) and waits for the run's end.
fn run_on(d: &mut Daemon, channel: u16, prompt: &str, send_id: &str) -> (String, Value) {
    run_with(
        d,
        channel,
        json!({"prompt": prompt, "model": "anthropic/m", "send_id": send_id}),
    )
}

/// Sends `send` on route `channel` (epoch 1); answers its run and the run's status at its end.
fn run_with(d: &mut Daemon, channel: u16, send: Value) -> (String, Value) {
    let (ty, sent) = d.request(channel, 1, "session.send", send.clone());
    assert_eq!(ty, FrameType::Response, "{send}: {sent}");
    let run_id = sent["result"]["run_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{sent}"))
        .to_string();
    let status = wait_ended(d, channel, 1, &run_id);
    (run_id, status)
}

fn run_on_route(d: &mut Daemon, prompt: &str, send_id: &str) -> (String, Value) {
    run_on(d, 1, prompt, send_id)
}

#[test]
fn tools_of_a_tool_module_go_over_the_sessions_own_route_and_run_at_most_once() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let peer = Aimock::start(&fixture("tools.json"));
    let mut d = Daemon::start(&dir.path().join("d"));
    let (mut child, tools) = with_tools(
        dir.path(),
        &mut d,
        &peer,
        &[("SUBC_LAUNCH_NONCE", "nonce-t")],
    );
    assert_eq!(d.bind(1, 1, "/t", "h", "s").0, FrameType::Response);

    // Two calls in one step, each delivered once with its own key and the frozen pin.
    let (run_id, status) = run_on_route(&mut d, "record two", "a");
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(
        (tools.times("call_rec_1"), tools.times("call_rec_2")),
        (1, 1)
    );
    let calls = tools.log.calls.lock().unwrap().clone();
    let keys: std::collections::HashSet<&str> = calls
        .iter()
        .map(|(c, _)| c["call_key"].as_str().unwrap())
        .collect();
    assert_eq!(keys.len(), 2, "a call key per call: {calls:?}");
    assert!(calls
        .iter()
        .all(|(c, _)| c["schema_pin"].as_str().unwrap().starts_with("tp1:record:")));
    // The catalog route is broca's own; the calls' route is the session's, opened with broca's
    // consumer identity.
    let opens = tools.log.opens.lock().unwrap().clone();
    assert_eq!(opens[0]["identity"]["session"], "tool-catalog", "{opens:?}");
    let session_open = opens
        .iter()
        .find(|o| o["identity"] == json!({"harness": "h", "session": "s"}))
        .unwrap_or_else(|| panic!("a route for the session: {opens:?}"));
    assert_eq!(
        session_open["target"],
        json!({"kind": "tool_provider", "module_id": "ck-tools"})
    );
    assert_eq!(
        session_open["consumer_identity"],
        json!({"module_id": "ck-broca", "launch_nonce": "nonce-t"})
    );
    let started = run_started(&state, &run_id);
    let frozen = each(&started["config"]["tools"], "route");
    assert!(
        frozen.iter().all(|r| r.starts_with("subc:ck-tools@tp1:")),
        "every tool frozen with its module and pin (ck-missing offers none): {frozen:?}"
    );
    let results: Vec<Value> = support::dump_all(&state)
        .into_iter()
        .filter(|r| r["kind"] == "tool_result")
        .collect();
    assert!(
        results.iter().any(|r| r.to_string().contains("recorded")),
        "the module's answer is the result: {results:?}"
    );

    // A session that differs only in its project root gets a route of its own.
    assert_eq!(d.bind(5, 1, "/u", "h", "s").0, FrameType::Response);
    let opened_before = tools.log.opens.lock().unwrap().len();
    let (_, status) = run_on(&mut d, 5, "record two", "u1");
    assert_eq!(status["state"], "completed", "{status}");
    let opens = tools.log.opens.lock().unwrap().clone();
    assert!(
        opens.len() > opened_before,
        "a route opened for the other project's session: {opens:?}"
    );
    let first_channels: Vec<u16> = calls.iter().map(|(_, c)| *c).collect();
    let now = tools.log.calls.lock().unwrap().clone();
    assert!(
        now[calls.len()..]
            .iter()
            .all(|(_, c)| !first_channels.contains(c)),
        "two sessions that differ only in their project root shared a tool route: {now:?}"
    );

    // The daemon says the route went stale before delivery: reopened, sent once more, run once.
    tools
        .stale_next
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let opened_before = tools.log.opens.lock().unwrap().len();
    let (_, status) = run_on_route(&mut d, "echo please", "b");
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(tools.times("call_echo_1"), 1);
    assert_eq!(
        tools.log.opens.lock().unwrap().len(),
        opened_before + 1,
        "one reopen"
    );

    // Refusals the daemon marks retryable are retried; the call still runs once.
    tools
        .stale_next
        .store(true, std::sync::atomic::Ordering::SeqCst);
    tools
        .refuse_opens
        .lock()
        .unwrap()
        .extend(["module_warming".to_string(), "module_reloading".to_string()]);
    let (_, status) = run_on_route(&mut d, "record again", "c");
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(tools.times("call_rec_9"), 1);

    // A call the module never answers: cancelled at its call timeout, indeterminate, the run
    // ends interrupted naming it; it is never sent again.
    // (Each on a session of its own: the next send there answers the model for the lost call.)
    assert_eq!(d.bind(2, 1, "/t", "h", "s2").0, FrameType::Response);
    assert_eq!(d.bind(3, 1, "/t", "h", "s3").0, FrameType::Response);
    let (_, status) = run_on(&mut d, 2, "hang call", "d");
    assert_eq!(
        status["state"], "interrupted",
        "a delivered call that went unanswered was sent again or taken as done: {status}"
    );
    assert!(status.to_string().contains("call_hang_1"), "{status}");
    assert_eq!(tools.times("call_hang_1"), 1);
    assert_eq!(
        tools.log.cancels.lock().unwrap().len(),
        1,
        "the call is cancelled"
    );

    // The module dies with a call delivered: indeterminate too; the next send reconnects.
    let (_, status) = run_on(&mut d, 3, "die call", "e");
    assert_eq!(status["state"], "interrupted", "{status}");
    assert!(status.to_string().contains("call_die_1"), "{status}");
    let (_, status) = run_on_route(&mut d, "echo please", "f");
    assert_eq!(status["state"], "completed", "after a reconnect: {status}");
    assert_eq!(
        tools.times("call_die_1"),
        1,
        "a call delivered before the module died was sent again"
    );
    assert_eq!(tools.times("call_hang_1"), 1, "never sent again");

    // A route refused for good: the call is refused before delivery and the model is told.
    assert_eq!(d.bind(4, 1, "/t", "h", "s4").0, FrameType::Response);
    tools
        .refuse_opens
        .lock()
        .unwrap()
        .push("capability_forbidden".into());
    let calls_before = tools.log.calls.lock().unwrap().len();
    let (run_id, status) = run_on(&mut d, 4, "record again", "g");
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(
        tools.log.calls.lock().unwrap().len(),
        calls_before,
        "nothing delivered"
    );
    let refused = support::dump_all(&state)
        .into_iter()
        .find(|r| r["kind"] == "tool_result" && r["record"]["run_id"] == run_id.as_str())
        .unwrap();
    assert!(
        refused.to_string().contains("capability_forbidden"),
        "the model is told why: {refused}"
    );

    drain(&mut d, &mut child);
    let err = stderr_of(&mut child);
    assert!(err.contains("tool module `ck-missing`"), "{err}");
    assert!(!err.contains("nonce-t"), "the launch nonce is never logged");
}

#[test]
fn killed_around_a_tool_modules_call_a_restart_never_sends_it_twice() {
    let peer = Aimock::start(&fixture("tools.json"));
    // intent: killed once the intent is durable, before the call goes; tool_result: killed
    // once the module's answer is durable.
    for (point, delivered) in [("intent", 0), ("tool_result", 1)] {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let tools = ToolModule::new("ck-tools");
        let mut d = Daemon::start(&dir.path().join("d1"));
        let crash = format!("{point}:1");
        let mut child = with_these_tools(
            dir.path(),
            &mut d,
            &peer,
            &[("BROCA_CRASH_AT", &crash)],
            &tools,
        );
        assert_eq!(d.bind(1, 1, "/k", "h", "s").0, FrameType::Response);
        let send = json!({"prompt": "echo please", "model": "anthropic/m", "send_id": "k1"});
        d.send(
            FrameType::Request,
            1,
            1,
            &json!({"method": "session.send", "params": send}),
        );
        d.until_closed();
        assert_aborted(&mut child, point);
        assert_eq!(
            tools.times("call_echo_1"),
            delivered,
            "{point}: before the restart"
        );

        // The supervisor starts it again under a new daemon connection.
        let mut d = Daemon::start(&dir.path().join("d2"));
        let mut child = with_these_tools(dir.path(), &mut d, &peer, &[], &tools);
        assert_eq!(d.bind(1, 1, "/k", "h", "s").0, FrameType::Response);
        let (_, again) = d.request(1, 1, "session.send", send.clone());
        let run_id = again["result"]["run_id"]
            .as_str()
            .unwrap_or_else(|| panic!("{again}"))
            .to_string();
        let s = wait_ended(&mut d, 1, 1, &run_id);
        if delivered == 0 {
            // Its intent is durable and its outcome unknown: never sent, the run interrupted.
            assert_eq!(s["state"], "interrupted", "{point}: {s}");
            assert!(s.to_string().contains("call_echo_1"), "{point}: {s}");
        } else {
            assert_eq!(
                s["state"], "completed",
                "{point}: the run goes on from the result: {s}"
            );
        }
        drain(&mut d, &mut child);
        assert_eq!(
            tools.times("call_echo_1"),
            delivered,
            "{point}: at most once across the restart"
        );
        let records = support::dump_all(&state);
        let count = |kind: &str| records.iter().filter(|r| r["kind"] == kind).count();
        assert_eq!(count("run_started"), 1, "{point}");
        assert_eq!(count("tool_dispatch_intent"), 1, "{point}");
        assert_eq!(count("run_finished") + count("run_paused"), 1, "{point}");
    }
}

#[test]
fn the_catalog_comes_from_fusiform_and_its_last_good_answer_outlives_an_outage() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let peer = Aimock::start(&fixture("aimock.json"));
    let catalog = CatalogModule::default();
    *catalog.answer.lock().unwrap() = Some(json!({
        "source": "models.dev", "resolved_at_ms": 1_786_488_349_024i64, "catalog_version": 7,
        "models": {"anthropic/claude-sonnet-4-5": {
            "limit.context": 123456, "limit.output": null,
            "rate.input": {"state": "priced", "units": 2_500_000_000i64, "exponent": 9, "currency": "USD"},
            "rate.output": {"state": "priced", "units": 12, "exponent": 0, "currency": "USD"}
        }}
    }));
    let frozen_entry = |send_id: &str, d: &mut Daemon| {
        let send =
            json!({"prompt": "hello", "model": "anthropic/claude-sonnet-4-5", "send_id": send_id});
        let (ty, sent) = d.request(1, 1, "session.send", send);
        assert_eq!(ty, FrameType::Response, "{sent}");
        let run_id = sent["result"]["run_id"].as_str().unwrap().to_string();
        assert_eq!(wait_ended(d, 1, 1, &run_id)["state"], "completed");
        run_started(&state, &run_id).to_string()
    };
    // The catalog is asked again every second while broca serves.
    let config = dir.path().join("serve.json");
    std::fs::write(&config, r#"{"catalog_refresh_secs": 1}"#).unwrap();
    for round in ["up", "down"] {
        let mut d = Daemon::start(&dir.path().join(round));
        let mut child = module(&state, &d, &peer, &[("BROCA_CATALOG_MODULE", "fusiform")])
            .args(["--config", config.to_str().unwrap()])
            .spawn_quiet();
        d.accept(Answer::Accept).unwrap();
        d.serve(Services {
            vault: None,
            tools: None,
            catalog: Some(catalog.clone()),
            bus: None,
        });
        assert_eq!(d.bind(1, 1, "/cat", "h", "s").0, FrameType::Response);
        let entry = frozen_entry(round, &mut d);
        // fusiform's facts, frozen with the run; its null output limit stays unknown (the
        // built-in catalog's 64000 is not put in its place).
        assert!(
            entry.contains("\"context_window\":123456"),
            "{round}: {entry}"
        );
        assert!(
            entry.contains("\"input\":2.5") && entry.contains("\"output\":12.0"),
            "{round}: {entry}"
        );
        assert!(!entry.contains("\"max_output\""), "{round}: {entry}");
        if round == "up" {
            // Only the facts broca reads are asked for.
            let asked = catalog.arguments.lock().unwrap().clone();
            assert!(
                asked.iter().all(|a| a["fact_prefixes"]
                    .as_array()
                    .is_some_and(|p| p.contains(&json!("rate.")) && p.contains(&json!("limit.")))),
                "{asked:?}"
            );
            // A new catalog_version while serving: the next admission resolves in it.
            let mut next = catalog.answer.lock().unwrap().clone().unwrap();
            next["catalog_version"] = json!(8);
            next["models"]["anthropic/claude-sonnet-4-5"]["limit.context"] = json!(222_222);
            *catalog.answer.lock().unwrap() = Some(next);
            let mut n = 0;
            let mut until_frozen = |context: &str, d: &mut Daemon| {
                let until = Instant::now() + Duration::from_secs(20);
                loop {
                    n += 1;
                    let entry = frozen_entry(&format!("refreshed-{n}"), d);
                    if entry.contains(&format!("\"context_window\":{context}")) {
                        return;
                    }
                    assert!(
                        Instant::now() < until,
                        "the new catalog was never taken: {entry}"
                    );
                    std::thread::sleep(Duration::from_millis(200));
                }
            };
            until_frozen("222222", &mut d);
            // Back as it was, as version 9: the last good copy the next round starts from.
            if let Some(a) = catalog.answer.lock().unwrap().as_mut() {
                a["catalog_version"] = json!(9);
                a["models"]["anthropic/claude-sonnet-4-5"]["limit.context"] = json!(123_456);
            }
            until_frozen("123456", &mut d);
        }
        drain(&mut d, &mut child);
        let err = stderr_of(&mut child);
        if round == "down" {
            assert!(
                err.contains("unavailable") && err.contains("last good"),
                "{err}"
            );
        }
        // Down from here on: the next start uses the last good answer.
        *catalog.answer.lock().unwrap() = None;
    }
    assert!(catalog.asked.load(std::sync::atomic::Ordering::SeqCst) >= 2);
}

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
    assert_eq!(byes, [(3, 1), (5, 2), (0, 0)], "{byes:?}");
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
fn a_vault_read_never_holds_up_the_shard_it_was_asked_on() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let peer = Aimock::start(&fixture("aimock.json"));
    let mut d = Daemon::start(dir.path());
    // One shard: the daemon's connection, both sessions and the vault's caller share it.
    let mut child = broca(&state)
        .env("ANTHROPIC_API_KEY", KEY)
        .env("BROCA_BASE_URL_ANTHROPIC", peer.url())
        .args(["module", "--subc"])
        .arg(&d.file)
        .args(["--shards", "1", "--grace-secs", "2"])
        .spawn_quiet();
    d.accept(Answer::Accept).unwrap();
    let vault = d.serve_vault(vec![(
        "team-key".into(),
        "sk-ant-from-the-vault-0123456789abcdef".into(),
    )]);
    d.bind(1, 1, "/vault-slow", "h", "a");
    d.bind(2, 1, "/vault-slow", "h", "b");
    // The vault takes its time with session a's credential...
    vault.hold.store(true, std::sync::atomic::Ordering::SeqCst);
    let held = d.send(
        FrameType::Request,
        1,
        1,
        &json!({"method": "session.send", "params": {"prompt": "hello", "model": "anthropic/m",
            "credential_id": "vault:team-key", "send_id": "a-1"}}),
    );
    let until = Instant::now() + Duration::from_secs(10);
    while vault.calls.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(Instant::now() < until, "the vault was never asked");
        std::thread::sleep(Duration::from_millis(10));
    }
    // ...while session b's whole run goes through on the same shard.
    let (_, sent) = d.request(
        2,
        1,
        "session.send",
        json!({"prompt": "hello", "model": "anthropic/m", "send_id": "b-1"}),
    );
    let b_run = result_of(&mut d, &sent)["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(wait_ended(&mut d, 2, 1, &b_run)["state"], "completed");
    if let Some(early) = d
        .seen
        .iter()
        .find(|f| f.header.channel == 1 && f.header.corr == held)
    {
        panic!(
            "session a's send was answered before its credential came from the vault: {}",
            String::from_utf8_lossy(&early.body)
        );
    }
    // Once the vault answers, session a's send is admitted and its run completes.
    vault.hold.store(false, std::sync::atomic::Ordering::SeqCst);
    let answer = d.answer(1, held);
    let answer: Value = serde_json::from_slice(&answer.body).unwrap();
    let a_run = result_of(&mut d, &answer)["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(wait_ended(&mut d, 1, 1, &a_run)["state"], "completed");
    drain(&mut d, &mut child);
}

#[test]
fn a_tool_module_up_after_broca_started_is_offered_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let peer = Aimock::start(&fixture("tools.json"));
    let mut d = Daemon::start(&dir.path().join("d"));
    // The module is not up at start: its catalog's route is refused for good, once.
    let tools = ToolModule::new("ck-tools");
    tools
        .refuse_opens
        .lock()
        .unwrap()
        .push("capability_forbidden".into());
    let cfg = dir.path().join("tools.json");
    std::fs::write(
        &cfg,
        json!({"modules": [{"module": "ck-tools", "call_timeout_ms": 1500}],
               "module_retry_ms": 1500})
        .to_string(),
    )
    .unwrap();
    let mut child = module(&state, &d, &peer, &[("BROCA_LOG", "info")])
        .arg("--tools-config")
        .arg(&cfg)
        .spawn_quiet();
    d.accept(Answer::Accept).unwrap();
    d.serve(Services {
        vault: None,
        tools: Some(tools.clone()),
        catalog: None,
        bus: None,
    });
    assert_eq!(d.bind(1, 1, "/t", "h", "s").0, FrameType::Response);
    let catalog_opens = || {
        tools
            .log
            .opens
            .lock()
            .unwrap()
            .iter()
            .filter(|o| o["identity"]["session"] == "tool-catalog")
            .count()
    };

    let offered = |run_id: &str| -> Vec<String> {
        run_started(&state, run_id)["config"]["tools"]
            .as_array()
            .map(|tools| {
                tools
                    .iter()
                    .filter_map(|t| t["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };

    // Before it answers, a run is offered none of its tools.
    let (early, _) = run_on_route(&mut d, "record two", "a");
    if catalog_opens() < 2 {
        let early = offered(&early);
        assert!(!early.iter().any(|t| t == "record"), "{early:?}");
    }

    // It is asked again while broca serves; from its answer on, its tools are offered.
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while catalog_opens() < 2 {
        assert!(
            std::time::Instant::now() < until,
            "the module was never asked again"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut run = String::new();
    for attempt in 0..40 {
        let (run_id, status) = run_on_route(&mut d, "record two", &format!("b{attempt}"));
        assert_eq!(status["state"], "completed", "{status}");
        if offered(&run_id).iter().any(|t| t == "record") {
            run = run_id;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!run.is_empty(), "the module's tools were never offered");
    assert_eq!(
        (tools.times("call_rec_1"), tools.times("call_rec_2")),
        (1, 1),
        "its tools run over its route"
    );
    drain(&mut d, &mut child);
    let err = stderr_of(&mut child);
    assert!(
        err.contains("tool module up after broca started"),
        "the pickup is logged: {err}"
    );
}

#[test]
fn a_tool_declaring_a_reply_deadline_is_waited_for_past_the_modules_call_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let peer = Aimock::start(&fixture("tools.json"));
    let mut d = Daemon::start(&dir.path().join("d"));
    // The module's call timeout is 1.5 s; `wait` declares its hold (2.5 s here) plus 1 s.
    let (mut child, tools) = with_tools(dir.path(), &mut d, &peer, &[]);
    assert_eq!(d.bind(1, 1, "/t", "h", "s").0, FrameType::Response);

    let (run_id, status) = run_on_route(&mut d, "wait call", "w");
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(tools.times("call_wait_1"), 1);
    assert!(
        tools.log.cancels.lock().unwrap().is_empty(),
        "the call was given up at the module's call timeout"
    );
    // The deadline is the one frozen with the tool.
    let frozen = run_started(&state, &run_id)["config"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "wait")
        .cloned()
        .unwrap();
    assert_eq!(frozen["reply"]["max_ms"], 10_000, "{frozen}");
    let result = support::dump_all(&state)
        .into_iter()
        .find(|r| r["kind"] == "tool_result" && r["record"]["run_id"] == run_id.as_str())
        .unwrap();
    assert!(
        result.to_string().contains("waited_ms") && result["record"]["result"]["is_error"] != true,
        "{result}"
    );
    drain(&mut d, &mut child);
}

#[test]
fn a_call_kept_alive_outlasts_the_call_timeout_and_a_silent_one_is_given_up() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let peer = Aimock::start(&fixture("tools.json"));
    let mut d = Daemon::start(&dir.path().join("d"));
    // The module provides call-keepalive/v1; its call timeout is 1.5 s, and (a debug build's
    // knob for tests) a call may go 1 s without a keepalive.
    let tools = ToolModule::new("ck-tools");
    tools
        .keepalive
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let mut child = with_these_tools(
        dir.path(),
        &mut d,
        &peer,
        &[("BROCA_TEST_KEEPALIVE_SILENCE_MS", "1000")],
        &tools,
    );
    assert_eq!(d.bind(1, 1, "/t", "h", "s").0, FrameType::Response);
    assert_eq!(d.bind(2, 1, "/t", "h", "s2").0, FrameType::Response);

    // 3 s of work with a keepalive every 200 ms: twice the call timeout, and it completes.
    let (_, status) = run_on_route(&mut d, "long call", "a");
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(tools.times("call_long_1"), 1);
    assert!(tools.log.cancels.lock().unwrap().is_empty());
    let opens = tools.log.opens.lock().unwrap().clone();
    assert!(
        opens.iter().all(|o| o["consumer_capabilities"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c == "call-keepalive/v1"))),
        "every route declares call-keepalive/v1: {opens:?}"
    );

    // The same work gone silent: given up once no keepalive came for 1 s, cancelled, never
    // sent again.
    tools
        .keepalive
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let (_, status) = run_on(&mut d, 2, "long call", "b");
    assert_eq!(status["state"], "interrupted", "{status}");
    assert!(status.to_string().contains("call_long_1"), "{status}");
    assert_eq!(
        tools.times("call_long_1"),
        2,
        "one call per session, each sent once"
    );
    // (The stand-in reads the CANCEL once its 3 s of work are over.)
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while tools.log.cancels.lock().unwrap().is_empty() && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        tools.log.cancels.lock().unwrap().len(),
        1,
        "the silent call is cancelled"
    );
    drain(&mut d, &mut child);
    let err = stderr_of(&mut child);
    assert!(err.contains("no keepalive for"), "{err}");
}
