//! broca-transport, the provider transport: turns a canonical request into a call on the shard's HTTP client
//! and its answer into canonical events, with the network policy in one place.
//!
//! - Base URLs: the catalog's, overridden per provider by `BROCA_BASE_URL_<PROVIDER>` or by
//!   the caller (`--base-url`). Plain http only for loopback hosts.
//! - Credentials: a credential id (`env:NAME`) resolves at call time (see `broca_provider::credential`);
//!   the secret goes into the request and never into a record, a log line or an error
//!   message (any echo of it in a provider's error text is replaced).
//! - Errors are classified here: 401/403 auth_required; 408, 409, 425, 429 and 5xx (529
//!   included) transient, with Retry-After (`retry-after-ms` or seconds) honoured by the run
//!   loop's backoff; other statuses by the family's reading of the body (context_overflow)
//!   else permanent. A connection that fails, or a stream that ends before the step's finish
//!   event, is a transient failure: the attempt's partial output is dropped by the run loop.

use std::collections::VecDeque;
use std::rc::Rc;

use broca_io::eventstream::EventStreamDecoder;
use broca_io::net::ws::WebSocket;
use broca_io::net::{HttpClient, NetError, Request as HttpRequest, Response, Url};
use broca_io::sse::SseDecoder;

use broca_catalog as catalog;
use broca_protocol::model::{Failure, ModelClient, ModelStream};
use broca_protocol::{ClassifiedError, ErrorClass, Request, StreamEvent, Usage};

use broca_provider::credential::{Redactor, Secrets};
use broca_provider::{
    Aliases, AuthContext, Framing, Normalized, Rendered, StreamNormalizer, WireFamily,
};

/// The most bytes of an error reply read for its message.
const ERROR_BODY_MAX: usize = 256 * 1024;

mod endpoints;
pub mod refresh;
pub use endpoints::{base_url_var, EndpointError, Endpoints};

/// The model client that speaks the wire families over the shard's HTTP client.
pub struct HttpModelClient {
    client: Rc<HttpClient>,
    endpoints: Endpoints,
    secrets: Box<dyn Secrets>,
    errors: Rc<ErrorCounts>,
}

/// Failed model attempts by error class (for metrics).
#[derive(Debug, Default)]
pub struct ErrorCounts([std::cell::Cell<u64>; 4]);

impl ErrorCounts {
    fn count(&self, class: ErrorClass) {
        let c = &self.0[Self::index(class)];
        c.set(c.get() + 1);
    }

    fn index(class: ErrorClass) -> usize {
        match class {
            ErrorClass::Transient => 0,
            ErrorClass::Permanent => 1,
            ErrorClass::AuthRequired => 2,
            ErrorClass::ContextOverflow => 3,
        }
    }

    /// The count for each class.
    pub fn snapshot(&self) -> Vec<(ErrorClass, u64)> {
        let classes = [
            ErrorClass::Transient,
            ErrorClass::Permanent,
            ErrorClass::AuthRequired,
            ErrorClass::ContextOverflow,
        ];
        debug_assert!(
            (0..classes.len()).all(|i| Self::index(classes[i]) == i),
            "each class counts on its own slot"
        );
        classes
            .into_iter()
            .map(|c| (c, self.0[Self::index(c)].get()))
            .collect()
    }
}

impl HttpModelClient {
    /// A client over `client`, with base URLs from `endpoints` and secrets from `secrets`.
    pub fn new(client: Rc<HttpClient>, endpoints: Endpoints, secrets: Box<dyn Secrets>) -> Self {
        HttpModelClient {
            client,
            endpoints,
            secrets,
            errors: Rc::default(),
        }
    }

    /// The HTTP client (its counters feed metrics).
    pub fn http(&self) -> &Rc<HttpClient> {
        &self.client
    }

    /// Failed attempts by class so far.
    pub fn errors(&self) -> &ErrorCounts {
        &self.errors
    }
}

fn failure(class: ErrorClass, message: String, retry_after_ms: Option<u64>) -> Failure {
    Failure {
        error: ClassifiedError {
            class,
            message,
            retry_after_ms,
        },
        usage: None,
    }
}

/// The class of a transport failure.
fn net_failure(e: &NetError, redact: &Redactor) -> Failure {
    let class = if e.is_transient() {
        ErrorClass::Transient
    } else {
        ErrorClass::Permanent
    };
    failure(class, redact.scrub(&e.to_string()), None)
}

/// How long the provider asked to wait: `retry-after-ms`, else `retry-after` in seconds.
pub fn retry_after_ms(ms: Option<&str>, secs: Option<&str>) -> Option<u64> {
    if let Some(ms) = ms.and_then(|v| v.trim().parse::<f64>().ok()) {
        if ms.is_finite() && ms >= 0.0 {
            return Some(ms.ceil() as u64);
        }
    }
    let s = secs?.trim().parse::<f64>().ok()?;
    (s.is_finite() && s >= 0.0).then(|| (s * 1000.0).ceil() as u64)
}

/// Classifies an error reply: by status first, then by what the family reads in the body.
pub fn classify_reply(
    family: &dyn WireFamily,
    status: u16,
    body: &[u8],
    retry_after_ms: Option<u64>,
    target: &str,
) -> ClassifiedError {
    let from_body = family.classify_body(status, body);
    let class = match status {
        401 | 403 => ErrorClass::AuthRequired,
        408 | 409 | 425 | 429 | 500..=599 => ErrorClass::Transient,
        _ => match &from_body {
            Some((c, _)) => *c,
            None => ErrorClass::Permanent,
        },
    };
    let said = match from_body {
        Some((_, text)) => text,
        None => {
            let text = String::from_utf8_lossy(&body[..body.len().min(300)]);
            let text = text.trim();
            if text.is_empty() {
                "no body".to_string()
            } else {
                text.to_string()
            }
        }
    };
    ClassifiedError {
        class,
        message: format!("HTTP {status} from {target}: {said}"),
        retry_after_ms,
    }
}

impl broca_protocol::model::ProviderCheck for HttpModelClient {
    fn family(
        &self,
        id: &str,
    ) -> Result<broca_protocol::model::FamilyTraits, broca_protocol::model::UnknownFamily> {
        broca_provider::check_family(id)
    }

    fn credential(
        &self,
        family: &str,
        credential_id: &str,
    ) -> Result<(), broca_protocol::model::CredentialProblem> {
        broca_provider::check_credential(&*self.secrets, family, credential_id)
    }
}

impl ModelClient for HttpModelClient {
    type Stream = HttpModelStream;

    fn check(&self) -> &dyn broca_protocol::model::ProviderCheck {
        self
    }

    async fn open(&self, request: &Request) -> Result<HttpModelStream, Failure> {
        match self.open_stream(request).await {
            Ok(mut s) => {
                s.errors = Some(self.errors.clone());
                Ok(s)
            }
            Err(f) => {
                self.errors.count(f.error.class);
                Err(f)
            }
        }
    }
}

impl HttpModelClient {
    async fn open_stream(&self, request: &Request) -> Result<HttpModelStream, Failure> {
        let route = route_of(request)?;
        let family = broca_provider::family(&route.family).ok_or_else(|| {
            failure(
                ErrorClass::Permanent,
                format!(
                    "provider `{}` speaks the {} wire format, which this build does not",
                    request.provider, route.family
                ),
                None,
            )
        })?;
        if route.family == broca_protocol::demo::FAMILY {
            let script = broca_protocol::demo::answer(request).into();
            return Ok(HttpModelStream::new(
                Source::Scripted(script),
                family.normalizer(Aliases::default()),
                Redactor::default(),
                format!("{}/{}", request.provider, request.model),
            ));
        }
        let url = self
            .endpoints
            .base_url_for(&request.provider, &route.base_url)
            .map_err(|e| failure(ErrorClass::Permanent, e.to_string(), None))?;
        // A credential that waits on another process (a vault read) is looked up on a
        // thread of its own: the shard goes on with its other sessions meanwhile.
        let resolved = match self.secrets.lookup_off_thread(&request.credential_id) {
            Some(lookup) => broca_provider::credential::off_thread(lookup).await,
            None => self.secrets.credential(&request.credential_id),
        };
        let credential = resolved.map_err(|e| {
            // A vault that is out fails the attempt for now; a refused credential pauses.
            let class = if e.outage {
                ErrorClass::Transient
            } else {
                ErrorClass::AuthRequired
            };
            failure(class, e.message, None)
        })?;
        self.open_refreshing(request, family, &url, credential)
            .await
    }

    /// Renders, authorizes and sends the request to `url` with `credential`, and opens the
    /// answer's stream. A provider that refuses the credential itself tells its source.
    async fn open_with(
        &self,
        request: &Request,
        family: &'static dyn WireFamily,
        url: &Url,
        credential: &broca_provider::credential::Credential,
    ) -> Result<HttpModelStream, Failure> {
        let redact = credential.redactor();
        let aliases = Aliases::for_tools(&request.tools);
        let mut rendered = family.render(request, &aliases);
        let auth = AuthContext {
            credential,
            url,
            now_unix_secs: now_unix_ms() / 1000,
        };
        family
            .authorize(&mut rendered, &auth)
            .map_err(|e| failure(ErrorClass::AuthRequired, e.message, None))?;
        let normalizer = family.normalizer(aliases);
        let target = url.to_string();
        let framing = family.framing(url.scheme);
        let mut quota = None;
        let status = std::cell::Cell::new(None);
        let out = Outgoing {
            client: &self.client,
            family,
            url,
            rendered: &rendered,
            redact: &redact,
            target: &target,
            refused_status: &status,
        };
        let opened = match framing {
            Framing::Sse | Framing::AwsEventStream => open_http(&out).await.map(|resp| {
                quota = family.quota(&|name| resp.head.header(name).map(str::to_string));
                Source::http(resp, framing)
            }),
            // Over a WebSocket the quota comes with the upgrade's reply.
            Framing::WebSocket => open_ws(&out).await.inspect(|source| {
                if let Source::Ws(ws) = source {
                    quota = family.quota(&|name| ws.header(name).map(str::to_string));
                }
            }),
        };
        let source = match opened {
            Ok(source) => source,
            Err(f) => {
                // The provider refused the credential itself: its source hears of it (a
                // vault marks it, and gives a fresh one next time).
                if let (ErrorClass::AuthRequired, Some(s @ (401 | 403))) =
                    (f.error.class, status.get())
                {
                    self.secrets.auth_failed(&request.credential_id, s);
                }
                return Err(f);
            }
        };
        let mut stream = HttpModelStream::new(source, normalizer, redact, target);
        debug_assert!(stream.pending.is_empty(), "a new stream holds no event yet");
        stream.pending.extend(quota.map(StreamEvent::Quota));
        Ok(stream)
    }
}

/// Which family and where: the run's frozen entry says; only a run admitted before entries
/// were frozen asks the catalog in use.
fn route_of(request: &Request) -> Result<broca_protocol::ProviderRoute, Failure> {
    if let Some(r) = &request.route {
        return Ok(r.clone());
    }
    let entry = catalog::provider(&request.provider).ok_or_else(|| {
        failure(
            ErrorClass::Permanent,
            format!("unknown provider `{}`", request.provider),
            None,
        )
    })?;
    Ok(broca_protocol::ProviderRoute {
        family: entry.family,
        base_url: entry.base_url,
    })
}

fn header_pairs(rendered: &Rendered) -> Vec<(&str, &str)> {
    rendered
        .headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect()
}

/// The failure of a non-2xx reply, classified, with any echo of the secret removed.
fn refused(
    family: &dyn WireFamily,
    status: u16,
    body: &[u8],
    wait: Option<u64>,
    target: &str,
    redact: &Redactor,
) -> Failure {
    let mut error = classify_reply(family, status, body, wait, target);
    error.message = redact.scrub(&error.message);
    Failure { error, usage: None }
}

/// Sends the request; a non-2xx reply is read and classified.
/// A request on its way out: where it goes, its bytes, and where a refusal's status is told.
#[derive(Clone, Copy)]
struct Outgoing<'a> {
    client: &'a Rc<HttpClient>,
    family: &'a dyn WireFamily,
    url: &'a Url,
    rendered: &'a Rendered,
    redact: &'a Redactor,
    target: &'a str,
    /// Set to the HTTP status of a refusal (the open's error says only its class).
    refused_status: &'a std::cell::Cell<Option<u16>>,
}

async fn open_http(out: &Outgoing<'_>) -> Result<Response, Failure> {
    let headers = header_pairs(out.rendered);
    let req = HttpRequest {
        method: "POST",
        url: out.url,
        path: &out.rendered.path,
        headers: &headers,
        body: &out.rendered.body,
    };
    let mut resp = out
        .client
        .send(&req)
        .await
        .map_err(|e| net_failure(&e, out.redact))?;
    let status = resp.status();
    if !(200..300).contains(&status) {
        let wait = retry_after_ms(
            resp.head.header("retry-after-ms"),
            resp.head.header("retry-after"),
        );
        let body = resp.body(ERROR_BODY_MAX).await.unwrap_or_default();
        let wait = wait.or_else(|| out.family.retry_after_body(&body));
        out.refused_status.set(Some(status));
        return Err(refused(
            out.family, status, &body, wait, out.target, out.redact,
        ));
    }
    Ok(resp)
}

async fn open_ws(out: &Outgoing<'_>) -> Result<Source, Failure> {
    let message = out.family.websocket_message(out.rendered).ok_or_else(|| {
        failure(
            ErrorClass::Permanent,
            format!("the {} family has no WebSocket mode", out.family.id()),
            None,
        )
    })?;
    let headers: Vec<(&str, &str)> = header_pairs(out.rendered)
        .into_iter()
        .filter(|(n, _)| {
            !n.eq_ignore_ascii_case("content-type") && !n.eq_ignore_ascii_case("accept")
        })
        .collect();
    let opened = WebSocket::connect(out.client, out.url, &out.rendered.path, &headers)
        .await
        .map_err(|e| net_failure(&e, out.redact))?;
    let mut ws = match opened {
        Ok(ws) => ws,
        Err(refused) => {
            let wait = retry_after_ms(None, refused.retry_after.as_deref());
            out.refused_status.set(Some(refused.status));
            return Err(self::refused(
                out.family,
                refused.status,
                &refused.body,
                wait,
                out.target,
                out.redact,
            ));
        }
    };
    ws.send_text(message)
        .await
        .map_err(|e| net_failure(&e, out.redact))?;
    Ok(Source::Ws(Box::new(ws)))
}

enum Source {
    Sse {
        resp: Box<Response>,
        sse: SseDecoder,
    },
    EventStream {
        resp: Box<Response>,
        frames: EventStreamDecoder,
    },
    Ws(Box<WebSocket>),
    /// A WebSocket handed over to be closed, once its answer was complete.
    Closed,
    /// The demo model's script: each event with the pause before it (ms).
    Scripted(VecDeque<(u64, StreamEvent)>),
}

/// How long a WebSocket's close waits for the server's close frame.
const WS_CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl Source {
    fn http(resp: Response, framing: Framing) -> Source {
        let resp = Box::new(resp);
        match framing {
            Framing::AwsEventStream => Source::EventStream {
                resp,
                frames: EventStreamDecoder::default(),
            },
            _ => Source::Sse {
                resp,
                sse: SseDecoder::default(),
            },
        }
    }
}

/// Why a stream stopped before its end.
enum StreamFault {
    /// The provider reported an error in the stream (classified where it arose).
    Provider(ClassifiedError),
    /// The bytes are not a stream of this family, or not framed as one.
    Format(String),
}

/// Normalizes one event into `pending`, noting reported usage.
fn normalize_into(
    normalizer: &mut dyn StreamNormalizer,
    pending: &mut VecDeque<StreamEvent>,
    usage: &mut Option<Usage>,
    event: Option<&str>,
    data: &str,
) -> Result<(), StreamFault> {
    match normalizer.push(event, data) {
        Ok(Normalized::Events(evs)) => {
            for ev in &evs {
                if let StreamEvent::Usage(u) = ev {
                    usage.get_or_insert_with(Usage::default).merge(u);
                }
            }
            pending.extend(evs);
            Ok(())
        }
        Ok(Normalized::Error(e)) => Err(StreamFault::Provider(e)),
        Err(why) => Err(StreamFault::Format(why.0)),
    }
}

/// One model call's answer, as canonical events.
pub struct HttpModelStream {
    source: Source,
    normalizer: Box<dyn StreamNormalizer>,
    pending: VecDeque<StreamEvent>,
    /// The step's finish event was seen: the step is complete whatever follows.
    finished: bool,
    ended: bool,
    /// Usage reported so far (a failed attempt carries it).
    usage: Option<Usage>,
    redact: Redactor,
    target: String,
    /// Where failures are counted.
    errors: Option<Rc<ErrorCounts>>,
}

impl HttpModelStream {
    fn new(
        source: Source,
        normalizer: Box<dyn StreamNormalizer>,
        redact: Redactor,
        target: String,
    ) -> HttpModelStream {
        HttpModelStream {
            source,
            normalizer,
            pending: VecDeque::new(),
            finished: false,
            ended: false,
            usage: None,
            redact,
            target,
            errors: None,
        }
    }

    /// The stream of a 2xx response already received, framed as `framing` (SSE or AWS
    /// event-stream), normalized by `normalizer`.
    pub fn from_response(
        resp: Response,
        framing: Framing,
        normalizer: Box<dyn StreamNormalizer>,
        target: String,
    ) -> HttpModelStream {
        HttpModelStream::new(
            Source::http(resp, framing),
            normalizer,
            Redactor::default(),
            target,
        )
    }

    fn fail(&mut self, class: ErrorClass, message: String) -> Failure {
        self.ended = true;
        Failure {
            error: ClassifiedError {
                class,
                message: self.redact.scrub(&message),
                retry_after_ms: None,
            },
            usage: self.usage,
        }
    }

    fn normalize(&mut self, event: Option<&str>, data: &str) -> Result<(), Failure> {
        normalize_into(
            self.normalizer.as_mut(),
            &mut self.pending,
            &mut self.usage,
            event,
            data,
        )
        .map_err(|f| self.normalize_failure(f))
    }

    /// The failure of a stream the normalizer stopped: the provider's classified error, or an
    /// event not of the family.
    fn normalize_failure(&mut self, f: StreamFault) -> Failure {
        match f {
            StreamFault::Provider(mut e) => {
                e.message = self
                    .redact
                    .scrub(&format!("{}: {}", self.target, e.message));
                self.ended = true;
                Failure {
                    error: e,
                    usage: self.usage,
                }
            }
            StreamFault::Format(why) => self.fail(
                ErrorClass::Permanent,
                format!(
                    "{}: the stream is not of this provider's format: {why}",
                    self.target
                ),
            ),
        }
    }

    /// Decodes body bytes with the response's framing and normalizes each event.
    fn decode(&mut self, bytes: &[u8]) -> Result<(), Failure> {
        let (normalizer, pending, usage) =
            (&mut self.normalizer, &mut self.pending, &mut self.usage);
        let mut failed: Option<StreamFault> = None;
        let mut feed = |name: Option<&str>, data: Result<&str, &str>| {
            if failed.is_none() {
                failed = match data {
                    Ok(data) => {
                        normalize_into(normalizer.as_mut(), pending, usage, name, data).err()
                    }
                    Err(why) => Some(StreamFault::Format(why.to_string())),
                };
            }
        };
        let decoded = match &mut self.source {
            Source::Sse { sse, .. } => sse
                .push(bytes, &mut |e| feed(e.event, Ok(e.data)))
                .map_err(|e| e.to_string()),
            Source::EventStream { frames, .. } => frames
                .push(bytes, &mut |m| {
                    let name = match m.header_str(":message-type") {
                        Some("exception" | "error") => m
                            .header_str(":exception-type")
                            .or(m.header_str(":error-code")),
                        _ => m.header_str(":event-type"),
                    };
                    let data = std::str::from_utf8(&m.payload)
                        .map_err(|_| "an event-stream payload is not UTF-8");
                    feed(name, data)
                })
                .map_err(|e| e.to_string()),
            Source::Ws(_) | Source::Closed | Source::Scripted(_) => Ok(()),
        };
        if let Err(e) = decoded {
            let msg = format!("{}: {e}", self.target);
            return Err(self.fail(ErrorClass::Permanent, msg));
        }
        match failed {
            None => Ok(()),
            Some(f) => Err(self.normalize_failure(f)),
        }
    }

    /// Reads and normalizes the next piece of the answer.
    async fn read_more(&mut self) -> Result<(), Failure> {
        match &mut self.source {
            Source::Scripted(script) => {
                match script.pop_front() {
                    Some((pause_ms, event)) => {
                        if pause_ms > 0 {
                            broca_io::net::sleep(std::time::Duration::from_millis(pause_ms)).await;
                        }
                        if let StreamEvent::Usage(u) = &event {
                            self.usage = Some(u.clone());
                        }
                        self.pending.push_back(event);
                    }
                    None => self.ended = true,
                }
                Ok(())
            }
            Source::Sse { resp, .. } | Source::EventStream { resp, .. } => {
                match resp.chunk().await {
                    Ok(Some(bytes)) => self.decode(&bytes),
                    Ok(None) => {
                        self.ended = true;
                        Ok(())
                    }
                    Err(_) if self.finished => {
                        self.ended = true;
                        Ok(())
                    }
                    Err(e) => {
                        let msg = format!("the stream was cut before the step completed: {e}");
                        Err(self.fail(ErrorClass::Transient, msg))
                    }
                }
            }
            Source::Ws(_) => self.read_ws().await,
            Source::Closed => {
                self.ended = true;
                Ok(())
            }
        }
    }
}

impl HttpModelStream {
    /// The next text frame of a WebSocket answer. The server keeps the socket open after a
    /// response: once its finish (or its error) is in, the answer is complete, and the socket
    /// is closed as the protocol asks: the close frame now, the server's close awaited off
    /// the step's path.
    async fn read_ws(&mut self) -> Result<(), Failure> {
        if self.finished {
            self.ended = true;
            return Ok(());
        }
        let Source::Ws(ws) = &mut self.source else {
            unreachable!("read_ws reads a WebSocket's answer")
        };
        match ws.next_text().await {
            Ok(Some(text)) => {
                let read = self.normalize(None, &text);
                let complete = read.is_err()
                    || self
                        .pending
                        .iter()
                        .any(|e| matches!(e, StreamEvent::Finish { .. }));
                if complete {
                    if let Source::Ws(mut ws) = std::mem::replace(&mut self.source, Source::Closed)
                    {
                        ws.send_close().await;
                        ws.finish_close_detached(WS_CLOSE_WAIT);
                    }
                }
                read
            }
            Ok(None) => {
                self.ended = true;
                Ok(())
            }
            Err(e) => {
                let msg = format!("the stream was cut before the step completed: {e}");
                Err(self.fail(ErrorClass::Transient, msg))
            }
        }
    }

    fn counted(&self, f: Failure) -> Failure {
        if let Some(e) = &self.errors {
            e.count(f.error.class);
        }
        f
    }
}

impl ModelStream for HttpModelStream {
    async fn next(&mut self) -> Option<Result<StreamEvent, Failure>> {
        loop {
            if let Some(ev) = self.pending.pop_front() {
                if matches!(ev, StreamEvent::Finish { .. }) {
                    self.finished = true;
                }
                return Some(Ok(ev));
            }
            if self.ended {
                if self.finished {
                    return None;
                }
                let msg = format!(
                    "{}: the stream ended before the step completed (no finish event)",
                    self.target
                );
                self.finished = true; // report once
                let f = self.fail(ErrorClass::Transient, msg);
                return Some(Err(self.counted(f)));
            }
            if let Err(f) = self.read_more().await {
                self.finished = true;
                return Some(Err(self.counted(f)));
            }
        }
    }
}

#[cfg(test)]
mod tests;

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
