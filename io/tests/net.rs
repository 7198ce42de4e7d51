//! The network client against real loopback servers (std threads): keep-alive reuse, stale
//! pooled connections, timeouts, truncation, TLS with a generated certificate, a CONNECT
//! proxy, and WebSocket.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use broca_io::net::proxy::ProxyConfig;
use broca_io::net::ws::WebSocket;
use broca_io::net::{tls, ClientConfig, HttpClient, NetError, Request, Url};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

fn run<T>(fut: impl std::future::Future<Output = T>) -> T {
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .io_memory(2 << 20)
        .make()
        .expect("an executor")
        .run(fut)
}

fn client(extra_roots: &[CertificateDer<'static>], proxy: ProxyConfig) -> Rc<HttpClient> {
    let mut cfg = ClientConfig::new(tls::client_config(extra_roots).unwrap(), proxy);
    cfg.timeouts.connect = Duration::from_secs(5);
    cfg.timeouts.first_byte = Duration::from_millis(400);
    cfg.timeouts.idle = Duration::from_millis(400);
    HttpClient::new(cfg)
}

/// Reads one request head and its Content-Length body; `None` at EOF.
fn read_request(r: &mut BufReader<impl Read>) -> Option<(String, Vec<u8>)> {
    let mut head = String::new();
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap();
        }
        head.push_str(&line);
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    Some((head, body))
}

/// A server answering each connection's requests with `answer(n)` (n counts requests over
/// all connections); counts connections.
fn serve(
    answer: impl Fn(usize, &str) -> Vec<u8> + Send + Sync + 'static,
) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let conns = Arc::new(AtomicUsize::new(0));
    let answer = Arc::new(answer);
    let requests = Arc::new(AtomicUsize::new(0));
    let c = conns.clone();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            c.fetch_add(1, Ordering::SeqCst);
            let answer = answer.clone();
            let requests = requests.clone();
            thread::spawn(move || {
                let mut w = stream.try_clone().unwrap();
                let mut r = BufReader::new(stream);
                while let Some((head, _body)) = read_request(&mut r) {
                    let n = requests.fetch_add(1, Ordering::SeqCst);
                    let reply = answer(n, &head);
                    if reply.is_empty() {
                        return; // close without answering
                    }
                    if w.write_all(&reply).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, conns)
}

fn post<'a>(url: &'a Url, body: &'a [u8]) -> Request<'a> {
    Request {
        method: "POST",
        url,
        path: "/v1/x",
        headers: &[("content-type", "application/json")],
        body,
    }
}

#[test]
fn keep_alive_reuses_one_connection_for_length_and_chunked_bodies() {
    let (port, conns) = serve(|n, head| {
        assert!(head.starts_with("POST /base/v1/x HTTP/1.1\r\n"), "{head}");
        assert!(head.contains("Host: 127.0.0.1:"), "{head}");
        if n % 2 == 0 {
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello".to_vec()
        } else {
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\n\r\n".to_vec()
        }
    });
    let url = Url::parse(&format!("http://127.0.0.1:{port}/base/")).unwrap();
    let c = client(&[], ProxyConfig::default());
    let bodies = run(async {
        let mut out = Vec::new();
        for _ in 0..4 {
            let mut r = c.send(&post(&url, b"{}")).await.unwrap();
            assert_eq!(r.status(), 200);
            out.push(String::from_utf8(r.body(1 << 20).await.unwrap()).unwrap());
        }
        out
    });
    assert_eq!(bodies, ["hello", "abcde", "hello", "abcde"]);
    assert_eq!(conns.load(Ordering::SeqCst), 1);
    let s = c.stats();
    assert_eq!((s.connects, s.reuses), (1, 3));
}

#[test]
fn connection_close_and_a_stale_pooled_connection_reconnect() {
    // Request 0 is answered and the connection kept; the server then drops it silently
    // (request 1 is read and not answered), so the client must retry on a new connection.
    let (port, conns) = serve(|n, _| match n {
        0 => b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na".to_vec(),
        1 => Vec::new(),
        2 => b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nConnection: close\r\n\r\nb".to_vec(),
        _ => b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nc".to_vec(),
    });
    let url = Url::parse(&format!("http://127.0.0.1:{port}")).unwrap();
    let c = client(&[], ProxyConfig::default());
    let bodies = run(async {
        let mut out = Vec::new();
        for _ in 0..3 {
            let mut r = c.send(&post(&url, b"")).await.unwrap();
            out.push(String::from_utf8(r.body(64).await.unwrap()).unwrap());
        }
        out
    });
    assert_eq!(bodies, ["a", "b", "c"]);
    assert_eq!(
        conns.load(Ordering::SeqCst),
        3,
        "stale retry and Connection: close each reconnect"
    );
}

#[test]
fn timeouts_and_truncation_are_errors_that_name_the_target() {
    // The connection closes without a response at all.
    let (port, _) = serve(|_, _| Vec::new());
    let url = Url::parse(&format!("http://127.0.0.1:{port}")).unwrap();
    let c = client(&[], ProxyConfig::default());
    let err = run(c.send(&post(&url, b""))).err().unwrap();
    assert!(matches!(err, NetError::Io { .. }), "{err}");

    // No answer at all within the first-byte timeout.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let sport = silent.local_addr().unwrap().port();
    let url = Url::parse(&format!("http://127.0.0.1:{sport}")).unwrap();
    let err = run(c.send(&post(&url, b""))).err().unwrap();
    assert!(
        matches!(
            err,
            NetError::Timeout {
                what: "response",
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{sport}")),
        "{err}"
    );

    // A body that stops: the idle timeout; a body cut by a close: truncation.
    let (port, _) = serve(|n, _| {
        if n == 0 {
            // Answer a head and part of the body, then hang (the thread sleeps).
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc".to_vec()
        } else {
            Vec::new()
        }
    });
    let url = Url::parse(&format!("http://127.0.0.1:{port}")).unwrap();
    let err = run(async {
        let mut r = c.send(&post(&url, b"")).await.unwrap();
        r.body(64).await.err().unwrap()
    });
    // The server thread reads the next request (none) and sees EOF only when we close, so
    // the body stalls: an idle timeout.
    assert!(
        matches!(
            err,
            NetError::Timeout {
                what: "body bytes",
                ..
            }
        ),
        "{err}"
    );

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let mut w = s.try_clone().unwrap();
        read_request(&mut BufReader::new(s)).unwrap();
        w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
            .unwrap();
    });
    let url = Url::parse(&format!("http://127.0.0.1:{port}")).unwrap();
    let err = run(async {
        let mut r = c.send(&post(&url, b"")).await.unwrap();
        r.body(64).await.err().unwrap()
    });
    assert!(
        matches!(&err, NetError::Io { why, .. } if why.contains("7 body bytes")),
        "{err}"
    );
}

#[test]
fn plain_http_is_refused_for_a_host_that_is_not_loopback() {
    let c = client(&[], ProxyConfig::default());
    let url = Url::parse("http://api.openai.com").unwrap();
    let err = run(c.send(&post(&url, b""))).err().unwrap();
    assert!(
        matches!(&err, NetError::Url(m) if m.contains("only for loopback")),
        "{err}"
    );
}

struct TlsServer {
    port: u16,
    roots: Vec<CertificateDer<'static>>,
}

/// A TLS server for `names` answering every request with `body`.
fn tls_server(names: &[&str], body: &'static str) -> TlsServer {
    let key =
        rcgen::generate_simple_self_signed(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap();
    let cert = key.cert.der().clone();
    let pkey = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.signing_key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], pkey)
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let config = Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let config = config.clone();
            thread::spawn(move || {
                let conn = rustls::ServerConnection::new(config).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, stream);
                let mut r = BufReader::new(&mut tls);
                let Some(_) = read_request(&mut r) else {
                    return;
                };
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.write_all(reply.as_bytes());
                let _ = tls.flush();
                tls.conn.send_close_notify();
                let _ = tls.flush();
            });
        }
    });
    TlsServer {
        port,
        roots: vec![cert],
    }
}

#[test]
fn tls_verifies_the_certificate_and_negotiates_http1() {
    let server = tls_server(&["localhost"], "secure");
    let c = client(&server.roots, ProxyConfig::default());
    let url = Url::parse(&format!("https://localhost:{}", server.port)).unwrap();
    let body = run(async {
        let conn = c.connect(&url).await.unwrap();
        assert_eq!(conn.alpn(), Some(&b"http/1.1"[..]));
        let mut r = c.send(&post(&url, b"{}")).await.unwrap();
        r.body(64).await.unwrap()
    });
    assert_eq!(body, b"secure");

    // The same server under a name its certificate does not cover, and without its root.
    let url = Url::parse(&format!("https://127.0.0.1:{}", server.port)).unwrap();
    let err = run(c.send(&post(&url, b""))).err().unwrap();
    assert!(matches!(err, NetError::Tls { .. }), "{err}");
    let untrusting = client(&[], ProxyConfig::default());
    let url = Url::parse(&format!("https://localhost:{}", server.port)).unwrap();
    let err = run(untrusting.send(&post(&url, b""))).err().unwrap();
    assert!(
        matches!(&err, NetError::Tls { why, .. } if why.contains("certificate")),
        "{err}"
    );
}

#[test]
fn https_goes_through_a_connect_proxy_unless_no_proxy_says_otherwise() {
    let server = tls_server(&["api.example.test"], "tunnelled");
    let tls_port = server.port;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy_port = listener.local_addr().unwrap().port();
    let connects = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = connects.clone();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let seen = seen.clone();
            thread::spawn(move || {
                let mut w = stream.try_clone().unwrap();
                let mut r = BufReader::new(stream);
                let (head, _) = read_request(&mut r).unwrap();
                seen.lock()
                    .unwrap()
                    .push(head.lines().next().unwrap().to_string());
                assert!(head.contains("Proxy-Authorization: Basic dTpw"), "{head}");
                let upstream = TcpStream::connect(("127.0.0.1", tls_port)).unwrap();
                w.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .unwrap();
                let mut up_w = upstream.try_clone().unwrap();
                let mut down = r.into_inner();
                let t = thread::spawn(move || std::io::copy(&mut down, &mut up_w));
                let mut up_r = upstream;
                let _ = std::io::copy(&mut up_r, &mut w);
                let _ = t.join();
            });
        }
    });
    let proxy = ProxyConfig::parse(
        Some(&format!("http://u:p@127.0.0.1:{proxy_port}")),
        Some("other.test"),
    )
    .unwrap();
    let c = client(&server.roots, proxy);
    let url = Url::parse("https://api.example.test").unwrap();
    let body = run(async {
        let mut r = c.send(&post(&url, b"{}")).await.unwrap();
        r.body(64).await.unwrap()
    });
    assert_eq!(body, b"tunnelled");
    assert_eq!(
        *connects.lock().unwrap(),
        ["CONNECT api.example.test:443 HTTP/1.1"]
    );

    // A proxy that refuses the tunnel is named in the error.
    let refusing = TcpListener::bind("127.0.0.1:0").unwrap();
    let rport = refusing.local_addr().unwrap().port();
    thread::spawn(move || {
        let (s, _) = refusing.accept().unwrap();
        let mut w = s.try_clone().unwrap();
        read_request(&mut BufReader::new(s)).unwrap();
        w.write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            .unwrap();
    });
    let proxy = ProxyConfig::parse(Some(&format!("127.0.0.1:{rport}")), None).unwrap();
    let c = client(&server.roots, proxy);
    let err = run(c.send(&post(&url, b""))).err().unwrap();
    assert!(
        matches!(&err, NetError::Proxy { why, .. } if why.contains("403")),
        "{err}"
    );
}

#[test]
fn websocket_upgrades_answers_pings_and_reads_text_until_close() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let mut ws =
            tungstenite::accept_hdr(s, |req: &tungstenite::handshake::server::Request, resp| {
                assert_eq!(req.uri().path(), "/base/v1/responses");
                assert_eq!(req.headers()["authorization"], "Bearer k");
                Ok(resp)
            })
            .unwrap();
        let got = ws.read().unwrap();
        ws.send(tungstenite::Message::Ping(vec![1, 2].into()))
            .unwrap();
        for part in ["one", "two"] {
            ws.send(tungstenite::Message::text(format!("{part}:{got}")))
                .unwrap();
        }
        // The client's pong comes back before the close.
        let pong = ws.read().unwrap();
        ws.close(None).unwrap();
        while ws.read().is_ok() {}
        pong
    });
    let c = client(&[], ProxyConfig::default());
    let url = Url::parse(&format!("ws://127.0.0.1:{port}/base")).unwrap();
    let texts = run(async {
        let mut ws =
            WebSocket::connect(&c, &url, "/v1/responses", &[("authorization", "Bearer k")])
                .await
                .unwrap()
                .unwrap();
        ws.send_text("hi".into()).await.unwrap();
        let mut out = Vec::new();
        while let Some(t) = ws.next_text().await.unwrap() {
            out.push(t);
        }
        out
    });
    assert_eq!(texts, ["one:hi", "two:hi"]);
    assert_eq!(
        server.join().unwrap(),
        tungstenite::Message::Pong(vec![1, 2].into())
    );
}

#[test]
fn a_refused_websocket_upgrade_reports_status_and_body() {
    let (port, _) =
        serve(|_, _| b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 7\r\n\r\nno auth".to_vec());
    let c = client(&[], ProxyConfig::default());
    let url = Url::parse(&format!("ws://127.0.0.1:{port}")).unwrap();
    let refused = run(WebSocket::connect(&c, &url, "/v1/responses", &[]))
        .unwrap()
        .err()
        .unwrap();
    assert_eq!(
        (refused.status, refused.body.as_slice()),
        (401, &b"no auth"[..])
    );
}

#[test]
fn requests_beyond_the_per_origin_cap_wait_for_a_slot() {
    // Bodies larger than one read: the first response is still being read when the second
    // request is made; with a cap of one, the second waits until the first body is read.
    let body = "x".repeat(100_000);
    let (port, conns) = serve(move |_, _| {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    });
    let mut cfg = ClientConfig::new(tls::client_config(&[]).unwrap(), ProxyConfig::default());
    cfg.max_per_origin = 1;
    cfg.idle_per_origin = 0; // every request on a new connection
    let c = HttpClient::new(cfg);
    let url = Url::parse(&format!("http://127.0.0.1:{port}")).unwrap();
    let order = run(async {
        let first = c.send(&post(&url, b"")).await.unwrap();
        let c2 = c.clone();
        let url2 = url.clone();
        let done = Rc::new(std::cell::RefCell::new(Vec::new()));
        let d = done.clone();
        let second = glommio::spawn_local(async move {
            let mut r = c2.send(&post(&url2, b"")).await.unwrap();
            r.body(1 << 20).await.unwrap();
            d.borrow_mut().push("second");
        });
        glommio::timer::sleep(Duration::from_millis(100)).await;
        done.borrow_mut().push("first read");
        let mut first = first;
        first.body(1 << 20).await.unwrap();
        second.await;
        let v = done.borrow().clone();
        v
    });
    assert_eq!(
        order,
        ["first read", "second"],
        "the second request waited for the slot"
    );
    assert_eq!(conns.load(Ordering::SeqCst), 2);
}

#[test]
fn a_burst_of_requests_keeps_its_connections_for_the_next_burst() {
    // 64 requests at once (a shard's runs asking one provider), then 64 more: the second
    // burst takes the first one's connections from the pool instead of opening new ones.
    let (port, conns) = serve(|_, _| b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec());
    let url = Url::parse(&format!("http://127.0.0.1:{port}")).unwrap();
    let c = client(&[], ProxyConfig::default());
    run(async {
        for _ in 0..2 {
            let tasks: Vec<_> = (0..64)
                .map(|_| {
                    let (c, url) = (c.clone(), url.clone());
                    glommio::spawn_local(async move {
                        let mut r = c.send(&post(&url, b"{}")).await.unwrap();
                        r.body(1 << 10).await.unwrap()
                    })
                })
                .collect();
            for t in tasks {
                assert_eq!(t.await, b"ok");
            }
        }
    });
    assert_eq!(conns.load(Ordering::SeqCst), 64);
    let s = c.stats();
    assert_eq!((s.connects, s.reuses), (64, 64));
}
