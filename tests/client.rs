//! The client commands against a real `broca serve` (found through its serve.json, or named
//! with --connect): `send` streams the answer and ends with the outcome, `status`, `ls`,
//! `read`, `cancel` and `attach`, each for a person and with --json.

mod support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Output, Stdio};

use serde_json::{json, Value};
use support::serve::{start, wait_for};
use support::{broca, fixture, last_json, Aimock};

/// A client command of the serve whose state dir is `state`, run in `cwd`.
fn client(state: &Path, cwd: &Path, args: &[&str]) -> Output {
    broca(state).current_dir(cwd).args(args).output().unwrap()
}

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

#[test]
fn send_streams_the_answer_and_the_other_commands_find_the_run() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let s = start(&state, &peer, &[]);
    let project = dir.path().join("proj");
    std::fs::create_dir(&project).unwrap();

    // Nothing running for another state dir: said so, exit 1.
    let o = client(&dir.path().join("nowhere"), &project, &["ls"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("no running broca serve"),
        "{}",
        text(&o.stderr)
    );

    let o = client(
        &state,
        &project,
        &["send", "--session", "s1", "--model", "anthropic/m", "hello"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("Hello! How can I help you today?"),
        "{} / {}",
        text(&o.stderr),
        text(&o.stdout)
    );
    let err = text(&o.stderr);
    assert!(
        err.contains(": completed")
            && err.contains("1 step")
            && err.contains("12 in, 9 out tokens"),
        "{err}"
    );

    // The session is the current directory's, under the `cli` harness; a second send takes
    // the session's model, and --json ends with run.result's answer.
    let o = client(
        &state,
        &project,
        &["send", "--session", "s1", "--json", "hello"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let result = last_json(&o);
    assert_eq!(result["state"], "completed", "{result}");
    let run_id = result["run_id"].as_str().unwrap().to_string();
    let root = project.display().to_string();
    let (_, st) = support::serve::post(
        &s,
        &json!({"method": "run.status", "params": {"project_root": root, "harness": "cli", "session": "s1"}}).to_string(),
    );
    assert_eq!(st["result"]["run_id"], run_id.as_str(), "{st}");

    let o = client(&state, &project, &["status", "--session", "s1", "--json"]);
    assert_eq!(last_json(&o)["run_id"], run_id.as_str());
    let o = client(&state, &project, &["status", "--session", "s1"]);
    assert!(
        text(&o.stdout).starts_with(&format!("run {run_id}: completed")),
        "{}",
        text(&o.stdout)
    );

    wait_for("the session to be listed", || {
        text(&client(&state, &project, &["ls"]).stdout).contains("s1")
    });
    let o = client(&state, &project, &["ls", "--json"]);
    let page: Value = serde_json::from_str(text(&o.stdout).lines().next().unwrap()).unwrap();
    assert_eq!(page["sessions"][0]["project_root"], root.as_str(), "{page}");
    assert_eq!(page["sessions"][0]["runs"], 2);
    let o = client(&state, &project, &["ls", "--state", "error"]);
    assert!(!text(&o.stdout).contains("s1"), "{}", text(&o.stdout));

    let o = client(&state, &project, &["read", "--session", "s1"]);
    let out = text(&o.stdout);
    assert!(
        out.starts_with("#1 user: hello\n#2 assistant: Hello!"),
        "{out}"
    );

    // A model the session cannot reach: the refusal on stderr, exit 1, nothing streamed.
    let o = client(
        &state,
        &project,
        &["send", "--session", "s2", "--model", "nope/x", "hi"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("broca: "), "{}", text(&o.stderr));
    drop(s);
}

#[test]
fn cancel_and_attach_follow_a_run_in_flight_over_tcp() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let s = start(&state, &peer, &[]);
    let connect = format!("http://{}", s.addr);
    let base = [
        "--connect",
        connect.as_str(),
        "--project-root",
        "/p",
        "--session",
        "a",
    ];

    // attach from the start, as JSON lines, in the background.
    let mut attach = broca(&state)
        .args(["attach"])
        .args(base)
        .args(["--from", "start", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut sent = broca(&state)
        .args(["send"])
        .args(base)
        .args(["--model", "anthropic/m", "slow"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The run is in flight: cancel it by its id (from status, over TCP with the handle).
    let mut run_id = String::new();
    wait_for("the run to start", || {
        let o = client(
            &state,
            dir.path(),
            &[&["status", "--json"][..], &base].concat(),
        );
        run_id = serde_json::from_slice::<Value>(&o.stdout)
            .map(|v| v["run_id"].as_str().unwrap_or("").to_string())
            .unwrap_or_default();
        !run_id.is_empty()
    });
    let o = client(
        &state,
        dir.path(),
        &[&["cancel", &run_id][..], &base].concat(),
    );
    assert_eq!(text(&o.stdout).trim(), "ack", "{}", text(&o.stderr));
    let sent_status = sent.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut sent.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(sent_status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("run {run_id}: cancelled")), "{err}");

    // attach saw the run start and end, each with its cursor.
    let mut lines = BufReader::new(attach.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let v: Value = serde_json::from_str(&line.unwrap()).unwrap();
        if let Some(t) = v["unit"]["type"].as_str() {
            assert!(v["id"].is_string(), "{v}");
            seen.push(t.to_string());
            if t == "run_finished" {
                break;
            }
        }
    }
    let _ = attach.kill();
    let _ = attach.wait();
    assert_eq!(
        seen.first().map(String::as_str),
        Some("run_started"),
        "{seen:?}"
    );
    assert_eq!(
        seen.last().map(String::as_str),
        Some("run_finished"),
        "{seen:?}"
    );
}
