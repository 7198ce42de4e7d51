//! broca-otel: OpenTelemetry traces over OTLP/HTTP (protobuf), turned on by the standard variables:
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as it is), else `OTEL_EXPORTER_OTLP_ENDPOINT`
//! (`/v1/traces` appended); `OTEL_EXPORTER_OTLP[_TRACES]_HEADERS` (`k=v,...`, never
//! logged), `_TIMEOUT` (ms, default 10000), `_PROTOCOL` (only `http/protobuf`);
//! `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`; `OTEL_SDK_DISABLED=true` or
//! `OTEL_TRACES_EXPORTER=none` turn it off; `OTEL_BSP_SCHEDULE_DELAY` (ms, default 5000),
//! `OTEL_BSP_MAX_QUEUE_SIZE` (2048) and `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` (512) size the
//! batching.
//!
//! Off the shards' hot path: a shard builds a finished span from a record it appended
//! (spans.rs) and offers it to a bounded queue without waiting (a full queue drops it,
//! counted); the thread `broca-otel` batches and posts them, and the host flushes it when it
//! stops.

pub mod proto;
pub mod spans;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use spans::{SessionSpans, Span};

/// Where and how traces are exported.
#[derive(Clone)]
pub struct Config {
    pub endpoint: Endpoint,
    /// Extra request headers (their values are secrets: never logged).
    pub headers: Vec<(String, String)>,
    pub timeout: Duration,
    pub delay: Duration,
    pub queue: usize,
    pub batch: usize,
    pub resource: Vec<(String, spans::Value)>,
}

/// Names the headers, never their values (they are secrets).
impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let headers: Vec<&str> = self.headers.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("Config")
            .field("endpoint", &self.endpoint.to_string())
            .field("headers", &headers)
            .field("timeout", &self.timeout)
            .field("delay", &self.delay)
            .field("queue", &self.queue)
            .field("batch", &self.batch)
            .finish_non_exhaustive()
    }
}

/// An OTLP/HTTP endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    pub path: String,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        write!(f, "{scheme}://{}:{}{}", self.host, self.port, self.path)
    }
}

/// Why traces are off, or an export failed: the variable that does not read, the endpoint
/// that does not parse, the collector that could not be reached or answered badly, the
/// exporter's thread that did not start.
#[derive(Debug)]
pub enum OtelError {
    Env { var: &'static str, why: String },
    Endpoint(String),
    Export(String),
    Thread(std::io::Error),
}

impl std::fmt::Display for OtelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OtelError::Env { var, why } => write!(f, "{var}: {why}"),
            OtelError::Endpoint(why) | OtelError::Export(why) => f.write_str(why),
            OtelError::Thread(e) => write!(f, "cannot start the trace exporter: {e}"),
        }
    }
}

impl std::error::Error for OtelError {}

impl Endpoint {
    /// `http[s]://host[:port][/path]`.
    pub fn parse(url: &str) -> Result<Endpoint, OtelError> {
        let invalid = |why: String| OtelError::Endpoint(why);
        let (tls, rest) = if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else {
            return Err(invalid(format!(
                "`{url}` is not an http:// or https:// URL"
            )));
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if authority.contains('@') {
            return Err(invalid(
                "an endpoint with user info is not taken (use the headers)".into(),
            ));
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
                let port = p
                    .parse()
                    .map_err(|_| invalid(format!("`{p}` is not a port")))?;
                (h, port)
            }
            _ => (authority, if tls { 443 } else { 80 }),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(invalid(format!("`{url}` names no host")));
        }
        Ok(Endpoint {
            tls,
            host: host.to_string(),
            port,
            path: path.to_string(),
        })
    }
}

/// `k=v,k2=v2` (values percent-decoded), as the OTEL variables write lists.
fn pairs(text: &str) -> Vec<(String, String)> {
    text.split(',')
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            let v = broca_io::http_server::percent_decode(v.trim())?;
            Some((k.trim().to_string(), v))
        })
        .filter(|(k, _)| !k.is_empty())
        .collect()
}

impl Config {
    /// The configuration the environment `var` gives: `Ok(None)` when traces are off,
    /// `Err` naming the variable that does not read.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Option<Config>, OtelError> {
        let env = Env(&var);
        if env
            .get("OTEL_SDK_DISABLED")
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
            || env
                .get("OTEL_TRACES_EXPORTER")
                .is_some_and(|v| v.trim() == "none")
        {
            return Ok(None);
        }
        let url = match (
            env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            env.get("OTEL_EXPORTER_OTLP_ENDPOINT"),
        ) {
            (Some(url), _) => url,
            (None, Some(base)) => format!("{}/v1/traces", base.trim_end_matches('/')),
            (None, None) => return Ok(None),
        };
        let endpoint = Endpoint::parse(url.trim()).map_err(|e| OtelError::Env {
            var: "OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT",
            why: e.to_string(),
        })?;
        if let Some(p) = env.either(
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ) {
            if p.trim() != "http/protobuf" {
                return Err(OtelError::Env {
                    var: "OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL",
                    why: format!("`{p}`: broca exports http/protobuf only"),
                });
            }
        }
        let headers = env
            .either(
                "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
                "OTEL_EXPORTER_OTLP_HEADERS",
            )
            .map(|h| pairs(&h))
            .unwrap_or_default();
        let timeout = env.ms(
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            Some("OTEL_EXPORTER_OTLP_TIMEOUT"),
            10_000,
        )?;
        Ok(Some(Config {
            endpoint,
            headers,
            timeout,
            delay: env.ms("OTEL_BSP_SCHEDULE_DELAY", None, 5_000)?,
            queue: env.count("OTEL_BSP_MAX_QUEUE_SIZE", 2048)?,
            batch: env.count("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)?,
            resource: env.resource(),
        }))
    }
}

/// The process's environment as the OTEL variables are read from it: a blank one is unset.
struct Env<'a, F: Fn(&str) -> Option<String>>(&'a F);

impl<F: Fn(&str) -> Option<String>> Env<'_, F> {
    fn get(&self, name: &str) -> Option<String> {
        (self.0)(name).filter(|v| !v.trim().is_empty())
    }

    /// The signal's own variable, else the general one.
    fn either(&self, signal: &str, general: &str) -> Option<String> {
        self.get(signal).or_else(|| self.get(general))
    }

    /// A duration in milliseconds (`general`: the variable read when `name` is unset).
    fn ms(
        &self,
        name: &'static str,
        general: Option<&str>,
        default: u64,
    ) -> Result<Duration, OtelError> {
        let v = general.map_or_else(|| self.get(name), |g| self.either(name, g));
        let Some(v) = v else {
            return Ok(Duration::from_millis(default));
        };
        v.trim()
            .parse()
            .map(Duration::from_millis)
            .map_err(|_| OtelError::Env {
                var: name,
                why: format!("`{v}` is not a number of milliseconds"),
            })
    }

    /// A positive count.
    fn count(&self, name: &'static str, default: usize) -> Result<usize, OtelError> {
        let Some(v) = self.get(name) else {
            return Ok(default);
        };
        v.trim()
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| OtelError::Env {
                var: name,
                why: format!("`{v}` is not a positive count"),
            })
    }

    /// The resource's attributes: `OTEL_RESOURCE_ATTRIBUTES`, its `service.name` the one
    /// `OTEL_SERVICE_NAME` gives (else `broca`), and broca's version.
    fn resource(&self) -> Vec<(String, spans::Value)> {
        let mut resource: Vec<(String, spans::Value)> = self
            .get("OTEL_RESOURCE_ATTRIBUTES")
            .map(|r| pairs(&r))
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, spans::Value::Str(v)))
            .collect();
        let service = self.get("OTEL_SERVICE_NAME").map(|s| s.trim().to_string());
        resource.retain(|(k, _)| !(k == "service.name" && service.is_some()));
        if !resource.iter().any(|(k, _)| k == "service.name") {
            let name = service.unwrap_or_else(|| "broca".into());
            resource.push(("service.name".into(), spans::Value::Str(name)));
        }
        resource.push((
            "service.version".into(),
            spans::Value::Str(env!("CARGO_PKG_VERSION").into()),
        ));
        resource
    }
}

/// The exporter's counts, for /metrics.
#[derive(Debug, Default)]
pub struct Counts {
    pub exported: AtomicU64,
    /// Dropped at the queue (full) or at shutdown (the flush ran out of time).
    pub dropped: AtomicU64,
    /// Sent and refused, or not delivered.
    pub failed: AtomicU64,
}

enum Msg {
    Span(Box<Span>),
    Flush(SyncSender<()>),
}

/// The trace exporter: a bounded queue and its thread.
pub struct Traces {
    tx: SyncSender<Msg>,
    pub counts: Arc<Counts>,
    timeout: Duration,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Traces {
    /// The exporter the OTEL variables ask for, started; `None` when they ask for none. A
    /// configuration that does not read turns traces off with a warning (a run's work does
    /// not depend on them).
    pub fn from_env(tls: &Arc<broca_io::net::rustls::ClientConfig>) -> Option<Arc<Traces>> {
        let config = match Config::from_env(|k| std::env::var(k).ok()) {
            Ok(config) => config?,
            Err(e) => {
                tracing::warn!("traces are off: {e}");
                return None;
            }
        };
        match Traces::start(config, tls.clone()) {
            Ok(t) => Some(Arc::new(t)),
            Err(e) => {
                tracing::warn!("traces are off: {e}");
                None
            }
        }
    }

    /// Starts the exporter thread.
    pub fn start(
        config: Config,
        tls: Arc<broca_io::net::rustls::ClientConfig>,
    ) -> Result<Traces, OtelError> {
        let (tx, rx) = sync_channel(config.queue);
        let counts = Arc::new(Counts::default());
        let timeout = config.timeout;
        tracing::info!("exporting traces to {} (OTLP/HTTP)", config.endpoint);
        let worker = Worker {
            config,
            tls,
            counts: counts.clone(),
            last_warned: None,
        };
        let thread = std::thread::Builder::new()
            .name("broca-otel".into())
            .spawn(move || worker.run(rx))
            .map_err(OtelError::Thread)?;
        Ok(Traces {
            tx,
            counts,
            timeout,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Hands spans over without waiting: a full queue drops them (counted).
    pub fn offer(&self, spans: Vec<Span>) {
        for s in spans {
            match self.tx.try_send(Msg::Span(Box::new(s))) {
                Ok(()) => {}
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                    self.counts.dropped.fetch_add(1, Relaxed);
                }
            }
        }
    }

    /// Exports what is queued and stops the thread, waiting at most the export timeout
    /// (twice: the queue's rest, then the batch in flight).
    pub fn shutdown(&self) {
        let (done_tx, done_rx) = sync_channel(1);
        if self
            .tx
            .send_within(Msg::Flush(done_tx), self.timeout)
            .is_ok()
            && done_rx.recv_timeout(self.timeout * 2).is_ok()
        {
            if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
                let _ = t.join();
            }
        } else {
            tracing::warn!(
                "the trace exporter did not finish in time; spans still queued are lost"
            );
        }
    }
}

/// `SyncSender::send` bounded in time (the queue may be full of spans).
trait SendTimeout {
    fn send_within(&self, msg: Msg, timeout: Duration) -> Result<(), ()>;
}

impl SendTimeout for SyncSender<Msg> {
    fn send_within(&self, mut msg: Msg, timeout: Duration) -> Result<(), ()> {
        let until = Instant::now() + timeout;
        loop {
            match self.try_send(msg) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Disconnected(_)) => return Err(()),
                Err(TrySendError::Full(m)) if Instant::now() < until => {
                    msg = m;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(TrySendError::Full(_)) => return Err(()),
            }
        }
    }
}

struct Worker {
    config: Config,
    tls: Arc<broca_io::net::rustls::ClientConfig>,
    counts: Arc<Counts>,
    last_warned: Option<Instant>,
}

impl Worker {
    fn run(mut self, rx: Receiver<Msg>) {
        assert!(
            self.config.batch > 0,
            "a batch holds at least one span (a positive count)"
        );
        let mut batch: Vec<Span> = Vec::new();
        let mut first_at: Option<Instant> = None;
        loop {
            let wait = match first_at {
                Some(at) => self.config.delay.saturating_sub(at.elapsed()),
                None => Duration::from_secs(3600),
            };
            match rx.recv_timeout(wait) {
                Ok(Msg::Span(s)) => {
                    batch.push(*s);
                    first_at.get_or_insert_with(Instant::now);
                    if batch.len() >= self.config.batch {
                        self.export(std::mem::take(&mut batch));
                        first_at = None;
                    }
                }
                Ok(Msg::Flush(done)) => {
                    // Whatever was queued before the flush is in `batch` or ahead of it.
                    while let Ok(Msg::Span(s)) = rx.try_recv() {
                        batch.push(*s);
                    }
                    for chunk in std::mem::take(&mut batch).chunks(self.config.batch) {
                        self.export(chunk.to_vec());
                    }
                    let _ = done.send(());
                    return;
                }
                Err(RecvTimeoutError::Timeout) => {
                    if !batch.is_empty() {
                        self.export(std::mem::take(&mut batch));
                    }
                    first_at = None;
                }
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    fn export(&mut self, spans: Vec<Span>) {
        debug_assert!(!spans.is_empty(), "a batch holds spans");
        debug_assert!(
            spans.iter().all(|s| s.end_ns >= s.start_ns),
            "a span ends after it starts"
        );
        let n = spans.len() as u64;
        let body = proto::export_request(&self.config.resource, env!("CARGO_PKG_VERSION"), &spans);
        match self.post(&body) {
            Ok(status) if (200..300).contains(&status) => {
                self.counts.exported.fetch_add(n, Relaxed);
            }
            outcome => {
                self.counts.failed.fetch_add(n, Relaxed);
                let why = match outcome {
                    Ok(status) => format!("answered {status}"),
                    Err(e) => e.to_string(),
                };
                // Once a minute at most: a collector that is down does not flood the log.
                if self
                    .last_warned
                    .is_none_or(|t| t.elapsed() >= Duration::from_secs(60))
                {
                    tracing::warn!(
                        "trace export to {} failed ({why}); {n} spans lost",
                        self.config.endpoint
                    );
                    self.last_warned = Some(Instant::now());
                }
            }
        }
    }

    /// One POST: the answer's status.
    fn post(&self, body: &[u8]) -> Result<u16, OtelError> {
        let e = &self.config.endpoint;
        let addr = format!("{}:{}", e.host, e.port);
        let tcp = std::net::ToSocketAddrs::to_socket_addrs(&addr)
            .map_err(|err| OtelError::Export(format!("cannot resolve {addr}: {err}")))?
            .next()
            .ok_or_else(|| OtelError::Export(format!("{addr} resolves to nothing")))?;
        let stream = TcpStream::connect_timeout(&tcp, self.config.timeout)
            .map_err(|err| OtelError::Export(format!("cannot connect to {addr}: {err}")))?;
        let _ = stream.set_read_timeout(Some(self.config.timeout));
        let _ = stream.set_write_timeout(Some(self.config.timeout));
        let mut head = format!(
            "POST {} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/x-protobuf\r\n\
             content-length: {}\r\nconnection: close\r\nuser-agent: broca/{}\r\n",
            e.path,
            e.host,
            body.len(),
            env!("CARGO_PKG_VERSION")
        );
        for (k, v) in &self.config.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        if e.tls {
            let name = broca_io::net::rustls::pki_types::ServerName::try_from(e.host.clone())
                .map_err(|err| OtelError::Export(format!("{}: {err}", e.host)))?;
            let conn = broca_io::net::rustls::ClientConnection::new(self.tls.clone(), name)
                .map_err(|err| OtelError::Export(format!("TLS: {err}")))?;
            exchange(
                broca_io::net::rustls::StreamOwned::new(conn, stream),
                &head,
                body,
            )
        } else {
            exchange(stream, &head, body)
        }
    }
}

/// Writes the request and reads the answer's status line.
fn exchange(mut s: impl Read + Write, head: &str, body: &[u8]) -> Result<u16, OtelError> {
    s.write_all(head.as_bytes())
        .and_then(|()| s.write_all(body))
        .and_then(|()| s.flush())
        .map_err(|e| OtelError::Export(format!("sending: {e}")))?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    while !answer.windows(2).any(|w| w == b"\r\n") && answer.len() < 8192 {
        let n = s
            .read(&mut buf)
            .map_err(|e| OtelError::Export(format!("reading the answer: {e}")))?;
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&answer);
    line.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| OtelError::Export("the answer is not HTTP".to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_standard_variables_configure_the_export() {
        assert!(Config::from_env(env(&[])).unwrap().is_none());
        let c = Config::from_env(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318/"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20x,k=v"),
            ("OTEL_SERVICE_NAME", "runner-a"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment=test,service.name=other",
            ),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(c.endpoint.to_string(), "http://127.0.0.1:4318/v1/traces");
        assert_eq!(c.headers[0], ("authorization".into(), "Bearer x".into()));
        assert!(c
            .resource
            .contains(&("service.name".into(), spans::Value::Str("runner-a".into()))));
        assert!(
            c.resource
                .iter()
                .filter(|(k, _)| k == "service.name")
                .count()
                == 1
        );
        // The signal's own endpoint is used as it is.
        let c = Config::from_env(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:1"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "https://collector.example/otlp/t",
            ),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            c.endpoint.to_string(),
            "https://collector.example:443/otlp/t"
        );
        // Off when said so; refused when it cannot be honoured.
        let off = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:1"),
            ("OTEL_SDK_DISABLED", "true"),
        ];
        assert!(Config::from_env(env(&off)).unwrap().is_none());
        let grpc = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:1"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ];
        assert!(Config::from_env(env(&grpc))
            .unwrap_err()
            .to_string()
            .contains("http/protobuf"));
        let bad = [("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")];
        assert!(Config::from_env(env(&bad))
            .unwrap_err()
            .to_string()
            .contains("ENDPOINT"));
    }
}
