//! What a new user meets first with `broca serve`: serve.json naming its files by absolute
//! paths whatever `--state-dir` was given, a subscription that shows itself open at once on an
//! idle session and says it is alive while idle, and a missing key whose refusal says how to give a running daemon one.

mod support;

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use support::serve::{command, open_sse, rpc, spawn};
use support::{fixture, Aimock};

#[test]
fn serve_json_names_absolute_paths_for_a_relative_state_dir() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = command(Path::new("rel-state"), &peer.url(), &[]);
    cmd.current_dir(dir.path())
        .stderr(std::process::Stdio::inherit());
    let state = dir.path().join("rel-state");
    let _s = spawn(&mut cmd, &state);
    let info: Value =
        serde_json::from_slice(&std::fs::read(state.join("serve.json")).unwrap()).unwrap();
    for member in ["handle_file", "socket"] {
        let path = Path::new(info[member].as_str().unwrap());
        assert!(path.is_absolute(), "{member}: {info}");
        assert!(path.exists(), "{member}: {info}");
    }
}

#[test]
fn the_socket_takes_requests_as_soon_as_serve_says_it_is_ready() {
    // Each start: the first request on the Unix socket right after the ready line (the
    // socket was once made again after that line, and such a request was reset).
    let peer = Aimock::start(&fixture("aimock.json"));
    for round in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let s = support::serve::start(&dir.path().join("state"), &peer, &[]);
        let mut c = std::os::unix::net::UnixStream::connect(&s.socket).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        std::io::Write::write_all(
            &mut c,
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .unwrap();
        let mut answer = String::new();
        c.read_to_string(&mut answer)
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "round {round}: {answer}"
        );
    }
}

#[test]
fn a_subscription_shows_itself_open_at_once_on_an_idle_session() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let s = support::serve::start(&dir.path().join("state"), &peer, &[]);
    let mut c = open_sse(
        &s,
        "project_root=/idle&harness=h&session=quiet&from=live",
        None,
    );
    // Well before the 15 s keepalive: the head and a first comment line.
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    while !got.windows(14).any(|w| w == b": subscribed\n\n") {
        let n = c
            .read(&mut buf)
            .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(&got)));
        assert!(n > 0, "closed: {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.contains("content-type: text/event-stream"), "{text}");
}

#[test]
fn an_idle_subscription_says_it_is_alive_once_every_period() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    // A debug build's knob: the keepalive every 300 ms instead of 15 s.
    let s = support::serve::start_env(
        &dir.path().join("state"),
        &peer,
        &[],
        &[("BROCA_TEST_SSE_KEEPALIVE_MS", "300")],
    );
    let mut c = open_sse(
        &s,
        "project_root=/idle&harness=h&session=quiet&from=live",
        None,
    );
    c.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    let until = std::time::Instant::now() + Duration::from_millis(2_000);
    while std::time::Instant::now() < until {
        match c.read(&mut buf) {
            Ok(0) => panic!("closed: {:?}", String::from_utf8_lossy(&got)),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(_) => {} // the read timeout: read again until the window ends
        }
    }
    // About six periods in the window: each idle period says so once (not every other one).
    let text = String::from_utf8_lossy(&got);
    let keepalives = text.matches(": keepalive\n\n").count();
    assert!(
        (5..=7).contains(&keepalives),
        "{keepalives} keepalives: {text:?}"
    );
}

#[test]
fn a_missing_key_says_how_to_give_a_running_daemon_one() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut cmd = command(&state, &peer.url(), &[]);
    cmd.env_remove("ANTHROPIC_API_KEY")
        .stderr(std::process::Stdio::null());
    let s = spawn(&mut cmd, &state);
    let send = json!({"prompt": "hi", "model": "anthropic/m"});
    let (status, r) = rpc(&s, "session.send", send.clone());
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(
        (status, &r["error"]["code"]),
        (400, &json!("auth_required")),
        "{r}"
    );
    let file = state.join("credentials.json");
    assert!(message.contains("ANTHROPIC_API_KEY"), "{message}");
    assert!(message.contains(&file.display().to_string()), "{message}");
    assert!(message.contains("file:NAME"), "{message}");
    assert!(
        !state.join("wal").read_dir().unwrap().any(|_| true),
        "nothing written"
    );
    // Following the message: the key in the credentials file, no restart.
    std::fs::write(
        &file,
        r#"{"mine": {"api_key": "sk-from-the-file-0123456789"}}"#,
    )
    .unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let (status, r) = rpc(
        &s,
        "session.send",
        json!({"prompt": "hello", "model": "anthropic/m", "credential_id": "file:mine"}),
    );
    assert_eq!(status, 200, "{r}");
    let run_id = r["result"]["run_id"].as_str().unwrap().to_string();
    support::serve::wait_for("the run to complete", || {
        rpc(&s, "run.status", json!({"run_id": run_id})).1["result"]["state"] == "completed"
    });
}
