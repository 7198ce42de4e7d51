//! Archive: idle WALs packed into sealed containers and read back through every read path
//! (run.status, run.result, session.read, a subscription from the start, store check, wal
//! verify), a send to a packed session restoring its WAL first, damaged containers named and
//! kept, a crash at every step of pack and restore, a pack racing sends, and 10,000 sessions.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use serde_json::{json, Value};
use support::serve::{get, rpc, start, wait_for, Serve};
use support::{broca, fixture, Aimock};

fn cmd(state: &Path, args: &[&str]) -> Output {
    broca(state).args(args).output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn live_wals(state: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(state.join("wal"))
        .map(|d| {
            d.map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|x| x == "wal"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn containers(state: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(state.join("wal-archive"))
        .map(|d| {
            d.map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|x| x == "wac"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The archive counters of `/metrics`.
fn archive_metric(s: &Serve, name: &str) -> u64 {
    let (_, body) = get(s, "/metrics");
    String::from_utf8(body)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} in /metrics"))
}

/// The events of a subscription from the start, up to the first run_finished.
fn subscribe_until_finished(s: &Serve, session: &str) -> Vec<String> {
    let mut c = TcpStream::connect(&s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(
        format!(
            "GET /v1/subscribe?project_root=%2Fproj&harness=h&session={session}&from=start HTTP/1.1\r\nAuthorization: Bearer {}\r\n\r\n",
            s.handle
        )
        .as_bytes(),
    )
    .unwrap();
    let mut events = Vec::new();
    for line in BufReader::new(c).lines() {
        let line = line.expect("the subscription streams");
        if let Some(data) = line.strip_prefix("data: ") {
            events.push(data.to_string());
            if data.contains("\"type\":\"run_finished\"") {
                return events;
            }
        }
    }
    panic!("the subscription ended before run_finished: {events:?}")
}

fn send_and_wait(s: &Serve, session: &str, prompt: &str) -> String {
    let (status, r) = rpc(
        s,
        "session.send",
        json!({"session": session, "prompt": prompt, "model": "anthropic/m"}),
    );
    assert_eq!(status, 200, "{r}");
    let run_id = r["result"]["run_id"].as_str().unwrap().to_string();
    wait_for("the run to complete", || {
        rpc(
            s,
            "run.status",
            json!({"session": session, "run_id": run_id}),
        )
        .1["result"]["state"]
            == "completed"
    });
    run_id
}

/// What a reader sees of a session: its run's status and result, and its first page.
fn reads(s: &Serve, session: &str, run_id: &str) -> Value {
    let p = json!({"session": session, "run_id": run_id});
    json!({
        "status": rpc(s, "run.status", p.clone()).1,
        "result": rpc(s, "run.result", p).1,
        "page": rpc(s, "session.read", json!({"session": session})).1,
    })
}

#[test]
fn packed_sessions_read_back_through_every_path_and_a_send_restores_first() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let config = dir.path().join("serve.json");
    std::fs::write(&config, r#"{"idle_secs": 1}"#).unwrap();
    let peer = Aimock::start(&fixture("aimock.json"));
    let s = start(&state, &peer, &["--config", config.to_str().unwrap()]);
    let sessions = ["a", "b", "c"];
    let mut before = Vec::new();
    for session in sessions {
        let run_id = send_and_wait(&s, session, "hello there");
        before.push((session, run_id.clone(), reads(&s, session, &run_id)));
    }
    let events_before = subscribe_until_finished(&s, "a");
    wait_for("the idle actors to close", || {
        support::serve::metric(&s, "broca_sessions_live") == 0
    });
    let live_before: Vec<String> = live_wals(&state)
        .iter()
        .map(|p| records(&state, p.file_name().unwrap().to_str().unwrap()).unwrap())
        .collect();
    assert_eq!(live_before.len(), 3);

    // A dry run touches nothing.
    let dry = cmd(
        &state,
        &["archive", "pack", "--idle-days", "0", "--dry-run"],
    );
    assert!(dry.status.success(), "{}", text(&dry));
    assert!(
        text(&dry).contains("would pack 3 sessions"),
        "{}",
        text(&dry)
    );
    assert_eq!(live_wals(&state).len(), 3);
    assert!(containers(&state).is_empty());

    // Packed beside the running serve: the live WALs go, one container holds them.
    let packed = cmd(&state, &["archive", "pack", "--idle-days", "0"]);
    assert!(packed.status.success(), "{}", text(&packed));
    assert!(
        text(&packed).contains("packed 3 sessions"),
        "{}",
        text(&packed)
    );
    assert!(live_wals(&state).is_empty());
    assert_eq!(containers(&state).len(), 1);
    let listed = cmd(&state, &["archive", "list"]);
    assert!(listed.status.success());
    assert_eq!(
        text(&listed).matches(".wal (/proj, h, ").count(),
        3,
        "{}",
        text(&listed)
    );
    let verified = cmd(&state, &["archive", "verify"]);
    assert!(verified.status.success(), "{}", text(&verified));
    let wal_verify = cmd(&state, &["wal", "verify"]);
    assert!(wal_verify.status.success(), "{}", text(&wal_verify));
    assert!(
        text(&wal_verify).contains("1 containers checked, 0 failed"),
        "{}",
        text(&wal_verify)
    );

    // Every read answers exactly as before, from the archive, and writes nothing.
    for (session, run_id, was) in &before {
        assert_eq!(
            &reads(&s, session, run_id),
            was,
            "{session} read from the archive"
        );
    }
    assert_eq!(subscribe_until_finished(&s, "a"), events_before);
    assert!(live_wals(&state).is_empty(), "a read restored a WAL");
    let check = cmd(&state, &["store", "check"]);
    assert!(check.status.success(), "{}", text(&check));

    // A send to a packed session restores its WAL first, then appends to it.
    let restored_before = archive_metric(&s, "broca_archive_restored_total");
    let second = send_and_wait(&s, "a", "hello again");
    assert_eq!(
        archive_metric(&s, "broca_archive_restored_total"),
        restored_before + 1,
        "a send to a packed session restores its WAL before it writes"
    );
    let live = live_wals(&state);
    assert_eq!(live.len(), 1);
    let now = records(&state, live[0].file_name().unwrap().to_str().unwrap()).unwrap();
    let was = live_before
        .iter()
        .find(|b| now.starts_with(b.as_str()))
        .expect("the restored WAL goes on from its archived records (the same lineage)");
    assert!(now.len() > was.len());
    let first_run = &before[0].1;
    let r = rpc(
        &s,
        "run.result",
        json!({"session": "a", "run_id": first_run}),
    )
    .1;
    assert_eq!(
        r["result"]["state"], "completed",
        "the first run is still there: {r}"
    );
    assert!(
        std::fs::read_to_string(state.join("wal-archive/restored.jsonl"))
            .unwrap()
            .contains("\"session\":\"a\"")
    );

    // Packed again: a second container; the newest copy is the one read.
    wait_for("the idle actor to close", || {
        support::serve::metric(&s, "broca_sessions_live") == 0
    });
    let again = cmd(&state, &["archive", "pack", "--idle-days", "0"]);
    assert!(again.status.success(), "{}", text(&again));
    assert_eq!(containers(&state).len(), 2);
    assert!(live_wals(&state).is_empty());
    let r = rpc(&s, "run.result", json!({"session": "a", "run_id": second})).1;
    assert_eq!(r["result"]["state"], "completed", "{r}");
    assert!(
        archive_metric(&s, "broca_archive_packed_total") == 0,
        "packed by the CLI, not serve"
    );
    let check = cmd(&state, &["store", "check"]);
    assert!(check.status.success(), "{}", text(&check));
}

#[test]
fn serve_packs_idle_sessions_itself_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let config = dir.path().join("serve.json");
    std::fs::write(
        &config,
        r#"{"idle_secs": 1, "archive_after_days": 0, "archive_every_secs": 1}"#,
    )
    .unwrap();
    let peer = Aimock::start(&fixture("aimock.json"));
    let s = start(&state, &peer, &["--config", config.to_str().unwrap()]);
    let run_id = send_and_wait(&s, "a", "hello there");
    wait_for("the scheduler to pack the idle session", || {
        live_wals(&state).is_empty() && !containers(&state).is_empty()
    });
    assert_eq!(archive_metric(&s, "broca_archive_packed_total"), 1);
    let r = rpc(&s, "run.result", json!({"session": "a", "run_id": run_id})).1;
    assert_eq!(r["result"]["state"], "completed", "{r}");
}

/// Makes three sessions with `broca run`; returns each WAL's name and records.
fn three_sessions(state: &Path, peer: &Aimock) -> Vec<(String, String)> {
    for session in ["x", "y", "z"] {
        let o = broca(state)
            .env("ANTHROPIC_API_KEY", "sk-archive-test-0123456789")
            .args(["run", "--model", "anthropic/m", "--base-url", &peer.url()])
            .args([
                "--project-root",
                "/proj",
                "--harness",
                "h",
                "--session",
                session,
            ])
            .arg("hello")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
    }
    live_wals(state)
        .iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let r = records(state, &name).unwrap();
            (name, r)
        })
        .collect()
}

/// A WAL's records as `broca wal dump` prints them (live, or from the archive).
fn records(state: &Path, name: &str) -> Option<String> {
    let o = cmd(
        state,
        &[
            "wal",
            "dump",
            state.join("wal").join(name).to_str().unwrap(),
        ],
    );
    o.status
        .success()
        .then(|| String::from_utf8(o.stdout).unwrap())
}

/// Each session readable exactly once: live, or from a sealed container; a live WAL beside
/// an archived copy holds the same records (never two diverging copies).
fn each_session_readable_once(state: &Path, wals: &[(String, String)], when: &str) {
    let v = cmd(state, &["wal", "verify"]);
    assert!(v.status.success(), "{when}: {}", text(&v));
    let listed = text(&cmd(state, &["archive", "list"]));
    for (name, want) in wals {
        let live = state.join("wal").join(name).exists();
        let archived = listed.contains(name.as_str());
        assert!(
            live || archived,
            "{when}: {name} is neither live nor archived"
        );
        let got = records(state, name);
        assert_eq!(
            got.as_deref(),
            Some(want.as_str()),
            "{when}: {name} reads otherwise"
        );
    }
}

/// Runs `args` with the kill point `point` armed; the process must die there (SIGABRT). With
/// `power_loss`, the kill is a power cut (see `broca_io::power_loss`): a file whose directory
/// entry was not synced when it died is gone afterwards. Answers how many files the cut took.
fn cut_at(state: &Path, point: &str, args: &[&str], power_loss: bool) -> usize {
    use std::os::unix::process::ExitStatusExt;
    let ledger = state.with_extension("power-loss.ledger");
    let mut c = broca(state);
    c.env("BROCA_CRASH_AT", point);
    if power_loss {
        c.env("BROCA_POWER_LOSS", &ledger);
    }
    let o = c.args(args).output().unwrap();
    assert_eq!(
        o.status.signal(),
        Some(libc::SIGABRT),
        "{point}: the cut was not reached: {}",
        text(&o)
    );
    if power_loss {
        broca_io::power_loss::cut_power(&ledger).unwrap().len()
    } else {
        0
    }
}

#[test]
fn a_crash_at_every_step_of_pack_and_restore_leaves_each_session_readable_once() {
    let peer = Aimock::start(&fixture("aimock.json"));
    // A kill keeps every file; a power cut takes the entries no directory sync covered.
    let mut lost = 0;
    for power_loss in [false, true] {
        for point in [
            "archive_written",
            "archive_sealed",
            "archive_removed_one",
            "archive_packed",
        ] {
            let when = format!("{point}, power loss {power_loss}");
            let dir = tempfile::tempdir().unwrap();
            let state = dir.path().join("state");
            let wals = three_sessions(&state, &peer);
            lost += cut_at(
                &state,
                point,
                &["archive", "pack", "--idle-days", "0"],
                power_loss,
            );
            each_session_readable_once(&state, &wals, &when);
            // The next pack finishes the job and cleans up what the cut one left.
            let o = cmd(&state, &["archive", "pack", "--idle-days", "0"]);
            assert!(o.status.success(), "{when}: {}", text(&o));
            assert!(live_wals(&state).is_empty(), "{when}");
            let temps: Vec<_> = std::fs::read_dir(state.join("wal-archive"))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".tmp"))
                .collect();
            assert!(temps.is_empty(), "{when}: {temps:?}");
            each_session_readable_once(&state, &wals, &when);
        }
        for point in ["archive_restore_written", "archive_restore_linked"] {
            let when = format!("{point}, power loss {power_loss}");
            let dir = tempfile::tempdir().unwrap();
            let state = dir.path().join("state");
            let wals = three_sessions(&state, &peer);
            assert!(cmd(&state, &["archive", "pack", "--idle-days", "0"])
                .status
                .success());
            let address = wals[0].0.trim_end_matches(".wal").to_string();
            lost += cut_at(&state, point, &["archive", "restore", &address], power_loss);
            each_session_readable_once(&state, &wals, &when);
            let o = cmd(&state, &["archive", "restore", &address]);
            assert!(o.status.success(), "{when}: {}", text(&o));
            assert!(
                state.join("wal").join(&wals[0].0).exists(),
                "{when}: restored"
            );
            // A pack cleans the cut restore's temporary file once it is old; the WAL is read
            // either way.
            each_session_readable_once(&state, &wals, &when);
        }
    }
    // The power cut at `archive_restore_linked` (the link made, its folder not yet synced)
    // took the restored WAL: the cuts did take files, and the sessions still read.
    assert!(lost >= 1, "no power cut took a file");
}

#[test]
fn a_damaged_or_truncated_container_is_named_and_nothing_is_deleted() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let wals = three_sessions(&state, &peer);
    assert!(cmd(&state, &["archive", "pack", "--idle-days", "0"])
        .status
        .success());
    let c = containers(&state).remove(0);
    let mut bytes = std::fs::read(&c).unwrap();
    // Flip a byte inside the second member's WAL bytes (its place from `archive list`'s
    // sizes: members follow the 16-byte magic back to back, in the order listed).
    let listed = text(&cmd(&state, &["archive", "list"]));
    let sizes: Vec<usize> = listed
        .lines()
        .filter(|l| l.starts_with("  "))
        .map(|l| {
            l.split("): ")
                .nth(1)
                .unwrap()
                .split(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    let names: Vec<&str> = listed
        .lines()
        .filter(|l| l.starts_with("  "))
        .map(|l| l.trim().split(' ').next().unwrap())
        .collect();
    let at = 16 + sizes[0] + sizes[1] / 2;
    bytes[at] ^= 0x40;
    let damaged = names[1].to_string();
    std::fs::write(&c, &bytes).unwrap();
    let o = cmd(&state, &["archive", "verify"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains(c.file_name().unwrap().to_str().unwrap()), "{t}");
    assert!(t.contains("do not match"), "{t}");
    // Named by its member and where that member starts.
    assert!(
        t.contains(&format!("member {damaged}: at offset {}", 16 + sizes[0])),
        "{t}"
    );
    let o = cmd(&state, &["wal", "verify"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    // The damaged member cannot be read (named), the others can; nothing was deleted.
    let dump = cmd(&state, &["store", "rebuild"]);
    let t = text(&dump);
    assert!(t.contains(&damaged), "{t}");
    assert!(c.exists());
    for (name, want) in &wals {
        if *name != damaged {
            assert_eq!(records(&state, name).as_deref(), Some(want.as_str()));
        }
    }

    // Truncated: no trailer, so never read as truth; reported, and kept.
    std::fs::write(&c, &bytes[..bytes.len() - 10]).unwrap();
    let o = cmd(&state, &["archive", "verify"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains("no valid trailer"), "{}", text(&o));
    assert!(c.exists());
}

/// The two tests of this file that load the disk hardest run one at a time: beside the
/// 10,000-session pack, the race's sends could wait on their fsyncs past its client's
/// 20-second read timeout, which says nothing of what the race checks.
static HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_pack_racing_sends_to_the_same_session_loses_nothing() {
    let _heavy = HEAVY.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let config = dir.path().join("serve.json");
    std::fs::write(&config, r#"{"idle_secs": 1}"#).unwrap();
    let peer = Aimock::start(&fixture("aimock.json"));
    let s = start(&state, &peer, &["--config", config.to_str().unwrap()]);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let packer = {
        let (stop, state) = (stop.clone(), state.clone());
        std::thread::spawn(move || {
            let mut packed = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let o = cmd(&state, &["archive", "pack", "--idle-days", "0"]);
                assert!(o.status.success(), "{}", text(&o));
                if text(&o).contains("packed 1 sessions") {
                    packed += 1;
                }
            }
            packed
        })
    };
    let mut runs = Vec::new();
    for i in 0..8u64 {
        runs.push(send_and_wait(&s, "race", "hello there"));
        // Sometimes the actor closes (idle 1 s) and the pack takes the WAL before the next send.
        std::thread::sleep(Duration::from_millis(900 + (i % 3) * 250));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let packed = packer.join().unwrap();
    assert!(
        packed >= 1,
        "the pack never took the session: the race was not run"
    );
    assert!(
        archive_metric(&s, "broca_archive_restored_total") >= 1,
        "no send met a packed session"
    );
    for run_id in &runs {
        let r = rpc(
            &s,
            "run.result",
            json!({"session": "race", "run_id": run_id}),
        )
        .1;
        assert_eq!(r["result"]["state"], "completed", "{run_id}: {r}");
    }
    // One lineage, every run in it once.
    let name = state.join("wal").join(
        broca::wal::SessionTriple::new("/proj", "h", "race")
            .unwrap()
            .address()
            .wal_file_name(),
    );
    let dump = records(&state, name.file_name().unwrap().to_str().unwrap()).unwrap();
    assert_eq!(dump.matches("\"kind\":\"run_started\"").count(), runs.len());
    let page = rpc(&s, "session.read", json!({"session": "race", "limit": 100})).1;
    assert_eq!(
        page["result"]["messages"].as_array().map(Vec::len),
        Some(2 * runs.len()),
        "{page}"
    );
    let check = cmd(&state, &["store", "check"]);
    assert!(check.status.success(), "{}", text(&check));
}

#[test]
fn ten_thousand_sessions_packed_and_read_back() {
    let _heavy = HEAVY.lock().unwrap_or_else(|p| p.into_inner());
    const SESSIONS: usize = 10_000;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let wal_dir = state.join("wal");
    broca::owner_only::create_dir(&wal_dir).unwrap();
    let triples: Vec<_> = (0..SESSIONS)
        .map(|i| broca::wal::SessionTriple::new("/proj", "h", &format!("s{i}")).unwrap())
        .collect();
    broca_shards::run_local(async {
        for t in &triples {
            let (w, _) = broca::wal::WalWriter::open(
                &wal_dir,
                t,
                broca_io::LogConfig::default(),
                broca_io::Committer::default(),
            )
            .await
            .unwrap();
            w.close().await.unwrap();
        }
    })
    .unwrap();
    let o = cmd(&state, &["archive", "pack", "--idle-days", "0"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("packed {SESSIONS} sessions")),
        "{}",
        text(&o)
    );
    assert!(live_wals(&state).is_empty());
    let sealed = containers(&state).len();
    assert_eq!(
        sealed,
        SESSIONS.div_ceil(broca::archive::MEMBERS_PER_CONTAINER)
    );
    for t in &triples {
        let path = broca::wal::writer::wal_path(&wal_dir, t);
        let (_, scan) = broca::wal::verify::read_and_scan_if_any(&path)
            .unwrap()
            .unwrap_or_else(|| panic!("{} is missing", path.display()));
        assert_eq!(&scan.header.triple, t);
        assert_eq!(scan.frames.len(), 1, "its lease record");
    }
    let v = cmd(&state, &["wal", "verify"]);
    assert!(v.status.success(), "{}", text(&v));
}
