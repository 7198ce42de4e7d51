//! The transport's AWS event-stream framing over a real loopback connection: messages named
//! by their `:event-type` (or `:exception-type`) reach the family's normalizer one by one; a
//! body cut inside a message is a transient failure. This is the framing the Bedrock family
//! plugs into; the normalizer here is a minimal one of that shape.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::thread;

use broca::protocol::model::ModelStream;
use broca::protocol::{ClassifiedError, ErrorClass, FinishReason, StreamEvent};
use broca::provider::{Framing, Normalized, StreamNormalizer};
use broca::transport::HttpModelStream;
use broca_io::eventstream::encode;
use broca_io::net::proxy::ProxyConfig;
use broca_io::net::{tls, ClientConfig, HttpClient, Request, Url};

struct Converse;

impl StreamNormalizer for Converse {
    fn push(
        &mut self,
        event: Option<&str>,
        data: &str,
    ) -> Result<Normalized, broca::provider::FormatError> {
        let v: serde_json::Value =
            serde_json::from_str(data).map_err(|e| broca::provider::FormatError(e.to_string()))?;
        Ok(match event {
            Some("contentBlockDelta") => Normalized::Events(vec![StreamEvent::TextDelta(
                v["delta"]["text"].as_str().unwrap_or_default().to_string(),
            )]),
            Some("messageStop") => Normalized::Events(vec![StreamEvent::Finish {
                reason: FinishReason::EndTurn,
                request_id: None,
            }]),
            Some("throttlingException") => Normalized::Error(ClassifiedError {
                class: ErrorClass::Transient,
                message: v["message"].as_str().unwrap_or_default().to_string(),
                retry_after_ms: None,
            }),
            _ => Normalized::Events(Vec::new()),
        })
    }
}

fn frames(exception: bool) -> Vec<u8> {
    let ev = |t: &str, p: &str| {
        encode(
            &[(":message-type", "event"), (":event-type", t)],
            p.as_bytes(),
        )
    };
    let mut b = ev("messageStart", r#"{"role":"assistant"}"#);
    b.extend(ev(
        "contentBlockDelta",
        r#"{"contentBlockIndex":0,"delta":{"text":"Hel"}}"#,
    ));
    if exception {
        b.extend(encode(
            &[
                (":message-type", "exception"),
                (":exception-type", "throttlingException"),
            ],
            br#"{"message":"Too many requests"}"#,
        ));
    }
    b.extend(ev(
        "contentBlockDelta",
        r#"{"contentBlockIndex":0,"delta":{"text":"lo"}}"#,
    ));
    b.extend(ev("messageStop", r#"{"stopReason":"end_turn"}"#));
    b
}

/// Serves one response whose body is `body`, chunked in pieces of 7 bytes, stopping after
/// `cut` bytes (closing the connection) when given.
fn serve(body: Vec<u8>, cut: Option<usize>) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut w = s.try_clone().unwrap();
        let mut r = BufReader::new(s);
        let mut len = 0;
        loop {
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
            if line == "\r\n" {
                break;
            }
        }
        let mut req = vec![0; len];
        r.read_exact(&mut req).unwrap();
        w.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/vnd.amazon.eventstream\r\ntransfer-encoding: chunked\r\n\r\n").unwrap();
        let end = cut.unwrap_or(body.len());
        for piece in body[..end].chunks(7) {
            w.write_all(format!("{:x}\r\n", piece.len()).as_bytes())
                .unwrap();
            w.write_all(piece).unwrap();
            w.write_all(b"\r\n").unwrap();
        }
        if cut.is_none() {
            w.write_all(b"0\r\n\r\n").unwrap();
        }
    });
    port
}

fn run(port: u16) -> Vec<Result<StreamEvent, String>> {
    broca_shards::run_local(async move {
        let client = HttpClient::new(ClientConfig::new(
            tls::client_config(&[]).unwrap(),
            ProxyConfig::default(),
        ));
        let url = Url::parse(&format!("http://127.0.0.1:{port}")).unwrap();
        let resp = client
            .send(&Request {
                method: "POST",
                url: &url,
                path: "/model/m/converse-stream",
                headers: &[],
                body: b"{}",
            })
            .await
            .unwrap();
        let mut s = HttpModelStream::from_response(
            resp,
            Framing::AwsEventStream,
            Box::new(Converse),
            url.to_string(),
        );
        let mut out = Vec::new();
        while let Some(ev) = s.next().await {
            let stop = ev.is_err();
            out.push(ev.map_err(|f| format!("{:?}: {}", f.error.class, f.error.message)));
            if stop {
                break;
            }
        }
        out
    })
    .unwrap()
}

#[test]
fn event_stream_messages_reach_the_normalizer_by_event_type() {
    let got = run(serve(frames(false), None));
    assert_eq!(
        got,
        vec![
            Ok(StreamEvent::TextDelta("Hel".into())),
            Ok(StreamEvent::TextDelta("lo".into())),
            Ok(StreamEvent::Finish {
                reason: FinishReason::EndTurn,
                request_id: None
            }),
        ]
    );
}

#[test]
fn an_exception_message_is_the_families_error() {
    let got = run(serve(frames(true), None));
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0], Ok(StreamEvent::TextDelta("Hel".into())));
    let err = got[1].as_ref().unwrap_err();
    assert!(
        err.starts_with("Transient: http://127.0.0.1:") && err.ends_with(": Too many requests"),
        "{err}"
    );
}

#[test]
fn a_body_cut_inside_a_message_is_transient() {
    let body = frames(false);
    let got = run(serve(body.clone(), Some(body.len() - 5)));
    let last = got.last().unwrap().as_ref().unwrap_err();
    assert!(
        last.starts_with("Transient:") && last.contains("cut"),
        "{got:?}"
    );
    assert!(!got
        .iter()
        .any(|e| matches!(e, Ok(StreamEvent::Finish { .. }))));
}
