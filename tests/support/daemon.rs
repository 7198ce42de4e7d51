//! A stand-in for the subconscious daemon, built on the ecosystem's own crates: it writes a
//! real connection file (`subc_transport::connection_file::write_atomic`, a fresh key and
//! daemon id), listens on loopback, runs the daemon's side of the handshake
//! (`subc_transport::authenticate_server`, tokio's) and moves frames with subc-transport's
//! `read_frame`/`write_frame`: nothing of broca's own wire code is on this side. The test
//! drives it step by step (bind a route, send a request, ask health, drain).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use subc_protocol::{Flags, Frame, FrameType, Priority};
use subc_transport::connection_file::{
    generate_daemon_id, generate_key, write_atomic, ConnectionInfo, Endpoint,
};

use tokio::net::TcpStream;

#[path = "daemon_scopes.rs"]
mod scopes;
#[path = "tool_module.rs"]
mod tool_module;
use tool_module::tool_answer;
pub use tool_module::ToolModule;

pub struct Daemon {
    pub rt: tokio::runtime::Runtime,
    listener: std::net::TcpListener,
    pub file: PathBuf,
    pub key: Vec<u8>,
    pub daemon_id: [u8; 16],
    stream: Option<TcpStream>,
    /// Frames read while waiting for another.
    pub seen: Vec<Frame>,
    next_corr: u64,
    /// Whether its HELLO_ACK advertises `scopes/v1` (a daemon that admits scoped routes).
    pub advertise_scopes: bool,
    /// The scopes registered on the registered connection (`scope.sync`, `scope.apply`), by
    /// ref: the owner's record. Scoped route.opens are admitted against it.
    pub scopes: ScopeTable,
    /// Every scope op broca sent, in order.
    pub scope_ops: Arc<Mutex<Vec<Value>>>,
    /// The registered module's id (its HELLO's), the owner of the scopes it registers.
    owner: String,
}

/// The machine id the stand-in's HELLO_ACK names.
pub const MACHINE_ID: &str = "00112233445566778899aabbccddeeff";

pub use scopes::ScopeTable;

/// What the daemon does with broca's handshake.
pub enum Answer {
    /// Prove itself with the file's key and take broca's HELLO.
    Accept,
    /// Prove itself with another key (a daemon that is not the file's).
    WrongKey,
    /// Take the HELLO and settle on another wire version than broca's.
    Version(u8),
}

impl Daemon {
    /// A daemon whose connection file is written into `dir` (created 0700).
    pub fn start(dir: &Path) -> Daemon {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let key = generate_key().unwrap();
        let daemon_id = generate_daemon_id().unwrap();
        let file = dir.join("run/subc-connection.json");
        let info = ConnectionInfo {
            schema: 1,
            wire_version: Some(2),
            endpoints: vec![Endpoint {
                host: "127.0.0.1".into(),
                port,
            }],
            key: key.clone(),
            daemon_id,
            pid: std::process::id(),
            daemon_ver: "test-daemon".into(),
        };
        write_atomic(&file, &info).unwrap();
        Daemon {
            rt,
            listener,
            file,
            key,
            daemon_id,
            stream: None,
            seen: Vec::new(),
            next_corr: 100,
            advertise_scopes: true,
            scopes: ScopeTable::default(),
            scope_ops: Arc::default(),
            owner: String::new(),
        }
    }

    /// Makes the connections accepted from now on take at most `bytes` into their receive
    /// buffer (a daemon slow to take what broca writes: broca's frames wait in broca).
    pub fn small_receive_buffer(&self, bytes: i32) {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid socket descriptor and an int option of the size given.
        let rc = unsafe {
            libc::setsockopt(
                self.listener.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&bytes as *const i32).cast(),
                std::mem::size_of::<i32>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "SO_RCVBUF");
    }

    /// Accepts broca's connection and answers its handshake; with `Accept`, reads its HELLO
    /// and answers HELLO_ACK. Answers the HELLO body, or how the handshake failed (the
    /// daemon side's `AuthError`).
    pub fn accept(&mut self, answer: Answer) -> Result<Value, String> {
        let (key, version) = match answer {
            Answer::Accept => (self.key.clone(), 2),
            Answer::WrongKey => (vec![7u8; 32], 2),
            Answer::Version(v) => (self.key.clone(), v),
        };
        let mut stream = self.accept_stream();
        let auth = self.rt.block_on(subc_transport::authenticate_server(
            &mut stream,
            &key,
            &self.daemon_id,
            "test-daemon",
            Duration::from_secs(2),
        ));
        if let Err(e) = auth {
            return Err(format!("{e:?}"));
        }
        let hello = self.read_on(&mut stream).expect("a HELLO");
        assert_eq!(hello.header.ty, FrameType::Hello);
        let caps: Vec<&str> = if self.advertise_scopes {
            vec![subc_protocol::scope::CAP_SCOPES_V1]
        } else {
            Vec::new()
        };
        let ack = serde_json::json!({
            "negotiated_ver": version,
            "subc_ops": ["route.open", "catalog.update", "scope.sync", "scope.apply"],
            "subc_capabilities": caps,
            "machine_id": MACHINE_ID,
        });
        let said: Value = serde_json::from_slice(&hello.body).unwrap_or(Value::Null);
        self.owner = said["manifest"]["module_id"]
            .as_str()
            .or(said["module_id"].as_str())
            .unwrap_or("")
            .to_string();
        self.write_on(
            &mut stream,
            FrameType::HelloAck,
            0,
            0,
            hello.header.corr,
            &ack,
        );
        self.stream = Some(stream);
        Ok(serde_json::from_slice(&hello.body).unwrap())
    }

    /// The next frame; `None` when broca closed the connection (or broke it).
    /// The next connection to the daemon (within 20 s), as a tokio stream.
    fn accept_stream(&self) -> TcpStream {
        let until = std::time::Instant::now() + Duration::from_secs(20);
        self.listener.set_nonblocking(true).unwrap();
        let std_stream = loop {
            match self.listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    assert!(
                        std::time::Instant::now() < until,
                        "broca connects within 20 s"
                    );
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("accept: {e}"),
            }
        };
        std_stream.set_nonblocking(true).unwrap();
        let _guard = self.rt.enter();
        TcpStream::from_std(std_stream).unwrap()
    }

    /// Serves the claustrum vault on the connections broca opens next (a thread of its own):
    /// each is authenticated, its `route.open` to claustrum answered, and its
    /// `credential.get_scoped` requests answered from `secrets` (an unknown id: the vault's
    /// `not_found`). Every route.open body and request is recorded.
    pub fn serve_vault(&self, secrets: Vec<(String, String)>) -> VaultLog {
        let log = VaultLog::default();
        self.serve(Services {
            vault: Some((secrets, log.clone())),
            tools: None,
            catalog: None,
            bus: None,
        });
        log
    }

    /// Serves the consumer connections broca opens from now on, each on a thread of its own:
    /// routes to the vault and to the tool module `tools` (whose calls are answered here,
    /// outside broca's process, and counted).
    pub fn serve(&self, services: Services) {
        let listener = self.listener.try_clone().unwrap();
        let key = self.key.clone();
        let daemon_id = self.daemon_id;
        let services = Arc::new(services);
        let scopes = self.scopes.clone();
        std::thread::spawn(move || loop {
            listener.set_nonblocking(false).unwrap();
            let Ok((s, _)) = listener.accept() else {
                return;
            };
            let (key, services, scopes) = (key.clone(), services.clone(), scopes.clone());
            std::thread::spawn(move || consumer(s, &key, &daemon_id, &services, &scopes));
        });
    }

    fn read_on(&self, stream: &mut TcpStream) -> Option<Frame> {
        self.rt
            .block_on(async {
                tokio::time::timeout(
                    Duration::from_secs(30),
                    subc_transport::frame_io::read_frame(stream),
                )
                .await
            })
            .expect("a frame within 30 s")
            .ok()
            .flatten()
    }

    fn write_on(
        &self,
        stream: &mut TcpStream,
        ty: FrameType,
        channel: u16,
        epoch: u32,
        corr: u64,
        body: &Value,
    ) {
        let body = if ty.is_pure_header() {
            Vec::new()
        } else {
            serde_json::to_vec(body).unwrap()
        };
        let priority = if channel == 0 {
            Priority::Passive
        } else {
            Priority::Interactive
        };
        let frame = Frame::build(
            ty,
            Flags::new(false, priority, false),
            channel,
            epoch,
            corr,
            body,
        )
        .unwrap();
        self.rt
            .block_on(subc_transport::frame_io::write_frame(stream, &frame))
            .unwrap();
    }

    /// Sends a frame to broca; answers its corr.
    pub fn send(&mut self, ty: FrameType, channel: u16, epoch: u32, body: &Value) -> u64 {
        self.next_corr += 1;
        let corr = self.next_corr;
        let body = &with_starter_policy(body);
        let mut stream = self.stream.take().expect("connected");
        self.write_on(&mut stream, ty, channel, epoch, corr, body);
        self.stream = Some(stream);
        corr
    }

    /// Sends a pure-header frame (CANCEL, GOODBYE) for an earlier corr.
    pub fn send_corr(&mut self, ty: FrameType, channel: u16, epoch: u32, corr: u64) {
        let mut stream = self.stream.take().expect("connected");
        self.write_on(&mut stream, ty, channel, epoch, corr, &Value::Null);
        self.stream = Some(stream);
    }

    /// The next frame from broca (`None`: it closed the connection).
    pub fn next(&mut self) -> Option<Frame> {
        if !self.seen.is_empty() {
            return Some(self.seen.remove(0));
        }
        loop {
            let mut stream = self.stream.take().expect("connected");
            let f = self.read_on(&mut stream);
            self.stream = Some(stream);
            match f {
                Some(f) if self.owner_op(&f) => continue,
                f => return f,
            }
        }
    }

    /// Answers broca's `scope.sync` and `scope.apply` (true), as the daemon does: the
    /// owner is the registered module; a sync replaces its set, an apply upserts and ends.
    fn owner_op(&mut self, f: &Frame) -> bool {
        if f.header.channel != 0 || f.header.ty != FrameType::Request {
            return false;
        }
        let body: Value = serde_json::from_slice(&f.body).unwrap_or(Value::Null);
        let op = body["op"].as_str().unwrap_or("");
        if op != "scope.sync" && op != "scope.apply" {
            return false;
        }
        self.scope_ops.lock().unwrap().push(body.clone());
        let answer = scopes::answer(&self.scopes, &self.owner, op, &body);
        let mut stream = self.stream.take().expect("connected");
        self.write_on(
            &mut stream,
            FrameType::Response,
            0,
            0,
            f.header.corr,
            &answer,
        );
        self.stream = Some(stream);
        true
    }

    /// broca's terminal frame for (channel, corr), keeping the others it sends meanwhile.
    pub fn answer(&mut self, channel: u16, corr: u64) -> Frame {
        if let Some(i) = self
            .seen
            .iter()
            .position(|f| f.header.channel == channel && f.header.corr == corr)
        {
            return self.seen.remove(i);
        }
        loop {
            let mut stream = self.stream.take().expect("connected");
            let f = self
                .read_on(&mut stream)
                .expect("broca answers before it closes");
            self.stream = Some(stream);
            if f.header.channel == channel && f.header.corr == corr {
                return f;
            }
            if self.owner_op(&f) {
                continue;
            }
            self.seen.push(f);
        }
    }

    /// A channel-0 request and broca's answer (its type and JSON body).
    pub fn control(&mut self, body: &Value) -> (FrameType, Value) {
        let corr = self.send(FrameType::Request, 0, 0, body);
        let f = self.answer(0, corr);
        (f.header.ty, serde_json::from_slice(&f.body).unwrap())
    }

    /// Binds route `channel` at `epoch` to the session (`workdir`, `harness`, `session`).
    pub fn bind(
        &mut self,
        channel: u16,
        epoch: u32,
        workdir: &str,
        harness: &str,
        session: &str,
    ) -> (FrameType, Value) {
        let body = serde_json::json!({
            "op": "route.bind",
            "route_channel": channel,
            "epoch": epoch,
            "target": {"kind": "management_surface", "module_id": "ck-broca"},
            "identity": {"harness": harness, "session": session},
            "principal": {"kind": "direct"},
            "scope": {
                "owner": {"kind": "direct"},
                "ref": format!("scope-{session}"),
                "scope_epoch": 1,
                "kind": "head",
                "workdir": workdir,
                "owner_authorized": false,
            },
        });
        self.control(&body)
    }

    /// A management request on a route, and broca's answer (its type and JSON body).
    pub fn request(
        &mut self,
        channel: u16,
        epoch: u32,
        method: &str,
        params: Value,
    ) -> (FrameType, Value) {
        let corr = self.send(
            FrameType::Request,
            channel,
            epoch,
            &serde_json::json!({"method": method, "params": params}),
        );
        let f = self.answer(channel, corr);
        (
            f.header.ty,
            serde_json::from_slice(&f.body).unwrap_or(Value::Null),
        )
    }

    /// broca's frames for (channel, corr) until `until` says stop (given each frame), keeping
    /// the others.
    pub fn frames_for(
        &mut self,
        channel: u16,
        corr: u64,
        mut until: impl FnMut(&Frame) -> bool,
    ) -> Vec<Frame> {
        let mut got = Vec::new();
        loop {
            let f = self.answer(channel, corr);
            let stop = until(&f);
            got.push(f);
            if stop {
                return got;
            }
        }
    }

    /// Reads until broca closes the connection; answers the frames it sent meanwhile.
    pub fn until_closed(&mut self) -> Vec<Frame> {
        let mut out = std::mem::take(&mut self.seen);
        while let Some(f) = self.next() {
            out.push(f);
        }
        out
    }

    /// Closes the connection without a word (the daemon died).
    pub fn drop_connection(&mut self) {
        self.stream = None;
    }
}

/// What the vault stand-in saw.
#[derive(Clone, Default)]
pub struct VaultLog {
    /// The route.open bodies.
    pub opens: Arc<Mutex<Vec<Value>>>,
    /// How many credential requests came.
    pub calls: Arc<AtomicUsize>,
    /// The params of each `credential.report_auth_failure`.
    pub reports: Arc<Mutex<Vec<Value>>>,
    /// The handles presented by `credential.get`.
    pub handles: Arc<Mutex<Vec<String>>>,
    /// While set the vault is out: its requests are answered with the daemon's relay
    /// refusal `module_reloading` and new routes to it with `unknown_module`.
    pub down: Arc<std::sync::atomic::AtomicBool>,
    /// While set, a credential read waits (at most 20 s) before it is answered.
    pub hold: Arc<std::sync::atomic::AtomicBool>,
    /// The record version every secret is answered with (0: 3); a rotation moves it.
    pub version: Arc<std::sync::atomic::AtomicU64>,
}

/// What the daemon's stand-in serves to broca's consumer connections.
pub struct Services {
    pub vault: Option<(Vec<(String, String)>, VaultLog)>,
    pub tools: Option<ToolModule>,
    /// The fusiform catalog module: its `catalog.get` answer, or `None` to refuse it
    /// (`unavailable`); every request it gets is counted.
    pub catalog: Option<CatalogModule>,
    /// ckbus: the bus credential it issues (the NATS server's URL, `acct`).
    pub bus: Option<BusModule>,
}

/// The ckbus stand-in: `ckbus.credential` answers a test JWT for the server at `url` under
/// account `acct`; `ckbus.nonce_sign` a fixed signature. Every request is recorded.
#[derive(Clone, Default)]
pub struct BusModule {
    pub url: String,
    pub acct: String,
    pub calls: Arc<Mutex<Vec<Value>>>,
}

/// The fusiform stand-in.
#[derive(Clone, Default)]
pub struct CatalogModule {
    pub answer: Arc<Mutex<Option<Value>>>,
    pub asked: Arc<AtomicUsize>,
    /// The arguments of each `catalog.get`.
    pub arguments: Arc<Mutex<Vec<Value>>>,
}

enum Reply {
    Frame(FrameType, Value, bool),
    /// A frame written after this long (nothing else is read meanwhile).
    Later(Duration, FrameType, Value),
    /// Keepalive PUSHes every `.0` (when `.1`) until `.2` has passed, then the frame.
    Working(Duration, bool, Duration, FrameType, Value),
    Silence,
    Die,
}

fn consumer(
    s: std::net::TcpStream,
    key: &[u8],
    daemon_id: &[u8; 16],
    services: &Services,
    scopes: &ScopeTable,
) {
    use subc_transport::frame_io::{read_frame, write_frame};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    s.set_nonblocking(true).unwrap();
    let mut stream = {
        let _guard = rt.enter();
        TcpStream::from_std(s).unwrap()
    };
    rt.block_on(async {
        if subc_transport::authenticate_server(
            &mut stream,
            key,
            daemon_id,
            "test-daemon",
            Duration::from_secs(2),
        )
        .await
        .is_err()
        {
            return;
        }
        // Routes of this connection: channel -> "vault" or "tools".
        let mut routes: std::collections::HashMap<u16, &str> = Default::default();
        let mut next_channel = 10u16;
        while let Ok(Some(f)) = read_frame(&mut stream).await {
            let h = f.header;
            let body: Value = serde_json::from_slice(&f.body).unwrap_or(Value::Null);
            let reply = match (h.channel, h.ty) {
                (_, FrameType::Cancel) => {
                    if let Some(t) = &services.tools {
                        t.log.cancels.lock().unwrap().push((h.channel, h.corr));
                    }
                    Reply::Silence
                }
                (_, FrameType::Goodbye) => {
                    routes.remove(&h.channel);
                    Reply::Silence
                }
                (0, FrameType::Request) => {
                    open_route(services, scopes, &body, &mut routes, &mut next_channel)
                }
                (ch, FrameType::Request) => match routes.get(&ch).copied() {
                    Some("vault") => vault_answer(services, &body),
                    Some("catalog") => catalog_answer(services.catalog.as_ref().unwrap(), &body),
                    Some("bus") => bus_answer(services.bus.as_ref().unwrap(), &body),
                    Some(_) => tool_answer(services.tools.as_ref().unwrap(), &body, ch),
                    None => Reply::Frame(
                        FrameType::Error,
                        serde_json::json!({"code": "unknown_channel", "message": "no such route"}),
                        true,
                    ),
                },
                _ => Reply::Silence,
            };
            let (ty, body, daemon) = match reply {
                Reply::Frame(ty, body, daemon) => (ty, body, daemon),
                Reply::Later(after, ty, body) => {
                    tokio::time::sleep(after).await;
                    (ty, body, false)
                }
                Reply::Working(every, pushes, total, ty, body) => {
                    let began = std::time::Instant::now();
                    while began.elapsed() < total {
                        tokio::time::sleep(every.min(total - began.elapsed())).await;
                        if !pushes {
                            continue;
                        }
                        let push = Frame::build(
                            FrameType::Push,
                            Flags::new(false, Priority::Interactive, false),
                            h.channel,
                            h.epoch,
                            h.corr,
                            cortexkit_role_tool_provider::keepalive_body().to_vec(),
                        )
                        .unwrap();
                        if write_frame(&mut stream, &push).await.is_err() {
                            return;
                        }
                    }
                    (ty, body, false)
                }
                Reply::Silence => continue,
                Reply::Die => return,
            };
            let mut flags = Flags::new(false, Priority::Interactive, false);
            if daemon {
                flags = flags.with_daemon_origin();
            }
            let frame = Frame::build(
                ty,
                flags,
                h.channel,
                h.epoch,
                h.corr,
                serde_json::to_vec(&body).unwrap(),
            )
            .unwrap();
            if write_frame(&mut stream, &frame).await.is_err() {
                return;
            }
        }
    });
}

fn open_route(
    services: &Services,
    scopes: &ScopeTable,
    body: &Value,
    routes: &mut std::collections::HashMap<u16, &'static str>,
    next_channel: &mut u16,
) -> Reply {
    let refuse = |code: &str| {
        Reply::Frame(
            FrameType::Error,
            serde_json::json!({"code": code, "message": format!("refused: {code}")}),
            true,
        )
    };
    if body["op"] == "catalog.list" {
        return tool_module::catalog_list(services.tools.as_ref(), body);
    }
    let target = &body["target"];
    let kind = if target["module_id"] == "fusiform" && services.catalog.is_some() {
        "catalog"
    } else if target["module_id"] == "ckbus" && services.bus.is_some() {
        "bus"
    } else if target["module_id"] == "claustrum" {
        if let Some((_, log)) = &services.vault {
            log.opens.lock().unwrap().push(body.clone());
            if log.down.load(Ordering::SeqCst) {
                return refuse("unknown_module");
            }
            "vault"
        } else {
            return refuse("unknown_module");
        }
    } else {
        match &services.tools {
            Some(t)
                if target["kind"] == "tool_provider"
                    && target["module_id"] == t.module_id.as_str() =>
            {
                t.log.opens.lock().unwrap().push(body.clone());
                let mut queue = t.refuse_opens.lock().unwrap();
                if !queue.is_empty() {
                    let code = queue.remove(0);
                    return refuse(&code);
                }
                let stamp = match scopes::admit(scopes, body) {
                    Ok(stamp) => stamp,
                    Err(code) => return refuse(code),
                };
                t.log
                    .stamps
                    .lock()
                    .unwrap()
                    .insert(*next_channel + 1, stamp);
                "tools"
            }
            _ => return refuse("unknown_module"),
        }
    };
    *next_channel += 1;
    routes.insert(*next_channel, kind);
    Reply::Frame(
        FrameType::Response,
        serde_json::json!({"op": "route.open", "route_channel": *next_channel, "route_epoch": 1}),
        false,
    )
}

fn bus_answer(b: &BusModule, body: &Value) -> Reply {
    b.calls.lock().unwrap().push(body.clone());
    let result = match body["method"].as_str() {
        Some("ckbus.credential") => serde_json::json!({
            "jwt": "test-bus-jwt", "credential_public": "UTEST", "account_public": "ATEST",
            "server_url": b.url, "acct": b.acct,
        }),
        Some("ckbus.nonce_sign") => serde_json::json!({"signature_b64": "c2lnbmVk"}),
        _ => {
            return Reply::Frame(
                FrameType::Error,
                serde_json::json!({"code": "unknown_method", "message": "ckbus: no such method"}),
                false,
            )
        }
    };
    Reply::Frame(
        FrameType::Response,
        serde_json::json!({ "result": result }),
        false,
    )
}

fn catalog_answer(c: &CatalogModule, body: &Value) -> Reply {
    c.asked.fetch_add(1, Ordering::SeqCst);
    c.arguments.lock().unwrap().push(body["arguments"].clone());
    if body["name"] != "catalog.get" {
        return Reply::Frame(
            FrameType::Error,
            serde_json::json!({"code": "bad_request", "message": "unknown tool"}),
            false,
        );
    }
    match c.answer.lock().unwrap().clone() {
        Some(a) => Reply::Frame(FrameType::Response, a, false),
        None => Reply::Frame(
            FrameType::Error,
            serde_json::json!({"code": "unavailable", "message": "the store is not open"}),
            false,
        ),
    }
}

fn vault_answer(services: &Services, body: &Value) -> Reply {
    let (secrets, l) = services.vault.as_ref().unwrap();
    if l.down.load(Ordering::SeqCst) {
        return Reply::Frame(
            FrameType::Error,
            serde_json::json!({"code": "module_reloading", "message": "the vault is reloading"}),
            true,
        );
    }
    let reply = if body["method"] == "credential.report_auth_failure" {
        l.reports.lock().unwrap().push(body["params"].clone());
        serde_json::json!({"result": {"accepted": true}})
    } else {
        l.calls.fetch_add(1, Ordering::SeqCst);
        let held_since = std::time::Instant::now();
        while l.hold.load(Ordering::SeqCst) && held_since.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(10));
        }
        // A scoped read names the credential; a handle read presents the handle.
        let id = match body["params"]["handle"].as_str() {
            Some(h) if body["method"] == "credential.get" => {
                l.handles.lock().unwrap().push(h.to_string());
                h.to_string()
            }
            _ => body["params"]["credential_id"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        };
        match secrets.iter().find(|(k, _)| *k == id) {
            Some((_, secret)) => {
                let version = match l.version.load(Ordering::SeqCst) {
                    0 => 3,
                    v => v,
                };
                serde_json::json!({"result": {"payload": secret, "record_version": version.to_string()}})
            }
            None => {
                serde_json::json!({"result": {"error": {"code": "not_found", "class": "permanent"}}})
            }
        }
    };
    Reply::Frame(FrameType::Response, reply, false)
}

/// A `session.send` naming no storage policy (nor the older `retention`), given the one the
/// role's starters send by default: broca's module mode requires one on a session's first
/// send (llm-runner/v1 `session_retention.required`), as a starter sends it to every runner
/// declaring the group. Any other body is as it was.
pub fn with_starter_policy(body: &Value) -> Value {
    let mut body = body.clone();
    if body["method"] == "session.send" {
        if let Some(params) = body["params"].as_object_mut() {
            if !params.contains_key("retention_policy") && !params.contains_key("retention") {
                params.insert(
                    "retention_policy".into(),
                    serde_json::json!({"keep": "forever", "archive_after_days": 0,
                        "backup": false, "request_dumps": false}),
                );
            }
        }
    }
    body
}
