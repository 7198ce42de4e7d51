//! The built-in compaction through `broca serve` against aimock (docs/compaction.md): a
//! 500-turn session on a 32k-token context goes on instead of ending at the ceiling, each
//! summary asked for once and recorded before the request that carries it; after a kill -9
//! the replayed session carries the recorded summary and asks for none again; a kill right
//! after a summary's record resumes the run from it.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::serve::{rpc, try_rpc, Serve};
use support::{dump_all, fixture, recorded_bodies, Aimock, Peer};

const MODEL: &str = "openai/gpt-4o";
const LIMIT: u64 = 32_000;

/// `broca serve` on `state` whose OpenAI provider is aimock behind the recording proxy.
fn serve(state: &Path, aimock: &Aimock, proxy: &Peer, more: &[(&str, &str)]) -> Serve {
    let url = proxy.url();
    let mut env = vec![
        ("OPENAI_API_KEY", "sk-compaction-0123456789"),
        ("BROCA_BASE_URL_OPENAI", url.as_str()),
    ];
    env.extend_from_slice(more);
    support::serve::start_env(state, aimock, &[], &env)
}

/// Sends `params` to session s1 and waits for its run to end: the run's final state.
fn turn(s: &Serve, params: Value) -> String {
    let (status, r) = rpc(s, "session.send", params);
    assert_eq!(status, 200, "{r}");
    let run_id = r["result"]["run_id"].as_str().unwrap().to_string();
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let state = rpc(s, "run.status", json!({"run_id": run_id})).1["result"]["state"].clone();
        if state != "active" && state != "pending" {
            return state.as_str().unwrap_or("?").to_string();
        }
        assert!(Instant::now() < until, "run {run_id} did not end");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn prompt(i: usize) -> String {
    format!("turn {i}: what comes next in the story?")
}

/// The requests the proxy passed on: (is a summary's request, its messages).
fn requests(file: &Path) -> Vec<(bool, Vec<Value>)> {
    recorded_bodies(file)
        .into_iter()
        .map(|b| {
            let messages = b["messages"].as_array().cloned().unwrap_or_default();
            let summary = messages
                .iter()
                .any(|m| m["content"].to_string().contains("(broca-compaction)"));
            (summary, messages)
        })
        .collect()
}

fn compactions(state: &Path) -> Vec<Value> {
    dump_all(state)
        .into_iter()
        .filter(|r| r["kind"] == "context_compacted")
        .map(|r| r["record"].clone())
        .collect()
}

fn text_of(message: &Value) -> String {
    match &message["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

#[test]
fn a_500_turn_session_on_a_32k_context_goes_on_and_its_replay_asks_nothing_again() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let aimock = Aimock::start(&fixture("compaction.json"));
    let file = dir.path().join("requests.jsonl");
    let proxy = Peer::recording_proxy(&file, &aimock.url());
    let mut s = serve(&state, &aimock, &proxy, &[]);

    // Turned on by the first send; the later ones inherit it from the session.
    let first = json!({"model": MODEL, "prompt": prompt(1), "context_limit": LIMIT,
        "compaction": {"mode": "summarize"}});
    assert_eq!(turn(&s, first), "completed");
    for i in 2..=500 {
        let state = turn(
            &s,
            json!({"model": MODEL, "prompt": prompt(i), "context_limit": LIMIT}),
        );
        assert_eq!(state, "completed", "turn {i}");
    }

    let recorded = compactions(&state);
    assert_eq!(
        support::serve::metric(&s, "broca_context_compactions_total"),
        recorded.len() as u64,
        "each summary is counted"
    );
    let asked = requests(&file);
    let summaries = asked.iter().filter(|(summary, _)| *summary).count();
    assert!(
        recorded.len() >= 5,
        "500 turns of about 320 tokens each pass 32k several times: {} summaries",
        recorded.len()
    );
    assert_eq!(summaries, recorded.len(), "each summary asked for once");
    eprintln!("500 turns: {} summaries", recorded.len());
    for pair in recorded.windows(2) {
        assert!(pair[1]["replaced"].as_u64() > pair[0]["replaced"].as_u64());
    }
    // Every request of a turn stayed under the context limit, as aimock counted it (the
    // text at 4 characters a token); those after the first summary start with a summary.
    let mut after_first = false;
    for (summary, messages) in &asked {
        let chars: usize = messages.iter().map(|m| text_of(m).len()).sum();
        assert!(
            (chars / 4) < LIMIT as usize,
            "a request of {chars} characters"
        );
        if *summary {
            after_first = true;
        } else if after_first {
            assert!(
                text_of(&messages[0]).starts_with("[Summary of the conversation's earlier turns"),
                "{}",
                text_of(&messages[0])
            );
        }
    }

    // kill -9, then a restart: the next turn carries the last recorded summary; nothing is
    // asked again.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGKILL) };
    let _ = s.child.wait();
    drop(s);
    let before = asked.len();
    let s = serve(&state, &aimock, &proxy, &[]);
    assert_eq!(
        turn(&s, json!({"model": MODEL, "prompt": prompt(501)})),
        "completed"
    );
    let asked = requests(&file);
    let fresh = &asked[before..];
    let last_summary = recorded.last().unwrap()["summary"]
        .as_str()
        .unwrap()
        .to_string();
    let new_summaries = fresh.iter().filter(|(summary, _)| *summary).count();
    assert_eq!(compactions(&state).len(), recorded.len() + new_summaries);
    if new_summaries == 0 {
        assert_eq!(fresh.len(), 1);
        assert!(text_of(&fresh[0].1[0]).ends_with(&last_summary));
    }
    // Reads keep every original entry: the first prompt is still the first one read.
    let (status, entries) = rpc(&s, "session.read", json!({"from_ordinal": 1, "limit": 1}));
    assert_eq!(status, 200, "{entries}");
    assert!(
        entries.to_string().contains("turn 1:"),
        "the first prompt is still read: {entries}"
    );
}

#[test]
fn a_kill_right_after_a_summary_is_recorded_resumes_from_it_without_asking_again() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let aimock = Aimock::start(&fixture("compaction.json"));
    let file = dir.path().join("requests.jsonl");
    let proxy = Peer::recording_proxy(&file, &aimock.url());
    // A small context: the fifth turn's request passes 80% of 1,500 tokens.
    let params = |i: usize| {
        json!({"model": MODEL, "prompt": prompt(i), "context_limit": 1500,
            "compaction": {"mode": "summarize"}})
    };
    let mut s = serve(
        &state,
        &aimock,
        &proxy,
        &[("BROCA_CRASH_AT", "context_compacted:1")],
    );
    // Turns until one's summary is recorded and serve dies there.
    for i in 1..20 {
        let Some(run_id) = try_rpc(&s, "session.send", params(i))
            .and_then(|r| r["result"]["run_id"].as_str().map(str::to_string))
        else {
            break;
        };
        let until = Instant::now() + Duration::from_secs(30);
        while let Some(r) = try_rpc(&s, "run.status", json!({"run_id": run_id})) {
            if r["result"]["state"] != "active" {
                break;
            }
            assert!(Instant::now() < until, "run {run_id} did not end");
            std::thread::sleep(Duration::from_millis(2));
        }
        if s.child.try_wait().unwrap().is_some() {
            break;
        }
    }
    let status = s.child.wait().unwrap();
    assert!(!status.success(), "serve died at the kill point");
    let recorded = compactions(&state);
    assert_eq!(recorded.len(), 1, "the summary's record is durable");
    assert_eq!(requests(&file).iter().filter(|(x, _)| *x).count(), 1);

    // The restart resumes the open run from the recorded summary.
    drop(s);
    let s = serve(&state, &aimock, &proxy, &[]);
    let run_id = recorded[0]["run_id"].as_str().unwrap();
    let result = support::serve::result_when_ended(&s, "s1", run_id);
    assert_eq!(result["state"], "completed", "{result}");
    let asked = requests(&file);
    assert_eq!(
        asked.iter().filter(|(x, _)| *x).count(),
        1,
        "the summary is not asked for again"
    );
    let (_, last) = asked.last().unwrap();
    assert!(text_of(&last[0]).ends_with(recorded[0]["summary"].as_str().unwrap()));
}

#[test]
fn broca_run_turns_compaction_on_for_the_session_and_later_runs_keep_it() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let aimock = Aimock::start(&fixture("compaction.json"));
    let run = |i: usize, more: &[&str]| {
        let out = support::broca(&state)
            .env("OPENAI_API_KEY", "sk-compaction-0123456789")
            .args(["run", "--model", MODEL, "--base-url", &aimock.url()])
            .args(["--session", "long", "--context-limit", "1500", "--json"])
            .args(more)
            .arg(prompt(i))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "turn {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // Only the first run says --compact; each turn adds about 300 tokens to a 1,500 limit.
    run(1, &["--compact"]);
    for i in 2..=8 {
        run(i, &[]);
    }
    let recorded = compactions(&state);
    assert!(
        recorded.len() >= 2,
        "eight turns of about 300 tokens pass 80% of 1,500 more than once: {recorded:?}"
    );
    let frozen: Vec<Value> = dump_all(&state)
        .into_iter()
        .filter(|r| r["kind"] == "run_started")
        .map(|r| r["record"]["config"]["compaction"].clone())
        .collect();
    assert_eq!(frozen.len(), 8);
    assert!(
        frozen.iter().all(|c| c["mode"] == "summarize"),
        "every run keeps the session's compaction: {frozen:?}"
    );
}
