//! The daemon connection on shard 0, after broca-subc registered it.
//! The daemon binds routes on channel 0 (`route.bind`: the session is the bind's identity,
//! its project root the scope's folder), asks `health.check` and pings; REQUEST frames
//! `{method, params}` on a bound route are parsed by the management core with the route's
//! session and executed by the host as serve's `/v1/rpc` requests are, each in a task of its
//! own, answered `{"result": ...}` or an ERROR frame
//! `{code, message, detail: {class, status}}`. `module.draining`, a GOODBYE on channel 0 or
//! the connection's end stop broca as a signal does (admission closed, the grace period, cut
//! short by a drain's deadline, the rest sealed interrupted); at the end broca says GOODBYE
//! on each bound route, then on channel 0. A subscription's STREAM_END carries LAST.

mod compaction;
mod egress;
mod health;
mod scopes;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::channels::local_channel;
use serde_json::{json, Value};

use broca_host::Host;
use broca_subc::frames::{self, Decoder, FrameIn};
use broca_subc::protocol::session::{ModuleControlCommand, ModuleControlRequest};
use broca_subc::protocol::{AdmissionClass, ErrorBody, FrameType, MAX_DELIVERED_FRAME_LEN};
use broca_wal::SessionTriple;
use broca_wire::lanes::{self, SubItem};
use broca_wire::{Code, RpcError, SessionName};

use egress::{Egress, Kind, Pushed};

/// The correlation id of broca's own `catalog.update` on channel 0.
const READY_CORR: u64 = 1 << 62;
/// The first correlation id of broca's other own requests on channel 0 (its scopes).
const OWN_CORR: u64 = (1 << 62) + 1;

/// The project root of a session whose bind names no folder.
pub const NO_WORKDIR_ROOT: &str = "/";

/// The daemon connection, registered, handed to shard 0.
pub struct SubcConn {
    pub stream: std::net::TcpStream,
    pub decoder: Decoder,
    /// The sessions' scopes asked by tool routes, when broca owns them (front::scopes).
    pub scopes: Option<futures_channel::mpsc::UnboundedReceiver<broca_subc::scope::Ask>>,
    /// What the daemon's HELLO_ACK settled.
    pub negotiated: broca_subc::negotiated::Negotiated,
}

/// A route the daemon bound.
#[derive(Debug, Clone)]
struct Route {
    epoch: u32,
    triple: SessionTriple,
    /// The triple as the management core names a session.
    session: SessionName,
    /// Who the daemon says the route's caller is (owner-only methods compare it with the
    /// session's owners).
    caller: broca_wire::Caller,
    /// A route of the session's compaction provider (role `compaction-runner`).
    compaction: bool,
}

struct Routes {
    host: Arc<Host>,
    /// Set when the connection ended unannounced (broca stops, and exits non-zero).
    lost: Arc<std::sync::atomic::AtomicBool>,
    routes: RefCell<HashMap<u16, Route>>,
    /// What is queued for the socket, per route and bounded (egress.rs); a push never waits.
    egress: Rc<RefCell<Egress>>,
    /// Rung when a frame is queued: the writer takes every queued frame in turn.
    bell: Rc<local_channel::LocalSender<()>>,
    /// Requests being answered.
    in_flight: Cell<usize>,
    /// Held-open `session.subscribe` requests by (channel, corr): dropping the sender ends
    /// the subscription.
    subs: RefCell<HashMap<(u16, u64), futures_channel::oneshot::Sender<()>>>,
    /// The connection is saying GOODBYE: it has ended every held subscription itself.
    closing: Cell<bool>,
    /// broca's own channel-0 requests waiting for the daemon's answer, by corr.
    own: RefCell<HashMap<u64, futures_channel::oneshot::Sender<FrameIn>>>,
    next_own: Cell<u64>,
    negotiated: broca_subc::negotiated::Negotiated,
}

/// Serves the daemon connection until it ends or broca stops; answers the GOODBYE's end
/// (the socket's write side, to be said GOODBYE on and closed when the shard ends).
pub(crate) async fn run(
    host: Arc<Host>,
    conn: SubcConn,
    lost: Arc<std::sync::atomic::AtomicBool>,
) -> Result<Closer, broca_host::StartError> {
    use std::os::fd::{FromRawFd, IntoRawFd};
    conn.stream.set_nonblocking(true).map_err(|e| {
        broca_host::StartError::new(
            broca_host::Stage::Front,
            format!("the daemon connection: {e}"),
        )
    })?;
    // SAFETY: the descriptor comes from a connected std socket whose ownership moves here.
    let stream = unsafe { glommio::net::TcpStream::from_raw_fd(conn.stream.into_raw_fd()) };
    let (reader, writer) = futures_lite::io::split(stream);
    let (bell, rung) = local_channel::new_bounded::<()>(1);
    let egress = Rc::new(RefCell::new(Egress::new()));
    let writer = Rc::new(RefCell::new(Some(writer)));
    glommio::spawn_local(write_loop(writer.clone(), egress.clone(), rung)).detach();
    let front = Rc::new(Routes {
        host,
        lost,
        routes: RefCell::new(HashMap::new()),
        egress,
        bell: Rc::new(bell),
        in_flight: Cell::new(0),
        subs: RefCell::new(HashMap::new()),
        closing: Cell::new(false),
        own: RefCell::new(HashMap::new()),
        next_own: Cell::new(OWN_CORR),
        negotiated: conn.negotiated,
    });
    let f = front.clone();
    glommio::spawn_local(async move { f.say_ready().await }).detach();
    if let Some(asks) = conn.scopes {
        glommio::spawn_local(scopes::own(front.clone(), asks)).detach();
    }
    glommio::spawn_local(read_loop(front.clone(), conn.decoder, reader)).detach();
    Ok(Closer {
        writer,
        routes: front.clone(),
    })
}

/// Writes the frames the egress queues, each time the bell rings, until the connection's
/// writer is gone or a write fails.
async fn write_loop(
    w: Rc<RefCell<Option<futures_lite::io::WriteHalf<glommio::net::TcpStream>>>>,
    queued: Rc<RefCell<Egress>>,
    rung: local_channel::LocalReceiver<()>,
) {
    while rung.recv().await.is_some() {
        while let Some(frame) = queued.borrow_mut().pop() {
            let Some(mut out) = w.borrow_mut().take() else {
                return;
            };
            let sent = out.write_all(&frame).await;
            *w.borrow_mut() = Some(out);
            if let Err(e) = sent {
                tracing::error!("the daemon connection: {e}");
                return;
            }
        }
    }
}

/// Reads until the daemon says GOODBYE or the connection ends; a drain stops broca and
/// reading goes on (the daemon may still send what it had in flight).
async fn read_loop(
    f: Rc<Routes>,
    mut decoder: broca_subc::frames::Decoder,
    mut reader: futures_lite::io::ReadHalf<glommio::net::TcpStream>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let end = loop {
        match decoder.next_frame() {
            Ok(Some(frame)) => match f.dispatch(frame).await {
                Some(End::Drain(why, by)) => f.stop(End::Drain(why, by)).await,
                Some(end) => break end,
                None => {}
            },
            Ok(None) => match reader.read(&mut buf).await {
                Ok(0) => break End::Lost("the daemon closed the connection".into()),
                Ok(n) => decoder.push(&buf[..n]),
                Err(e) => break End::Lost(format!("the daemon connection: {e}")),
            },
            Err(e) => break End::Lost(format!("the daemon sent {e}")),
        }
    };
    f.stop(end).await;
}

/// The daemon connection ended before it answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConnectionEnded;

/// Why broca stops.
enum End {
    /// The daemon is draining broca (`module.draining`) by the wall-clock deadline (Unix
    /// ms): the connection stays.
    Drain(String, u64),
    /// The daemon said GOODBYE.
    Asked(String),
    /// The connection broke or the daemon went away unannounced.
    Lost(String),
}

/// Says GOODBYE and closes the connection, at the shard's end.
pub(crate) struct Closer {
    writer: Rc<RefCell<Option<futures_lite::io::WriteHalf<glommio::net::TcpStream>>>>,
    routes: Rc<Routes>,
}

impl broca_host::Running for Closer {
    fn stop(self: Box<Self>) -> broca_host::LocalBoxFuture<'static, ()> {
        Box::pin(self.goodbye())
    }
}

impl Closer {
    async fn goodbye(self) {
        // Each held subscription ends with its STREAM_END (the sessions it follows are
        // closed; a subscription still waiting for its hub's end is ended here), then each
        // route says GOODBYE, then the connection.
        self.routes.closing.set(true);
        let held: Vec<(u16, u64)> = self
            .routes
            .subs
            .borrow_mut()
            .drain()
            .map(|(k, _)| k)
            .collect();
        let bound: Vec<(u16, u32)> = {
            let mut routes = self.routes.routes.borrow_mut();
            let mut bound: Vec<(u16, u32)> = routes.iter().map(|(c, r)| (*c, r.epoch)).collect();
            routes.clear();
            bound.sort_unstable();
            bound
        };
        let epoch_of = |channel: u16| bound.iter().find(|b| b.0 == channel).map_or(0, |b| b.1);
        let mut frames_out = Vec::new();
        for (channel, corr) in held {
            let epoch = epoch_of(channel);
            frames_out.push(stream_end(channel, epoch, corr));
        }
        for &(channel, epoch) in &bound {
            frames_out.push(frames::encode(
                FrameType::Goodbye,
                frames::data(),
                channel,
                epoch,
                0,
                Vec::new(),
            ));
        }
        for frame in frames_out {
            self.routes.send(frame).await;
        }
        // Channel 0's GOODBYE last: after the routes' frames are out (channel 0's queue
        // goes first).
        for _ in 0..200 {
            if self.routes.egress.borrow().is_empty() && self.writer.borrow().is_some() {
                break;
            }
            glommio::timer::sleep(Duration::from_millis(10)).await;
        }
        self.routes
            .send(frames::encode(
                FrameType::Goodbye,
                frames::control(),
                0,
                0,
                0,
                Vec::new(),
            ))
            .await;
        // Let the writer drain what is queued (it holds the write side while it writes),
        // then close the write side.
        for _ in 0..200 {
            if self.routes.egress.borrow().is_empty() && self.writer.borrow().is_some() {
                break;
            }
            glommio::timer::sleep(Duration::from_millis(10)).await;
        }
        let taken = self.writer.borrow_mut().take();
        if let Some(mut w) = taken {
            let _ = w.flush().await;
            let _ = w.close().await;
        }
    }
}

impl Routes {
    /// One request of broca's own on channel 0 and the daemon's answer (`Err`: the
    /// connection ended first).
    async fn ask_daemon(&self, body: Vec<u8>) -> Result<FrameIn, ConnectionEnded> {
        let corr = self.next_own.get();
        self.next_own.set(corr + 1);
        let (tx, rx) = futures_channel::oneshot::channel();
        let earlier = self.own.borrow_mut().insert(corr, tx);
        debug_assert!(
            earlier.is_none(),
            "a correlation id of broca's is used once"
        );
        self.send(frames::encode(
            FrameType::Request,
            frames::control(),
            0,
            0,
            corr,
            body,
        ))
        .await;
        let answer = rx.await;
        self.own.borrow_mut().remove(&corr);
        answer.map_err(|_| ConnectionEnded)
    }

    async fn send(&self, frame: Result<Vec<u8>, broca_subc::LinkError>) {
        self.queue(frame, Kind::Frame);
    }

    /// Queues a frame under the egress policy (egress.rs), never waiting; a route the policy
    /// closes is forgotten here too (its subscriptions end).
    fn queue(&self, frame: Result<Vec<u8>, broca_subc::LinkError>, kind: Kind) {
        let bytes = match frame {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::error!("a frame for the daemon: {e}");
                return;
            }
        };
        let (channel, epoch) = header_route(&bytes);
        let goodbye = |channel: u16, epoch: u32| {
            frames::encode(
                FrameType::Goodbye,
                frames::data(),
                channel,
                epoch,
                0,
                Vec::new(),
            )
            .unwrap_or_default()
        };
        let mut closed = Vec::new();
        {
            let mut egress = self.egress.borrow_mut();
            if channel == 0 {
                egress.push_control(bytes);
            } else if let Pushed::Closed { now: true } =
                egress.push(channel, bytes, kind, || goodbye(channel, epoch))
            {
                closed.push(channel);
            }
            let epoch_of = |c: u16| self.routes.borrow().get(&c).map_or(0, |r| r.epoch);
            if let Some(c) = egress.enforce_connection_bound(|c| goodbye(c, epoch_of(c))) {
                closed.push(c);
            }
        }
        for channel in closed {
            tracing::warn!(
                channel,
                policy = "shed-then-close",
                "a route's frames were not taken fast enough: its display deltas were shed, \
                 then the route was closed"
            );
            self.routes.borrow_mut().remove(&channel);
            self.subs.borrow_mut().retain(|(ch, _), _| *ch != channel);
        }
        let _ = self.bell.try_send(());
    }

    async fn reply(&self, ty: FrameType, channel: u16, epoch: u32, corr: u64, body: &Value) {
        let flags = if channel == 0 {
            frames::control()
        } else {
            frames::data()
        };
        let bytes = serde_json::to_vec(body).expect("JSON values serialize");
        self.send(frames::encode(ty, flags, channel, epoch, corr, bytes))
            .await;
    }

    async fn error(&self, channel: u16, epoch: u32, corr: u64, e: &RpcError) {
        let body = ErrorBody::new(e.code.as_str(), e.message.clone()).with_detail(e.detail_body());
        let body = serde_json::to_value(body).expect("an error body serializes");
        self.reply(FrameType::Error, channel, epoch, corr, &body)
            .await;
    }

    /// One frame from the daemon; `Some` when the connection is to end.
    async fn dispatch(self: &Rc<Self>, f: FrameIn) -> Option<End> {
        let h = f.header;
        if h.channel == 0 {
            return self.control(f).await;
        }
        match h.ty {
            FrameType::Request => {
                let route = self.routes.borrow().get(&h.channel).cloned();
                match route {
                    Some(r) if r.epoch == h.epoch && lanes::is_subscribe(&f.body) => {
                        let me = self.clone();
                        glommio::spawn_local(async move {
                            me.subscribe(r.triple, h.channel, h.epoch, h.corr, &f.body)
                                .await;
                        })
                        .detach();
                    }
                    Some(r) if r.epoch == h.epoch => {
                        let me = self.clone();
                        self.in_flight.set(self.in_flight.get() + 1);
                        glommio::spawn_local(async move {
                            me.request(&r, h.channel, h.epoch, h.corr, f.body).await;
                            me.in_flight.set(me.in_flight.get() - 1);
                        })
                        .detach();
                    }
                    Some(_) => {
                        let e = RpcError::new(
                            Code::StaleRouteEpoch,
                            format!("route {} was bound again since", h.channel),
                        );
                        self.error(h.channel, h.epoch, h.corr, &e).await;
                    }
                    None => {
                        let e = RpcError::new(
                            Code::UnknownChannel,
                            format!("no route is bound on channel {}", h.channel),
                        );
                        self.error(h.channel, h.epoch, h.corr, &e).await;
                    }
                }
            }
            FrameType::Goodbye => {
                // The route is gone; its requests already in flight finish and their
                // answers are dropped by the daemon.
                let mut routes = self.routes.borrow_mut();
                if routes.get(&h.channel).is_some_and(|r| r.epoch == h.epoch) {
                    routes.remove(&h.channel);
                    self.subs.borrow_mut().retain(|(ch, _), _| *ch != h.channel);
                }
            }
            // Ends a held-open subscription; any other request is answered at once and has
            // nothing to cancel.
            FrameType::Cancel => {
                self.subs.borrow_mut().remove(&(h.channel, h.corr));
            }
            other => tracing::debug!("a {other:?} frame on route {}: ignored", h.channel),
        }
        None
    }

    async fn control(&self, f: FrameIn) -> Option<End> {
        let h = f.header;
        match h.ty {
            FrameType::Ping => {
                self.send(frames::encode(
                    FrameType::Pong,
                    h.flags,
                    0,
                    0,
                    h.corr,
                    Vec::new(),
                ))
                .await;
            }
            FrameType::Goodbye => return Some(End::Asked("the daemon said GOODBYE".into())),
            FrameType::Push => {
                if let Ok(ModuleControlCommand::Draining {
                    reason,
                    deadline_ms,
                }) = serde_json::from_slice(&f.body)
                {
                    return Some(End::Drain(
                        format!("the daemon is draining broca ({reason:?}, by {deadline_ms} ms)"),
                        deadline_ms,
                    ));
                }
            }
            FrameType::Request => self.control_request(h.corr, &f.body).await,
            // The daemon's answer to broca's own `catalog.update`.
            FrameType::Response if h.corr == READY_CORR => {}
            FrameType::Response | FrameType::Error if h.corr >= OWN_CORR => {
                if let Some(waiting) = self.own.borrow_mut().remove(&h.corr) {
                    let _ = waiting.send(f);
                }
            }
            FrameType::Error if h.corr == READY_CORR => tracing::warn!(
                "the daemon refused broca's readiness: {}",
                String::from_utf8_lossy(&f.body)
            ),
            _ => {}
        }
        None
    }

    /// A control request on channel 0: `health.check`, or a `route.bind`.
    async fn control_request(&self, corr: u64, body: &[u8]) {
        match serde_json::from_slice::<ModuleControlRequest>(body) {
            Ok(ModuleControlRequest::HealthCheck {}) => {
                let report = self.health().await;
                self.reply(FrameType::Response, 0, 0, corr, &report).await;
            }
            Ok(ModuleControlRequest::RouteBind {
                route_channel,
                epoch,
                identity,
                scope,
                principal,
                role_versions,
                ..
            }) => {
                let compaction = match compaction::is_compaction_route(
                    role_versions.as_ref(),
                    principal.as_ref().and_then(attested).is_some(),
                    &identity.session,
                ) {
                    Ok(c) => c,
                    Err((code, why)) => return self.refuse_bind(corr, code, why).await,
                };
                let caller = broca_wire::Caller {
                    principal: principal.as_ref().and_then(attested),
                    scope_owner: scope.as_ref().and_then(|s| attested(&s.owner)),
                    operator: false,
                };
                let bound = self.bind(
                    route_channel,
                    epoch,
                    &identity,
                    scope.as_ref(),
                    (caller, compaction),
                    body,
                );
                match bound {
                    Ok(()) => {
                        let ok = json!({"op": "route.bind"});
                        self.reply(FrameType::Response, 0, 0, corr, &ok).await
                    }
                    Err(e) => self.error(0, 0, corr, &e).await,
                }
            }
            Err(e) => {
                let e = RpcError::new(
                    Code::InvalidRequest,
                    format!("a control request broca does not take: {e}"),
                );
                self.error(0, 0, corr, &e).await;
            }
        }
    }

    /// Installs a route: the session is the bind's identity, its project root the scope's
    /// folder (else the legacy `project_root` of the bind, else `/`).
    fn bind(
        &self,
        channel: u16,
        epoch: u32,
        identity: &broca_subc::protocol::BindIdentity,
        scope: Option<&broca_subc::protocol::scope::ScopeStamp>,
        (caller, compaction): (broca_wire::Caller, bool),
        raw: &[u8],
    ) -> Result<(), RpcError> {
        let refuse = |code, why: String| RpcError::new(code, why);
        if channel == 0 {
            return Err(refuse(Code::InvalidRequest, "a route on channel 0".into()));
        }
        if let Some(r) = self.routes.borrow().get(&channel) {
            if epoch <= r.epoch {
                return Err(refuse(
                    Code::RouteRejected,
                    format!("channel {channel} is bound at epoch {} already", r.epoch),
                ));
            }
        }
        let legacy = serde_json::from_slice::<Value>(raw).ok().and_then(|v| {
            v.pointer("/identity/project_root")
                .or_else(|| v.get("project_root"))
                .and_then(Value::as_str)
                .map(str::to_string)
        });
        let root = scope
            .and_then(|s| s.workdir.clone())
            .or(legacy)
            .unwrap_or_else(|| NO_WORKDIR_ROOT.to_string());
        let triple = SessionTriple::new(&root, &identity.harness, &identity.session)
            .map_err(|e| refuse(Code::InvalidRequest, format!("the bind's session: {e}")))?;
        let session = SessionName {
            project_root: triple.project_root.clone(),
            harness: triple.harness.clone(),
            session: triple.session.clone(),
        };
        let route = Route {
            epoch,
            triple,
            session,
            caller,
            compaction,
        };
        self.routes.borrow_mut().insert(channel, route);
        self.egress.borrow_mut().bound(channel);
        Ok(())
    }

    /// One management request on a bound route: the route's session goes into the params.
    async fn request(&self, r: &Route, channel: u16, epoch: u32, corr: u64, body: Vec<u8>) {
        if r.compaction {
            return self.compaction_request(r, channel, epoch, corr, body).await;
        }
        let answer = match broca_wire::request::parse_on_route(&body, &r.session) {
            Ok(request) => self.host.call(request, &r.caller).await,
            Err(e) => Err(e),
        };
        match answer {
            Ok(result) => {
                let released = broca_crash_points::planned("release_pending")
                    && result == json!({"state": "pending"})
                    && body_method(&body) == Some(broca_wire::Method::SessionRelease.as_str());
                let body = json!({ "result": result });
                let bytes = serde_json::to_vec(&body).expect("JSON values serialize");
                if bytes.len() + broca_subc::protocol::HEADER_LEN > MAX_DELIVERED_FRAME_LEN {
                    let e = RpcError::new(Code::ReplyTooLarge,
                        format!(
                            "the answer is {} bytes, more than a frame carries ({MAX_DELIVERED_FRAME_LEN})",
                            bytes.len()
                        ),
                    );
                    self.error(channel, epoch, corr, &e).await;
                    return;
                }
                self.send(frames::encode(
                    FrameType::Response,
                    frames::data(),
                    channel,
                    epoch,
                    corr,
                    bytes,
                ))
                .await;
                if released {
                    // A crash test's `release_pending` cut: once the answer has had time to
                    // leave through the connection's egress.
                    glommio::spawn_local(async {
                        glommio::timer::sleep(std::time::Duration::from_millis(200)).await;
                        broca_crash_points::reached("release_pending");
                    })
                    .detach();
                }
            }
            Err(e) => self.error(channel, epoch, corr, &e).await,
        }
    }

    /// `session.subscribe` on a route: the session's control lane as STREAM_DATA frames,
    /// one per unit with its durable cursor, and its display lane marked SHEDDABLE (a delta
    /// that finds the connection's queue full is dropped and reported as a gap), until the
    /// subscription ends (the hub's `end`, a CANCEL, the route's GOODBYE, broca stopping),
    /// then STREAM_END. A subscriber that falls behind is ended by the hub, naming the cursor
    /// to resume from; the run it follows never waits for it.
    async fn subscribe(&self, t: SessionTriple, channel: u16, epoch: u32, corr: u64, body: &[u8]) {
        let (accepted, limits) = match lanes::route_subscription(body) {
            Ok((from, limits)) => (self.host.subscribe(t, from).await, limits),
            Err(e) => (Err(e), None),
        };
        let mut encoder = lanes::StreamEncoder::new(limits);
        let (mut items, alive) = match accepted {
            Ok(sub) => sub.into_parts(),
            Err(e) => return self.error(channel, epoch, corr, &e).await,
        };
        self.subs.borrow_mut().insert((channel, corr), alive);
        let mut dropped = 0u64;
        while let Some(item) = futures_lite::StreamExt::next(&mut items).await {
            if !self.subs.borrow().contains_key(&(channel, corr)) {
                break; // cancelled, or the route is gone
            }
            let sheddable = matches!(item, SubItem::Display(_));
            if sheddable && self.egress.borrow().would_shed(channel) {
                dropped += 1;
                continue;
            }
            if dropped > 0 && !sheddable {
                let gap = encoder.display_gap(dropped);
                self.stream_data(channel, epoch, corr, gap, false).await;
                dropped = 0;
            }
            let Some((body, sheddable)) = encoder.encode(&item) else {
                continue;
            };
            self.stream_data(channel, epoch, corr, body, sheddable)
                .await;
            if item.is_last() {
                break;
            }
        }
        self.subs.borrow_mut().remove(&(channel, corr));
        if self.closing.get() {
            return; // ended by the connection's GOODBYE, which said its STREAM_END
        }
        self.send(stream_end(channel, epoch, corr)).await;
    }

    async fn stream_data(
        &self,
        channel: u16,
        epoch: u32,
        corr: u64,
        body: String,
        sheddable: bool,
    ) {
        let (flags, kind) = if sheddable {
            (
                frames::data().with_admission_class(AdmissionClass::Sheddable),
                Kind::Delta,
            )
        } else {
            (frames::data(), Kind::Frame)
        };
        let frame = frames::encode(
            FrameType::StreamData,
            flags,
            channel,
            epoch,
            corr,
            body.into_bytes(),
        );
        self.queue(frame, kind);
    }

    /// Stops broca as a signal would. The connection's end after broca began to stop (its
    /// own GOODBYE answered by a close) is no loss.
    async fn stop(&self, end: End) {
        // broca's own requests get no answer now.
        self.own.borrow_mut().clear();
        let why = match end {
            End::Drain(why, by) => {
                self.host.stop_by(&why, by).await;
                return;
            }
            End::Asked(why) => why,
            End::Lost(_) if self.host.is_stopping() => return,
            End::Lost(why) => {
                self.lost.store(true, Ordering::Release);
                why
            }
        };
        self.host.stop(&why).await;
    }
}

/// A subscription's last frame: STREAM_END, flagged LAST.
/// The route (channel, epoch) of an encoded frame, read from its header.
fn header_route(frame: &[u8]) -> (u16, u32) {
    debug_assert!(
        frame.len() >= broca_subc::protocol::HEADER_LEN,
        "an encoded frame holds its header"
    );
    let channel = frame
        .get(7..9)
        .map_or(0, |b| u16::from_le_bytes([b[0], b[1]]));
    let epoch = frame
        .get(9..13)
        .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    (channel, epoch)
}

fn stream_end(channel: u16, epoch: u32, corr: u64) -> Result<Vec<u8>, broca_subc::LinkError> {
    frames::encode(
        FrameType::StreamEnd,
        frames::last(),
        channel,
        epoch,
        corr,
        Vec::new(),
    )
}

/// A principal the daemon attested (`reserved:<module>`): a direct or unverified caller is
/// nobody's owner.
fn attested(p: &broca_subc::protocol::Principal) -> Option<String> {
    match p {
        broca_subc::protocol::Principal::Reserved { module_id } => {
            Some(format!("reserved:{module_id}"))
        }
        _ => None,
    }
}

/// The method a request body names, when it names one.
fn body_method(body: &[u8]) -> Option<&str> {
    #[derive(serde::Deserialize)]
    struct Named<'a> {
        #[serde(borrow)]
        method: Option<&'a str>,
    }
    serde_json::from_slice::<Named>(body).ok()?.method
}
