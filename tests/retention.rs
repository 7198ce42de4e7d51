//! Whole-session retention (llm-runner/v1 `retention`, docs/retention.md) through a real
//! `broca serve`: a session past its retention answers `expired`, its every copy is deleted
//! behind a content-free tombstone, a send starts it afresh under the next history version,
//! and a kill between the tombstone and the deletion is finished by the next start. The
//! clock is moved by the debug build's `broca.debug.advance_clock`.

mod support;

use std::io::{Read, Write};
use std::path::Path;

use serde_json::{json, Value};
use support::serve::{post, rpc, send_until_completed, start, start_env, wait_for, Serve};
use support::{fixture, Aimock};

const TITLE: &str = "title-kept-with-the-run-only";

fn address() -> String {
    broca::wal::SessionTriple::new("/proj", "h", "s1")
        .unwrap()
        .address()
        .to_string()
}

fn advance(s: &Serve, ms: u64) -> (u16, Value) {
    post(
        s,
        &json!({"method": "broca.debug.advance_clock", "params": {"ms": ms}}).to_string(),
    )
}

/// Every file under `dir` whose bytes hold `needle` (the store's LMDB map aside: its freed
/// pages are reused, not wiped; docs/retention.md).
fn files_holding(dir: &Path, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n != "store") {
                    dirs.push(p);
                }
            } else if let Ok(bytes) = std::fs::read(&p) {
                if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                    found.push(p.display().to_string());
                }
            }
        }
    }
    found
}

/// What `broca archive retention` says of the state dir.
fn planned(state: &Path) -> String {
    let out = support::broca(state)
        .args(["archive", "retention"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

fn listed(s: &Serve) -> usize {
    let (_, r) = post(
        s,
        &json!({"method": "sessions.list", "params": {}}).to_string(),
    );
    r["result"]["sessions"].as_array().map_or(0, Vec::len)
}

#[test]
fn an_expired_session_answers_expired_is_deleted_and_a_send_starts_it_afresh() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let s = start(&state, &peer, &[]);
    let addr = address();

    let run = send_until_completed(
        &s,
        json!({"prompt": "hello", "model": "anthropic/m", "retention": 60, "title": TITLE}),
    );
    let (_, head) = rpc(&s, "session.head", json!({}));
    let updated_at = head["result"]["updated_at"].as_u64().unwrap();
    assert_eq!(head["result"]["history_version"], 1);
    wait_for("the store to list it", || listed(&s) == 1);
    let (_, runs) = rpc(&s, "runs.list", json!({}));
    assert_eq!(runs["result"]["runs"][0]["title"], TITLE);
    assert!(state.join(format!("retention/{addr}.json")).exists());
    // `broca archive retention` says what will happen before it does.
    let plan = planned(&state);
    assert!(
        plan.contains(&format!(
            "{addr}  /proj h s1  retention 60 s  expires at {}",
            updated_at + 60_000
        )),
        "{plan}"
    );

    // Lengthening is refused and writes nothing.
    let (status, r) = rpc(
        &s,
        "session.send",
        json!({"prompt": "hello", "model": "anthropic/m", "retention": 61}),
    );
    assert_eq!(status, 400, "{r}");
    assert_eq!(r["error"]["detail"]["field"], "retention");

    // A second before its expiry it is served; at its expiry it is gone.
    assert_eq!(advance(&s, 59_000).0, 200);
    assert_eq!(rpc(&s, "session.head", json!({})).0, 200);
    assert_eq!(advance(&s, 1_000).0, 200);
    let expired_at = updated_at + 60_000;
    for (method, params) in [
        ("session.read", json!({})),
        ("session.head", json!({})),
        ("session.history", json!({})),
        ("run.status", json!({"run_id": run})),
        ("run.result", json!({"run_id": run})),
        ("runs.list", json!({})),
    ] {
        let (status, r) = rpc(&s, method, params);
        assert_eq!(status, 410, "{method}: {r}");
        assert_eq!(r["error"]["code"], "expired", "{method}: {r}");
        assert_eq!(
            r["error"]["detail"]["expired_at_ms"], expired_at,
            "{method}"
        );
    }
    // Deleted everywhere: the WAL, its listing, the store's projection; the tombstone holds
    // identity and times, no content.
    assert!(!state.join(format!("wal/{addr}.wal")).exists());
    assert!(!state.join(format!("retention/{addr}.json")).exists());
    let tomb: Value = serde_json::from_slice(
        &std::fs::read(state.join(format!("tombstones/{addr}.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(tomb["expired_at_ms"], expired_at);
    assert_eq!(tomb["runs"], json!([run]));
    assert_eq!(files_holding(&state, TITLE), Vec::<String>::new());
    assert_eq!(files_holding(&state, "hello"), Vec::<String>::new());
    assert_eq!(listed(&s), 0);

    // A send starts a fresh record: kept forever, under the next history version.
    send_until_completed(&s, json!({"prompt": "hello", "model": "anthropic/m"}));
    let (_, head) = rpc(&s, "session.head", json!({}));
    assert_eq!(head["result"]["history_version"], 2, "{head}");
    let (status, r) = rpc(
        &s,
        "session.read",
        json!({"history_version": 1, "from_ordinal": 0}),
    );
    assert_eq!(
        (status, r["error"]["code"].clone()),
        (409, json!("history_changed")),
        "{r}"
    );
    let (_, page) = rpc(&s, "session.read", json!({"from_ordinal": 0}));
    assert_eq!(
        page["result"]["messages"].as_array().unwrap().len(),
        2,
        "{page}"
    );
    assert_eq!(advance(&s, 86_400_000).0, 200);
    assert_eq!(
        rpc(&s, "session.head", json!({})).0,
        200,
        "no retention: kept"
    );
    drop(s);

    // A restart keeps all of it, also once the archive packed the fresh record: the
    // tombstone of the old one never touches it.
    let out = support::broca(&state)
        .args(["archive", "pack", "--idle-days", "0"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(!state.join(format!("wal/{addr}.wal")).exists(), "packed");
    let s = start(&state, &peer, &[]);
    let (status, head) = rpc(&s, "session.head", json!({}));
    assert_eq!(status, 200, "{head}");
    assert_eq!(head["result"]["history_version"], 2, "{head}");
    let (_, page) = rpc(&s, "session.read", json!({"from_ordinal": 0}));
    assert_eq!(
        page["result"]["messages"].as_array().unwrap().len(),
        2,
        "{page}"
    );
}

/// A POST whose connection the daemon may drop (it aborts while answering).
fn post_dropped(s: &Serve, body: &str) {
    let raw = format!(
        "POST /v1/rpc HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: \
         application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        s.handle,
        body.len()
    );
    let mut c = std::net::TcpStream::connect(&s.addr).unwrap();
    c.write_all(raw.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
}

#[test]
fn a_kill_after_the_tombstone_is_finished_by_the_next_start() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let addr = address();
    let mut s = start_env(
        &state,
        &peer,
        &[],
        &[("BROCA_CRASH_AT", "retention_tombstoned:1")],
    );
    send_until_completed(
        &s,
        json!({"prompt": "hello", "model": "anthropic/m", "retention": 5}),
    );
    let (_, head) = rpc(&s, "session.head", json!({}));
    let expired_at = head["result"]["updated_at"].as_u64().unwrap() + 5_000;
    post_dropped(
        &s,
        &json!({"method": "broca.debug.advance_clock", "params": {"ms": 5_000}}).to_string(),
    );
    let status = s.child.wait().unwrap();
    assert!(
        !status.success(),
        "serve aborted at the tombstone: {status}"
    );
    // Killed between the two: the tombstone is durable, the content not yet deleted.
    assert!(state.join(format!("tombstones/{addr}.json")).exists());
    assert!(state.join(format!("wal/{addr}.wal")).exists());
    drop(s);
    let plan = planned(&state);
    assert!(
        plan.contains(&format!("{addr}  expired at {expired_at}: tombstoned")),
        "{plan}"
    );

    let s = start(&state, &peer, &[]);
    assert!(
        !state.join(format!("wal/{addr}.wal")).exists(),
        "finished at start"
    );
    assert!(!state.join(format!("retention/{addr}.json")).exists());
    let (status, r) = rpc(&s, "session.read", json!({}));
    assert_eq!(status, 410, "{r}");
    assert_eq!(r["error"]["detail"]["expired_at_ms"], expired_at);
    assert_eq!(planned(&state), "no session is kept with a retention\n");
}

/// A session nobody reads is deleted by shard 0's look, within the declared
/// `delete_within_ms` of its expiry, on the real clock.
#[test]
fn an_expired_session_nobody_reads_is_deleted_within_the_declared_bound() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let s = start(&state, &peer, &[]);
    let addr = address();
    send_until_completed(
        &s,
        json!({"prompt": "hello", "model": "anthropic/m", "retention": 1}),
    );
    let wal = state.join(format!("wal/{addr}.wal"));
    assert!(wal.exists());
    let began = std::time::Instant::now();
    while wal.exists() {
        assert!(
            began.elapsed().as_millis()
                < 1_000 + u128::from(broca::wire::role::RETENTION_DELETE_WITHIN_MS),
            "not deleted within its bound"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(state.join(format!("tombstones/{addr}.json")).exists());
    let (status, r) = rpc(&s, "session.head", json!({}));
    assert_eq!(
        (status, r["error"]["code"].clone()),
        (410, json!("expired")),
        "{r}"
    );
}

fn policy(keep: Value) -> Value {
    json!({"keep": keep, "archive_after_days": 0, "backup": false, "request_dumps": false})
}

fn tombstone(state: &Path) -> Value {
    let path = state.join(format!("tombstones/{}.json", address()));
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// llm-runner/v1 `session_retention` through serve: a policy is checked member by member and
/// frozen by the first send naming one; a release records itself and, with nothing running,
/// deletes the session before it answers; a deleted session answers `unknown_session` (not
/// `expired`), a repeat release `absent`, and the next send starts a new incarnation.
#[test]
fn a_storage_policy_is_frozen_and_a_release_deletes_the_session() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let s = start(&state, &peer, &[]);
    let addr = address();
    let send = |extra: Value| {
        let mut p = json!({"prompt": "hello", "model": "anthropic/m"});
        p.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        rpc(&s, "session.send", p)
    };

    // serve requires no policy: a session first sent without one carries the runner's.
    let (_, describe) = rpc(&s, "role.describe", json!({}));
    assert_eq!(
        describe["result"]["session_retention"],
        json!({"max_days": 3650, "max_unreleased_hold_ms": 86_400_000u64, "required": false}),
        "{describe}"
    );
    // Bad policies are refused by member path, and write nothing.
    for (bad, code, field) in [
        (
            json!({"retention_policy": policy(json!({"days": 0}))}),
            "invalid_params",
            "retention_policy.keep.days",
        ),
        (
            json!({"retention_policy": {"keep": "forever", "archive_after_days": 0, "backup": false}}),
            "invalid_params",
            "retention_policy.request_dumps",
        ),
        (
            json!({"retention_policy": {"keep": "none", "archive_after_days": 0, "backup": true, "request_dumps": false}}),
            "invalid_params",
            "retention_policy.backup",
        ),
        (
            json!({"retention_policy": policy(json!("forever")), "retention": 60}),
            "invalid_params",
            "retention_policy",
        ),
    ] {
        let (status, r) = send(bad.clone());
        assert_eq!(status, 400, "{bad}: {r}");
        assert_eq!(r["error"]["code"], code, "{bad}: {r}");
        assert_eq!(r["error"]["detail"]["field"], field, "{bad}: {r}");
    }
    let mut backup = policy(json!({"days": 3}));
    backup["backup"] = json!(true);
    let (status, r) = send(json!({"retention_policy": backup}));
    assert_eq!(
        (status, r["error"]["code"].clone()),
        (400, json!("backup_unsupported")),
        "{r}"
    );
    assert!(r["error"]["detail"]["reason"].is_string(), "{r}");
    assert!(
        !state.join(format!("wal/{addr}.wal")).exists(),
        "refusals write nothing"
    );

    let mut frozen = policy(json!("forever"));
    frozen["request_dumps"] = json!(true);
    let (status, r) = send(json!({"retention_policy": frozen}));
    assert_eq!(status, 200, "{r}");
    // Nothing acts on a `forever` policy by itself: the session is not listed among those
    // kept (a restart reads no WAL for it).
    let listing = state.join(format!("retention/{addr}.json"));
    assert!(!listing.exists(), "a forever policy is not listed");
    wait_for("the run to end", || {
        rpc(&s, "session.head", json!({})).1["result"]["last_run_state"]["state"] == "completed"
    });
    let (_, head) = rpc(&s, "session.head", json!({}));
    let head = &head["result"];
    assert_eq!(head["retention_policy"], frozen, "{head}");
    assert_eq!(
        head["retention_state"],
        json!({"source": "starter", "request_dumps_unsupported": true}),
        "{head}"
    );
    let incarnation = head["incarnation"].clone();
    // Another policy is refused with the frozen one; leaving it out is fine.
    let (status, r) = send(json!({"retention_policy": policy(json!({"days": 1}))}));
    assert_eq!(status, 409, "{r}");
    assert_eq!(r["error"]["code"], "retention_conflict");
    assert_eq!(r["error"]["detail"]["frozen"], frozen);
    send_until_completed(
        &s,
        json!({"prompt": "hello", "model": "anthropic/m", "title": TITLE}),
    );

    // Nothing runs: the release deletes it before answering.
    let (status, r) = rpc(&s, "session.release", json!({}));
    assert_eq!(
        (status, r["result"].clone()),
        (200, json!({"state": "deleted"})),
        "{r}"
    );
    assert!(!state.join(format!("wal/{addr}.wal")).exists());
    assert!(!state.join(format!("retention/{addr}.json")).exists());
    assert_eq!(tombstone(&state)["deleted"], true);
    assert_eq!(files_holding(&state, TITLE), Vec::<String>::new());
    for method in [
        "session.head",
        "session.read",
        "session.history",
        "runs.list",
    ] {
        let (status, r) = rpc(&s, method, json!({}));
        assert_eq!(status, 404, "{method}: {r}");
        assert_eq!(r["error"]["code"], "unknown_session", "{method}: {r}");
    }
    let (_, r) = rpc(&s, "session.release", json!({}));
    assert_eq!(r["result"], json!({"state": "absent"}), "{r}");

    // The next send starts a new incarnation, with the runner's policy until one is named.
    send_until_completed(&s, json!({"prompt": "hello", "model": "anthropic/m"}));
    let (_, head) = rpc(&s, "session.head", json!({}));
    let head = &head["result"];
    assert_ne!(head["incarnation"], incarnation, "{head}");
    assert_eq!(
        head["retention_state"],
        json!({"source": "runner"}),
        "{head}"
    );
    assert_eq!(head["retention_policy"], policy(json!("forever")), "{head}");
    let (_, page) = rpc(&s, "session.read", json!({"from_ordinal": 0}));
    assert_eq!(
        page["result"]["messages"].as_array().unwrap().len(),
        2,
        "only the fresh send's turn: {page}"
    );
}

/// `keep: "none"` is deleted a day after its last run ends and `keep: {days}` that many
/// days after its last activity, as `broca archive retention` says beforehand; a release's
/// deletion a kill cut short is finished by the next start.
#[test]
fn keep_none_and_keep_days_are_deleted_on_time_and_a_cut_release_is_finished_at_start() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let s = start(&state, &peer, &[]);
    let addr = address();
    send_until_completed(
        &s,
        json!({"prompt": "hello", "model": "anthropic/m", "retention_policy": policy(json!("none"))}),
    );
    assert!(
        state.join(format!("retention/{addr}.json")).exists(),
        "a policy that deletes is listed, so a restart finds it"
    );
    let (_, head) = rpc(&s, "session.head", json!({}));
    let updated_at = head["result"]["updated_at"].as_u64().unwrap();
    let plan = planned(&state);
    assert!(
        plan.contains(&format!(
            "{addr}  /proj h s1  keep none  expires at {}",
            updated_at + 86_400_000
        )),
        "{plan}"
    );
    assert_eq!(advance(&s, 86_400_000 - 1_000).0, 200);
    assert_eq!(
        rpc(&s, "session.head", json!({})).0,
        200,
        "kept until its hold ends"
    );
    assert_eq!(advance(&s, 2_000).0, 200);
    let (status, r) = rpc(&s, "session.head", json!({}));
    assert_eq!(
        (status, r["error"]["code"].clone()),
        (404, json!("unknown_session")),
        "{r}"
    );
    assert!(!state.join(format!("wal/{addr}.wal")).exists());

    send_until_completed(
        &s,
        json!({"prompt": "hello", "model": "anthropic/m",
            "retention_policy": policy(json!({"days": 2}))}),
    );
    assert_eq!(advance(&s, 2 * 86_400_000 - 1_000).0, 200);
    assert_eq!(rpc(&s, "session.head", json!({})).0, 200);
    assert_eq!(advance(&s, 2_000).0, 200);
    assert_eq!(rpc(&s, "session.head", json!({})).0, 404);

    // A release whose deletion a kill cut short (after the tombstone): the next start
    // finishes it, and the session answers as deleted, not expired (a process of its own:
    // the clock moved above is that process's alone).
    drop(s);
    let mut s = start_env(
        &state,
        &peer,
        &[],
        &[("BROCA_CRASH_AT", "retention_tombstoned:1")],
    );
    send_until_completed(
        &s,
        json!({"prompt": "hello", "model": "anthropic/m",
            "retention_policy": policy(json!("forever"))}),
    );
    let wal = state.join(format!("wal/{addr}.wal"));
    let body = json!({"method": "session.release",
        "params": {"project_root": "/proj", "harness": "h", "session": "s1"}});
    post_dropped(&s, &body.to_string());
    assert!(
        !s.child.wait().unwrap().success(),
        "serve aborted at the tombstone"
    );
    assert!(wal.exists(), "killed before the deletion");
    assert_eq!(tombstone(&state)["deleted"], true);
    drop(s);
    let s = start(&state, &peer, &[]);
    assert!(!wal.exists(), "finished at start");
    let (status, r) = rpc(&s, "session.read", json!({}));
    assert_eq!(
        (status, r["error"]["code"].clone()),
        (404, json!("unknown_session")),
        "{r}"
    );
    let (_, r) = rpc(&s, "session.release", json!({}));
    assert_eq!(r["result"], json!({"state": "absent"}), "{r}");
}
