//! The HTTP/1.1 client: one per shard, with a keep-alive pool per origin. A request is written
//! in one piece; the response head comes within the first-byte timeout and every body read
//! within the idle timeout. A connection goes back to the pool only after its response was
//! read to the end and neither side asked to close it; a response dropped early closes it.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::http1::{Head, HttpError, Limits, Part, ResponseDecoder};

use super::conn::Conn;
use super::proxy::ProxyConfig;
use super::{with_timeout, NetError, Timeouts, Url};

/// Bytes read from a connection at a time (per response in flight).
const READ_CHUNK: usize = 8 * 1024;

/// How the client connects.
#[derive(Clone)]
pub struct ClientConfig {
    pub timeouts: Timeouts,
    pub limits: Limits,
    pub tls: Arc<rustls::ClientConfig>,
    pub proxy: ProxyConfig,
    /// Idle connections kept per origin. A shard with many runs in flight to one provider
    /// needs about as many: a response whose connection finds the pool full closes it, and
    /// the next request pays a new connection (and, for TLS, a handshake).
    pub idle_per_origin: usize,
    /// Requests in flight per origin at most (more wait for a slot): bounds the sockets and
    /// buffers a burst of runs can take, and the load one daemon puts on a provider.
    pub max_per_origin: usize,
    /// How long an idle pooled connection is trusted.
    pub idle_keep: Duration,
    pub user_agent: String,
}

impl ClientConfig {
    /// Defaults with the given TLS configuration and proxy settings.
    pub fn new(tls: Arc<rustls::ClientConfig>, proxy: ProxyConfig) -> ClientConfig {
        ClientConfig {
            timeouts: Timeouts::default(),
            limits: Limits::default(),
            tls,
            proxy,
            idle_per_origin: 256,
            max_per_origin: 1024,
            idle_keep: Duration::from_secs(30),
            user_agent: concat!("broca/", env!("CARGO_PKG_VERSION")).to_string(),
        }
    }
}

/// One request.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub method: &'a str,
    /// The base URL (its prefix goes before `path`).
    pub url: &'a Url,
    /// The path (and query) after the base URL's prefix, starting with `/`.
    pub path: &'a str,
    /// Extra headers (Host, User-Agent and Content-Length are added).
    pub headers: &'a [(&'a str, &'a str)],
    pub body: &'a [u8],
}

/// Counters of one client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStats {
    pub connects: u64,
    pub reuses: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// Origins counted apart, at most; the traffic of others is counted under [`OTHER_ORIGINS`].
pub const ORIGINS_COUNTED: usize = 64;
/// Where the traffic of origins past [`ORIGINS_COUNTED`] is counted.
pub const OTHER_ORIGINS: &str = "other";

/// A shard's HTTP client.
pub struct HttpClient {
    config: ClientConfig,
    pool: RefCell<HashMap<String, Vec<(Conn, Instant)>>>,
    slots: RefCell<HashMap<String, Rc<glommio::sync::Semaphore>>>,
    stats: Cell<ClientStats>,
    /// The counters by origin (`scheme://host:port`), in the order first seen.
    by_origin: RefCell<Vec<(String, ClientStats)>>,
}

impl HttpClient {
    /// A client with `config`.
    pub fn new(config: ClientConfig) -> Rc<HttpClient> {
        Rc::new(HttpClient {
            config,
            pool: RefCell::new(HashMap::new()),
            slots: RefCell::new(HashMap::new()),
            stats: Cell::new(ClientStats::default()),
            by_origin: RefCell::new(Vec::new()),
        })
    }

    /// The client's configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// The counters so far.
    pub fn stats(&self) -> ClientStats {
        self.stats.get()
    }

    /// The counters by origin, with the connections each keeps idle.
    pub fn origin_stats(&self) -> Vec<(String, ClientStats, usize)> {
        let pool = self.pool.borrow();
        self.by_origin
            .borrow()
            .iter()
            .map(|(origin, s)| (origin.clone(), *s, pool.get(origin).map_or(0, Vec::len)))
            .collect()
    }

    fn count(&self, origin: &str, f: impl Fn(&mut ClientStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
        let mut by = self.by_origin.borrow_mut();
        let at = match by.iter().position(|(o, _)| o == origin) {
            Some(i) => i,
            None if by.len() < ORIGINS_COUNTED => {
                by.push((origin.to_string(), ClientStats::default()));
                by.len() - 1
            }
            None => match by.iter().position(|(o, _)| o == OTHER_ORIGINS) {
                Some(i) => i,
                None => {
                    // The last counted origin's place is taken by the rest, its counts kept.
                    let last = by.len() - 1;
                    by[last].0 = OTHER_ORIGINS.to_string();
                    last
                }
            },
        };
        f(&mut by[at].1);
    }

    /// Opens a new connection to `url`'s origin: direct or through the proxy, TLS when the
    /// scheme says so. Plain http only for loopback hosts.
    pub async fn connect(&self, url: &Url) -> Result<Conn, NetError> {
        if !url.scheme.is_tls() && !url.is_loopback() {
            return Err(NetError::Url(format!(
                "{url}: plain {} is accepted only for loopback hosts; use {}",
                url.scheme.as_str(),
                if url.scheme == super::Scheme::Ws {
                    "wss://"
                } else {
                    "https://"
                }
            )));
        }
        let t = self.config.timeouts.connect;
        let conn = match self.config.proxy.for_target(url) {
            Some(proxy) => self.config.proxy.tunnel(proxy, url, t).await?,
            None => Conn::connect(&url.host, url.port, t).await?,
        };
        self.count(&url.origin(), |s| s.connects += 1);
        if url.scheme.is_tls() {
            conn.start_tls(self.config.tls.clone(), &url.host, t).await
        } else {
            Ok(conn)
        }
    }

    fn pooled(&self, origin: &str) -> Option<Conn> {
        let mut pool = self.pool.borrow_mut();
        let idle = pool.get_mut(origin)?;
        while let Some((conn, since)) = idle.pop() {
            if since.elapsed() < self.config.idle_keep {
                return Some(conn);
            }
        }
        None
    }

    fn give_back(&self, origin: String, conn: Conn) {
        let mut pool = self.pool.borrow_mut();
        let idle = pool.entry(origin).or_default();
        // The oldest are first (each goes back at its time, and the newest is taken first):
        // those kept past `idle_keep` are closed here rather than held until reached.
        let stale = idle
            .iter()
            .take_while(|(_, since)| since.elapsed() >= self.config.idle_keep)
            .count();
        idle.drain(..stale);
        if idle.len() < self.config.idle_per_origin {
            idle.push((conn, Instant::now()));
        }
    }

    /// Sends a request and reads the response head. A pooled connection the server closed
    /// meanwhile (the write fails, or it ends before a byte of the response) is replaced once
    /// by a new connection.
    pub async fn send(self: &Rc<Self>, req: &Request<'_>) -> Result<Response, NetError> {
        for (name, value) in req.headers {
            if value.contains(['\r', '\n']) || name.contains(['\r', '\n', ':']) {
                return Err(NetError::Url(format!("header `{name}` holds a line break")));
            }
        }
        let origin = req.url.origin();
        let head_request = req.method.eq_ignore_ascii_case("HEAD");
        let slots = self
            .slots
            .borrow_mut()
            .entry(origin.clone())
            .or_insert_with(|| {
                Rc::new(glommio::sync::Semaphore::new(
                    self.config.max_per_origin.max(1) as u64,
                ))
            })
            .clone();
        let slot = slots
            .acquire_static_permit(1)
            .await
            .map_err(|e| NetError::Io {
                target: req.url.authority(),
                why: format!("no request slot: {e}"),
            })?;
        // The request's bytes exist only once it has a slot: a request waiting for one holds
        // no copy of its body.
        let mut bytes = format!(
            "{} {}{} HTTP/1.1\r\nHost: {}\r\nUser-Agent: {}\r\nContent-Length: {}\r\n",
            req.method,
            req.url.prefix,
            req.path,
            req.url.authority(),
            self.config.user_agent,
            req.body.len()
        )
        .into_bytes();
        bytes.reserve(req.body.len() + 256);
        for (name, value) in req.headers {
            bytes.extend_from_slice(name.as_bytes());
            bytes.extend_from_slice(b": ");
            bytes.extend_from_slice(value.as_bytes());
            bytes.extend_from_slice(b"\r\n");
        }
        bytes.extend_from_slice(b"\r\n");
        bytes.extend_from_slice(req.body);
        if let Some(conn) = self.pooled(&origin) {
            self.count(&origin, |s| s.reuses += 1);
            match self
                .exchange(conn, &bytes, origin.clone(), head_request)
                .await
            {
                Err(Exchange::Stale) => {} // try a fresh connection
                Err(Exchange::Failed(e)) => return Err(e),
                Ok(resp) => return Ok(resp.holding(slot)),
            }
        }
        let conn = self.connect(req.url).await?;
        match self.exchange(conn, &bytes, origin, head_request).await {
            Ok(resp) => Ok(resp.holding(slot)),
            Err(Exchange::Failed(e)) => Err(e),
            Err(Exchange::Stale) => Err(NetError::Io {
                target: req.url.authority(),
                why: "the server closed the connection before answering".into(),
            }),
        }
    }

    async fn exchange(
        self: &Rc<Self>,
        mut conn: Conn,
        request: &[u8],
        origin: String,
        head_request: bool,
    ) -> Result<Response, Exchange> {
        let target = conn.target().to_string();
        if conn.write_all(request).await.is_err() {
            return Err(Exchange::Stale);
        }
        self.count(&origin, |s| s.bytes_out += request.len() as u64);
        let mut decoder = ResponseDecoder::new(self.config.limits, head_request);
        let mut parts = Vec::new();
        let mut buf = vec![0u8; READ_CHUNK];
        let head = self
            .read_head(&mut conn, &origin, &mut decoder, &mut parts, &mut buf)
            .await?;
        let keep_alive = !head
            .header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"));
        let mut ready = VecDeque::new();
        let mut done = false;
        for p in parts {
            match p {
                Part::Body(b) => ready.push_back(b),
                Part::End => done = true,
                Part::Head(_) => {}
            }
        }
        let mut resp = Response {
            head,
            conn: Some(conn),
            decoder,
            ready,
            done: false,
            keep_alive,
            origin,
            client: self.clone(),
            target,
            buf,
            slot: None,
        };
        if done {
            resp.finish();
        }
        Ok(resp)
    }
}

impl HttpClient {
    /// Reads until the response's head is decoded (each read within the first-byte timeout);
    /// the parts decoded after it stay in `parts`. A connection that ends or fails before any
    /// byte of the answer was a stale pooled one.
    async fn read_head(
        &self,
        conn: &mut Conn,
        origin: &str,
        decoder: &mut ResponseDecoder,
        parts: &mut Vec<Part>,
        buf: &mut [u8],
    ) -> Result<Head, Exchange> {
        let target = conn.target().to_string();
        let t = self.config.timeouts.first_byte;
        let mut got_any = false;
        loop {
            let n = match with_timeout(t, conn.read(buf)).await {
                Err(()) => {
                    return Err(Exchange::Failed(NetError::Timeout {
                        what: "response",
                        target,
                        after: t,
                    }))
                }
                Ok(Err(_)) if !got_any => return Err(Exchange::Stale),
                Ok(Err(e)) => {
                    let why = e.to_string();
                    return Err(Exchange::Failed(NetError::Io { target, why }));
                }
                Ok(Ok(n)) => n,
            };
            if n == 0 {
                if !got_any {
                    return Err(Exchange::Stale);
                }
                decoder.finish(parts).map_err(|e| http(&target, e))?;
            } else {
                assert!(n <= buf.len(), "a read fills at most its buffer");
                got_any = true;
                self.count(origin, |s| s.bytes_in += n as u64);
                decoder
                    .push(&buf[..n], parts)
                    .map_err(|e| http(&target, e))?;
            }
            if let Some(Part::Head(_)) = parts.first() {
                let Part::Head(head) = parts.remove(0) else {
                    unreachable!("the first part is the head")
                };
                return Ok(head);
            }
        }
    }
}

enum Exchange {
    /// A pooled connection had gone away before the request was answered.
    Stale,
    Failed(NetError),
}

impl From<NetError> for Exchange {
    fn from(e: NetError) -> Exchange {
        Exchange::Failed(e)
    }
}

fn http(target: &str, e: HttpError) -> NetError {
    match e {
        HttpError::Truncated { .. } => NetError::Io {
            target: target.to_string(),
            why: e.to_string(),
        },
        _ => NetError::Http {
            target: target.to_string(),
            why: e.to_string(),
        },
    }
}

/// A response whose head has arrived; its body streams.
pub struct Response {
    pub head: Head,
    conn: Option<Conn>,
    decoder: ResponseDecoder,
    ready: VecDeque<Vec<u8>>,
    done: bool,
    keep_alive: bool,
    origin: String,
    client: Rc<HttpClient>,
    target: String,
    buf: Vec<u8>,
    /// The origin's request slot, held until the body has been read (or the response
    /// dropped).
    slot: Option<glommio::sync::StaticPermit>,
}

impl Response {
    /// The status code.
    pub fn status(&self) -> u16 {
        self.head.status
    }

    /// Keeps the origin's request slot until the body has been read.
    fn holding(mut self, slot: glommio::sync::StaticPermit) -> Response {
        if !self.done {
            self.slot = Some(slot);
        }
        self
    }

    fn finish(&mut self) {
        self.done = true;
        self.slot = None;
        self.buf = Vec::new();
        if let Some(conn) = self.conn.take() {
            if self.keep_alive && self.decoder.leftover().is_empty() {
                self.client
                    .give_back(std::mem::take(&mut self.origin), conn);
            }
        }
    }

    /// The next piece of the body; `None` at its end. A connection that breaks or falls
    /// silent for the idle timeout before the end is an error (the body was cut).
    pub async fn chunk(&mut self) -> Result<Option<Vec<u8>>, NetError> {
        loop {
            if let Some(b) = self.ready.pop_front() {
                return Ok(Some(b));
            }
            if self.done {
                return Ok(None);
            }
            let conn = self
                .conn
                .as_mut()
                .expect("a live response has its connection");
            let t = self.client.config.timeouts.idle;
            let n = match with_timeout(t, conn.read(&mut self.buf)).await {
                Err(()) => {
                    self.conn = None;
                    return Err(NetError::Timeout {
                        what: "body bytes",
                        target: self.target.clone(),
                        after: t,
                    });
                }
                Ok(Err(e)) => {
                    self.conn = None;
                    return Err(NetError::Io {
                        target: self.target.clone(),
                        why: e.to_string(),
                    });
                }
                Ok(Ok(n)) => n,
            };
            let mut parts = Vec::new();
            let r = if n == 0 {
                self.keep_alive = false;
                self.decoder.finish(&mut parts)
            } else {
                self.client.count(&self.origin, |s| s.bytes_in += n as u64);
                self.decoder.push(&self.buf[..n], &mut parts)
            };
            if let Err(e) = r {
                self.conn = None;
                return Err(http(&self.target, e));
            }
            for p in parts {
                match p {
                    Part::Body(b) => self.ready.push_back(b),
                    Part::End => self.finish(),
                    Part::Head(_) => {}
                }
            }
        }
    }

    /// Reads the rest of the body, refusing more than `limit` bytes.
    pub async fn body(&mut self, limit: usize) -> Result<Vec<u8>, NetError> {
        let mut all = Vec::new();
        while let Some(b) = self.chunk().await? {
            if all.len() + b.len() > limit {
                self.conn = None;
                return Err(NetError::Http {
                    target: self.target.clone(),
                    why: format!("body over {limit} bytes"),
                });
            }
            all.extend_from_slice(&b);
        }
        assert!(all.len() <= limit, "a body read keeps its limit");
        Ok(all)
    }
}
