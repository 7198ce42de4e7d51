//! The daemon's message plane for the `step_events` cases, outside broca's process: ckbus's
//! two ops as the stand-in daemon serves them on its management surface (`ckbus.credential`:
//! a JWT, the server's URL, the account; `ckbus.nonce_sign`: the server's nonce signed with a
//! key broca never sees), and a NATS server speaking the protocol's text form (INFO with a
//! nonce, CONNECT checked against the issued JWT and ckbus's signature, PING/PONG, PUB).
//!
//! Each PUB is kept as it arrived, with what the session's WAL held at that moment: whether
//! the record the hint names (its `seq`) was already in the file, read from the file itself
//! before the next byte of the connection is taken. That is the capture at the publish seam
//! the suite asks for; the hints' record positions are read from the WAL separately.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use cortexkit_role_llm_runner::session_ref::{session_ref, SessionIdentity};
use cortexkit_role_llm_runner::step_events::StepRef;
use cortexkit_role_llm_runner_conformance::step_events::{
    PublishedStep, RecordedStep, StepEventObservation,
};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// The account the stand-in's subjects are under.
pub const ACCT: &str = "conformance";

/// One PUB as the server received it.
#[derive(Debug, Clone)]
pub struct Published {
    pub subject: String,
    pub body: Value,
    /// The record the hint names was in the session's WAL when the PUB arrived.
    pub record_in_wal: bool,
}

struct Inner {
    url: String,
    jwt: String,
    key: [u8; 32],
    published: Mutex<Vec<Published>>,
    /// The WAL folders of the modules started so far (a hint's session is looked up in each).
    wal_dirs: Mutex<Vec<PathBuf>>,
    /// CONNECTs refused: a wrong JWT or signature.
    refused: AtomicU64,
}

/// The bus: ckbus's answers and the NATS server, shared by every module of the run.
#[derive(Clone)]
pub struct Bus {
    inner: Arc<Inner>,
}

impl Bus {
    pub async fn start() -> Bus {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("the bus listens on loopback");
        let port = listener.local_addr().expect("a bound port").port();
        let seed = format!("{:?}{}", std::time::SystemTime::now(), std::process::id());
        let key = *blake3::hash(seed.as_bytes()).as_bytes();
        let inner = Arc::new(Inner {
            url: format!("nats://127.0.0.1:{port}"),
            jwt: format!("conformance-jwt-{}", blake3::hash(&key).to_hex()),
            key,
            published: Mutex::default(),
            wal_dirs: Mutex::default(),
            refused: AtomicU64::new(0),
        });
        let serving = inner.clone();
        tokio::spawn(async move {
            let mut n = 0u64;
            while let Ok((stream, _)) = listener.accept().await {
                n += 1;
                tokio::spawn(nats_connection(stream, serving.clone(), n));
            }
        });
        Bus { inner }
    }

    /// A module keeps its WALs in `dir`.
    pub fn watch_wal_dir(&self, dir: PathBuf) {
        let mut dirs = self.inner.wal_dirs.lock().unwrap();
        if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }

    /// Every PUB so far whose hint names `harness` and `session`.
    pub fn published(&self, harness: &str, session: &str) -> Vec<Published> {
        self.inner
            .published
            .lock()
            .unwrap()
            .iter()
            .filter(|p| p.body["harness"] == harness && p.body["session"] == session)
            .cloned()
            .collect()
    }

    /// CONNECTs refused so far.
    pub fn refused(&self) -> u64 {
        self.inner.refused.load(Ordering::Relaxed)
    }

    fn signature(&self, nonce: &[u8]) -> Vec<u8> {
        blake3::keyed_hash(&self.inner.key, nonce)
            .as_bytes()
            .to_vec()
    }

    /// ckbus's answer to a `{method, params}` request on its management surface.
    pub fn ckbus(&self, body: &Value) -> Result<Value, Value> {
        match body["method"].as_str() {
            Some("ckbus.credential") => Ok(json!({"result": {
                "jwt": self.inner.jwt,
                "credential_public": "UCONFORMANCE",
                "account_public": "ACONFORMANCE",
                "server_url": self.inner.url,
                "acct": ACCT,
            }})),
            Some("ckbus.nonce_sign") => {
                let params = &body["params"];
                let nonce = params["nonce_b64"]
                    .as_str()
                    .and_then(|n| STANDARD.decode(n).ok());
                match (nonce, params["credential_public"].as_str()) {
                    (Some(nonce), Some("UCONFORMANCE")) => Ok(json!({"result": {
                        "signature_b64": STANDARD.encode(self.signature(&nonce)),
                    }})),
                    _ => Err(
                        json!({"code": "invalid_params", "message": "nonce_b64 and the issued credential_public are required"}),
                    ),
                }
            }
            other => {
                Err(json!({"code": "unknown_method", "message": format!("ckbus has no {other:?}")}))
            }
        }
    }
}

/// Whether the WAL of the hint's session holds a record `seq`, read from the file now.
fn record_in_wal(inner: &Inner, body: &Value) -> bool {
    let (Some(harness), Some(session), Some(seq)) = (
        body["harness"].as_str(),
        body["session"].as_str(),
        body["seq"].as_u64(),
    ) else {
        return false;
    };
    let Ok(triple) =
        broca::wal::SessionTriple::new(broca::daemon::NO_WORKDIR_ROOT, harness, session)
    else {
        return false;
    };
    let dirs = inner.wal_dirs.lock().unwrap().clone();
    dirs.iter().any(|dir| {
        let path = broca::wal::writer::wal_path(dir, &triple);
        match broca::wal::verify::read_and_scan(&path) {
            Ok((_, scan)) => scan.frames.iter().any(|f| f.seq == seq),
            Err(_) => false,
        }
    })
}

async fn nats_connection(stream: TcpStream, inner: Arc<Inner>, n: u64) {
    let (reader, mut writer) = stream.into_split();
    let mut reader = BufReader::new(reader);
    let nonce = blake3::keyed_hash(&inner.key, &n.to_le_bytes()).to_hex()[..22].to_string();
    let info = json!({"server_id": "conformance-bus", "version": "2.10.0", "proto": 1,
        "headers": false, "max_payload": 1_048_576, "auth_required": true, "nonce": nonce});
    if writer
        .write_all(format!("INFO {info}\r\n").as_bytes())
        .await
        .is_err()
    {
        return;
    }
    let bus = Bus {
        inner: inner.clone(),
    };
    let mut line = String::new();
    let mut connected = false;
    loop {
        line.clear();
        match reader.read_line(&mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let l = line.trim_end();
        if let Some(connect) = l.strip_prefix("CONNECT ") {
            let c: Value = serde_json::from_str(connect).unwrap_or(Value::Null);
            let sig = c["sig"]
                .as_str()
                .and_then(|s| URL_SAFE_NO_PAD.decode(s).ok());
            if c["jwt"] != inner.jwt || sig != Some(bus.signature(nonce.as_bytes())) {
                inner.refused.fetch_add(1, Ordering::Relaxed);
                let _ = writer
                    .write_all(b"-ERR 'Authorization Violation'\r\n")
                    .await;
                return;
            }
            connected = true;
        } else if l == "PING" {
            if writer.write_all(b"PONG\r\n").await.is_err() {
                return;
            }
        } else if let Some(rest) = l.strip_prefix("PUB ") {
            let parts: Vec<&str> = rest.split_whitespace().collect();
            let (Some(subject), Some(Ok(size))) =
                (parts.first(), parts.last().map(|s| s.parse::<usize>()))
            else {
                return;
            };
            let subject = subject.to_string();
            let mut payload = vec![0u8; size + 2];
            if reader.read_exact(&mut payload).await.is_err() || !connected {
                return;
            }
            payload.truncate(size);
            let body: Value = serde_json::from_slice(&payload).unwrap_or(Value::Null);
            let record_in_wal = record_in_wal(&inner, &body);
            inner.published.lock().unwrap().push(Published {
                subject,
                body,
                record_in_wal,
            });
        }
    }
}

/// The suite's evidence for the session `session` of `harness` whose WAL is in `wal_dir`: its
/// model attempts' records read from the WAL (independently of the bus), and the hints the
/// bus received for it, once as many hints as records have arrived (or 10 s passed) and a
/// further 300 ms brought none (a duplicate would show).
pub async fn observation(
    bus: &Bus,
    wal_dir: &std::path::Path,
    runner: &str,
    harness: &str,
    session: &str,
) -> Result<StepEventObservation, String> {
    use broca::wal::Record;
    let triple = broca::wal::SessionTriple::new(broca::daemon::NO_WORKDIR_ROOT, harness, session)
        .map_err(|e| format!("the session's triple: {e}"))?;
    let path = broca::wal::writer::wal_path(wal_dir, &triple);
    let (bytes, scan) = broca::wal::verify::read_and_scan(&path)
        .map_err(|e| format!("reading {}: {e}", path.display()))?;
    let lineage = scan.header.lineage_hex();
    let session_ref = session_ref(&SessionIdentity {
        runner,
        harness,
        session,
    });
    let mut recorded: Vec<RecordedStep> = Vec::new();
    for f in &scan.frames {
        let record = Record::decode(f.kind, &bytes[f.payload.clone()])
            .map_err(|e| format!("record {} of {}: {e}", f.seq, path.display()))?;
        let (run_id, step, attempt, completes) = match &record {
            Record::ModelStepFinished(r) => (&r.run_id, r.step, r.attempt, true),
            // A failed attempt completes its step unless the step was tried again.
            Record::ModelAttemptFinished(r) => (&r.run_id, r.step, r.attempt, true),
            _ => continue,
        };
        if let Some(earlier) = recorded
            .iter_mut()
            .rev()
            .find(|r| r.run_id == *run_id && r.step_id == step.to_string())
        {
            earlier.completes_step = false;
        }
        let position = StepRef::new(runner, &session_ref, &lineage, f.seq);
        let attempt = std::num::NonZeroU64::new(u64::from(attempt).max(1)).expect("at least 1");
        recorded.push(
            RecordedStep::new(
                position,
                run_id.clone(),
                step.to_string(),
                attempt,
                completes,
            )
            .with_attempt_id(format!("{lineage}-{}", f.seq)),
        );
    }
    let until = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while bus.published(harness, session).len() < recorded.len()
        && tokio::time::Instant::now() < until
    {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    if bus.refused() > 0 {
        return Err(format!(
            "the bus refused {} CONNECTs: broca's JWT or nonce signature was not ckbus's",
            bus.refused()
        ));
    }
    let published = bus
        .published(harness, session)
        .into_iter()
        .map(|p| PublishedStep::new(p.subject, p.body, p.record_in_wal))
        .collect();
    Ok(StepEventObservation::new(recorded, published))
}
