//! Input a hostile or careless caller gives, against the real binary: logs that are not
//! regular files (/dev/zero, a FIFO), a line or an episode larger than the WAL can hold,
//! `session.import` paths outside the folders the daemon imports from (and links out of
//! them), names with control characters, and one folder spelled many ways. Each is refused
//! by name, promptly, with nothing written.

mod support;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use support::serve::{post, rpc, start, wait_for};
use support::{broca, fixture, Aimock};

/// How long a refusal may take before the test calls the command hung (and kills it).
const PROMPT: Duration = Duration::from_secs(30);

/// Runs `cmd` to its end, or kills it after [`PROMPT`] and fails naming `what`.
fn output_within(what: &str, cmd: &mut Command) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("broca runs");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > PROMPT {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what}: still running after {PROMPT:?} (stderr {})",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn wal_files(state: &Path) -> Vec<String> {
    std::fs::read_dir(state.join("wal"))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".wal"))
                .collect()
        })
        .unwrap_or_default()
}

fn mkfifo(path: &Path) {
    let made = Command::new("mkfifo").arg(path).status().expect("mkfifo");
    assert!(made.success());
}

/// A Claude Code log line of a user message with `text`.
fn claude_line(session: &str, text: &str) -> String {
    json!({"type": "user", "sessionId": session, "cwd": "/p",
        "message": {"role": "user", "content": text}})
    .to_string()
        + "\n"
}

/// `broca import claude-code PATH`: refused (a failed exit), its stderr.
fn import_refused(state: &Path, path: &Path) -> String {
    let out = output_within(
        &format!("importing {}", path.display()),
        broca(state).args(["import", "claude-code"]).arg(path),
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "{} imported: {stderr}",
        path.display()
    );
    stderr
}

#[test]
fn an_import_reads_regular_files_only_and_bounds_what_it_reads() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    // A device that never ends and a FIFO no one writes: refused by kind, before a read.
    let e = import_refused(&state, Path::new("/dev/zero"));
    assert!(
        e.contains("/dev/zero") && e.contains("a character device"),
        "{e}"
    );
    let fifo = dir.path().join("log.jsonl");
    mkfifo(&fifo);
    let e = import_refused(&state, &fifo);
    assert!(e.contains("log.jsonl") && e.contains("a FIFO"), "{e}");
    // A link to the device is the device.
    let link = dir.path().join("link.jsonl");
    std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
    let e = import_refused(&state, &link);
    assert!(e.contains("a character device"), "{e}");

    // One line of 50 MB: named by the log and its line.
    let big = dir.path().join("big.jsonl");
    let text = claude_line("big", "hello") + &claude_line("big", &"x".repeat(50 << 20));
    std::fs::write(&big, text).unwrap();
    let e = import_refused(&state, &big);
    assert!(
        e.contains(&format!("{}:2:", big.display())) && e.contains("more than the 8388608"),
        "{e}"
    );
    // Lines each under the limit that come to an episode larger than a WAL record holds.
    let many = dir.path().join("many.jsonl");
    let text: String = (0..5)
        .map(|_| claude_line("many", &"y".repeat(4 << 20)))
        .collect();
    std::fs::write(&many, text).unwrap();
    let e = import_refused(&state, &many);
    assert!(
        e.contains("many.jsonl") && e.contains("lines 1 to 5") && e.contains("episode"),
        "{e}"
    );
    assert_eq!(
        wal_files(&state),
        Vec::<String>::new(),
        "nothing is written"
    );
}

#[test]
fn session_import_reads_only_from_the_folders_it_is_given() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let allowed = dir.path().join("logs");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir_all(&allowed).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    let s = start(&state, &peer, &["--import-root", allowed.to_str().unwrap()]);
    let import = |path: &Path| {
        let started = Instant::now();
        let (status, r) = post(
            &s,
            &json!({"method": "session.import",
                "params": {"format": "claude-code", "path": path}})
            .to_string(),
        );
        assert!(started.elapsed() < PROMPT, "{}: {r}", path.display());
        (status, r["error"].clone())
    };
    let good = claude_line("imported", "hello");
    // A log outside the folder, and a link in the folder that leads out of it.
    let outside = elsewhere.join("a.jsonl");
    std::fs::write(&outside, &good).unwrap();
    let (status, e) = import(&outside);
    assert_eq!(
        (status, e["code"].as_str()),
        (403, Some("import_forbidden"))
    );
    let message = e["message"].as_str().unwrap();
    assert!(
        message.contains("a.jsonl") && message.contains(allowed.to_str().unwrap()),
        "{message}"
    );
    let out_link = allowed.join("out.jsonl");
    std::os::unix::fs::symlink(&outside, &out_link).unwrap();
    assert_eq!(import(&out_link).0, 403);
    let dev_link = allowed.join("zero.jsonl");
    std::os::unix::fs::symlink("/dev/zero", &dev_link).unwrap();
    assert_eq!(import(&dev_link).0, 403);
    assert_eq!(import(Path::new("/dev/zero")).0, 403);
    // A `..` that climbs out is out.
    let climbed = allowed.join("../elsewhere/a.jsonl");
    assert_eq!(import(&climbed).0, 403);
    // A FIFO in the folder: refused by kind, at once.
    let fifo = allowed.join("fifo.jsonl");
    mkfifo(&fifo);
    let (status, e) = import(&fifo);
    assert_eq!(
        (status, e["code"].as_str()),
        (404, Some("import_unreadable"))
    );
    assert!(e["message"].as_str().unwrap().contains("a FIFO"), "{e}");
    assert_eq!(
        wal_files(&state),
        Vec::<String>::new(),
        "nothing is written"
    );
    // A log in the folder is imported.
    let inside = allowed.join("b.jsonl");
    std::fs::write(&inside, &good).unwrap();
    let (status, r) = post(
        &s,
        &json!({"method": "session.import", "params": {"format": "claude-code", "path": inside}})
            .to_string(),
    );
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["result"]["session"], "imported");
    assert_eq!(wal_files(&state).len(), 1);
}

#[test]
fn names_refuse_control_characters_and_a_folder_has_one_spelling() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let s = start(&state, &peer, &[]);
    let send = |root: &str, harness: &str, session: &str| {
        post(
            &s,
            &json!({"method": "session.send", "params": {"project_root": root,
                "harness": harness, "session": session, "prompt": "hello there",
                "model": "anthropic/m"}})
            .to_string(),
        )
    };
    for (root, harness, session, named) in [
        ("/proj\u{0}x", "h", "s1", "project_root"),
        ("/proj", "h\u{1b}[2J", "s1", "harness"),
        ("/proj", "h", "s1\n", "session"),
        ("proj", "h", "s1", "absolute"),
        ("./proj", "h", "s1", "absolute"),
    ] {
        let (status, r) = send(root, harness, session);
        assert_eq!(
            (status, r["error"]["code"].as_str()),
            (400, Some("invalid_params")),
            "{root:?} {harness:?} {session:?}: {r}"
        );
        let message = r["error"]["message"].as_str().unwrap();
        assert!(message.contains(named), "{message}");
    }
    assert_eq!(
        wal_files(&state),
        Vec::<String>::new(),
        "nothing is written"
    );
    // One folder, spelled another way: the same session.
    let (status, r) = send("/proj/./x/../", "h", "s1");
    assert_eq!(status, 200, "{r}");
    let run_id = r["result"]["run_id"].as_str().unwrap().to_string();
    wait_for("the run to end", || {
        rpc(&s, "run.status", json!({"run_id": run_id})).1["result"]["state"] != "active"
    });
    let (status, read) = rpc(&s, "session.read", json!({}));
    assert_eq!(status, 200, "{read}");
    let messages = read["result"]["messages"].as_array().unwrap();
    assert!(!messages.is_empty(), "{read}");
    assert_eq!(wal_files(&state).len(), 1);
    let (_, st) = post(
        &s,
        &json!({"method": "run.status", "params": {"project_root": "//proj", "harness": "h",
            "session": "s1", "run_id": run_id}})
        .to_string(),
    );
    assert_eq!(
        st["result"]["run_id"].as_str(),
        Some(run_id.as_str()),
        "{st}"
    );
}

#[test]
fn serve_on_an_address_other_hosts_reach_needs_plain_http_said() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    for addr in ["0.0.0.0:0", "[::]:0"] {
        let out = output_within(
            "serve on a network address",
            broca(&state).args(["serve", "--listen", addr]),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{addr}: {stderr}");
        assert!(
            stderr.contains("reachable from other hosts") && stderr.contains("--plain-http"),
            "{stderr}"
        );
        assert!(!state.join("serve.json").exists());
    }
    // Said: it serves, and a loopback client reaches it.
    let mut cmd = broca(&state);
    cmd.args([
        "serve",
        "--listen",
        "0.0.0.0:0",
        "--plain-http",
        "--shards",
        "1",
    ]);
    let (mut child, line) = support::spawn_first_line(&mut cmd);
    let port = line
        .trim()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse::<u16>().ok())
        .unwrap_or_else(|| panic!("the listen line: {line:?}"));
    let handle = std::fs::read_to_string(state.join("serve.handle")).unwrap();
    let (status, _) = support::serve::http(
        &format!("127.0.0.1:{port}"),
        format!(
            "GET /healthz HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
             Connection: close\r\n\r\n",
            handle.trim()
        )
        .as_bytes(),
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(status, 200, "{line}");
}

#[test]
fn a_fifo_named_like_a_wal_is_skipped_by_every_command_that_lists_wal() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let log = fixture("import/claude_killed.jsonl");
    let out = broca(&state)
        .args(["import", "claude-code"])
        .arg(&log)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let real = wal_files(&state);
    assert_eq!(real.len(), 1);
    let fifo = state.join("wal").join(format!("{}.wal", "0".repeat(32)));
    mkfifo(&fifo);
    for args in [
        &["wal", "verify"][..],
        &["store", "check"][..],
        &["archive", "pack", "--idle-days", "0"][..],
    ] {
        let out = output_within(&args.join(" "), broca(&state).args(args));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{args:?}: {stderr} {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(
            stderr.contains("a FIFO") && stderr.contains(&"0".repeat(32)),
            "{args:?} warns naming it: {stderr}"
        );
    }
    // The FIFO named by hand: refused by kind, not read.
    let out = output_within(
        "wal verify FIFO",
        broca(&state).args(["wal", "verify"]).arg(&fifo),
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("a FIFO"));
    // The real WAL was packed (the FIFO left where it was).
    assert!(fifo.exists());
    assert_eq!(wal_files(&state), vec![format!("{}.wal", "0".repeat(32))]);
}

/// A raw request's whole answer (status line, headers, body) as text.
fn raw_answer(s: &support::serve::Serve, request: &str) -> String {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(&s.addr).unwrap();
    c.set_read_timeout(Some(PROMPT)).unwrap();
    c.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn a_full_disk_refuses_writes_by_name_keeps_reads_and_recovers_without_a_restart() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let mount = support::Mount::tmpfs(48 << 20);
    let state = mount.dir.join("state");
    let s = start(&state, &peer, &[]);
    let send = |session: &str| {
        post(
            &s,
            &json!({"method": "session.send", "params": {"project_root": "/proj",
                "harness": "h", "session": session, "prompt": "hello there",
                "model": "anthropic/m"}})
            .to_string(),
        )
    };
    let (status, r) = send("s1");
    assert_eq!(status, 200, "{r}");
    let first = r["result"]["run_id"].as_str().unwrap().to_string();
    support::serve::result_when_ended(&s, "s1", &first);

    // Fill the file system.
    let filler = mount.dir.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0x5au8; 1 << 20];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.sync_all();
    }
    // A new session's send: refused storage_full, 503 with Retry-After.
    let body = json!({"method": "session.send", "params": {"project_root": "/proj",
        "harness": "h", "session": "s2", "prompt": "hello there", "model": "anthropic/m"}})
    .to_string();
    let answer = raw_answer(
        &s,
        &format!(
            "POST /v1/rpc HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            s.handle,
            body.len()
        ),
    );
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("\r\nretry-after: "),
        "{answer}"
    );
    assert!(answer.contains("\"storage_full\""), "{answer}");
    assert!(answer.contains("full"), "{answer}");
    // Reads go on; health says degraded, with the reason; the failures are counted.
    let (status, read) = rpc(&s, "session.read", json!({}));
    assert_eq!(status, 200, "{read}");
    assert!(!read["result"]["messages"].as_array().unwrap().is_empty());
    let (status, health) = support::serve::get(&s, "/healthz");
    let health: serde_json::Value = serde_json::from_slice(&health).unwrap();
    assert_eq!(
        (status, &health["status"]),
        (200, &json!("degraded")),
        "{health}"
    );
    assert_eq!(health["reasons"][0]["code"], "storage_full", "{health}");
    let (_, metrics) = support::serve::get(&s, "/metrics");
    let metrics = String::from_utf8_lossy(&metrics).into_owned();
    let count = |line: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(line))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{line}: {metrics}"))
    };
    assert!(count("broca_wal_write_errors_total{kind=\"storage_full\"}") >= 1);
    assert!(count("broca_storage_full_total") >= 1);
    assert_eq!(count("broca_storage_degraded"), 1);

    // Space comes back: the same send goes through, health is ok, no restart.
    std::fs::remove_file(&filler).unwrap();
    let (status, r) = send("s2");
    assert_eq!(status, 200, "{r}");
    let run = r["result"]["run_id"].as_str().unwrap().to_string();
    let done = support::serve::result_when_ended(&s, "s2", &run);
    assert_eq!(done["state"], "completed", "{done}");
    let (_, health) = support::serve::get(&s, "/healthz");
    let health: serde_json::Value = serde_json::from_slice(&health).unwrap();
    assert_eq!(health["status"], "ok", "{health}");
    // The store catches up on its own: check (read-only) agrees with the WALs.
    wait_for("the store to agree with the WALs", || {
        broca(&state)
            .args(["store", "check"])
            .output()
            .unwrap()
            .status
            .success()
    });
}
