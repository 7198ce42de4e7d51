//! Tools from real MCP servers, through the real `broca` binary with aimock as the provider:
//! `@modelcontextprotocol/server-everything` over stdio and over Streamable HTTP, and
//! tests/peers/counting_mcp.py, which appends every call to a file before it answers, so each
//! test counts side effects exactly (also across a kill -9 of broca while a call runs).

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::serve::{metric_with, rpc, start, wait_for};
use support::{
    broca, dump_all, ensure_peers, fixture, last_json, peers_dir, Aimock, EVERYTHING_JS,
};

const KEY: &str = "sk-tools-test-0123456789";

struct Env {
    _dir: tempfile::TempDir,
    state: PathBuf,
    count: PathBuf,
    starts: PathBuf,
    peer: Aimock,
    root: PathBuf,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        Env {
            state: root.join("state"),
            count: root.join("calls.jsonl"),
            starts: root.join("starts.txt"),
            peer: Aimock::start(&fixture("tools.json")),
            root,
            _dir: dir,
        }
    }

    /// A tools config with the counting server (its extra settings in `server`).
    fn counting_config(&self, server: Value, extra: Value) -> PathBuf {
        let mut s = json!({
            "name": "counting",
            "command": ["python3", peers_dir().join("counting_mcp.py")],
            "env": {"COUNT_FILE": self.count, "STARTS_FILE": self.starts},
        });
        merge(&mut s, server);
        let mut cfg = json!({"mcp": [s]});
        merge(&mut cfg, extra);
        self.write_config("counting.json", &cfg)
    }

    fn write_config(&self, name: &str, cfg: &Value) -> PathBuf {
        let path = self.root.join(name);
        std::fs::write(&path, cfg.to_string()).unwrap();
        path
    }

    fn run(&self, config: &Path, session: &str, prompt: &str) -> Output {
        broca(&self.state)
            .env("ANTHROPIC_API_KEY", KEY)
            .args(["run", "--model", "anthropic/test-model", "--base-url"])
            .arg(self.peer.url())
            .arg("--tools-config")
            .arg(config)
            .args(["--session", session, "--max-steps", "3", "--json", prompt])
            .output()
            .expect("broca runs")
    }

    /// The calls the counting server received, in order.
    fn calls(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.count)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn starts(&self) -> usize {
        std::fs::read_to_string(&self.starts)
            .unwrap_or_default()
            .lines()
            .count()
    }

    fn records(&self, kind: &str) -> Vec<Value> {
        dump_all(&self.state)
            .into_iter()
            .filter(|r| r["kind"] == kind)
            .map(|r| r["record"].clone())
            .collect()
    }

    /// The recorded result of tool call `call_id`: a tool_result record, or the one a later
    /// RunStarted gave a call that an interrupted run left without a result.
    fn result(&self, call_id: &str) -> Value {
        let mut all = self.records("tool_result");
        for started in self.records("run_started") {
            all.extend(
                started["resolved_calls"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default(),
            );
        }
        let found: Vec<&Value> = all.iter().filter(|r| r["call_id"] == call_id).collect();
        assert_eq!(found.len(), 1, "one result for {call_id}: {all:?}");
        found[0].clone()
    }
}

fn merge(into: &mut Value, from: Value) {
    if let (Some(a), Value::Object(b)) = (into.as_object_mut(), from) {
        a.extend(b);
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn everything_stdio(env: &Env) -> PathBuf {
    ensure_peers();
    env.write_config(
        "everything.json",
        &json!({"mcp": [{"name": "everything", "command": ["node", peers_dir().join(EVERYTHING_JS), "stdio"]}]}),
    )
}

#[test]
fn server_everything_over_stdio_runs_tools_and_schema_mismatches_are_never_sent() {
    let env = Env::new();
    let config = everything_stdio(&env);

    let o = env.run(&config, "echo", "echo please");
    let r = last_json(&o);
    assert!(o.status.success(), "{r} {}", stderr(&o));
    assert_eq!(r["final_message"]["text"], "The server echoed it.");
    let echoed = env.result("call_echo_1");
    assert_eq!(echoed["content"], "Echo: hi from broca");
    assert!(!echoed["is_error"].as_bool().unwrap_or(false), "{echoed}");
    // The offered specs are frozen into RunStarted with their route.
    let started = env.records("run_started");
    let tools = started[0]["config"]["tools"].as_array().unwrap();
    let echo = tools.iter().find(|t| t["name"] == "echo").unwrap();
    assert_eq!(echo["route"], "mcp:everything");
    assert!(
        echo["input_schema"]["properties"]["message"].is_object(),
        "{echo}"
    );
    assert!(tools.len() >= 5, "{tools:?}");

    // Structured content comes back as text.
    let o = env.run(&config, "weather", "structured weather");
    assert!(o.status.success(), "{}", stderr(&o));
    let w = env.result("call_weather_1");
    assert!(w["content"].as_str().unwrap().contains("36"), "{w}");

    // An image the tool returns is kept in the session's content store, named by its digest,
    // and its result is recorded in parts: its text and the image, in the tool's order.
    let o = env.run(&config, "image", "tiny image");
    let r = last_json(&o);
    assert!(o.status.success(), "{r} {}", stderr(&o));
    assert_eq!(r["final_message"]["text"], "A small logo.");
    let img = env.result("call_img_1");
    let parts = img["parts"].as_array().expect("a result in parts");
    assert_eq!(parts[0]["type"], "text", "{img}");
    let media = parts
        .iter()
        .find(|p| p["type"] == "media")
        .expect("its image");
    assert_eq!(media["mime"], "image/png");
    let sha = media["sha256"].as_str().unwrap();
    let kept: Vec<std::path::PathBuf> = std::fs::read_dir(env.state.join("media"))
        .unwrap()
        .map(|d| d.unwrap().path().join(sha))
        .filter(|p| p.exists())
        .collect();
    assert_eq!(kept.len(), 1, "the image is in one session's store");
    let bytes = std::fs::read(&kept[0]).unwrap();
    assert_eq!(bytes.len() as u64, media["bytes"].as_u64().unwrap());
    assert_eq!(
        cortexkit_role_llm_runner::content_digest::sha256_hex(&bytes),
        sha
    );
    assert!(bytes.starts_with(b"\x89PNG"));

    // Arguments that do not match the schema: an error result, and the tool never called.
    let o = env.run(&config, "sum", "sum badly");
    assert!(o.status.success(), "{}", stderr(&o));
    let sum = env.result("call_sum_1");
    assert_eq!(sum["is_error"], true);
    assert_eq!(sum["reason"], "invalid_arguments");
    let text = sum["content"].as_str().unwrap();
    assert!(
        text.contains("`/a`: \"one\" is not of type \"number\"") && text.contains("not called"),
        "{text}"
    );
}

#[test]
fn server_everything_over_streamable_http() {
    ensure_peers();
    let port = free_port();
    let mut node = Command::new("node")
        .arg(peers_dir().join(EVERYTHING_JS))
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("node runs");
    let until = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < until, "the HTTP MCP server did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    let env = Env::new();
    let config = env.write_config(
        "http.json",
        &json!({"mcp": [{"name": "web", "url": format!("http://127.0.0.1:{port}/mcp")}]}),
    );
    let o = env.run(&config, "echo", "echo please");
    let _ = node.kill();
    let _ = node.wait();
    let r = last_json(&o);
    assert!(o.status.success(), "{r} {}", stderr(&o));
    assert_eq!(env.result("call_echo_1")["content"], "Echo: hi from broca");
    let started = env.records("run_started");
    assert!(started[0]["config"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["name"] == "echo" && t["route"] == "mcp:web"));
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn calls_of_one_step_share_one_intent_run_at_once_and_each_happens_once() {
    let env = Env::new();
    let config = env.counting_config(json!({}), json!({}));
    let o = env.run(&config, "s", "record two");
    let r = last_json(&o);
    assert!(o.status.success(), "{r} {}", stderr(&o));
    assert_eq!(r["final_message"]["text"], "Both recorded.");
    let mut notes: Vec<String> = env
        .calls()
        .iter()
        .map(|c| c["arguments"]["note"].as_str().unwrap().to_string())
        .collect();
    notes.sort();
    assert_eq!(notes, ["first", "second"]);
    let intents = env.records("tool_dispatch_intent");
    assert_eq!(intents.len(), 1);
    assert_eq!(intents[0]["calls"].as_array().unwrap().len(), 2);
    assert_eq!(env.result("call_rec_1")["content"], "recorded: first");
    assert_eq!(env.result("call_rec_2")["content"], "recorded: second");
    assert_eq!(env.starts(), 1, "one server process for the broca process");
}

#[test]
fn unknown_tools_and_mismatched_arguments_are_answered_without_dispatch() {
    let env = Env::new();
    let config = env.counting_config(json!({}), json!({}));
    let o = env.run(&config, "s", "odd calls");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(env.result("call_odd_1")["reason"], "unknown_tool");
    let mismatch = env.result("call_odd_2");
    assert_eq!(mismatch["reason"], "invalid_arguments");
    assert!(mismatch["content"]
        .as_str()
        .unwrap()
        .contains("`/note`: 7 is not of type \"string\""));
    assert!(
        env.calls().is_empty(),
        "nothing dispatched: {:?}",
        env.calls()
    );
}

#[test]
fn a_call_that_times_out_is_indeterminate_never_sent_again_and_resolved_by_the_next_send() {
    let env = Env::new();
    let config = env.counting_config(json!({"call_timeout_ms": 800}), json!({}));
    let o = env.run(&config, "s", "hang call");
    let r = last_json(&o);
    assert_eq!(o.status.code(), Some(1), "{r}");
    assert_eq!(r["state"], "interrupted");
    assert_eq!(r["indeterminate_tool_calls"], json!(["call_hang_1"]));
    assert_eq!(env.calls().len(), 1);

    let o = env.run(&config, "s", "hello");
    assert!(o.status.success(), "{}", stderr(&o));
    let resolved = env.result("call_hang_1");
    assert_eq!(resolved["reason"], "outcome_unknown");
    assert_eq!(env.calls().len(), 1, "the hung call was never sent again");
}

#[test]
fn bad_results_errors_and_long_text_are_recorded_as_such() {
    let env = Env::new();
    let config = env.counting_config(json!({}), json!({"result_bytes_max": 1000}));
    let o = env.run(&config, "s", "misc results");
    assert!(o.status.success(), "{}", stderr(&o));
    let failed = env.result("call_misc_1");
    assert_eq!(
        (failed["content"].as_str(), failed["is_error"].as_bool()),
        (Some("it went wrong"), Some(true))
    );
    let rpc_err = env.result("call_misc_2");
    assert_eq!(rpc_err["is_error"], true);
    assert!(
        rpc_err["content"]
            .as_str()
            .unwrap()
            .contains("the tool broke"),
        "{rpc_err}"
    );
    let big = env.result("call_misc_3");
    let text = big["content"].as_str().unwrap();
    assert!(text.len() <= 1000, "{}", text.len());
    assert!(
        text.starts_with("xxxx")
            && text.contains("result truncated")
            && text.contains("of 5000 bytes"),
        "{text}"
    );
    assert_eq!(env.calls().len(), 3);
}

#[test]
fn a_server_that_prints_garbage_still_serves_each_call_once() {
    let env = Env::new();
    let config = env.counting_config(
        json!({"env": {"COUNT_FILE": env.count, "MCP_MODE": "garbage"}}),
        json!({}),
    );
    let o = env.run(&config, "s", "record two");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(env.calls().len(), 2);
    assert!(stderr(&o).contains("not JSON-RPC"), "{}", stderr(&o));
}

#[test]
fn servers_that_exit_at_once_or_hang_at_initialize_are_reported_within_their_timeout() {
    for (mode, want) in [
        ("exit_at_once", "exited"),
        ("hang_init", "did not finish starting within 1000 ms"),
    ] {
        let env = Env::new();
        let config = env.counting_config(
            json!({"env": {"COUNT_FILE": env.count, "MCP_MODE": mode}, "startup_timeout_ms": 1000}),
            json!({}),
        );
        let t = Instant::now();
        let o = env.run(&config, "s", "record two");
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "{mode}: bounded in time"
        );
        let err = stderr(&o);
        assert!(
            err.contains("tool server `counting`") && err.contains(want),
            "{mode}: {err}"
        );
        // The run goes on without the server's tools: the model's calls are unknown tools.
        assert!(o.status.success(), "{mode}: {err}");
        assert_eq!(env.result("call_rec_1")["reason"], "unknown_tool");
        assert!(env.calls().is_empty());
    }
}

#[test]
fn two_servers_offering_one_name_refuse_the_send() {
    let env = Env::new();
    let server = |name: &str| {
        json!({"name": name, "command": ["python3", peers_dir().join("counting_mcp.py")],
               "env": {"COUNT_FILE": env.count}})
    };
    let config = env.write_config(
        "twice.json",
        &json!({"mcp": [server("one"), server("two")]}),
    );
    let o = env.run(&config, "s", "record two");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("tool_name_collision: two tool servers offer `record`"),
        "{}",
        stderr(&o)
    );
    assert!(env.calls().is_empty());
}

#[test]
fn a_kill_9_of_broca_during_a_call_leaves_it_indeterminate_and_it_is_never_sent_again() {
    let env = Env::new();
    let config = env.counting_config(json!({}), json!({}));
    let mut child = broca(&env.state)
        .env("ANTHROPIC_API_KEY", KEY)
        .args(["run", "--model", "anthropic/test-model", "--base-url"])
        .arg(env.peer.url())
        .arg("--tools-config")
        .arg(&config)
        .args(["--session", "s", "--max-steps", "3", "--json", "slow call"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the slow call to reach the server", || {
        env.calls().len() == 1
    });
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert!(
        std::os::unix::process::ExitStatusExt::signal(&status) == Some(9),
        "broca was killed mid-call: {status:?}"
    );

    // The next run resumes the open one: interrupted naming the call, then the new send
    // gives it an outcome-unknown result and runs on.
    let o = env.run(&config, "s", "record again");
    let r = last_json(&o);
    assert!(o.status.success(), "{r} {}", stderr(&o));
    assert!(
        stderr(&o).contains("call_slow_1"),
        "the resumed run names the indeterminate call: {}",
        stderr(&o)
    );
    assert_eq!(env.result("call_slow_1")["reason"], "outcome_unknown");
    let tools: Vec<String> = env
        .calls()
        .iter()
        .map(|c| c["tool"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(tools, ["slow", "record"], "the slow call happened once");
    // The killed run was resumed and sealed interrupted, naming the call, never cancelled.
    let records = support::dump_all(&env.state);
    let first_run = records
        .iter()
        .find(|r| r["kind"] == "run_started")
        .map(|r| r["record"]["run_id"].clone())
        .unwrap();
    let ends: Vec<&Value> = records
        .iter()
        .filter(|r| r["kind"] == "run_finished" && r["record"]["run_id"] == first_run)
        .collect();
    assert_eq!(ends.len(), 1, "one terminal for the killed run: {ends:?}");
    assert_eq!(ends[0]["record"]["reason"], "interrupted", "{}", ends[0]);
    assert_eq!(
        ends[0]["record"]["indeterminate_tool_calls"],
        json!(["call_slow_1"]),
        "{}",
        ends[0]
    );
    assert!(
        records
            .iter()
            .any(|r| r["kind"] == "run_resumed" && r["record"]["run_id"] == first_run),
        "the resume is recorded"
    );
}

#[test]
fn under_serve_one_server_process_is_shared_and_restarted_after_it_dies() {
    let env = Env::new();
    let config = env.counting_config(json!({}), json!({}));
    let s = start(
        &env.state,
        &env.peer,
        &["--tools-config", config.to_str().unwrap()],
    );
    let send = |session: &str, prompt: &str| {
        let (status, r) = rpc(
            &s,
            "session.send",
            json!({"session": session, "prompt": prompt, "model": "anthropic/m", "max_steps": 3}),
        );
        assert_eq!(status, 200, "{r}");
        r["result"]["run_id"].as_str().unwrap().to_string()
    };
    let state_of = |session: &str, run_id: &str| {
        rpc(
            &s,
            "run.status",
            json!({"session": session, "run_id": run_id}),
        )
        .1["result"]
            .clone()
    };
    let a = send("a", "record two");
    wait_for("run a", || state_of("a", &a)["state"] == "completed");
    let d = send("d", "die call");
    wait_for("run d", || state_of("d", &d)["state"] == "interrupted");
    assert_eq!(
        state_of("d", &d)["indeterminate_tool_calls"],
        json!(["call_die_1"])
    );
    let b = send("b", "record again");
    wait_for("run b", || state_of("b", &b)["state"] == "completed");
    let tools: Vec<String> = env
        .calls()
        .iter()
        .map(|c| c["tool"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(tools.iter().filter(|t| *t == "die").count(), 1);
    assert_eq!(tools.len(), 4, "{tools:?}");
    assert_eq!(
        env.starts(),
        2,
        "one process for all sessions, started again after it died"
    );
    // What an operator reads: runs by how they ended, calls by what came of them.
    let runs = |reason: &str| {
        metric_with(
            &s,
            "broca_runs_finished_total",
            &format!("reason=\"{reason}\""),
        )
    };
    let calls = |outcome: &str| {
        metric_with(
            &s,
            "broca_tool_calls_total",
            &format!("outcome=\"{outcome}\""),
        )
    };
    assert_eq!((runs("completed"), runs("interrupted")), (2, 1));
    assert_eq!((calls("succeeded"), calls("indeterminate")), (3, 1));
    // A session's next send copies the messages its earlier requests rendered, from the
    // session's held prefix, and renders only the new ones.
    let again = send("a", "record two");
    wait_for("run a again", || {
        state_of("a", &again)["state"] == "completed"
    });
    let metric = |name: &str| support::serve::metric(&s, name);
    let (reused, rendered) = (
        metric("broca_render_messages_reused_total"),
        metric("broca_render_messages_rendered_total"),
    );
    assert!(
        reused > 0 && rendered > 0,
        "{reused} reused, {rendered} rendered"
    );
    assert!(metric("broca_render_prefix_bytes") > 0);
}

/// A stopping serve closes its servers' input and lets them exit on their own: a well-behaved
/// server is never killed (it may have state to flush), and serve does not wait out the kill's
/// grace for it.
#[test]
fn a_stopping_serve_lets_its_servers_end_on_their_own() {
    let env = Env::new();
    let ends = env.root.join("ends.txt");
    let config = env.counting_config(
        json!({"env": {"COUNT_FILE": env.count, "STARTS_FILE": env.starts, "ENDS_FILE": ends}}),
        json!({}),
    );
    let mut s = start(
        &env.state,
        &env.peer,
        &["--tools-config", config.to_str().unwrap()],
    );
    let (status, r) = rpc(
        &s,
        "session.send",
        json!({"session": "a", "prompt": "record two", "model": "anthropic/m", "max_steps": 3}),
    );
    assert_eq!(status, 200, "{r}");
    let run_id = r["result"]["run_id"].as_str().unwrap().to_string();
    wait_for("the run", || {
        rpc(&s, "run.status", json!({"session": "a", "run_id": run_id})).1["result"]["state"]
            == "completed"
    });
    assert_eq!(env.starts(), 1);
    // SAFETY: kill(2) on a child this test started.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
    let status = s.child.wait().unwrap();
    // A stopped serve dies of the signal it was stopped with, once everything is closed.
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGTERM)
    );
    let ended = std::fs::read_to_string(&ends).unwrap_or_default();
    assert_eq!(
        ended.lines().count(),
        1,
        "the server saw its input close and ended by itself, not by a kill"
    );
}

#[test]
fn a_server_that_cannot_be_restarted_refuses_the_call_before_delivery() {
    let env = Env::new();
    let config = env.counting_config(
        json!({"env": {"COUNT_FILE": env.count, "STARTS_FILE": env.starts, "MCP_MODE": "first_start_only"}}),
        json!({}),
    );
    let s = start(
        &env.state,
        &env.peer,
        &["--tools-config", config.to_str().unwrap()],
    );
    let run = |session: &str, prompt: &str, want: &str| {
        let (status, r) = rpc(
            &s,
            "session.send",
            json!({"session": session, "prompt": prompt, "model": "anthropic/m", "max_steps": 3}),
        );
        assert_eq!(status, 200, "{r}");
        let run_id = r["result"]["run_id"].as_str().unwrap().to_string();
        wait_for(want, || {
            rpc(
                &s,
                "run.status",
                json!({"session": session, "run_id": run_id}),
            )
            .1["result"]["state"]
                == want
        });
    };
    run("d", "die call", "interrupted");
    run("r", "record again", "completed");
    let refused = env.result("call_rec_9");
    assert_eq!(refused["reason"], "refused_before_delivery", "{refused}");
    assert!(
        refused["content"]
            .as_str()
            .unwrap()
            .contains("not available"),
        "{refused}"
    );
    let tools: Vec<String> = env
        .calls()
        .iter()
        .map(|c| c["tool"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(tools, ["die"], "the refused call never reached a server");
    assert!(env.starts() >= 2, "a restart was tried");
}
