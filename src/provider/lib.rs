//! Provider wire families: one folder per family, each a renderer (canonical request ->
//! request bytes, deterministic) and a normalizer (wire events -> canonical stream events),
//! behind one [`WireFamily`] trait. The transport ([`transport`]) owns network policy:
//! connections, timeouts, framing, error classification by status, and the stream's end.
//!
//! A family is: a renderer, an authorizer (a header for the key-based families; a later
//! family may sign the rendered bytes), a framing (server-sent events, WebSocket, or a binary
//! frame format a later family brings), a normalizer fed one framed event at a time (its
//! event name and its data), and a classifier of error replies.
//!
//! Where things are: one folder per wire family (render + normalize; `demo.rs` the keyless demo
//! family, answered in process by the script), each session's rendered messages held per shard
//! between its requests (`prefix.rs`: Anthropic, Chat and Responses render only the messages
//! the last request did not hold), aliases, credentials (`credential.rs`; the claustrum vault
//! over broca-subc in `vault.rs`: module mode's grant and handles, `HandleVault` for run and
//! serve, typed secrets), the catalog service's GET (`catalog_service.rs`); which family an id
//! names is `broca_protocol::family::Family`'s, matched exhaustively here

pub mod alias;
pub mod anthropic;
pub mod bedrock;
pub mod catalog_service;
pub mod chatgpt;
pub mod code_assist;
pub mod credential;
pub mod demo;
pub mod gemini;
pub(crate) mod json;
#[cfg(test)]
mod media_tests;
pub mod openai_chat;
pub mod openai_responses;
pub mod prefix;
pub(crate) mod scan;
#[cfg(test)]
mod shape_tests;
pub mod sigv4;
pub(crate) mod template;
pub mod vault;

pub use alias::Aliases;

use broca_protocol::model::CredentialProblem;
use broca_protocol::{ClassifiedError, ErrorClass, Request, StreamEvent};

/// What a normalizer makes of one wire event.
#[derive(Debug, Clone, PartialEq)]
pub enum Normalized {
    /// Canonical events (possibly none, e.g. for a ping).
    Events(Vec<StreamEvent>),
    /// The provider reported an error in the stream, classified here.
    Error(ClassifiedError),
}

/// A framed event that is not an event of the family: what was wrong with it (shown to the
/// operator; the attempt fails as a permanent error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatError(pub String);

impl std::fmt::Display for FormatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for FormatError {}

/// A family's stream normalizer: one framed event in (its event name when the framing has
/// one, and its data), canonical events out.
pub trait StreamNormalizer {
    /// Normalizes one event; `Err` says why it is not an event of this family.
    fn push(&mut self, event: Option<&str>, data: &str) -> Result<Normalized, FormatError>;
}

/// What a family authorizes a request with.
pub struct AuthContext<'a> {
    pub credential: &'a credential::Credential,
    /// The base URL the request goes to (a signature covers its host).
    pub url: &'a broca_io::net::Url,
    /// Seconds since the epoch (a signature is dated).
    pub now_unix_secs: u64,
}

/// How a family's answer is framed on the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// An HTTP response of server-sent events.
    Sse,
    /// A WebSocket: the rendered body is sent as one text message; each answer message is
    /// one event.
    WebSocket,
    /// An HTTP response of AWS event-stream messages; each message is one event, named by its
    /// `:event-type` (or `:exception-type`) header.
    AwsEventStream,
}

/// A rendered request: everything but the connection.
#[derive(Clone, PartialEq, Eq)]
pub struct Rendered {
    /// The path after the base URL's prefix (`/v1/messages`).
    pub path: String,
    /// Headers besides Host, User-Agent and Content-Length. Holds the credential once
    /// authorized: never logged, never stored.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl std::fmt::Debug for Rendered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rendered")
            .field("path", &self.path)
            .field(
                "headers",
                &self.headers.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .field("body_bytes", &self.body.len())
            .finish()
    }
}

/// One wire family.
pub trait WireFamily: Sync {
    /// The family's id, as the catalog names it.
    fn id(&self) -> &'static str;
    /// Renders `req` (deterministic: the same request gives the same bytes, always).
    fn render(&self, req: &Request, aliases: &Aliases) -> Rendered;
    /// Whether the family's requests mark prompt-cache breakpoints.
    fn marks_cache(&self) -> bool {
        false
    }
    /// Whether the family can use `credential` (admission asks before a run is admitted).
    fn takes(&self, credential: &credential::Credential) -> Result<(), CredentialProblem> {
        credential.api_key(self.id()).map(|_| ())
    }
    /// Adds the credential to a rendered request (a header; or a signature over the
    /// rendered bytes, for a family that signs). `Err` when the credential is of a kind the
    /// family cannot use.
    fn authorize(
        &self,
        rendered: &mut Rendered,
        auth: &AuthContext<'_>,
    ) -> Result<(), CredentialProblem>;
    /// How the answer is framed when the base URL has `scheme`.
    fn framing(&self, scheme: broca_io::net::Scheme) -> Framing {
        let _ = scheme;
        Framing::Sse
    }
    /// The first message to send over a WebSocket (families that support it).
    fn websocket_message(&self, rendered: &Rendered) -> Option<String> {
        let _ = rendered;
        None
    }
    /// A fresh normalizer for one attempt.
    fn normalizer(&self, aliases: Aliases) -> Box<dyn StreamNormalizer>;
    /// The class of an error reply body the provider sent with a non-2xx `status`, when the
    /// body says more than the status does (e.g. a context-length signal).
    fn classify_body(&self, status: u16, body: &[u8]) -> Option<(ErrorClass, String)>;
    /// How long an error reply's body asks to wait before a retry, when no header says it
    /// (Google's `RetryInfo`).
    fn retry_after_body(&self, body: &[u8]) -> Option<u64> {
        let _ = body;
        None
    }
    /// The quota a 2xx answer's headers report (`header` looks one up by name).
    fn quota(&self, header: &dyn Fn(&str) -> Option<String>) -> Option<broca_protocol::Quota> {
        let _ = header;
        None
    }
}

/// The family a catalog family id names.
pub fn family(id: &str) -> Option<&'static dyn WireFamily> {
    use broca_protocol::family::Family as F;
    Some(match F::parse(id)? {
        F::AnthropicMessages => &anthropic::Family,
        F::OpenAiChat => &openai_chat::Family,
        F::OpenAiResponses => &openai_responses::Family,
        F::Gemini => &gemini::Family,
        F::CodeAssist => &code_assist::Family,
        F::BedrockConverse => &bedrock::Family,
        F::ChatGpt => &chatgpt::Family,
        F::Demo => &demo::Family,
    })
}

/// Admission's checks against this build's families and a credential source.
pub struct Checks {
    secrets: Box<dyn credential::Secrets + Send + Sync>,
    /// What a lookup run off the thread ([`Checks::prefetch`]) just answered for a credential
    /// it could not resolve, so the admission right after it does not ask again on its own
    /// thread.
    refused: std::sync::Mutex<Vec<(String, credential::CredentialProblem, std::time::Instant)>>,
}

/// How long a prefetched refusal answers admission.
const PREFETCH_KEPT: std::time::Duration = std::time::Duration::from_secs(2);

impl Checks {
    pub fn new(secrets: Box<dyn credential::Secrets + Send + Sync>) -> Checks {
        Checks {
            secrets,
            refused: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Resolves `credential_id` on a thread of its own when its resolution waits on another
    /// process (a vault read): the check admission makes next on its shard then answers at
    /// once, from the vault's memory or from the refusal kept here.
    pub async fn prefetch(&self, credential_id: &str) {
        let Some(lookup) = self.secrets.lookup_off_thread(credential_id) else {
            return;
        };
        let answer = credential::off_thread(lookup).await;
        if let (Err(problem), Ok(mut refused)) = (answer, self.refused.lock()) {
            refused.retain(|(_, _, at)| at.elapsed() < PREFETCH_KEPT);
            refused.push((
                credential_id.to_string(),
                problem,
                std::time::Instant::now(),
            ));
        }
    }

    /// The refusal a prefetch kept for `credential_id`, if still fresh (taken: used once).
    fn prefetched_refusal(&self, credential_id: &str) -> Option<credential::CredentialProblem> {
        let mut refused = self.refused.lock().ok()?;
        let i = refused
            .iter()
            .position(|(id, _, at)| id == credential_id && at.elapsed() < PREFETCH_KEPT)?;
        Some(refused.swap_remove(i).1)
    }
}

impl broca_protocol::model::ProviderCheck for Checks {
    fn family(
        &self,
        id: &str,
    ) -> Result<broca_protocol::model::FamilyTraits, broca_protocol::model::UnknownFamily> {
        check_family(id)
    }

    fn credential(
        &self,
        family: &str,
        credential_id: &str,
    ) -> Result<(), credential::CredentialProblem> {
        if let Some(problem) = self.prefetched_refusal(credential_id) {
            return Err(problem);
        }
        check_credential(&*self.secrets, family, credential_id)
    }
}

/// Whether this build speaks the family `id`.
pub fn check_family(
    id: &str,
) -> Result<broca_protocol::model::FamilyTraits, broca_protocol::model::UnknownFamily> {
    let f = family(id).ok_or_else(|| broca_protocol::model::UnknownFamily {
        family: id.to_string(),
        known: FAMILIES.to_vec(),
    })?;
    Ok(broca_protocol::model::FamilyTraits {
        marks_cache: f.marks_cache(),
    })
}

/// Resolves `credential_id` through `secrets` and checks that `family` takes it.
pub fn check_credential(
    secrets: &dyn credential::Secrets,
    family: &str,
    credential_id: &str,
) -> Result<(), credential::CredentialProblem> {
    let c = secrets.credential(credential_id)?;
    match self::family(family) {
        Some(f) => Ok(f.takes(&c)?),
        None => Ok(()),
    }
}

/// The wire families this build speaks, by id (the demo model, `demo`, has no wire).
pub const FAMILIES: &[&str] = &broca_protocol::family::Family::WIRE_IDS;

/// An error reply's body, in the shape both the Anthropic and the OpenAI APIs use:
/// `{"error": {"type", "message", "code"?}}` (Anthropic adds a top-level `"type":"error"`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub(crate) struct ErrorBody {
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub message: String,
    #[serde(default, deserialize_with = "code_text")]
    pub code: Option<String>,
}

fn code_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let v: Option<serde_json::Value> = serde::Deserialize::deserialize(d)?;
    Ok(match v {
        Some(serde_json::Value::String(s)) => Some(s),
        Some(serde_json::Value::Number(n)) => Some(n.to_string()),
        _ => None,
    })
}

/// Parses an error reply body; `None` when it is not of that shape.
pub(crate) fn error_body(body: &[u8]) -> Option<ErrorBody> {
    #[derive(serde::Deserialize)]
    struct Outer {
        error: ErrorBody,
    }
    serde_json::from_slice::<Outer>(body).ok().map(|o| o.error)
}

/// A media block as a family renders it: its bytes, when the request carries them (its model
/// takes them), else the role's marker text in its place (reason `unsupported`).
pub(crate) enum MediaPart<'a> {
    Bytes {
        kind: &'a str,
        mime: &'a str,
        data: &'a [u8],
    },
    Marker(String),
}

impl<'a> MediaPart<'a> {
    pub(crate) fn of(m: &'a broca_protocol::media::Media, req: &'a Request) -> MediaPart<'a> {
        match req.media.get(&m.sha256) {
            Some(data) => MediaPart::Bytes {
                kind: &m.kind,
                mime: &m.mime,
                data,
            },
            None => MediaPart::Marker(broca_protocol::media::marker(m, "unsupported")),
        }
    }
}

/// A file name for a document (the families that ask for one): its digest's head.
pub(crate) fn file_name(m: &broca_protocol::media::Media) -> String {
    let ext = if m.mime == "application/pdf" {
        "pdf"
    } else {
        "bin"
    };
    format!("{}.{ext}", &m.sha256[..m.sha256.len().min(12)])
}

/// About how many bytes `req` renders to (a little more, for escapes and field names).
pub(crate) fn size_hint(req: &Request) -> usize {
    use broca_protocol::Block;
    let blocks: usize = req
        .messages
        .iter()
        .flat_map(|m| &m.content)
        .map(|b| {
            96 + match b {
                Block::Text { text } => text.len(),
                Block::ToolUse { id, name, input } => id.len() + name.len() + input.get().len() * 2,
                Block::ToolResult {
                    tool_use_id,
                    content,
                    ..
                } => tool_use_id.len() + content.len(),
                Block::Thinking { text, signature } => {
                    text.len() + signature.as_ref().map_or(0, String::len)
                }
                Block::Media(m) => usize::try_from(m.bytes).unwrap_or(0) / 3 * 4 + 64,
            }
        })
        .sum();
    let tools = req.tools.len() * 512 + req.system.as_ref().map_or(0, String::len);
    (blocks + tools) * 9 / 8 + 512
}

/// Decodes `chunks` as server-sent events and normalizes them (for the families' tests).
#[cfg(test)]
pub(crate) fn normalize_chunks(
    family: &dyn WireFamily,
    aliases: &Aliases,
    chunks: &[&[u8]],
) -> Vec<StreamEvent> {
    let mut sse = broca_io::sse::SseDecoder::default();
    let mut n = family.normalizer(aliases.clone());
    let mut out = Vec::new();
    for c in chunks {
        sse.push(
            c,
            &mut |e| match n.push(e.event, e.data).expect("a known event") {
                Normalized::Events(evs) => out.extend(evs),
                Normalized::Error(e) => panic!("unexpected stream error {e:?}"),
            },
        )
        .expect("valid SSE");
    }
    out
}

/// Asserts that `stream` normalizes to `expected` whole and split at every byte boundary.
#[cfg(test)]
pub(crate) fn assert_every_split(
    family: &dyn WireFamily,
    aliases: &Aliases,
    stream: &[u8],
    expected: &[StreamEvent],
) {
    assert_eq!(normalize_chunks(family, aliases, &[stream]), expected);
    for i in 0..=stream.len() {
        assert_eq!(
            normalize_chunks(family, aliases, &[&stream[..i], &stream[i..]]),
            expected,
            "split at {i}"
        );
    }
}

/// The constructors every family's normalizer has: `new(aliases)`, and (tests) `full_only()`,
/// which reads every event with the full parse. The struct has `aliases` and `full_only`
/// fields and derives `Default`.
macro_rules! normalizer_constructors {
    ($ty:ident) => {
        impl $ty {
            /// A normalizer mapping the request's tool aliases back to the caller's names.
            pub fn new(aliases: Aliases) -> $ty {
                $ty {
                    aliases,
                    ..$ty::default()
                }
            }

            /// A normalizer that reads every event with the full parse (tests compare the
            /// fast path with it).
            #[cfg(test)]
            pub(crate) fn full_only() -> $ty {
                $ty {
                    full_only: true,
                    ..$ty::default()
                }
            }
        }
    };
}
pub(crate) use normalizer_constructors;

/// The two tests every family's recorded stream gets: the fast path agrees with the full
/// parse on each event, and the stream normalizes to `expected` split at every byte.
#[cfg(test)]
macro_rules! recorded_stream_tests {
    ($stream:expr, $expected:expr) => {
        #[test]
        fn the_fast_path_agrees_with_the_full_parse() {
            crate::assert_fast_path_agrees(
                $stream.as_bytes(),
                Normalizer::default(),
                Normalizer::full_only(),
            );
        }

        #[test]
        fn a_recorded_stream_normalizes_at_every_byte_boundary() {
            crate::assert_every_split(
                &super::super::Family,
                &Aliases::default(),
                $stream.as_bytes(),
                &$expected,
            );
        }
    };
}
#[cfg(test)]
pub(crate) use recorded_stream_tests;

/// Asserts that `fast` (a normalizer with its fast path) and `full` (the same family reading
/// every event with the full parse) make the same events of every event in `stream`, and of
/// every event made odd (a field renamed, a value of another type, padding added).
#[cfg(test)]
pub(crate) fn assert_fast_path_agrees(
    stream: &[u8],
    mut fast: impl StreamNormalizer,
    mut full: impl StreamNormalizer,
) {
    let mut datas = Vec::new();
    broca_io::sse::SseDecoder::default()
        .push(stream, &mut |e| datas.push(e.data.to_string()))
        .unwrap();
    let mut variants = Vec::new();
    for d in &datas {
        variants.push(d.clone());
        variants.push(d.replacen("\"text\":", "\"text\" : ", 1));
        variants.push(d.replacen(":\"", ":  \"", 2));
        variants.push(d.replacen("\"delta\":\"", "\"delta\":1,\"x\":\"", 1));
        variants.push(d.replacen("}", ",\"extra\":[{\"}\":\"]\"}]}", 1));
        variants.push(d.replacen("\"content\":\"", "\"content\":null,\"c\":\"", 1));
    }
    for d in &variants {
        assert_eq!(
            fast.push(None, d).ok(),
            full.push(None, d).ok(),
            "the fast path and the full parse differ on {d}"
        );
    }
}

/// [`sample_request`] with its tools' aliases, and the wire name of its tool that needs one.
#[cfg(test)]
pub(crate) fn sample_with_alias() -> (Request, Aliases, String) {
    let req = sample_request();
    let aliases = Aliases::for_tools(&req.tools);
    let alias = aliases.wire("weather.get").to_string();
    (req, aliases, alias)
}

/// A request for the families' render tests: a system text, two tools (one whose name needs
/// an alias), and a transcript with text, thinking, a tool call and its result.
#[cfg(test)]
pub(crate) fn sample_request() -> Request {
    use broca_protocol::{Block, Generation, Json, Message, Role, ToolSpec};
    Request {
        provider: "x".into(),
        model: "m-1".into(),
        credential_id: "env:X".into(),
        system: Some("Be brief.".into()),
        messages: vec![
            Message::user_text("Weather in Paris?"),
            Message {
                role: Role::Assistant,
                content: vec![
                    Block::Thinking {
                        text: "need the tool".into(),
                        signature: Some("sig==".into()),
                    },
                    Block::Text {
                        text: "Checking.".into(),
                    },
                    Block::ToolUse {
                        id: "call_1".into(),
                        name: "weather.get".into(),
                        input: Json::from_text(r#"{"city":"Paris"}"#.into()).unwrap(),
                    },
                ],
            },
            Message {
                role: Role::User,
                content: vec![Block::ToolResult {
                    tool_use_id: "call_1".into(),
                    content: "18C".into(),
                    is_error: false,
                }],
            },
        ]
        .into_iter()
        .map(std::sync::Arc::new)
        .collect(),
        tools: vec![
            ToolSpec {
                name: "weather.get".into(),
                description: "Current weather".into(),
                input_schema: serde_json::json!({"type":"object","properties":{"city":{"type":"string"}}}),
                route: String::new(),
                reply: None,
            },
            ToolSpec {
                name: "clock".into(),
                description: String::new(),
                input_schema: serde_json::json!({"type":"object"}),
                route: String::new(),
                reply: None,
            },
        ]
        .into(),
        generation: Generation {
            max_output_tokens: Some(256),
            temperature: Some(0.5),
            ..Generation::default()
        },
        prompt_cache: true,
        route: None,
        shape: None,
        media: Default::default(),
    }
}
