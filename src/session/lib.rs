//! broca-session: one live session. [`SessionActor`] holds the session's WAL writer lease,
//! answers its [`SessionCommand`]s in order and drives its runs' state machine
//! (broca-core) with real I/O: the WAL, the model client, the tools. Its [`hub`] fans the
//! session's durable records out to subscribers (the control lane, replayed from the WAL
//! from any cursor) and its token deltas (the lossy display lane). A shard keeps its
//! sessions' actors in broca-shards' registry; the process's crash hooks are handed in
//! ([`Hooks`]).
//!
//! Where things are: the session actor (`actor.rs`: built with an `Opener`, holds the lease,
//! admits sends, appends and applies each record; `commands.rs` a person-only command's
//! records, before its forward and before its answer; `change.rs` a mid-session change's
//! records; `adopt.rs` a host's start's and an adoption's; `drive.rs` drives the machine: model
//! stream, tools and a compaction provider's ride report into one channel beside the shard
//! inbox's commands; `view.rs` a compaction provider's view recorded; `compactor.rs` the
//! session's Setup, notices and rides to its provider, and each request rendered through its
//! view, the numbered transcript kept between uses; `import.rs`, `queue.rs`, `command.rs` the
//! commands; `answer.rs` the one answer to each, idle or during a run (`SessionActor::answer`,
//! what the keeper does next an `After`), `unopened.rs` the answers of a session no actor holds
//! (`answer_unopened`)), the crash hooks it reports to (`hooks.rs`: a trait handed to it), what
//! watches it (`watch.rs`: `Watch`, told of each append, the display lane, the storage's
//! health; never reaching back in), uploads answered and the bytes of a model call's media
//! loaded (`uploads.rs`) from the session's content store (`content.rs`: `media/<address>/`,
//! files named by digest), the hub (`hub.rs`: subscribers' queues, seek points) and one
//! subscription's replay and live loop (`subscription.rs`)

mod actor;
mod adopt;
mod answer;
#[cfg(test)]
mod answer_tests;
mod change;
mod command;
mod commands;
mod compactor;
pub mod content;
mod drive;
mod error;
pub mod hooks;
pub mod hub;
mod import;
mod queue;
mod subscription;
mod unopened;
mod uploads;
mod view;
pub mod watch;
pub use uploads::process_boot;

pub use actor::{ActorError, Opener, SessionActor};
pub use answer::After;
pub use command::{
    Cancelled, CommandStep, ImportInput, ImportReply, Joins, RefreshStep, Release, Retracted,
    SendReply, SessionCommand, StatusAnswer,
};
pub use hooks::{Abort, CrashPlan, Hooks, NoHooks};
pub use import::{
    check_read_only, confine, import_error, log_files, read_source, ImportTarget, IMPORT_BYTES_MAX,
};
pub use subscription::{subscribe, REPLAY_PAGE_BYTES, SUB_CHANNEL_ITEMS};
pub use unopened::{answer_unopened, Unopened};
pub use watch::{Appended, NoWatch, Watch};

use broca_protocol::model::{Failure, ModelClient, ModelStream};

/// The clock of the actors and the daemon: milliseconds since the Unix epoch (the run loop
/// is handed this time; it reads none itself). Records' times, retention's expiry and its
/// deletion deadlines all read it; a debug build's tests may move it forward
/// ([`advance_clock`]), a release build has no way to.
pub fn now_unix_ms() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    now.saturating_add(clock::offset())
}

/// How far tests moved the clock: always nothing in a release build.
mod clock {
    #[cfg(debug_assertions)]
    pub(super) static OFFSET_MS: std::sync::atomic::AtomicU64 =
        std::sync::atomic::AtomicU64::new(0);

    #[cfg(debug_assertions)]
    pub(super) fn offset() -> u64 {
        OFFSET_MS.load(std::sync::atomic::Ordering::Relaxed)
    }

    #[cfg(not(debug_assertions))]
    pub(super) fn offset() -> u64 {
        0
    }
}

/// Moves the process's clock forward by `ms` (the retention clock of the llm-runner/v1
/// suite's `advance_retention_clock`). Debug builds only: a release build has no such call.
#[cfg(debug_assertions)]
pub fn advance_clock(ms: u64) {
    clock::OFFSET_MS.fetch_add(ms, std::sync::atomic::Ordering::Relaxed);
}

/// The model of a process that calls none (`broca import`): a call fails, permanently.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoModel;

/// [`NoModel`]'s stream (never opened).
pub struct NoStream;

impl ModelStream for NoStream {
    async fn next(&mut self) -> Option<Result<broca_protocol::StreamEvent, Failure>> {
        None
    }
}

impl ModelClient for NoModel {
    type Stream = NoStream;

    fn check(&self) -> &dyn broca_protocol::model::ProviderCheck {
        &broca_protocol::model::AnyProvider
    }

    async fn open(&self, _request: &broca_protocol::Request) -> Result<NoStream, Failure> {
        Err(Failure {
            error: broca_protocol::ClassifiedError {
                class: broca_protocol::ErrorClass::Permanent,
                message: "this process calls no model".into(),
                retry_after_ms: None,
            },
            usage: None,
        })
    }
}
