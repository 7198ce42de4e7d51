//! `sessions.list` and `runs.list` through a real `broca serve`: every session with its latest
//! run, newest activity first, filtered and paged by cursor; a session's runs newest first; and
//! the memory (the store's map among it) /metrics reports by kind.

mod support;

use serde_json::{json, Value};
use support::serve::{post, rpc, start, wait_for, Serve};
use support::{fixture, Aimock};

/// A request with exactly these params (no session filled in).
fn call(s: &Serve, method: &str, params: Value) -> (u16, Value) {
    post(s, &json!({"method": method, "params": params}).to_string())
}

/// A session.send in `session` of `project_root`, and its end.
fn run_in(s: &Serve, project_root: &str, session: &str, send_id: &str) -> String {
    let p = json!({"project_root": project_root, "harness": "h", "session": session,
                   "prompt": "hello", "model": "anthropic/m", "send_id": send_id});
    let (status, r) = call(s, "session.send", p);
    assert_eq!(status, 200, "{r}");
    let run_id = r["result"]["run_id"].as_str().unwrap().to_string();
    wait_for("the run to end", || {
        let q = json!({"project_root": project_root, "harness": "h", "session": session, "run_id": run_id});
        call(s, "run.status", q).1["result"]["state"] == "completed"
    });
    run_id
}

fn list(s: &Serve, params: Value) -> Value {
    let (status, r) = call(s, "sessions.list", params);
    assert_eq!(status, 200, "{r}");
    r["result"].clone()
}

fn names(page: &Value) -> Vec<String> {
    page["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            format!(
                "{}:{}",
                s["project_root"].as_str().unwrap(),
                s["session"].as_str().unwrap()
            )
        })
        .collect()
}

#[test]
fn sessions_are_listed_newest_first_filtered_and_paged() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let s = start(&dir.path().join("state"), &peer, &[]);
    assert_eq!(list(&s, json!({})), json!({"sessions": []}));

    let first = run_in(&s, "/a", "one", "k1");
    run_in(&s, "/a", "two", "k2");
    let last = run_in(&s, "/b", "three", "k3");
    // The store hears of each run's end within its hand-off tick.
    wait_for("the three sessions to be listed", || {
        list(&s, json!({}))["sessions"].as_array().unwrap().len() == 3
    });
    let all = list(&s, json!({}));
    assert_eq!(names(&all), ["/b:three", "/a:two", "/a:one"], "{all}");
    let newest = &all["sessions"][0];
    assert_eq!(newest["harness"], "h");
    assert_eq!(newest["runs"], 1);
    assert_eq!(newest["last_run"]["run_id"], last.as_str());
    assert_eq!(newest["last_run"]["state"], "completed");
    assert_eq!(newest["last_run"]["model"], "m");
    assert!(
        newest["last_run"]["ended_at_ms"].as_u64() >= newest["last_run"]["started_at_ms"].as_u64()
    );
    assert!(all.get("next_cursor").is_none(), "{all}");

    // Filters.
    assert_eq!(
        names(&list(&s, json!({"project_root": "/a"}))),
        ["/a:two", "/a:one"]
    );
    assert_eq!(
        names(&list(&s, json!({"harness": "other"}))),
        Vec::<String>::new()
    );
    assert_eq!(names(&list(&s, json!({"state": "completed"}))).len(), 3);
    assert_eq!(
        names(&list(&s, json!({"state": "active"}))),
        Vec::<String>::new()
    );
    let since = newest["active_at_ms"].as_u64().unwrap();
    assert_eq!(names(&list(&s, json!({"since_ms": since}))), ["/b:three"]);

    // Pages of one, each from the previous page's cursor: every session once, in order.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut p = json!({"limit": 1});
        if let Some(c) = &cursor {
            p["cursor"] = c.clone().into();
        }
        let page = list(&s, p);
        seen.extend(names(&page));
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, ["/b:three", "/a:two", "/a:one"]);

    // A second run moves its session to the front.
    run_in(&s, "/a", "one", "k4");
    wait_for("/a:one to lead", || {
        names(&list(&s, json!({})))[0] == "/a:one"
    });
    let again = list(&s, json!({"limit": 1}));
    assert_eq!(again["sessions"][0]["runs"], 2);
    assert_ne!(again["sessions"][0]["last_run"]["run_id"], first.as_str());

    // Refusals name the field.
    for (params, field) in [
        (json!({"limit": 0}), "limit"),
        (json!({"state": "done"}), "state"),
        (json!({"cursor": "x"}), "cursor"),
        (json!({"session": "one"}), "session"),
        (json!({"colour": 1}), "colour"),
    ] {
        let (status, r) = call(&s, "sessions.list", params.clone());
        assert_eq!(status, 400, "{params}: {r}");
        assert_eq!(r["error"]["code"], "invalid_params", "{r}");
        assert_eq!(r["error"]["detail"]["field"], field, "{r}");
    }
}

#[test]
fn a_sessions_runs_are_listed_newest_first_and_paged() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let s = start(&dir.path().join("state"), &peer, &[]);
    let runs: Vec<String> = (0..3)
        .map(|i| run_in(&s, "/proj", "s1", &format!("r{i}")))
        .collect();
    let (status, r) = rpc(&s, "runs.list", json!({}));
    assert_eq!(status, 200, "{r}");
    let listed: Vec<&str> = r["result"]["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [&runs[2], &runs[1], &runs[0]]);
    let one = &r["result"]["runs"][0];
    assert_eq!(
        (
            &one["state"],
            &one["provider"],
            &one["model"],
            &one["send_id"],
            &one["steps"]
        ),
        (
            &json!("completed"),
            &json!("anthropic"),
            &json!("m"),
            &json!("r2"),
            &json!(1)
        ),
        "{one}"
    );
    // run.status's own shape, usage included.
    let (_, st) = rpc(&s, "run.status", json!({"run_id": runs[2]}));
    assert_eq!(one["usage"], st["result"]["usage"]);

    let (_, p1) = rpc(&s, "runs.list", json!({"limit": 2}));
    let cursor = p1["result"]["next_cursor"].as_str().unwrap().to_string();
    let (_, p2) = rpc(&s, "runs.list", json!({"limit": 2, "cursor": cursor}));
    assert_eq!(p2["result"]["runs"][0]["run_id"], runs[0].as_str());
    assert!(p2["result"].get("next_cursor").is_none(), "{p2}");
    let (_, none) = rpc(&s, "runs.list", json!({"state": "cancelled"}));
    assert_eq!(none["result"]["runs"], json!([]));
    // A session nothing reached has no runs (and nothing is written for asking).
    let (status, empty) = call(
        &s,
        "runs.list",
        json!({"project_root": "/nobody", "harness": "h", "session": "x"}),
    );
    assert_eq!((status, &empty["result"]), (200, &json!({"runs": []})));

    // run.result's long poll answers once the run has ended (a slow answer: seconds).
    let (status, sent) = rpc(
        &s,
        "session.send",
        json!({"prompt": "slow", "model": "anthropic/m", "send_id": "w"}),
    );
    assert_eq!(status, 200, "{sent}");
    let run_id = sent["result"]["run_id"].as_str().unwrap();
    let (_, now) = rpc(&s, "run.result", json!({"run_id": run_id}));
    assert_eq!(now["result"]["state"], "active", "{now}");
    // Meanwhile sessions.list shows it active: the store heard of the run's start.
    wait_for("the active run to be listed", || {
        let (_, l) = call(&s, "sessions.list", json!({"state": "active"}));
        l["result"]["sessions"][0]["last_run"]["run_id"] == run_id
    });
    let (status, r) = rpc(
        &s,
        "run.result",
        json!({"run_id": run_id, "wait_ms": 20000}),
    );
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["result"]["state"], "completed", "{r}");
    let (status, r) = rpc(
        &s,
        "run.result",
        json!({"run_id": run_id, "wait_ms": 60001}),
    );
    assert_eq!(
        (status, &r["error"]["detail"]["field"]),
        (400, &json!("wait_ms")),
        "{r}"
    );
}

#[test]
fn a_session_whose_wal_moved_past_the_stores_mark_is_listed_from_its_wal() {
    // The demo model: its run is handed to the store as it starts; its first step's message
    // (1.2 s later) is not, until the run ends. Listed while its tool runs, the session has
    // that message too.
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut cmd = support::broca(&state);
    cmd.env_remove("ANTHROPIC_API_KEY")
        .args(["serve", "--listen", "127.0.0.1:0", "--shards", "2"]);
    let s = support::serve::spawn(&mut cmd, &state);
    let mut attach =
        support::serve::attach_json(&state, &["--project-root", "/lag", "--session", "s1"]);
    let p = json!({"project_root": "/lag", "harness": "cli", "session": "s1",
                   "prompt": "one two", "model": "demo/tour"});
    let (status, r) = call(&s, "session.send", p);
    assert_eq!(status, 200, "{r}");
    support::serve::until_unit(&mut attach, "tool_call");
    // The tool runs for 1.5 s: the run's end (and its hand-off) is still ahead.
    let page = list(&s, json!({"project_root": "/lag"}));
    let row = &page["sessions"][0];
    assert_eq!(row["last_run"]["state"], "active", "{page}");
    assert_eq!(row["messages"], 2, "the step's message is listed: {page}");
    let _ = attach.kill();
    let _ = attach.wait();
}

/// /metrics tells the process's memory apart by kind: anonymous, the store's map, other
/// file-backed pages (the three the resident set), and the WALs' page cache.
#[test]
fn memory_is_reported_by_kind() {
    use support::serve::metric_with;
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let s = start(&dir.path().join("state"), &peer, &[]);
    run_in(&s, "/a", "one", "k1");
    wait_for("the store to list it", || {
        list(&s, json!({}))["sessions"].as_array().unwrap().len() == 1
    });
    // A read takes the WAL through the page cache.
    let p = json!({"project_root": "/a", "harness": "h", "session": "one", "from_ordinal": 0});
    assert_eq!(call(&s, "session.read", p).0, 200);
    let kind = |k: &str| metric_with(&s, "broca_memory_bytes", &format!("kind=\"{k}\""));
    let (anon, store, file, cache) = (
        kind("anonymous"),
        kind("store_map"),
        kind("file"),
        kind("wal_page_cache"),
    );
    assert!(anon > 1 << 20, "anonymous {anon}");
    assert!(store > 0, "the store's map is touched: {store}");
    assert!(file > 1 << 20, "the binary's pages: {file}");
    assert!(cache > 0, "the WAL read is cached: {cache}");
    let status = std::fs::read_to_string(format!("/proc/{}/status", s.child.id())).unwrap();
    let rss: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    let sum = (anon + store + file) / 1024;
    assert!(
        sum.abs_diff(rss) * 5 < rss,
        "the kinds sum to {sum} KiB, VmRSS {rss} KiB"
    );
}
