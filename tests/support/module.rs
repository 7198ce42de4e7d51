//! What the module-mode tests share (tests/module.rs, tests/module_tools.rs): `broca module`
//! started against the daemon stand-in, its stderr and exit, a run driven over a route, the
//! tool module's config, and reads of the WAL.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use subc_protocol::FrameType;

use super::daemon::{Answer, Daemon, Services, ToolModule};
use super::support::{broca, Aimock};

pub(crate) const KEY: &str = "sk-module-test-0123456789";

pub(crate) fn module(state: &Path, d: &Daemon, peer: &Aimock, extra: &[(&str, &str)]) -> Command {
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
pub(crate) trait SpawnQuiet {
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

pub(crate) fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
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

pub(crate) fn stderr_of(child: &mut Child) -> String {
    let mut s = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut s);
    }
    s
}

/// Polls run.status on route (channel, epoch) until the run is no longer active; answers the
/// status.
pub(crate) fn wait_ended(d: &mut Daemon, channel: u16, epoch: u32, run_id: &str) -> Value {
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
pub(crate) fn drain(d: &mut Daemon, child: &mut Child) {
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

pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// broca aborted at its crash point (BROCA_CRASH_AT) within 20 s.
pub(crate) fn assert_aborted(child: &mut Child, point: &str) {
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
pub(crate) fn each<'a>(list: &'a Value, key: &str) -> Vec<&'a str> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|o| o[key].as_str().unwrap())
        .collect()
}

/// The RunStarted record of `run_id` in the WALs under `state`.
pub(crate) fn run_started(state: &Path, run_id: &str) -> Value {
    super::support::dump_all(state)
        .into_iter()
        .find(|r| r["kind"] == "run_started" && r["record"]["run_id"] == run_id)
        .unwrap_or_else(|| panic!("no run_started for {run_id}"))["record"]
        .clone()
}

pub(crate) fn result_of(d: &mut Daemon, body: &Value) -> Value {
    body.get("result")
        .cloned()
        .unwrap_or_else(|| panic!("not a result: {body} ({:?})", d.seen.len()))
}

pub(crate) fn with_tools(
    dir: &Path,
    d: &mut Daemon,
    peer: &Aimock,
    extra: &[(&str, &str)],
) -> (Child, ToolModule) {
    let tools = ToolModule::new("ck-tools");
    (with_these_tools(dir, d, peer, extra, &tools), tools)
}

pub(crate) fn with_these_tools(
    dir: &Path,
    d: &mut Daemon,
    peer: &Aimock,
    extra: &[(&str, &str)],
    tools: &ToolModule,
) -> Child {
    let config = json!({"modules": [{"module": "ck-tools", "call_timeout_ms": 1500},
        {"module": "ck-missing"}]});
    with_tools_config(dir, d, peer, extra, tools, &config)
}

/// `broca module` with the tools config `config` (written to `dir/tools.json`), registered
/// with `d`, which serves `tools` as its one tool module.
pub(crate) fn with_tools_config(
    dir: &Path,
    d: &mut Daemon,
    peer: &Aimock,
    extra: &[(&str, &str)],
    tools: &ToolModule,
    config: &Value,
) -> Child {
    with_configs(dir, d, peer, extra, tools, config, None)
}

/// `broca module` with the tools config `config` and, when given, the `--config` file
/// `broca_config` (both written to `dir`), registered with `d`, which serves `tools`.
pub(crate) fn with_configs(
    dir: &Path,
    d: &mut Daemon,
    peer: &Aimock,
    extra: &[(&str, &str)],
    tools: &ToolModule,
    config: &Value,
    broca_config: Option<&Value>,
) -> Child {
    let cfg = dir.join("tools.json");
    std::fs::write(&cfg, config.to_string()).unwrap();
    let mut command = module(&dir.join("state"), d, peer, extra);
    if let Some(c) = broca_config {
        let file = dir.join("broca.json");
        std::fs::write(&file, c.to_string()).unwrap();
        command.arg("--config").arg(&file);
    }
    let child = command.arg("--tools-config").arg(&cfg).spawn_quiet();
    d.accept(Answer::Accept).unwrap();
    d.serve(Services {
        vault: None,
        tools: Some(tools.clone()),
        catalog: None,
        bus: None,
    });
    child
}

/// `broca module` with plans on (a plan's items waited for 1 s at most, the default being
/// 10 s) and no configured tool module, registered with a new daemon stand-in (its socket in
/// `dir/<name>`) serving `tools`: every tool a session offers is its plan's.
pub(crate) fn planned_module(
    dir: &Path,
    name: &str,
    peer: &Aimock,
    tools: &ToolModule,
    extra: &[(&str, &str)],
) -> (Daemon, Child) {
    let mut d = Daemon::start(&dir.join(name));
    let config = json!({"plans": true, "plan_fetch_deadline_ms": 1000});
    let child = with_configs(
        dir,
        &mut d,
        peer,
        extra,
        tools,
        &json!({"modules": []}),
        Some(&config),
    );
    (d, child)
}

/// [`planned_module`] in a new temporary folder, aimock answering from tools.json, and route
/// 1 bound to the session ("/p", "h", "s").
pub(crate) struct PlannedRig {
    pub dir: tempfile::TempDir,
    pub state: std::path::PathBuf,
    pub peer: Aimock,
    pub d: Daemon,
    pub child: Child,
}

pub(crate) fn planned_rig(tools: &ToolModule) -> PlannedRig {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let peer = Aimock::start(&super::support::fixture("tools.json"));
    let (d, child) = planned_bound(dir.path(), "d", &peer, tools, &[]);
    PlannedRig {
        dir,
        state,
        peer,
        d,
        child,
    }
}

/// [`planned_module`] (in `dir/<name>`, with `extra` in its environment), route 1 bound to
/// the session ("/p", "h", "s").
pub(crate) fn planned_bound(
    dir: &Path,
    name: &str,
    peer: &Aimock,
    tools: &ToolModule,
    extra: &[(&str, &str)],
) -> (Daemon, Child) {
    let (mut d, child) = planned_module(dir, name, peer, tools, extra);
    assert_eq!(d.bind(1, 1, "/p", "h", "s").0, FrameType::Response);
    (d, child)
}

/// [`planned_bound`] set to abort at the first pass of crash point `point`.
pub(crate) fn planned_to_crash(
    dir: &Path,
    name: &str,
    peer: &Aimock,
    tools: &ToolModule,
    point: &str,
) -> (Daemon, Child) {
    let at = format!("{point}:1");
    planned_bound(dir, name, peer, tools, &[("BROCA_CRASH_AT", &at)])
}

/// Sends `method` with `params` on route 1 and waits for broca to abort at `point`.
pub(crate) fn killed_by(
    d: &mut Daemon,
    child: &mut Child,
    (method, params): (&str, Value),
    point: &str,
) {
    d.send(
        FrameType::Request,
        1,
        1,
        &json!({"method": method, "params": params}),
    );
    d.until_closed();
    assert_aborted(child, point);
}

/// Asserts that `role.describe` on route 1 declares `group` and lists each of `ops`.
pub(crate) fn assert_declares(d: &mut Daemon, group: &str, ops: &[&str]) {
    let (_, described) = d.request(1, 1, "role.describe", json!({}));
    let result = &described["result"];
    let listed =
        |member: &Value, name: &str| member.as_array().is_some_and(|a| a.contains(&json!(name)));
    assert!(
        listed(&result["capabilities"], group),
        "{group}: {described}"
    );
    for op in ops {
        assert!(listed(&result["majors"][0]["ops"], op), "{op}: {described}");
    }
}

/// Sends `prompt` on route `channel` (epoch 1) and waits for the run's end.
pub(crate) fn run_on(d: &mut Daemon, channel: u16, prompt: &str, send_id: &str) -> (String, Value) {
    run_with(
        d,
        channel,
        json!({"prompt": prompt, "model": "anthropic/m", "send_id": send_id}),
    )
}

/// Sends `send` on route `channel` (epoch 1); answers its run and the run's status at its end.
pub(crate) fn run_with(d: &mut Daemon, channel: u16, send: Value) -> (String, Value) {
    let (ty, sent) = d.request(channel, 1, "session.send", send.clone());
    assert_eq!(ty, FrameType::Response, "{send}: {sent}");
    let run_id = sent["result"]["run_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{sent}"))
        .to_string();
    let status = wait_ended(d, channel, 1, &run_id);
    (run_id, status)
}

pub(crate) fn run_on_route(d: &mut Daemon, prompt: &str, send_id: &str) -> (String, Value) {
    run_on(d, 1, prompt, send_id)
}

/// `broca module` (launch nonce `nonce`) with the stand-in tool module, aimock answering from
/// tools.json, and route 1 bound to the session (`root`, "h", "s").
pub(crate) struct ToolsRig {
    pub dir: tempfile::TempDir,
    pub state: std::path::PathBuf,
    pub peer: Aimock,
    pub d: Daemon,
    pub child: Child,
    pub tools: ToolModule,
}

pub(crate) fn tools_rig(nonce: &str, root: &str) -> ToolsRig {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let peer = Aimock::start(&super::support::fixture("tools.json"));
    let mut d = Daemon::start(&dir.path().join("d"));
    let (child, tools) = with_tools(dir.path(), &mut d, &peer, &[("SUBC_LAUNCH_NONCE", nonce)]);
    assert_eq!(d.bind(1, 1, root, "h", "s").0, FrameType::Response);
    ToolsRig {
        dir,
        state,
        peer,
        d,
        child,
        tools,
    }
}

/// Gives credential `name` the vault handle `handle` in the state dir's credentials file.
pub(crate) fn give_vault_handle(state: &Path, name: &str, handle: &str) {
    std::fs::create_dir_all(state).unwrap();
    broca::owner_only::write_file(
        &state.join("credentials.json"),
        json!({ name: {"vault_handle": handle} })
            .to_string()
            .as_bytes(),
    )
    .unwrap();
}
