//! Spans from a session's records, as they are appended: a run (`invoke_agent`), each model
//! step or failed attempt (`chat`), each tool call (`execute_tool`), with the OpenTelemetry
//! GenAI semantic conventions' `gen_ai.*` attributes. Sans-IO: records in, finished spans
//! out. Ids come from the run id (a run's spans share its trace wherever they are built, also
//! after a restart), and times from the records' own clocks. No prompt, answer, tool input or
//! tool output is put in a span.

use broca_wal::runrec::FinishKind;
use broca_wal::Record;

/// A span's kind (OTLP's numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Internal = 1,
    Client = 3,
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(String),
    Int(i64),
    Bool(bool),
    Strs(Vec<String>),
}

/// A finished span.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent: Option<[u8; 8]>,
    pub name: String,
    pub kind: Kind,
    pub start_ns: u64,
    pub end_ns: u64,
    pub attrs: Vec<(&'static str, Value)>,
    /// `Some(message)`: the span's status is an error.
    pub error: Option<String>,
}

/// The open spans of one session's runs.
pub struct SessionSpans {
    conversation: String,
    run: Option<OpenRun>,
}

struct OpenRun {
    run_id: String,
    provider: String,
    model: String,
    start_ms: u64,
    /// The open step: its number and start.
    step: Option<(u32, u64)>,
    /// Calls sent and not yet answered: id, name, where, start.
    calls: Vec<(String, String, Option<String>, u64)>,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The usage a span reports: what the provider measured, absent where it did not.
fn usage_attrs(span: &mut Span, usage: &broca_protocol::Usage) {
    if let Some(n) = usage.input {
        span.attrs
            .push(("gen_ai.usage.input_tokens", Value::Int(n as i64)));
    }
    if let Some(n) = usage.output {
        span.attrs
            .push(("gen_ai.usage.output_tokens", Value::Int(n as i64)));
    }
}

fn ns(ms: u64) -> u64 {
    ms.saturating_mul(1_000_000)
}

/// `n` bytes of the hash of `parts`.
fn id<const N: usize>(parts: &[&str]) -> [u8; N] {
    let mut h = blake3::Hasher::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update(&[0]);
    }
    let mut out = [0u8; N];
    debug_assert!(N <= blake3::OUT_LEN, "an id is at most a hash long");
    out.copy_from_slice(&h.finalize().as_bytes()[..N]);
    out
}

/// A run's trace id.
pub fn trace_id(run_id: &str) -> [u8; 16] {
    id(&["broca-trace", run_id])
}

fn run_span_id(run_id: &str) -> [u8; 8] {
    id(&["run", run_id])
}

fn label<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

impl SessionSpans {
    /// A session's spans; `conversation` is its `gen_ai.conversation.id` (the session's
    /// address).
    pub fn new(conversation: String) -> SessionSpans {
        SessionSpans {
            conversation,
            run: None,
        }
    }

    /// The spans `record` finishes.
    pub fn observe(&mut self, record: &Record) -> Vec<Span> {
        let span = match record {
            Record::RunStarted(r) => {
                self.run = Some(OpenRun {
                    run_id: r.run_id.clone(),
                    provider: r.config.provider.clone(),
                    model: r.config.model.clone(),
                    start_ms: r.at_unix_ms,
                    step: None,
                    calls: Vec::new(),
                });
                None
            }
            Record::StepStarted(s) => {
                if let Some(run) = self.open(&s.run_id) {
                    run.step = Some((s.step, s.at_unix_ms.unwrap_or_else(now_ms)));
                }
                None
            }
            Record::ModelStepFinished(m) => self.open(&m.run_id).map(|run| run.step_span(m)),
            Record::ModelAttemptFinished(a) => {
                self.open(&a.run_id).map(|run| run.failed_attempt_span(a))
            }
            Record::ToolDispatchIntent(t) => {
                let at = t.at_unix_ms.unwrap_or_else(now_ms);
                if let Some(run) = self.open(&t.run_id) {
                    for (i, call) in t.calls.iter().enumerate() {
                        let to = t.dispatched_to.get(i).cloned().flatten();
                        run.calls.push((call.id.clone(), call.name.clone(), to, at));
                    }
                }
                None
            }
            Record::ToolResult(t) => self.open(&t.run_id).and_then(|run| run.tool_span(t)),
            Record::RunFinished(f) => {
                let run = self.run.take().filter(|r| r.run_id == f.run_id);
                run.map(|run| run.run_span(f, &self.conversation))
            }
            _ => None,
        };
        span.into_iter().collect()
    }

    fn open(&mut self, run_id: &str) -> Option<&mut OpenRun> {
        self.run.as_mut().filter(|r| r.run_id == run_id)
    }
}

impl OpenRun {
    /// A model step's `chat` span, from its step's start (or its last failed attempt's end).
    fn step_span(&mut self, m: &broca_wal::runrec::ModelStepFinished) -> Span {
        let end = m.at_unix_ms.unwrap_or_else(now_ms);
        let start = self.step.map_or(end, |(_, at)| at);
        let mut span = self.chat(m.step, m.attempt, start, end);
        usage_attrs(&mut span, &m.usage);
        span.attrs.push((
            "gen_ai.response.finish_reasons",
            Value::Strs(vec![label(&m.finish_reason)]),
        ));
        if let Some(id) = &m.request_id {
            span.attrs
                .push(("gen_ai.response.id", Value::Str(id.clone())));
        }
        span
    }

    /// A failed model attempt's `chat` span, its error's class as its error; the step's next
    /// attempt starts at its end.
    fn failed_attempt_span(&mut self, a: &broca_wal::runrec::ModelAttemptFinished) -> Span {
        let end = a.at_unix_ms.unwrap_or_else(now_ms);
        let start = self.step.map_or(end, |(_, at)| at);
        let mut span = self.chat(a.step, a.attempt, start, end);
        let class = label(&a.error.class);
        span.attrs.push(("error.type", Value::Str(class.clone())));
        span.error = Some(class);
        self.step = Some((a.step, end));
        span
    }

    /// A tool call's `execute_tool` span, from its intent to its result (none for a result
    /// whose call this run did not dispatch).
    fn tool_span(&mut self, t: &broca_wal::runrec::ToolResult) -> Option<Span> {
        let end = t.at_unix_ms.unwrap_or_else(now_ms);
        let at = self.calls.iter().position(|c| c.0 == t.result.call_id)?;
        let (call_id, name, to, start) = self.calls.remove(at);
        let mut span = self.child(
            &["tool", &call_id],
            format!("execute_tool {name}"),
            Kind::Internal,
            start,
            end,
        );
        span.attrs.extend([
            ("gen_ai.operation.name", Value::Str("execute_tool".into())),
            ("gen_ai.tool.name", Value::Str(name)),
            ("gen_ai.tool.call.id", Value::Str(call_id)),
            ("gen_ai.tool.type", Value::Str("function".into())),
        ]);
        if let Some(to) = to {
            span.attrs
                .push(("broca.tool.dispatched_to", Value::Str(to)));
        }
        if t.result.is_error {
            let why = t
                .result
                .reason
                .clone()
                .unwrap_or_else(|| "tool_error".into());
            span.attrs.push(("error.type", Value::Str(why.clone())));
            span.error = Some(why);
        }
        Some(span)
    }

    /// The run's `invoke_agent` span, the parent of its others. The calls left open have no
    /// result: the run span names them; no span of their own (their end is unknown).
    fn run_span(self, f: &broca_wal::runrec::RunFinished, conversation: &str) -> Span {
        let end = f.at_unix_ms.unwrap_or_else(now_ms);
        let mut span = Span {
            trace_id: trace_id(&self.run_id),
            span_id: run_span_id(&self.run_id),
            parent: None,
            name: "invoke_agent broca".into(),
            kind: Kind::Internal,
            start_ns: ns(self.start_ms),
            end_ns: ns(end.max(self.start_ms)),
            attrs: vec![
                ("gen_ai.operation.name", Value::Str("invoke_agent".into())),
                ("gen_ai.agent.name", Value::Str("broca".into())),
                ("gen_ai.conversation.id", Value::Str(conversation.into())),
                ("gen_ai.provider.name", Value::Str(self.provider)),
                ("gen_ai.request.model", Value::Str(self.model)),
                ("broca.run.id", Value::Str(self.run_id.clone())),
                ("broca.run.finish", Value::Str(f.reason.as_str().into())),
            ],
            error: None,
        };
        assert!(span.end_ns >= span.start_ns, "a span ends after it starts");
        usage_attrs(&mut span, &f.usage);
        if !f.indeterminate_tool_calls.is_empty() {
            span.attrs.push((
                "broca.run.indeterminate_tool_calls",
                Value::Strs(f.indeterminate_tool_calls.clone()),
            ));
        }
        if matches!(f.reason, FinishKind::Error | FinishKind::Interrupted) {
            let why = f.detail.clone().unwrap_or_else(|| f.reason.as_str().into());
            span.attrs
                .push(("error.type", Value::Str(f.reason.as_str().into())));
            span.error = Some(why);
        }
        span
    }

    fn child(&self, parts: &[&str], name: String, kind: Kind, start: u64, end: u64) -> Span {
        let mut key = vec![self.run_id.as_str()];
        key.extend_from_slice(parts);
        debug_assert!(!parts.is_empty(), "a child span's id is not its run's");
        Span {
            trace_id: trace_id(&self.run_id),
            span_id: id(&key),
            parent: Some(run_span_id(&self.run_id)),
            name,
            kind,
            start_ns: ns(start),
            end_ns: ns(end.max(start)),
            attrs: Vec::new(),
            error: None,
        }
    }

    /// A model attempt's span (`chat {model}`).
    fn chat(&self, step: u32, attempt: u32, start: u64, end: u64) -> Span {
        let (s, a) = (step.to_string(), attempt.to_string());
        let mut span = self.child(
            &["step", &s, &a],
            format!("chat {}", self.model),
            Kind::Client,
            start,
            end,
        );
        span.attrs.extend([
            ("gen_ai.operation.name", Value::Str("chat".into())),
            ("gen_ai.provider.name", Value::Str(self.provider.clone())),
            ("gen_ai.request.model", Value::Str(self.model.clone())),
            ("broca.step", Value::Int(i64::from(step))),
            ("broca.attempt", Value::Int(i64::from(attempt))),
        ]);
        span
    }
}
