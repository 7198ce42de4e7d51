//! OpenTelemetry traces over OTLP/HTTP, received by a real OTLP receiver that decodes the
//! protobuf with OpenTelemetry's own classes (tests/peers/otlp_receiver.py): a run through
//! `broca serve` gives a trace of the run, its model steps and its tool call with the GenAI
//! conventions' attributes, batched off the shards and flushed when serve stops.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::serve::{metric_with, Serve};
use support::{broca, peers_dir, python_sdks, Peer};

/// The spans the receiver decoded so far (a line that did not decode fails the test).
fn received(file: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            assert!(
                v.get("error").is_none(),
                "the receiver could not decode: {v}"
            );
            v
        })
        .collect()
}

/// The OTLP receiver, writing what it decodes to `requests`.
fn receiver(requests: &Path) -> Peer {
    Peer::start(
        Command::new(python_sdks())
            .arg(peers_dir().join("otlp_receiver.py"))
            .env("REQUESTS_FILE", requests),
    )
}

fn wait_for_spans(file: &Path, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let spans = received(file);
        if spans.len() >= n || Instant::now() > deadline {
            return spans;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_run_is_a_trace_of_its_steps_and_tool_calls_flushed_when_serve_stops() {
    let dir = tempfile::tempdir().unwrap();
    let requests = dir.path().join("spans.jsonl");
    let receiver = receiver(&requests);
    let state = dir.path().join("state");
    let secret = "otel-secret-0123456789";
    let mut cmd = broca(&state);
    cmd.env_remove("ANTHROPIC_API_KEY")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url())
        .env(
            "OTEL_EXPORTER_OTLP_HEADERS",
            format!("authorization=Bearer%20{secret}"),
        )
        .env("OTEL_SERVICE_NAME", "broca-under-test")
        // A batch leaves when it holds 3 spans; the timer alone would wait a minute: the last
        // span of the run leaves only with the flush at stop.
        .env("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "3")
        .env("OTEL_BSP_SCHEDULE_DELAY", "60000")
        .env("BROCA_LOG", "info")
        .args(["serve", "--listen", "127.0.0.1:0", "--shards", "2"])
        .stderr(Stdio::piped());
    let mut s: Serve = support::serve::spawn(&mut cmd, &state);
    let o = broca(&state)
        .args(["send", "--project-root", "/traced", "--session", "t1"])
        .args(["--model", "demo/tour", "count these four words"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // Two chat spans and the tool's filled the first batch; the run's waits.
    let first = wait_for_spans(&requests, 3);
    assert_eq!(first.len(), 3, "{first:#?}");
    // The exporter counts a batch once its POST is answered, a moment after the collector
    // has it.
    support::serve::wait_for("three spans counted as exported", || {
        metric_with(&s, "broca_trace_spans_total", "outcome=\"exported\"") == 3
    });
    // SAFETY: a signal to the serve this test started and has not reaped.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
    let out = s.child.stderr_at_exit();
    let spans = received(&requests);
    assert_eq!(
        spans.len(),
        4,
        "the run's span left with the flush at stop: {spans:#?}"
    );
    assert!(
        !out.contains(secret),
        "the collector's header reached the log"
    );

    let by_name =
        |name: &str| -> Vec<&Value> { spans.iter().filter(|s| s["name"] == name).collect() };
    let run = by_name("invoke_agent broca");
    assert_eq!(run.len(), 1, "{spans:#?}");
    let run = run[0];
    let chats = by_name("chat tour");
    assert_eq!(chats.len(), 2, "{spans:#?}");
    let tools = by_name("execute_tool demo_word_count");
    assert_eq!(tools.len(), 1, "{spans:#?}");
    // One trace; the run is its root, every other span its child.
    for s in &spans {
        assert_eq!(s["trace_id"], run["trace_id"]);
        assert_eq!(s["trace_id"].as_str().unwrap().len(), 32);
        assert_eq!(s["scope"], "broca");
        assert_eq!(s["resource"]["service.name"], "broca-under-test");
        assert_eq!(s["authorization"], format!("Bearer {secret}"));
        assert!(
            s["start"].as_u64().unwrap() <= s["end"].as_u64().unwrap(),
            "{s}"
        );
        assert!(
            s["start"].as_u64().unwrap() >= run["start"].as_u64().unwrap(),
            "{s}"
        );
        assert!(
            s["end"].as_u64().unwrap() <= run["end"].as_u64().unwrap(),
            "{s}"
        );
    }
    assert_eq!(run["parent"], "");
    for s in chats.iter().chain(&tools) {
        assert_eq!(s["parent"], run["span_id"], "{s}");
    }
    // The GenAI conventions' attributes.
    let a = &run["attributes"];
    assert_eq!(a["gen_ai.operation.name"], "invoke_agent");
    assert_eq!(a["gen_ai.provider.name"], "demo");
    assert_eq!(a["gen_ai.request.model"], "tour");
    assert_eq!(
        a["gen_ai.conversation.id"].as_str().map(str::is_empty),
        Some(false)
    );
    assert_eq!(a["broca.run.finish"], "completed");
    assert_eq!(run["kind"], 1);
    let tokens = |key: &str| -> i64 {
        chats
            .iter()
            .map(|c| c["attributes"][key].as_i64().unwrap())
            .sum()
    };
    let run_tokens = |key: &str| a[key].as_i64().unwrap();
    assert_eq!(
        tokens("gen_ai.usage.output_tokens"),
        run_tokens("gen_ai.usage.output_tokens")
    );
    assert_eq!(
        tokens("gen_ai.usage.input_tokens"),
        run_tokens("gen_ai.usage.input_tokens")
    );
    for c in &chats {
        assert_eq!(c["kind"], 3, "a model call is a client span");
        assert_eq!(c["attributes"]["gen_ai.operation.name"], "chat");
        assert!(
            c["attributes"]["gen_ai.response.finish_reasons"].is_array(),
            "{c}"
        );
    }
    let t = &tools[0]["attributes"];
    assert_eq!(t["gen_ai.operation.name"], "execute_tool");
    assert_eq!(t["gen_ai.tool.name"], "demo_word_count");
    assert_eq!(t["gen_ai.tool.call.id"], "demo_1");
    assert_eq!(
        tools[0]["status"]["code"], 0,
        "the call succeeded: no error status"
    );
    // Nothing of the conversation is in a span.
    let all = serde_json::to_string(&spans).unwrap();
    assert!(!all.contains("count these four words"));
    assert!(!all.contains("4 words"));
}

/// The child's stderr (piped) once it has exited.
trait WaitOutput {
    fn stderr_at_exit(&mut self) -> String;
}

impl WaitOutput for std::process::Child {
    fn stderr_at_exit(&mut self) -> String {
        let mut err = String::new();
        if let Some(mut e) = self.stderr.take() {
            use std::io::Read;
            let _ = e.read_to_string(&mut err);
        }
        let _ = self.wait();
        err
    }
}

#[test]
fn broca_run_exports_its_trace_before_it_exits() {
    let dir = tempfile::tempdir().unwrap();
    let requests = dir.path().join("spans.jsonl");
    let receiver = receiver(&requests);
    let o = broca(&dir.path().join("state"))
        .env_remove("ANTHROPIC_API_KEY")
        .env(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            format!("{}/v1/traces", receiver.url()),
        )
        // Only the flush at exit sends them.
        .env("OTEL_BSP_SCHEDULE_DELAY", "60000")
        .current_dir(dir.path())
        .args(["run", "--model", "demo/tour", "two words"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The receiver wrote what it got before answering, and broca waited for the answer.
    let spans = received(&requests);
    let mut names: Vec<&str> = spans.iter().map(|s| s["name"].as_str().unwrap()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "chat tour",
            "chat tour",
            "execute_tool demo_word_count",
            "invoke_agent broca"
        ],
        "{spans:#?}"
    );
    assert_eq!(spans[0]["resource"]["service.name"], "broca");
}
