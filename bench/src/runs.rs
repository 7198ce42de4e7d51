//! Runs of tool steps driven through the run machine, shared by the compaction benchmarks:
//! the frozen config of a bench run, its `run_started`, and the model's answer to a request.

use broca::core::machine::{Event, RunMachine};
use broca::protocol::compaction::Compaction;
use broca::protocol::{FinishReason, StreamEvent, ToolSpec, Usage};
use broca::wal::runrec::{CachePolicy, FrozenConfig, RunStarted, StopConditions};

/// A bench run's config: the `echo` tool, 64 steps at most, `context_limit` and the built-in
/// `compaction` as given.
pub fn config(context_limit: Option<u64>, compaction: Option<Compaction>) -> FrozenConfig {
    FrozenConfig {
        provider: "scripted".into(),
        model: "bench".into(),
        credential_id: "env:X".into(),
        renderer_version: 1,
        catalog_digest: "d".into(),
        catalog: None,
        system: Some("You are a careful assistant.".into()),
        tools: vec![ToolSpec {
            name: "echo".into(),
            description: "Echoes its input.".into(),
            input_schema: serde_json::json!({"type": "object"}),
            route: String::new(),
            reply: None,
        }]
        .into(),
        tools_digest: "t".into(),
        generation: Default::default(),
        stop: StopConditions {
            input_cap: None,
            max_steps: 64,
            max_total_tokens: None,
            max_cost_micros: None,
        },
        context_limit,
        cache_policy: CachePolicy::Off,
        directives: Vec::new(),
        structured_output: None,
        route_decision_id: None,
        compaction,
        retention: None,
        retention_policy: None,
        title: None,
        plan: None,
    }
}

/// Run `run_id`'s first record, its send's `prompt` under `config`.
pub fn started(run_id: &str, prompt: String, config: FrozenConfig) -> RunStarted {
    RunStarted {
        run_id: run_id.into(),
        send_id: Some(format!("send-{run_id}")),
        inputs_digest: format!("digest-{run_id}"),
        prompt,
        config,
        resolved_calls: Vec::new(),
        at_unix_ms: 0,
        principal: None,
        scope_owner: None,
        submission_id: None,
        client_message_id: None,
        resolved_mid: None,
        delivery: None,
        steer_seq: None,
        media: Vec::new(),
        order: None,
        pre_user: Vec::new(),
    }
}

/// The model's answer: a call of `echo` (`call`), else `text`, ending the run.
pub fn answer(m: &mut RunMachine, call: Option<String>, text: &str, now: u64) {
    let usage = Usage {
        input: Some(1000),
        output: Some(50),
        ..Usage::default()
    };
    let mut feed = |ev| m.handle(Event::Stream(ev), now);
    match call {
        None => {
            feed(StreamEvent::TextDelta(text.into()));
            feed(StreamEvent::Usage(usage));
            feed(StreamEvent::Finish {
                reason: FinishReason::EndTurn,
                request_id: None,
            });
        }
        Some(id) => {
            feed(StreamEvent::ToolCallStart {
                index: 0,
                id,
                name: "echo".into(),
            });
            feed(StreamEvent::ToolCallArgsDelta {
                index: 0,
                json: "{\"path\":\"src/lib.rs\"}".into(),
            });
            feed(StreamEvent::ToolCallEnd { index: 0 });
            feed(StreamEvent::Usage(usage));
            feed(StreamEvent::Finish {
                reason: FinishReason::ToolUse,
                request_id: None,
            });
        }
    }
    m.handle(Event::StepEnded, now);
}
