//! The session's side of its compaction provider's calls (cortexkit-role-compaction A4, A5,
//! A9; ops W5.1 to W5.3), for a session whose plan names one:
//!
//! - **Setup** before the first notice of this process (so after a restart too), and again
//!   when a notice is answered `setup_required`. Setup holds nothing: a session whose provider
//!   refuses it, or cannot be reached, runs on the view it has (none at first).
//! - **Notices** after each durable change to the transcript, in compact form: the entries new
//!   since the last one and those changed (a call's result arrived). One at a time, sent off
//!   the run's path (N2, N3); changes made while one is out go in the next, sent as soon as
//!   it is answered.
//! - **Rides** before a model request that would not fit the usable window (`over_limit`),
//!   whose prompt cache broca cannot know to be warm (`cache_expired`: the first request of
//!   this process, or one after the cache's five minutes), or that goes out under another
//!   model, account or surface than the one before it in this process (`model_change`,
//!   `account_change`, `surface_change`). Changes not yet noticed are sent first (N3). The
//!   request waits for the answer up to the ride's deadline; a view it brings is checked,
//!   recorded durably and applied to that very request. A request still over the window ends
//!   the turn at `context_ceiling` (RD4): broca never sends over its limit.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use broca_ck::{neutral, provided};
use broca_protocol::model::ModelClient;
use broca_tools::ToolRunner;
use broca_wal::runrec::FrozenConfig;
use cortexkit_role_compaction::notice::{Conditions, Event, NoticeAnswer, NoticeRequest};
use cortexkit_role_compaction::read::Entry;
use cortexkit_role_compaction::ride::{RideAnswer, RideCause, RideRequest};
use cortexkit_role_compaction::setup::{ModelRef, SetupAnswer, SetupRequest};
use cortexkit_role_compaction::view::View;
use cortexkit_role_compaction::{ops, wire};

use crate::SessionActor;

/// How long Setup and a notice wait for their answer.
const CALL_DEADLINE: Duration = Duration::from_secs(10);
/// How long a request waits for a ride's answer: a short one for a cold cache alone, a longer
/// one when the request does not fit without a view.
const RIDE_DEADLINE_COLD: Duration = Duration::from_secs(3);
const RIDE_DEADLINE_OVER: Duration = Duration::from_secs(30);
/// The prompt cache's lifetime broca asks for (the providers' default, five minutes).
const CACHE_LIFETIME_MS: u64 = 5 * 60 * 1000;
/// The window of a model the catalog gives none for.
const WINDOW_UNKNOWN: u64 = 128_000;
/// The reply's room when the send names no output cap (the Anthropic renderer's default).
const OUTPUT_DEFAULT: u64 = 4096;
/// How long a ride waits for the notices of changes not yet told (N3) before it goes.
const FLUSH_DEADLINE: Duration = Duration::from_secs(1);
/// The ride causes broca detects (RD5). Not `tier_change` (broca asks for no service tier) nor
/// `chain_reset` (its requests are not chained).
fn detects() -> Vec<RideCause> {
    vec![
        RideCause::CacheExpired,
        RideCause::ModelChange,
        RideCause::AccountChange,
        RideCause::SurfaceChange,
        RideCause::OverLimit,
    ]
}

/// What a request goes out under, as the ride causes compare it: the session's model (the
/// run's frozen one, so a retry's fallback is no change, RD6), its account (the credential's
/// id, never the secret) and its surface (a hash of the system text and the tool definitions
/// it carries).
#[derive(Clone, PartialEq)]
struct Sent {
    model: (String, String),
    account: String,
    surface: u64,
}

impl Sent {
    fn of(config: &FrozenConfig, request: &broca_protocol::Request) -> Sent {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        serde_json::to_vec(&(&request.system, &*request.tools))
            .unwrap_or_default()
            .hash(&mut h);
        Sent {
            model: (config.provider.clone(), config.model.clone()),
            account: config.credential_id.clone(),
            surface: h.finish(),
        }
    }

    /// The causes going from `self` to `next` rides with.
    fn changes(&self, next: &Sent) -> impl Iterator<Item = RideCause> {
        [
            (self.model != next.model, RideCause::ModelChange),
            (self.account != next.account, RideCause::AccountChange),
            (self.surface != next.surface, RideCause::SurfaceChange),
        ]
        .into_iter()
        .filter_map(|(changed, cause)| changed.then_some(cause))
    }
}

/// A ride on its way: what its answer is checked against once it comes.
pub(crate) struct Riding {
    provider: String,
    shared: Rc<RefCell<Shared>>,
    usable: u64,
}

/// A ride's answer as it came: the provider's answer object, or why there is none.
pub(crate) struct RideOutcome(Result<serde_json::Value, broca_tools::modules::CompactionMiss>);

/// A session's link to its provider.
pub(crate) struct Compactor {
    provider: String,
    preset: String,
    shared: Rc<RefCell<Shared>>,
}

/// What the link's calls in flight share with the actor.
#[derive(Default)]
struct Shared {
    /// Setup answered `ready` (this process, since the last `setup_required`).
    ready: bool,
    /// The last notice's `seq` since the latest Setup.
    seq: u64,
    /// The digest of each entry (by ordinal) as the provider was last told of it.
    noticed: Vec<String>,
    /// A Setup or notice is out.
    busy: bool,
    /// What the next notice reports besides its entries.
    events: Vec<Event>,
    /// When this process last sent the session's model a request (Unix ms).
    last_request_ms: Option<u64>,
    /// What that request went out under.
    last_sent: Option<Sent>,
    /// The numbered transcript, brought up to date at each use.
    numbered: neutral::Numbered,
    /// The notice made while another was out, sent once that one is answered.
    pending: Option<Payload>,
}

/// A notice ready to go, with the Setup to make first if the link is not ready, and the
/// entries' digests the provider knows once it is received.
struct Payload {
    setup: SetupRequest,
    notice: NoticeRequest,
    digests: Vec<String>,
}

/// What changed since the provider was last told: each entry's digest now, the entries
/// whose digest differs (compacted), whether they fit a notice, the newest entry's cursor,
/// and the events waiting.
struct Changes {
    digests: Vec<String>,
    changed: Vec<Entry>,
    fits: bool,
    newest: Option<cortexkit_role_compaction::read::Cursor>,
    events: Vec<cortexkit_role_compaction::notice::Event>,
}

impl Changes {
    fn since(s: &mut Shared, entries: &broca_core::entries::Entries) -> Changes {
        let numbered = s.numbered.refresh(entries);
        let digests: Vec<String> = numbered.iter().map(|e| e.digest.clone()).collect();
        let changed: Vec<Entry> = numbered
            .iter()
            .enumerate()
            .filter(|(i, e)| s.noticed.get(*i) != Some(&e.digest))
            .map(|(_, e)| {
                let mut c = e.clone();
                c.parts = e.parts.iter().map(|p| p.compact()).collect();
                c
            })
            .collect();
        let fits = serde_json::to_vec(&changed)
            .is_ok_and(|b| b.len() <= cortexkit_role_compaction::notice::ENTRIES_BUDGET_BYTES);
        let newest = numbered.last().map(neutral::cursor);
        assert!(
            changed.len() <= digests.len(),
            "the changed entries are of the numbered"
        );
        Changes {
            digests,
            changed,
            fits,
            newest,
            events: std::mem::take(&mut s.events),
        }
    }

    /// The Setup and the notice that tell the provider of these changes (the entries only
    /// when they fit), under the session's latest run's conditions.
    fn payload(
        self,
        preset: String,
        config: &FrozenConfig,
        applied: Option<cortexkit_role_compaction::view::AppliedView>,
    ) -> Payload {
        let cond = conditions(config);
        let mut setup = SetupRequest::new(
            preset,
            cond.model.clone(),
            cond.context_window,
            cond.output_reserve,
            cond.rules.clone(),
            detects(),
            crate::now_unix_ms(),
        );
        if let Some(a) = &applied {
            setup = setup.with_applied_view(a.clone());
        }
        if let Some(n) = &self.newest {
            setup = setup.with_newest(n.clone());
        }
        let mut notice = NoticeRequest::new(0, cond).with_events(self.events);
        if let Some(a) = applied {
            notice = notice.with_applied_view(a);
        }
        if let Some(n) = self.newest {
            notice = notice.with_newest(n);
        }
        if self.fits {
            notice = notice.with_entries(self.changed);
        }
        Payload {
            setup,
            notice,
            digests: self.digests,
        }
    }
}

/// What a request is sent under: the session's model, its window and its reply's room.
fn conditions(config: &FrozenConfig) -> Conditions {
    let window = config
        .catalog
        .as_ref()
        .and_then(|c| c.context_window)
        .unwrap_or(WINDOW_UNKNOWN);
    let reserve = config
        .generation
        .max_output_tokens
        .unwrap_or(OUTPUT_DEFAULT);
    Conditions::new(
        ModelRef::new(config.provider.clone(), config.model.clone()),
        window,
        reserve,
        cortexkit_compaction_view::rules::defaults(&config.model),
    )
}

/// A request's size in tokens, estimated as four bytes of its JSON to a token.
fn estimate(request: &broca_protocol::Request) -> u64 {
    serde_json::to_vec(&(&request.system, &request.messages, &*request.tools))
        .map_or(u64::MAX, |b| b.len() as u64 / 4)
}

impl<P: ModelClient, T: ToolRunner> SessionActor<P, T> {
    /// The session's link to its compaction provider, when its plan names one (and the actor
    /// keeps entries, as it does where the runner hosts providers).
    fn compactor(&mut self) -> Option<&Compactor> {
        let plan = self.state.plan.as_ref()?;
        self.state.entries.as_ref()?;
        if self
            .compactor
            .as_ref()
            .is_none_or(|(id, _)| *id != plan.identity)
        {
            let link =
                broca_fetch_plan::plan::plan_provider(plan).map(|(provider, preset)| Compactor {
                    provider,
                    preset,
                    shared: Rc::default(),
                });
            self.compactor = Some((plan.identity.clone(), link));
        }
        self.compactor.as_ref()?.1.as_ref()
    }

    /// After a record is applied: tells the provider what the transcript gained or changed,
    /// unless a call to it is out (the next notice then carries it) or nothing did.
    pub(crate) fn notice_due(&mut self) {
        let Some(link) = self.compactor() else {
            return;
        };
        let (provider, preset, shared) = (
            link.provider.clone(),
            link.preset.clone(),
            link.shared.clone(),
        );
        let Some(entries) = &self.state.entries else {
            return;
        };
        {
            let s = shared.borrow();
            if s.noticed.len() == entries.list.len() && s.events.is_empty() {
                return;
            }
        }
        let Some(config) = self.state.runs.last().map(|r| r.config.clone()) else {
            return;
        };
        let changes = Changes::since(&mut shared.borrow_mut(), entries);
        let applied = self.state.view.as_ref().map(|v| v.applied());
        let payload = changes.payload(preset, &config, applied);
        let ask = Ask {
            tools: self.tools.clone(),
            triple: self.triple.clone(),
            scope_epoch: self.writer.header().created_unix_ms,
            provider,
        };
        {
            let mut s = shared.borrow_mut();
            if s.busy {
                // One notice at a time (N3): this one goes once the one out is answered, in
                // place of any waiting, whose events it takes over.
                let mut payload = payload;
                if let Some(waiting) = s.pending.take() {
                    let mut events = waiting.notice.events;
                    events.append(&mut payload.notice.events);
                    payload.notice.events = events;
                }
                s.pending = Some(payload);
                return;
            }
            s.busy = true;
        }
        glommio::spawn_local(async move {
            let mut next = Some(payload);
            while let Some(p) = next {
                ask.notice(&shared, p.setup, p.notice, p.digests).await;
                next = shared.borrow_mut().pending.take();
            }
            shared.borrow_mut().busy = false;
        })
        .detach();
    }

    /// Renders the model request of step `step` through the session's compaction view
    /// (cortexkit-role-compaction W6.3) when its plan names a provider: every numbered part
    /// behind its number, the view's edits applied. A session without a provider, one with the
    /// built-in compaction, or an actor that keeps no entries sends its conversation as it is.
    pub(crate) fn through_view(
        &mut self,
        request: &mut broca_protocol::Request,
        step: u32,
        held: &mut crate::view::StepView,
    ) {
        let built_in = self.state.compacted.is_some()
            || self
                .state
                .runs
                .last()
                .is_some_and(|r| r.config.compaction.is_some());
        if built_in {
            return;
        }
        let Some(link) = self.compactor() else {
            return;
        };
        let shared = link.shared.clone();
        let Some(entries) = &self.state.entries else {
            return;
        };
        let view = held.take_for(step, &self.state.view);
        let mut s = shared.borrow_mut();
        let numbered = s.numbered.refresh(entries);
        match provided::request_messages(
            numbered,
            &entries.list,
            &self.state.transcript,
            view.as_deref(),
        ) {
            Some(messages) => request.messages = messages,
            None => tracing::warn!(
                session = %self.triple.address(),
                "the compaction view fits the transcript no more; the request goes out whole"
            ),
        }
    }

    /// A view holding a cut is durable: broca's own log is the host, and the view's record
    /// its compaction marker (M1), which the next notice reports (`marker_written`). The
    /// numbers stay as they were (T2): broca counts from the session's first entry.
    pub(crate) fn marker_written(&mut self, view: &View) {
        use cortexkit_role_compaction::view::EditOp;
        if !view
            .edits
            .iter()
            .any(|e| matches!(e.op, EditOp::Cut { .. }))
        {
            return;
        }
        let Some(link) = self.compactor() else {
            return;
        };
        let version = view.version;
        link.shared
            .borrow_mut()
            .events
            .push(Event::MarkerWritten { version });
        self.notice_due();
    }

    /// Before model request `request` goes out: the ride its causes call for, if any, as the
    /// call to make (its answer comes to the drive loop, which answers the session's commands
    /// meanwhile) and what the answer is checked against ([`Self::ride_answered`]). None: the
    /// request goes out at once (it fits, and nothing calls for a ride).
    pub(crate) fn ride_due(
        &mut self,
        request: &broca_protocol::Request,
    ) -> Option<(
        Riding,
        impl std::future::Future<Output = RideOutcome> + 'static,
    )> {
        let link = self.compactor()?;
        let (provider, shared) = (link.provider.clone(), link.shared.clone());
        let config = self.state.runs.last().map(|r| r.config.clone())?;
        let now = crate::now_unix_ms();
        let cond = conditions(&config);
        let usable = cond.context_window.saturating_sub(cond.output_reserve);
        let tokens = estimate(request);
        let cold = shared
            .borrow()
            .last_request_ms
            .is_none_or(|t| now.saturating_sub(t) > CACHE_LIFETIME_MS);
        let sent = Sent::of(&config, request);
        let mut causes = Vec::new();
        if cold {
            causes.push(RideCause::CacheExpired);
        }
        if let Some(last) = &shared.borrow().last_sent {
            causes.extend(last.changes(&sent));
        }
        let over = tokens > usable;
        if over {
            causes.push(RideCause::OverLimit);
        }
        {
            let mut s = shared.borrow_mut();
            s.last_request_ms = Some(now);
            s.last_sent = Some(sent);
        }
        if causes.is_empty() {
            return None;
        }
        // What changed and was not yet told goes first (N3); the ride waits for it below.
        self.notice_due();
        let deadline = if over {
            RIDE_DEADLINE_OVER
        } else {
            RIDE_DEADLINE_COLD
        };
        let mut ride = RideRequest::new(causes, deadline.as_millis() as u64, cond);
        if let Some(v) = &self.state.view {
            ride = ride.with_applied_view(v.applied());
        }
        if over {
            ride = ride.with_request_tokens(tokens);
        }
        let ask = Ask {
            tools: self.tools.clone(),
            triple: self.triple.clone(),
            scope_epoch: self.writer.header().created_unix_ms,
            provider: provider.clone(),
        };
        let body = wire::encode(ops::COMPACTION_RIDE, &ride);
        let told = shared.clone();
        let call = async move {
            let until = std::time::Instant::now() + FLUSH_DEADLINE;
            while told.borrow().busy && std::time::Instant::now() < until {
                glommio::timer::sleep(Duration::from_millis(2)).await;
            }
            RideOutcome(ask.op(body, deadline).await)
        };
        let riding = Riding {
            provider,
            shared,
            usable,
        };
        Some((riding, call))
    }

    /// A ride's answer, for model request `request` of step `step`: a view it brings checked,
    /// recorded and applied to that very request; then the ceiling. `Err` with why the
    /// request does not fit the usable window even so (RD4).
    pub(crate) async fn ride_answered(
        &mut self,
        riding: Riding,
        answer: RideOutcome,
        request: &mut broca_protocol::Request,
        step: u32,
        held: &mut crate::view::StepView,
    ) -> Result<(), RideFailed> {
        let Riding {
            provider,
            shared,
            usable,
        } = riding;
        match answer.0 {
            Ok(answer) => match serde_json::from_value::<RideAnswer>(answer) {
                Ok(RideAnswer::View { view }) => {
                    self.take_ride_view(&provider, view, &shared).await?;
                    // This very request goes out through it.
                    *held = Default::default();
                    self.through_view(request, step, held);
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(%provider, "a ride's answer that does not decode: {e}"),
            },
            // `unknown_session`: the provider restarted; Setup comes before the next notice.
            Err(broca_tools::modules::CompactionMiss::Refused { code, .. })
                if code == wire::codes::UNKNOWN_SESSION =>
            {
                shared.borrow_mut().ready = false;
            }
            Err(why) => {
                tracing::info!(%provider, "a ride went unanswered ({why}); the request goes out with the view it has")
            }
        }
        let tokens = estimate(request);
        if tokens > usable {
            return Err(RideFailed::TooBig {
                tokens,
                usable,
                provider,
            });
        }
        Ok(())
    }

    /// A ride's view: checked as a handed-over one is; recorded durably when it passes, else
    /// reported in the next notice (`view_refused`).
    async fn take_ride_view(
        &mut self,
        provider: &str,
        view: View,
        shared: &Rc<RefCell<Shared>>,
    ) -> Result<(), RideFailed> {
        let Some(entries) = &self.state.entries else {
            return Ok(());
        };
        let rules = provided::session_rules(&self.state);
        let checked = {
            let mut s = shared.borrow_mut();
            let numbered = s.numbered.refresh(entries);
            provided::check(numbered, self.state.view.as_deref(), &view, &rules)
        };
        match checked {
            Ok(_) => {
                let answer = self.apply_view(provider.to_string(), Arc::new(view)).await;
                match answer {
                    Ok(Ok(())) => {}
                    Ok(Err(refusal)) => {
                        tracing::info!(%provider, "a ride's view refused: {refusal:?}")
                    }
                    Err(e) => return Err(RideFailed::Record(e)),
                }
            }
            Err(refusal) => {
                let version = view.version;
                shared
                    .borrow_mut()
                    .events
                    .push(Event::ViewRefused { version, refusal });
            }
        }
        Ok(())
    }
}

/// Why a request does not go out after its ride.
#[derive(Debug)]
pub(crate) enum RideFailed {
    /// The ride's view could not be recorded.
    Record(crate::ActorError),
    /// The request is over the usable window and the provider gave no view that fits.
    TooBig {
        tokens: u64,
        usable: u64,
        provider: String,
    },
}

impl std::fmt::Display for RideFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RideFailed::Record(e) => write!(f, "recording the ride's view failed: {e}"),
            RideFailed::TooBig {
                tokens,
                usable,
                provider,
            } => write!(
                f,
                "the request would carry about {tokens} tokens, over the {usable} the model's \
                 window leaves beside its reply, and the compaction provider `{provider}` gave \
                 no view that fits"
            ),
        }
    }
}

/// What a call to the provider needs, moved into the task that makes it.
struct Ask<T> {
    tools: Rc<T>,
    triple: Rc<broca_wal::SessionTriple>,
    scope_epoch: u64,
    provider: String,
}

impl<T: ToolRunner> Ask<T> {
    async fn op(
        &self,
        body: Vec<u8>,
        deadline: Duration,
    ) -> Result<serde_json::Value, broca_tools::modules::CompactionMiss> {
        self.tools
            .compaction_op(
                self.triple.clone(),
                self.scope_epoch,
                self.provider.clone(),
                body,
                deadline,
            )
            .await
    }

    /// Setup when the link is not ready, then the notice; what the provider was told is
    /// remembered only once it answered `received`.
    async fn notice(
        &self,
        shared: &Rc<RefCell<Shared>>,
        setup: SetupRequest,
        mut notice: NoticeRequest,
        digests: Vec<String>,
    ) {
        let provider = &self.provider;
        if !shared.borrow().ready {
            let body = wire::encode(ops::COMPACTION_SETUP, &setup);
            match self.op(body, CALL_DEADLINE).await {
                Ok(answer) if serde_json::from_value::<SetupAnswer>(answer.clone()).is_ok() => {
                    let mut s = shared.borrow_mut();
                    s.ready = true;
                    s.seq = 0;
                }
                Ok(answer) => {
                    tracing::warn!(%provider, "compaction.setup answered {answer}; no views until it is ready");
                    return;
                }
                Err(why) => {
                    tracing::warn!(%provider, "compaction.setup: {why}; the session runs on the view it has");
                    return;
                }
            }
        }
        let seq = {
            let mut s = shared.borrow_mut();
            s.seq += 1;
            s.seq
        };
        notice.seq = seq;
        let body = wire::encode(ops::COMPACTION_NOTICE, &notice);
        match self.op(body, CALL_DEADLINE).await {
            Ok(answer) => match serde_json::from_value::<NoticeAnswer>(answer) {
                Ok(NoticeAnswer::Received) => shared.borrow_mut().noticed = digests,
                // The provider restarted, or answered something broca does not know (W1.5):
                // Setup again before the next notice, which carries these entries again.
                _ => shared.borrow_mut().ready = false,
            },
            Err(why) => {
                tracing::info!(%provider, "compaction.notice {seq}: {why}");
                // Its events go in the next one.
                shared.borrow_mut().events.extend(notice.events);
            }
        }
    }
}
