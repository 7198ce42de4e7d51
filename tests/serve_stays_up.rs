//! `broca serve` stays up against what a host running it for days meets: idleness (no accept
//! loop wakes), a full descriptor table, greedy subscribers that never read, a closed stderr,
//! a second serve on the same state dir, files that are not broca's, ambiguous HTTP framing
//! and requests that trickle in, and a few small things (cursors beyond the head, control
//! characters in a model id, a state dir that is a file, `wal verify` of a huge sparse file).

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::Stdio;
use std::rc::Rc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::serve::{command, get, http, metric, rpc, spawn, start, wait_for, Serve};
use support::{broca, Aimock};

/// A base URL where nothing listens: the provider is down.
const DOWN: &str = "http://127.0.0.1:1";

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Runs a command that should refuse at once; a daemon that starts instead is killed and the
/// test fails.
fn refused(cmd: &mut std::process::Command) -> std::process::Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(15);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > until {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "it started instead of refusing: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn sigterm(s: &Serve) {
    // SAFETY: kill(2) on a child this test started.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
}

/// Waits for the child to exit, at most `within`.
fn exit_within(s: &mut Serve, within: Duration) -> std::process::ExitStatus {
    let until = Instant::now() + within;
    loop {
        if let Some(status) = s.child.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < until,
            "serve did not exit within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// docs/metrics.md lists every family /metrics serves, so an operator can look each one up.
#[test]
fn every_metric_family_is_documented() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = command(&dir.path().join("state"), DOWN, &[]);
    let s = spawn(cmd.stderr(Stdio::inherit()), &dir.path().join("state"));
    let (status, text) = get(&s, "/metrics");
    assert_eq!(status, 200);
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/metrics.md"))
            .unwrap();
    let families: Vec<String> = String::from_utf8_lossy(&text)
        .lines()
        .filter_map(|l| l.strip_prefix("# HELP "))
        .map(|l| l.split(' ').next().unwrap().to_string())
        .collect();
    assert!(families.len() > 20, "{families:?}");
    let missing: Vec<&String> = families
        .iter()
        .filter(|f| !doc.contains(&format!("`{f}`")))
        .collect();
    assert!(missing.is_empty(), "docs/metrics.md lacks {missing:?}");
}

#[test]
fn an_idle_daemon_never_wakes_its_accept_loops() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = command(&dir.path().join("state"), DOWN, &[]);
    let s = spawn(cmd.stderr(Stdio::inherit()), &dir.path().join("state"));
    let (_, text) = get(&s, "/metrics");
    assert!(
        String::from_utf8_lossy(&text).contains("broca_accept_wakes_total{shard=\"0\"}"),
        "/metrics counts accept-loop wakes"
    );
    let before = metric(&s, "broca_accept_wakes_total");
    std::thread::sleep(Duration::from_secs(5));
    let after = metric(&s, "broca_accept_wakes_total");
    // Each /metrics request is a connection accepted, not a wake; a loop that polled its
    // stop flag on a timer would have woken about 250 times per listener here.
    assert_eq!(after, before, "accept loops woke while idle");
    let (status, _) = get(&s, "/healthz");
    assert_eq!(status, 200);
}

/// The child may open at most `n` descriptors (its soft and hard limit).
fn limit_descriptors(cmd: &mut std::process::Command, n: u64) {
    // SAFETY: setrlimit in the child before exec; async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: n,
                rlim_max: n,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[test]
fn running_out_of_descriptors_pauses_accepting_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let stderr_path = dir.path().join("stderr");
    let mut cmd = command(&state, DOWN, &["--shards", "1"]);
    cmd.stderr(std::fs::File::create(&stderr_path).unwrap());
    limit_descriptors(&mut cmd, 256);
    let mut s = spawn(&mut cmd, &state);
    let hold = |s: &Serve| {
        let mut held = Vec::new();
        for _ in 0..300 {
            if let Ok(c) = TcpStream::connect(&s.addr) {
                held.push(c);
            }
        }
        held
    };
    // More connections than the daemon has descriptors for, held open.
    let mut held = hold(&s);
    std::thread::sleep(Duration::from_secs(2));
    // Those past the limit were told, with a 503, rather than left hanging.
    let mut told = 0;
    for c in &mut held {
        c.set_read_timeout(Some(Duration::from_millis(5))).unwrap();
        let mut buf = [0u8; 64];
        if let Ok(n) = c.read(&mut buf) {
            told += usize::from(buf[..n].starts_with(b"HTTP/1.1 503"));
        }
    }
    assert!(told > 0, "no connection was shed with a 503");
    drop(held);
    // Descriptors free up: the daemon answers again, soon.
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let ok = TcpStream::connect(&s.addr).ok().and_then(|mut c| {
            c.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
            let req = format!(
                "GET /healthz HTTP/1.1\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
                s.handle
            );
            c.write_all(req.as_bytes()).ok()?;
            Some(support::serve::read_response(&mut c).0)
        });
        if ok == Some(200) {
            break;
        }
        assert!(Instant::now() < until, "the daemon did not recover");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(metric(&s, "broca_accept_shed_total") >= told as u64);
    // The failures were reported, not once per failed accept.
    let log = std::fs::read_to_string(&stderr_path).unwrap();
    let accept_lines = log.lines().filter(|l| l.contains("accept on")).count();
    assert!(
        (1..=20).contains(&accept_lines),
        "{accept_lines} accept log lines:\n{}",
        &log[..log.len().min(2000)]
    );
    // Out of descriptors again, SIGTERM still stops it.
    let held = hold(&s);
    std::thread::sleep(Duration::from_millis(500));
    sigterm(&s);
    let status = exit_within(&mut s, Duration::from_secs(15));
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    drop(held);
}

#[test]
fn sessions_that_find_no_descriptor_wait_for_an_idle_one_to_close_and_are_logged_in_summary() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let stderr_path = dir.path().join("stderr");
    let peer = Aimock::start(&support::fixture("aimock.json"));
    // More open sessions allowed than there are descriptors (serve warns of it at start).
    let config = dir.path().join("serve.json");
    std::fs::write(&config, r#"{"open_sessions_max": 1000}"#).unwrap();
    let extra = ["--shards", "1", "--config", config.to_str().unwrap()];
    let mut cmd = command(&state, &peer.url(), &extra);
    cmd.stderr(std::fs::File::create(&stderr_path).unwrap());
    limit_descriptors(&mut cmd, 128);
    let s = spawn(&mut cmd, &state);
    // Each open session holds its WAL's descriptor (idle sessions stay open 30 s): new
    // sessions soon find none left. Each such send waits for an idle session to close and is
    // then admitted; none is refused. (A connection that comes while not one descriptor is
    // free is answered 503 `too_many_open_files` at accept, and is made again, as a client
    // would.)
    let mut shed = 0;
    for i in 0..200 {
        let mut attempts = 0;
        let (status, r) = loop {
            let (status, r) = rpc(
                &s,
                "session.send",
                json!({"session": format!("f{i}"), "prompt": "hello there", "model": "anthropic/m"}),
            );
            if status == 503 && r["error"]["code"] == "too_many_open_files" && attempts < 100 {
                attempts += 1;
                shed += 1;
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            break (status, r);
        };
        assert_eq!(status, 200, "send {i} (after {attempts} sheds): {r}");
    }
    let short = metric(&s, "broca_sessions_out_of_descriptors_total") as usize;
    // Running short once is enough: the idle sessions are then told to close, each giving
    // its descriptor back, and the sends after it fit.
    assert!(
        short >= 1,
        "no session met the limit: the test did not run out"
    );
    assert!(metric(&s, "broca_sessions_waited_for_room_total") as usize >= short);
    assert!(
        metric(&s, "broca_sessions_live") < 128,
        "the open sessions stay within the descriptors"
    );
    eprintln!("{short} sessions found no descriptor; {shed} connections were shed at accept");
    // One line, then a summary at most every 10 s: not a line per session.
    let log = std::fs::read_to_string(&stderr_path).unwrap();
    let lines = log
        .lines()
        .filter(|l| l.contains("out of file descriptors"))
        .count();
    assert!(
        (1..=3).contains(&lines),
        "{lines} lines for {short} sessions short of a descriptor:\n{}",
        &log[..log.len().min(3000)]
    );
    // The window's count is logged when it closes, with no more to carry it: the lines add
    // up to every session that met the limit.
    let counted = || {
        let log = std::fs::read_to_string(&stderr_path).unwrap();
        let summed: usize = log
            .lines()
            .filter_map(|l| {
                let (head, _) = l.split_once(" more sessions could not open their WAL")?;
                head.rsplit(' ').next()?.parse::<usize>().ok()
            })
            .sum();
        1 + summed
    };
    let until = Instant::now() + Duration::from_secs(30);
    while counted() < short && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(counted(), short);
    // The sessions that did open are whole: the first one's run completed.
    let first = rpc(&s, "run.status", json!({"session": "f0"})).1;
    assert_ne!(first["result"], Value::Null, "{first}");
}

/// Writes a WAL of about `mib` MiB for the session (/proj, h, s1): runs whose prompts are
/// 200 KiB each, answered by the scripted model.
fn big_wal(state: &Path, mib: usize) {
    use broca::core::admission::SendRequest;
    use broca::session::SessionActor;
    use broca_testkit::{CountingTools, Script, ScriptedModel};
    let wal_dir = state.join("wal");
    broca::owner_only::create_dir(&wal_dir).unwrap();
    let triple = broca::wal::SessionTriple::new("/proj", "h", "s1").unwrap();
    let runs = mib * 5;
    broca_shards::run_local(async {
        let script = Script {
            tool_step_percent: 0,
            ..Script::default()
        };
        let mut actor: SessionActor<ScriptedModel, CountingTools> = SessionActor::opener(
            &wal_dir,
            &triple,
            Rc::new(ScriptedModel::new(script)),
            Rc::new(CountingTools::default()),
        )
        .tool_specs(Vec::new())
        .log(broca_io::LogConfig::default())
        .committer(broca_io::Committer::default())
        .open()
        .await
        .unwrap();
        for i in 0..runs {
            let req = SendRequest {
                prompt: format!("{i} {}", "p".repeat(200 * 1024)),
                model: "scripted/m1".into(),
                ..SendRequest::default()
            };
            actor.send(&req).await.unwrap();
            actor.run_admitted().await.unwrap();
        }
        actor.close().await.unwrap();
    })
    .unwrap();
}

fn subscribe_request(s: &Serve, from: &str, extra_header: &str) -> String {
    format!(
        "GET /v1/subscribe?project_root=/proj&harness=h&session=s1&from={from} HTTP/1.1\r\n\
         Authorization: Bearer {}\r\n{extra_header}\r\n",
        s.handle
    )
}

#[test]
fn subscribers_that_never_read_cost_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    big_wal(&state, 25);
    let wal_bytes: u64 = std::fs::read_dir(state.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert!(wal_bytes >= 25 << 20, "the WAL has {wal_bytes} bytes");
    let mut cmd = command(&state, DOWN, &["--shards", "1"]);
    let s = spawn(cmd.stderr(Stdio::inherit()), &state);
    let pid = s.child.id();
    // One subscriber that reads, to see the replay works and the session is warm.
    let mut reader = TcpStream::connect(&s.addr).unwrap();
    reader
        .write_all(subscribe_request(&s, "start", "").as_bytes())
        .unwrap();
    let mut first = [0u8; 4096];
    reader
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let n = loop {
        match reader.read(&mut first) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => break r.unwrap(),
        }
    };
    assert!(first[..n].starts_with(b"HTTP/1.1 200"));
    drop(reader);
    // The store projects the 25 MiB WAL at start on its own thread: the baseline is taken
    // once that is done and the RSS holds still.
    let until = Instant::now() + Duration::from_secs(30);
    let mut before = rss_kib(pid);
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = rss_kib(pid);
        let still = now.abs_diff(before) < 512;
        before = now;
        if still || Instant::now() > until {
            break;
        }
    }
    let mut greedy = Vec::new();
    for _ in 0..50 {
        let mut c = TcpStream::connect(&s.addr).unwrap();
        c.write_all(subscribe_request(&s, "start", "").as_bytes())
            .unwrap();
        greedy.push(c); // never read
    }
    // Let every replay run until its connection's buffers are full.
    std::thread::sleep(Duration::from_secs(4));
    let after = rss_kib(pid);
    let added_mib = after.saturating_sub(before) / 1024;
    assert!(
        added_mib < 50,
        "50 subscribers that do not read added {added_mib} MiB ({before} -> {after} KiB)"
    );
    let (status, _) = get(&s, "/healthz");
    assert_eq!(status, 200);
}

#[test]
fn a_closed_stderr_neither_panics_nor_keeps_runs_from_being_sealed() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut cmd = command(&state, DOWN, &["--grace-secs", "1"]);
    cmd.env("BROCA_LOG", "info").stderr(Stdio::piped());
    let mut s = spawn(&mut cmd, &state);
    drop(s.child.stderr.take()); // the reading end is gone: every log write is EPIPE
    let mut runs = Vec::new();
    for i in 0..3 {
        let (status, r) = rpc(
            &s,
            "session.send",
            json!({"session": format!("s{i}"), "prompt": "hi", "model": "anthropic/m"}),
        );
        assert_eq!(status, 200, "{r}");
        runs.push(r["result"]["run_id"].as_str().unwrap().to_string());
    }
    std::thread::sleep(Duration::from_secs(2)); // the provider is down: attempts fail, logged
    let (status, _) = get(&s, "/healthz");
    assert_eq!(status, 200, "the daemon stopped answering");
    sigterm(&s);
    let status = exit_within(&mut s, Duration::from_secs(20));
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    // Every run was sealed with one terminal record before the daemon exited.
    let records = support::dump_all(&state);
    for run in &runs {
        let terminals: Vec<&Value> = records
            .iter()
            .filter(|r| {
                matches!(r["kind"].as_str(), Some("run_finished" | "run_paused"))
                    && r["record"]["run_id"] == run.as_str()
            })
            .collect();
        assert_eq!(terminals.len(), 1, "run {run}: {terminals:?}");
    }
}

#[test]
fn a_second_serve_on_the_same_state_dir_refuses_and_the_first_keeps_working() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let peer = Aimock::start(&support::fixture("aimock.json"));
    let first = start(&state, &peer, &[]);
    let serve_json = std::fs::read(state.join("serve.json")).unwrap();
    let handle = std::fs::read(state.join("serve.handle")).unwrap();
    let out = refused(&mut command(&state, DOWN, &[]));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("pid {}", first.child.id())),
        "the refusal names the owner: {err}"
    );
    assert_eq!(std::fs::read(state.join("serve.json")).unwrap(), serve_json);
    assert_eq!(std::fs::read(state.join("serve.handle")).unwrap(), handle);
    assert!(first.socket.exists(), "the first daemon's socket is gone");
    assert_eq!(get(&first, "/healthz").0, 200);
    let (status, r) = rpc(
        &first,
        "session.send",
        json!({"prompt": "hello there", "model": "anthropic/m"}),
    );
    assert_eq!(status, 200, "{r}");
    // Another state dir, but the first daemon's live socket: refused, left alone.
    let other = dir.path().join("other");
    let sock = first.socket.to_str().unwrap();
    let out = refused(&mut command(&other, DOWN, &["--socket", sock]));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("running process"));
    assert_eq!(get(&first, "/healthz").0, 200);
    // A file that is not a socket is never removed.
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, "keep me").unwrap();
    let out = refused(&mut command(
        &other,
        DOWN,
        &["--socket", notes.to_str().unwrap()],
    ));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a socket"));
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "keep me");
}

#[test]
fn ambiguous_framing_is_refused_and_a_trickled_head_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(dir.path()).unwrap();
    let config = dir.path().join("serve.json");
    std::fs::write(&config, r#"{"request_timeout_ms": 1000}"#).unwrap();
    let mut cmd = command(&state, DOWN, &["--config", config.to_str().unwrap()]);
    let s = spawn(cmd.stderr(Stdio::inherit()), &state);
    let auth = format!("Authorization: Bearer {}\r\n", s.handle);
    let body =
        r#"{"method":"run.status","params":{"project_root":"/p","harness":"h","session":"s"}}"#;
    for lengths in [
        format!("Content-Length: {}\r\nContent-Length: 5\r\n", body.len()),
        format!("Content-Length: +{}\r\n", body.len()),
    ] {
        let raw = format!(
            "POST /v1/rpc HTTP/1.1\r\n{auth}{lengths}\r\n{body}GET /healthz HTTP/1.1\r\n{auth}\r\n"
        );
        let mut c = TcpStream::connect(&s.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(raw.as_bytes()).unwrap();
        let (status, out) = support::serve::read_response(&mut c);
        assert_eq!(
            status,
            400,
            "{lengths:?}: {}",
            String::from_utf8_lossy(&out)
        );
        // ...and the connection is closed: nothing after the body is read as a request.
        let mut rest = Vec::new();
        let _ = c.read_to_end(&mut rest);
        assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
    }
    // A head sent a byte every 100 ms never completes: 408 at its deadline (1 s), not later.
    let mut c = TcpStream::connect(&s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let start = Instant::now();
    let head = format!(
        "GET /healthz HTTP/1.1\r\n{auth}X-Padding: {}\r\n\r\n",
        "y".repeat(200)
    );
    let mut got = Vec::new();
    for b in head.bytes() {
        if c.write_all(&[b]).is_err() {
            break;
        }
        let mut buf = [0u8; 512];
        if let Ok(n) = c.read(&mut buf) {
            got.extend_from_slice(&buf[..n]);
            if n == 0 || !got.is_empty() {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let took = start.elapsed();
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408 Request Timeout"), "{text:?}");
    assert!(took < Duration::from_secs(5), "408 after {took:?}");
}

#[test]
fn small_things_get_clear_answers() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let peer = Aimock::start(&support::fixture("aimock.json"));
    let s = start(&state, &peer, &[]);
    // Error messages do not repeat their code.
    let (status, r) = rpc(
        &s,
        "session.send",
        json!({"prompt": "", "model": "anthropic/m"}),
    );
    assert_eq!(
        (status, r["error"]["code"].as_str()),
        (400, Some("invalid_params"))
    );
    let message = r["error"]["message"].as_str().unwrap();
    assert!(!message.starts_with("invalid_params"), "{message}");
    // CR/LF inside a model id: refused, and not echoed raw.
    let (status, r) = rpc(
        &s,
        "session.send",
        json!({"prompt": "hi", "model": "anthropic/m\r\nx-evil: 1"}),
    );
    assert_eq!(status, 400, "{r}");
    assert!(!r["error"]["message"].as_str().unwrap().contains('\n'));
    // A cursor beyond the session's head is refused, for a session with and without a WAL.
    let (status, r) = rpc(
        &s,
        "session.send",
        json!({"prompt": "hello there", "model": "anthropic/m"}),
    );
    assert_eq!(status, 200, "{r}");
    let run_id = r["result"]["run_id"].as_str().unwrap().to_string();
    wait_for("the run to end", || {
        rpc(&s, "run.status", json!({"run_id": run_id})).1["result"]["state"] != "active"
    });
    for (session, cursor) in [("s1", "9999.0"), ("never", "3.0")] {
        let req = format!(
            "GET /v1/subscribe?project_root=/proj&harness=h&session={session} HTTP/1.1\r\n\
             Authorization: Bearer {}\r\nLast-Event-ID: {cursor}\r\n\r\n",
            s.handle
        );
        let (status, body) = http(&s.addr, req.as_bytes());
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(status, 400, "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("beyond"),
            "{v}"
        );
    }
    // A state dir that is a regular file: the error names it.
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let out = refused(&mut command(&file, DOWN, &[]));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is a file, not a folder"), "{err}");
}

#[test]
fn wal_verify_reads_a_huge_sparse_file_in_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    big_wal(&state, 1);
    let wal = std::fs::read_dir(state.join("wal"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    // The records, then a hole of 256 MiB (zeros that take no disk).
    let f = std::fs::OpenOptions::new().write(true).open(&wal).unwrap();
    f.set_len(256 << 20).unwrap();
    drop(f);
    let mut child = broca(&state)
        .args(["wal", "verify"])
        .arg(&wal)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // The peak resident set of the process since its exec, sampled until it exits.
    let pid = child.id();
    let mut peak_kib = 0u64;
    let status = loop {
        if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            if let Some(hwm) = text
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            {
                peak_kib = peak_kib.max(hwm);
            }
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(status.success(), "{status:?}: {out}");
    assert!(out.contains("intact"), "{out}");
    let peak_mib = peak_kib / 1024;
    assert!(
        peak_mib < 64,
        "wal verify peaked at {peak_mib} MiB for a 256 MiB file"
    );
}

/// Takes an exclusive flock on `path` (created if missing), held while the file stays open.
fn hold_flock(path: &Path) -> std::fs::File {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap();
    // SAFETY: flock(2) on a descriptor this test owns.
    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
    f
}

#[test]
fn a_session_that_cannot_take_its_commands_refuses_past_its_queue_and_loses_none() {
    const SENDS: usize = 300;
    const INBOX: usize = 256; // a session's commands waiting (docs/architecture.md)
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let config = dir.path().join("serve.json");
    std::fs::write(&config, r#"{"idle_secs": 1}"#).unwrap();
    let peer = Aimock::start(&support::fixture("aimock.json"));
    let s = start(&state, &peer, &["--config", config.to_str().unwrap()]);
    let send = |s: &Serve, id: &str| {
        rpc(
            s,
            "session.send",
            json!({"prompt": "hello there", "model": "anthropic/m", "send_id": id}),
        )
    };
    assert_eq!(send(&s, "first").0, 200);
    wait_for("the session to close when idle", || {
        metric(&s, "broca_sessions_live") == 0 && metric(&s, "broca_runs_active") == 0
    });

    // A pack holds the session's WAL (its lock and the WAL's lease): the next actor waits in
    // its open and reads no command, so every send queues in front of it.
    let wal = state.join("wal").join(
        broca::wal::SessionTriple::new("/proj", "h", "s1")
            .unwrap()
            .address()
            .wal_file_name(),
    );
    std::fs::create_dir_all(state.join("wal-archive")).unwrap();
    let pack = hold_flock(&state.join("wal-archive").join("pack.lock"));
    let lease = hold_flock(&wal);
    let answers: Vec<(u16, Value)> = std::thread::scope(|scope| {
        let sends: Vec<_> = (0..SENDS)
            .map(|i| {
                let s = &s;
                scope.spawn(move || send(s, &format!("k{i}")))
            })
            .collect();
        // Those past the queue are told at once; the rest wait for the session.
        wait_for("the sends past the session's queue to be refused", || {
            metric(&s, "broca_session_queue_full_total") as usize >= SENDS - INBOX
        });
        drop((lease, pack));
        sends.into_iter().map(|h| h.join().unwrap()).collect()
    });

    let code = |r: &Value| r["error"]["code"].as_str().unwrap_or("").to_string();
    let full: Vec<_> = answers
        .iter()
        .filter(|(_, r)| code(r) == "session_queue_full")
        .collect();
    assert_eq!(full.len(), SENDS - INBOX, "{:?}", &answers[..3]);
    for (status, r) in &full {
        assert_eq!(*status, 503, "{r}");
        assert_eq!(r["error"]["class"], "transient", "{r}");
        assert!(
            r["error"]["message"].as_str().unwrap().contains("retry"),
            "{r}"
        );
    }
    assert_eq!(
        metric(&s, "broca_session_queue_full_total") as usize,
        SENDS - INBOX
    );
    // The session took the others in order once it opened: the first starts a run, the
    // next are queued behind it (answered pending, at most 64 waiting at a time) or refused
    // busy; nothing was left unanswered.
    let state_of = |r: &Value| r["result"]["state"].as_str().unwrap_or("").to_string();
    let started = answers
        .iter()
        .filter(|(_, r)| r["result"]["run_id"].is_string())
        .count();
    let pending = answers
        .iter()
        .filter(|(_, r)| state_of(r) == "pending")
        .count();
    let busy = answers
        .iter()
        .filter(|(_, r)| code(r) == "session_busy")
        .count();
    assert!(started >= 1, "{:?}", &answers[..3]);
    assert!(pending >= 1, "{:?}", &answers[..3]);
    assert_eq!(started + pending + busy, INBOX, "{:?}", &answers[..3]);
    // Every admitted send runs to its end, and the session keeps working.
    let until = Instant::now() + Duration::from_secs(90);
    let finished = || {
        support::dump_all(&state)
            .into_iter()
            .filter(|r| r["kind"] == "run_finished")
            .map(|r| r["record"]["reason"].as_str().unwrap_or("").to_string())
            .collect::<Vec<_>>()
    };
    let runs = 1 + started + pending; // the first send's run, before the pack, counts too
    let ends = loop {
        let ends = finished();
        if ends.len() >= runs || Instant::now() > until {
            break ends;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(ends.len(), runs, "{ends:?}");
    assert!(ends.iter().all(|r| r == "completed"), "{ends:?}");
    assert_eq!(send(&s, "after").0, 200);
}
