//! broca-testkit: test doubles for the run loop's tests, simulations and benches (a
//! dev-dependency only: no production crate uses it). The scripted model answers from a seed
//! and the request alone, so a step redone after a crash gets the same answer, as a
//! deterministic provider would give; the counting tools count every dispatch by call id.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use broca_protocol::{
    Block, ClassifiedError, ErrorClass, FinishReason, Request, Role, StreamEvent, ToolCall,
    ToolSpec, Usage,
};

use broca_protocol::model::{Failure, ModelClient, ModelStream};
use broca_tools::{ToolOrigin, ToolOutcome, ToolRunner};

/// How the scripted model behaves.
#[derive(Debug, Clone)]
pub struct Script {
    pub seed: u64,
    /// Tool calls per tool step, at most.
    pub calls_per_step_max: u32,
    /// Percent chance that a step asks for tools (until `tool_steps_max`).
    pub tool_step_percent: u64,
    /// Tool steps per run, at most; then the model ends its turn.
    pub tool_steps_max: u32,
    /// Percent chance that an attempt fails with a transient error (never twice in a row).
    pub transient_percent: u64,
    /// Whether usage is reported (else the stream reports none).
    pub report_usage: bool,
    /// Steps of a run (1 for its first model step) whose stream reports no usage.
    pub unreported_steps: Vec<u32>,
    /// The tool names it calls.
    pub tools: Vec<String>,
    /// Bytes of signed reasoning each step opens with (0: none).
    pub thinking_bytes: usize,
}

impl Default for Script {
    fn default() -> Self {
        Script {
            seed: 1,
            calls_per_step_max: 3,
            tool_step_percent: 70,
            tool_steps_max: 3,
            transient_percent: 0,
            report_usage: true,
            unreported_steps: Vec::new(),
            tools: vec!["echo".into()],
            thinking_bytes: 0,
        }
    }
}

/// The scripted model.
pub struct ScriptedModel {
    pub script: Script,
    /// Model calls opened so far.
    pub calls: RefCell<u64>,
}

/// The test-only provider the scripted model answers for (`scripted/<any model>`): it is not
/// in the built-in catalog users see, so a process that drives a scripted model adds it to
/// its own catalog ([`ScriptedModel::new`] does).
pub const SCRIPTED_PROVIDER: &str = "scripted";

/// Adds the provider [`SCRIPTED_PROVIDER`] to this process's catalog, unless it is there.
pub fn install_scripted_provider() {
    let current = broca_catalog::current();
    if current.providers.iter().any(|p| p.id == SCRIPTED_PROVIDER) {
        return;
    }
    let mut catalog = (*current).clone();
    catalog.providers.push(broca_catalog::ProviderEntry {
        id: SCRIPTED_PROVIDER.into(),
        family: "scripted".into(),
        base_url: "http://127.0.0.1".into(),
        credential_env: "BROCA_SCRIPTED_KEY".into(),
    });
    broca_catalog::install(catalog);
}

impl ScriptedModel {
    /// The scripted model; the process's catalog learns the provider `scripted`.
    pub fn new(script: Script) -> ScriptedModel {
        install_scripted_provider();
        ScriptedModel {
            script,
            calls: RefCell::new(0),
        }
    }
}

/// splitmix64: a small, good, deterministic mixer.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn request_hash(seed: u64, req: &Request) -> u64 {
    // The count and the last two messages pin the request down without hashing a long
    // conversation at every step.
    let tail = &req.messages[req.messages.len().saturating_sub(2)..];
    let mut bytes = serde_json::to_vec(tail).expect("messages serialize");
    bytes.extend_from_slice(&(req.messages.len() as u64).to_le_bytes());
    let digest = blake3::hash(&bytes);
    mix(seed ^ u64::from_le_bytes(digest.as_bytes()[..8].try_into().expect("8 bytes")))
}

/// Played-back events of one scripted answer.
pub struct ScriptedStream {
    events: std::vec::IntoIter<StreamEvent>,
}

impl ModelStream for ScriptedStream {
    async fn next(&mut self) -> Option<Result<StreamEvent, Failure>> {
        self.events.next().map(Ok)
    }
}

impl ModelClient for ScriptedModel {
    type Stream = ScriptedStream;

    /// A scripted model calls no provider: every family and credential is admitted.
    fn check(&self) -> &dyn broca_protocol::model::ProviderCheck {
        &broca_protocol::model::AnyProvider
    }

    async fn open(&self, req: &Request) -> Result<ScriptedStream, Failure> {
        *self.calls.borrow_mut() += 1;
        let h = request_hash(self.script.seed, req);
        // Transient failures depend on the request and the attempt count so far, so a retry of
        // the same request can succeed.
        let calls = *self.calls.borrow();
        if self.script.transient_percent > 0 && mix(h ^ calls) % 100 < self.script.transient_percent
        {
            return Err(Failure {
                error: ClassifiedError {
                    class: ErrorClass::Transient,
                    message: "scripted overload (HTTP 529)".into(),
                    retry_after_ms: Some(1),
                },
                usage: None,
            });
        }
        let tool_steps_so_far = req
            .messages
            .iter()
            .skip(last_user_prompt(req))
            .filter(|m| m.role == Role::Assistant && m.tool_calls().next().is_some())
            .count() as u32;
        let mut events = Vec::new();
        if self.script.thinking_bytes > 0 {
            let thought: String = (0..self.script.thinking_bytes)
                .map(|i| char::from(b'a' + ((h >> (i % 56)) % 26) as u8))
                .collect();
            events.push(StreamEvent::ThinkingDelta(thought));
            events.push(StreamEvent::ThinkingSignature(format!("sig-{h:x}")));
        }
        events.push(StreamEvent::TextDelta(format!(
            "step {}",
            req.messages.len()
        )));
        let wants_tools = !self.script.tools.is_empty()
            && tool_steps_so_far < self.script.tool_steps_max
            && h % 100 < self.script.tool_step_percent;
        if wants_tools {
            self.tool_calls(h, &mut events);
        } else {
            events.push(StreamEvent::TextDelta(" done".into()));
        }
        let step = 1 + req
            .messages
            .iter()
            .skip(last_user_prompt(req))
            .filter(|m| m.role == Role::Assistant)
            .count() as u32;
        if self.script.report_usage && !self.script.unreported_steps.contains(&step) {
            let input = 10 * req.messages.len() as u64;
            events.push(StreamEvent::Usage(Usage {
                input: Some(input),
                output: Some(7),
                ..Usage::default()
            }));
        }
        let reason = if wants_tools {
            FinishReason::ToolUse
        } else {
            FinishReason::EndTurn
        };
        events.push(StreamEvent::Finish {
            reason,
            request_id: Some(format!("req_{h:x}")),
        });
        Ok(ScriptedStream {
            events: events.into_iter(),
        })
    }
}

impl ScriptedModel {
    /// The tool calls of a step whose request hashed to `h`: 1 to `calls_per_step_max` of
    /// them, each with its arguments streamed in two pieces.
    fn tool_calls(&self, h: u64, events: &mut Vec<StreamEvent>) {
        let n = 1 + (mix(h) % u64::from(self.script.calls_per_step_max.max(1))) as u32;
        for i in 0..n {
            let name = &self.script.tools
                [(mix(h + u64::from(i)) % self.script.tools.len() as u64) as usize];
            events.push(StreamEvent::ToolCallStart {
                index: i,
                id: format!("call_{:016x}_{i}", h),
                name: name.clone(),
            });
            let args = format!("{{\"n\":{},\"tag\":\"{:x}\"}}", i, h & 0xffff);
            let (a, b) = args.split_at(args.len() / 2);
            events.push(StreamEvent::ToolCallArgsDelta {
                index: i,
                json: a.into(),
            });
            events.push(StreamEvent::ToolCallArgsDelta {
                index: i,
                json: b.into(),
            });
            events.push(StreamEvent::ToolCallEnd { index: i });
        }
    }
}

fn last_user_prompt(req: &Request) -> usize {
    req.messages
        .iter()
        .rposition(|m| {
            m.role == Role::User && m.content.iter().any(|b| matches!(b, Block::Text { .. }))
        })
        .unwrap_or(0)
}

/// Test tools that count every dispatch by call id (the side effects a test can check).
#[derive(Clone, Default)]
pub struct CountingTools {
    pub dispatched: DispatchCounts,
    /// Calls whose outcome is reported as indeterminate (delivered, then lost).
    pub lose: Rc<RefCell<Vec<String>>>,
}

impl CountingTools {
    /// The tool specs these tools answer to.
    pub fn specs(names: &[&str]) -> Vec<ToolSpec> {
        names
            .iter()
            .map(|n| ToolSpec {
                name: n.to_string(),
                description: format!("test tool {n}"),
                input_schema: serde_json::json!({"type": "object"}),
                route: String::new(),
                reply: None,
            })
            .collect()
    }

    /// How often `call_id` was dispatched.
    pub fn count(&self, call_id: &str) -> u32 {
        self.dispatched.borrow().get(call_id).copied().unwrap_or(0)
    }
}

impl ToolRunner for CountingTools {
    async fn call(&self, call: ToolCall, _route: String, _origin: ToolOrigin) -> ToolOutcome {
        *self
            .dispatched
            .borrow_mut()
            .entry(call.id.clone())
            .or_insert(0) += 1;
        if self.lose.borrow().contains(&call.id) {
            return ToolOutcome::Indeterminate;
        }
        ToolOutcome::Done {
            content: format!("{} ran with {}", call.name, call.input.get()),
            is_error: false,
        }
    }
}

/// How often each call id was dispatched.
pub type DispatchCounts = Rc<RefCell<HashMap<String, u32>>>;
