//! The chatgpt family's policy against a loopback ChatGPT backend (tests/peers/
//! chatgpt_peer.py): the headers it sends, quota headers surfaced in run.result and recorded
//! with the step, a usage limit waited out, a refusal ended as one; the Codex mode over
//! the peer's own WebSocket server (written from RFC 6455 apart from broca's client); and an
//! OAuth token refreshed at the peer's token endpoint and kept.

mod support;

use std::path::Path;
use std::process::Output;

use serde_json::{json, Value};
use support::{assert_refused_naming, broca, dump_all, last_json, Peer};

fn run(state: &Path, base: &str, prompt: &str) -> Output {
    run_at(state, &format!("{base}/backend-api/codex"), prompt)
}

fn run_at(state: &Path, base_url: &str, prompt: &str) -> Output {
    broca(state)
        .env("CHATGPT_ACCESS_TOKEN", "chatgpt-token-0123456789")
        .env("CHATGPT_ACCOUNT_ID", "acct-42")
        .args([
            "run",
            "--model",
            "chatgpt/gpt-5-codex",
            "--base-url",
            base_url,
        ])
        .args(["--json", prompt])
        .output()
        .unwrap()
}

/// The run's failed model attempts, as recorded.
fn failed_attempts(state: &Path, run_id: &Value) -> Vec<Value> {
    dump_all(state)
        .into_iter()
        .filter(|x| x["kind"] == "model_attempt_finished" && x["record"]["run_id"] == *run_id)
        .map(|x| x["record"].clone())
        .collect()
}

#[test]
fn the_chatgpt_policy_sends_its_headers_surfaces_quota_waits_out_limits_and_ends_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests.jsonl");
    let peer = Peer::python("chatgpt_peer.py", &log);
    let state = dir.path().join("state");

    let o = run(&state, &peer.url(), "quota please");
    let r = last_json(&o);
    assert!(o.status.success(), "{r}");
    assert_eq!(r["final_message"]["text"], "Within quota.");
    let want = json!({"windows": [
        {"name": "primary", "used_basis_points": 4250, "window_minutes": 300, "resets_in_seconds": 1200},
        {"name": "secondary", "used_basis_points": 700}
    ]});
    assert_eq!(r["quota"], want, "{r}");
    let steps: Vec<Value> = dump_all(&state)
        .into_iter()
        .filter(|r| r["kind"] == "model_step_finished")
        .collect();
    assert_eq!(steps[0]["record"]["quota"], want, "recorded with the step");

    let o = run(&state, &peer.url(), "limit please");
    let r = last_json(&o);
    assert!(o.status.success(), "{r}");
    assert_eq!(r["final_message"]["text"], "After the reset.");
    let failed = failed_attempts(&state, &r["run_id"]);
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["error"]["class"], "transient");
    assert_eq!(failed[0]["error"]["retry_after_ms"], 1000);
    assert!(failed[0]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("usage_limit_reached (plan plus)"));

    let o = run(&state, &peer.url(), "refuse please");
    let r = last_json(&o);
    assert_eq!(r["final_message"]["text"], "I can't help with that.", "{r}");
    let last = dump_all(&state)
        .into_iter()
        .filter(|x| x["kind"] == "model_step_finished")
        .last()
        .unwrap();
    assert_eq!(last["record"]["finish_reason"], json!({"other": "refusal"}));

    for line in std::fs::read_to_string(&log).unwrap().lines() {
        let h: Value = serde_json::from_str(line).unwrap();
        assert_eq!(h["path"], "/backend-api/codex/responses");
        assert_eq!(h["authorization"], "Bearer chatgpt-token-0123456789");
        assert_eq!(h["chatgpt-account-id"], "acct-42");
        assert_eq!(h["openai-beta"], "responses=experimental");
        assert_eq!(h["originator"], "broca");
    }

    // Without the account id the send is refused at admission, naming what to set.
    assert_refused_naming(
        &dir.path().join("state2"),
        ("CHATGPT_ACCESS_TOKEN", "chatgpt-token-0123456789"),
        "CHATGPT_ACCOUNT_ID",
        "chatgpt/gpt-5-codex",
        &peer.url(),
    );
}

#[test]
fn the_codex_mode_speaks_to_a_websocket_server_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests.jsonl");
    let peer = Peer::python("chatgpt_peer.py", &log);
    let state = dir.path().join("state");
    let base = format!(
        "{}/backend-api/codex",
        peer.url().replace("http://", "ws://")
    );

    // Text, one event split over two frames, after a ping; the quota from the upgrade's
    // reply, surfaced and recorded as over HTTP.
    let o = run_at(&state, &base, "quota please");
    let r = last_json(&o);
    assert!(o.status.success(), "{r}");
    assert_eq!(r["final_message"]["text"], "Within quota.");
    let want = json!({"windows": [
        {"name": "primary", "used_basis_points": 4250, "window_minutes": 300, "resets_in_seconds": 1200},
        {"name": "secondary", "used_basis_points": 700}
    ]});
    assert_eq!(r["quota"], want, "{r}");
    assert_eq!(
        r["usage"],
        json!({"input": 11, "output": 3, "cache_read": 0, "reasoning": 0})
    );

    // A usage limit arrives as an error event: waited out as over HTTP, then the answer.
    let o = run_at(&state, &base, "limit please");
    let r = last_json(&o);
    assert!(o.status.success(), "{r}");
    assert_eq!(r["final_message"]["text"], "After the reset.");
    let failed = failed_attempts(&state, &r["run_id"]);
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["error"]["class"], "transient");
    assert_eq!(failed[0]["error"]["retry_after_ms"], 1000);

    // A refusal over the socket ends as one.
    let o = run_at(&state, &base, "refuse please");
    let r = last_json(&o);
    assert_eq!(r["final_message"]["text"], "I can't help with that.", "{r}");

    let seen: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(seen.len(), 4, "{seen:?}");
    for h in &seen {
        assert_eq!(h["mode"], "websocket");
        assert_eq!(h["path"], "/backend-api/codex/responses");
        assert_eq!(h["version"], "13");
        assert_eq!(h["authorization"], "Bearer chatgpt-token-0123456789");
        assert_eq!(h["chatgpt-account-id"], "acct-42");
        assert_eq!(h["openai-beta"], "responses=experimental");
        assert_eq!(h["originator"], "broca");
        assert_eq!(h["first_opcode"], 1, "the first message is text");
        assert_eq!(h["message_type"], "response.create");
        assert_eq!(h["model"], "gpt-5-codex");
        assert_eq!(
            h["pong"], "are-you-there",
            "the ping answered with its payload"
        );
        assert_eq!(h["unmasked_frames"], 0, "every client frame masked");
        assert_eq!(
            h["client_closed"], true,
            "the socket closed with a close frame: {h}"
        );
    }
}

/// The peer's request log (one JSON object a line).
fn logged(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn an_oauth_token_is_refreshed_when_refused_or_about_to_expire_and_the_new_one_kept() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests.jsonl");
    let peer = Peer::python("chatgpt_peer.py", &log);
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let token_url = format!("{}/oauth/token", peer.url());
    let creds = state.join("credentials.json");
    let entry = |access: &str, expires: Option<u64>| {
        let mut e = json!({"access_token": access, "account_id": "acct-42",
            "refresh_token": "rt-1", "client_id": "app-test", "token_url": token_url});
        if let Some(at) = expires {
            e["expires_at_ms"] = json!(at);
        }
        e
    };
    // `refused`: the provider refuses its token; `expiring`: it expired a while ago.
    broca::owner_only::write_file(
        &creds,
        json!({"refused": entry("at-expired", None), "expiring": entry("at-old", Some(1_000))})
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    let aimock = support::Aimock::start(&support::fixture("aimock.json"));
    let base = format!("{}/backend-api/codex", peer.url());
    let s = support::serve::start_env(
        &state,
        &aimock,
        &[],
        &[("BROCA_BASE_URL_CHATGPT", base.as_str())],
    );
    // (One session, the helper's: its runs one after the other.)
    let send = |credential: &str| {
        support::serve::send_until_completed(
            &s,
            json!({"prompt": "quota please", "model": "chatgpt/gpt-5-codex",
                   "credential_id": credential}),
        )
    };
    // Refused: refreshed once, and the attempt made again with the new token.
    send("file:refused");
    let seen = logged(&log);
    let auth: Vec<&str> = seen
        .iter()
        .filter_map(|r| r["authorization"].as_str())
        .collect();
    assert_eq!(auth, ["Bearer at-expired", "Bearer at-2"], "{seen:?}");
    let asked: Vec<&Value> = seen.iter().filter(|r| r.get("form").is_some()).collect();
    assert_eq!(asked.len(), 1, "{seen:?}");
    assert_eq!(
        asked[0]["form"],
        json!({"grant_type": "refresh_token", "refresh_token": "rt-1", "client_id": "app-test"})
    );
    assert_eq!(
        asked[0]["content-type"],
        "application/x-www-form-urlencoded"
    );
    // The new tokens are kept, owner-only, for the next use and the next process.
    let kept: Value = serde_json::from_slice(&std::fs::read(&creds).unwrap()).unwrap();
    assert_eq!(kept["refused"]["access_token"], "at-2");
    assert_eq!(kept["refused"]["refresh_token"], "rt-2");
    assert!(kept["refused"]["expires_at_ms"].as_u64() > Some(1_000));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&creds).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    // About to expire: refreshed before it is used; the old token never reaches the provider.
    let before = logged(&log).len();
    send("file:expiring");
    let seen = logged(&log)[before..].to_vec();
    let auth: Vec<&str> = seen
        .iter()
        .filter_map(|r| r["authorization"].as_str())
        .collect();
    assert_eq!(auth, ["Bearer at-2"], "{seen:?}");
    assert_eq!(seen.iter().filter(|r| r.get("form").is_some()).count(), 1);
    // No token is in what broca writes besides the credentials file.
    for secret in ["at-2", "rt-2", "rt-1"] {
        support::assert_no_file_holds(&state.join("wal"), secret);
    }
    drop(s);
}
