//! Every wire family behaves the same where a host meets it: one table over all seven, each
//! through a real `broca serve` against an independent peer (aimock; Code Assist through a
//! relay that puts aimock's Gemini answers in Code Assist's envelope), with a real MCP tool
//! server. For each family: the display lane carries the answer's text as it streams and the
//! control lane the same units; a token budget stops the run at the same step, before the
//! same tool call; the usage facts are one per step, with the provider and exactly the
//! measures reported.

mod support;

use std::path::Path;

use serde_json::{json, Value};
use support::serve::{command, open_sse_ready, read_events, result_when_ended, rpc, spawn, Serve};
use support::{broca, fixture, peers_dir, Aimock, CountingTools, Peer};

/// Provider id, and whether the peer is the Code Assist relay (else aimock itself).
const FAMILIES: [(&str, bool); 7] = [
    ("anthropic", false),
    ("openai", false),
    ("openai-responses", false),
    ("gemini", false),
    ("code-assist", true),
    ("bedrock", false),
    ("chatgpt", false),
];

fn serve(state: &Path, aimock: &Aimock, relay: &Peer, tools: &Path) -> Serve {
    let mut cmd = command(
        state,
        &aimock.url(),
        &["--tools-config", tools.to_str().unwrap()],
    );
    for (family, relayed) in FAMILIES {
        let var = format!("BROCA_BASE_URL_{}", family.to_uppercase().replace('-', "_"));
        cmd.env(var, if relayed { relay.url() } else { aimock.url() });
    }
    cmd.env("OPENAI_API_KEY", "sk-families-0123456789")
        .env("GEMINI_API_KEY", "gm-families-0123456789")
        .env("GOOGLE_CLOUD_ACCESS_TOKEN", "ya29.families-0123456789")
        .env("GOOGLE_CLOUD_PROJECT", "families-project")
        .env("AWS_ACCESS_KEY_ID", "AKIDFAMILIES")
        .env("AWS_SECRET_ACCESS_KEY", "aws-families-secret-0123456789")
        .env("AWS_REGION", "us-east-1")
        .env("CHATGPT_ACCESS_TOKEN", "chatgpt-families-0123456789")
        .env("CHATGPT_ACCOUNT_ID", "acct-families")
        .stderr(std::process::Stdio::inherit());
    spawn(&mut cmd, state)
}

/// The `type` of each control unit and the display text, of one run's events.
fn lanes(events: &[(Option<String>, Option<String>, String)]) -> (Vec<String>, String) {
    let mut kinds = Vec::new();
    let mut display = String::new();
    for (id, event, data) in events {
        let v: Value = serde_json::from_str(data).unwrap();
        if event.as_deref() == Some("display") {
            display.push_str(v["text"].as_str().unwrap_or(""));
        } else if id.is_some() {
            kinds.push(v["type"].as_str().unwrap().to_string());
        }
    }
    (kinds, display)
}

#[test]
fn every_family_streams_stops_on_its_budget_and_reports_usage_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let tools = CountingTools::new(dir.path(), json!({}));
    // Each step of "spend" reports 10,000 input and 1,000 output tokens and asks for `record`;
    // "hello" is answered "Hello there." (5 in, 2 out).
    let aimock = Aimock::start(&fixture("budget.json"));
    let relay = Peer::start(
        std::process::Command::new("python3")
            .arg(peers_dir().join("code_assist_relay.py"))
            .env("GEMINI_URL", aimock.url()),
    );
    let s = serve(&state, &aimock, &relay, &tools.config);

    let mut runs = Vec::new();
    for (n, (family, _)) in FAMILIES.iter().enumerate() {
        let model = format!("{family}/test-model");
        let session = format!("hello-{family}");
        let q = format!("project_root=%2Fproj&harness=h&session={session}&from=start");
        // Subscribed before the send: the display lane is live only.
        let sub = open_sse_ready(&s, &q);
        let (status, r) = rpc(
            &s,
            "session.send",
            json!({"session": session, "prompt": "hello", "model": model}),
        );
        assert_eq!(status, 200, "{family}: {r}");
        let run_id = r["result"]["run_id"].as_str().unwrap().to_string();
        let events = read_events(sub, |e| e.2.contains("\"type\":\"run_finished\""));
        let (kinds, display) = lanes(&events);
        assert_eq!(display, "Hello there.", "{family}: the display lane");
        // The prompt's message and the answer's, each announced before it is stored.
        assert_eq!(
            kinds,
            [
                "run_started",
                "message_started",
                "message",
                "step_started",
                "message_started",
                "message",
                "run_finished"
            ],
            "{family}: the control lane"
        );
        let hello = result_when_ended(&s, &session, &run_id);
        assert_eq!(hello["state"], "completed", "{family}: {hello}");
        assert_eq!(hello["final_message"]["text"], "Hello there.");
        assert_eq!(
            hello["metered_usage"],
            json!({"input": 5, "output": 2}),
            "{family}"
        );

        // 25,000 tokens: the first step (11,000) and its tool call; the second (22,000 in
        // all) leaves too little for the next request, which resends at least its 10,000
        // input tokens: the run stops before the second step's tool call.
        let session = format!("spend-{family}");
        let (status, r) = rpc(
            &s,
            "session.send",
            json!({"session": session, "prompt": "spend", "model": model,
                   "stop_when": {"max_total_tokens": 25_000}}),
        );
        assert_eq!(status, 200, "{family}: {r}");
        let run_id = r["result"]["run_id"].as_str().unwrap().to_string();
        let spent = result_when_ended(&s, &session, &run_id);
        assert_eq!(spent["state"], "budget_exhausted", "{family}: {spent}");
        assert_eq!(
            spent["metered_usage"],
            json!({"input": 20_000, "output": 2_000}),
            "{family}: {spent}"
        );
        assert_eq!(
            tools.dispatched(),
            n + 1,
            "{family}: one tool call dispatched, the second stopped by the budget"
        );
        runs.push((family, hello["run_id"].clone(), spent["run_id"].clone()));
    }

    // The usage facts: one per step, each naming its provider and the model, with exactly the
    // measures reported (no cache or reasoning measure invented as 0).
    let out = broca(&state)
        .args(["export", "usage", "--format", "jsonl"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let facts: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for (family, hello, spent) in runs {
        let of =
            |run: &Value| -> Vec<&Value> { facts.iter().filter(|f| f["run_id"] == *run).collect() };
        let hello = of(&hello);
        assert_eq!(hello.len(), 1, "{family}: {hello:?}");
        let spent = of(&spent);
        assert_eq!(spent.len(), 2, "{family}: {spent:?}");
        for f in hello.iter().chain(&spent) {
            assert_eq!(f["provider"], *family, "{f}");
            assert_eq!(f["model"], "test-model", "{f}");
        }
        assert_eq!(
            hello[0]["usage"],
            json!({"input": 5, "output": 2}),
            "{family}"
        );
        for f in spent {
            assert_eq!(
                f["usage"],
                json!({"input": 10_000, "output": 1_000}),
                "{family}"
            );
        }
    }
}
