//! How long a session is kept (llm-runner/v1 `retention` and `session_retention`; a child
//! of `replay`): when it expires or is deleted, from what its WAL says of its retention, its
//! frozen storage policy, its release and its runs.

use super::{RunState, Session};

/// When a session with a retention expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// It has no retention: kept forever.
    Never,
    /// A run of it is not over: it does not expire until that run ends.
    Held,
    /// At this time (ms since the Unix epoch): its last activity plus its retention
    /// (llm-runner/v1 `retention`): reads then answer `expired`.
    At(u64),
    /// At this time its storage policy or its release deletes it (llm-runner/v1
    /// `session_retention`): reads then answer `unknown_session`.
    Delete(u64),
}

impl Expiry {
    /// When it is due, if ever (`Held`: not while a run of it is not over).
    pub fn due_at(self) -> Option<u64> {
        match self {
            Expiry::At(t) | Expiry::Delete(t) => Some(t),
            Expiry::Never | Expiry::Held => None,
        }
    }
}

impl Session {
    /// The first policy a send named freezes (admission refuses any other after it).
    pub(crate) fn note_policy(
        &mut self,
        policy: Option<&cortexkit_role_llm_runner::session_retention::RetentionPolicy>,
    ) {
        if self.policy.is_none() {
            self.policy = policy.cloned();
        }
    }

    /// Whether nothing was sent or imported into the session yet, nor did its host start it
    /// (its first send is next).
    pub fn is_new(&self) -> bool {
        !self.hosting.hosted
            && self.runs.is_empty()
            && self.queued.is_empty()
            && self.retracted.is_empty()
            && self.imports.is_empty()
    }

    /// Whether a run of it is not over (active, paused, queued, or a steer not yet
    /// rendered): nothing deletes it meanwhile.
    pub fn is_held(&self) -> bool {
        self.open.is_some()
            || !self.queued.is_empty()
            || !self.pending_steers.is_empty()
            || self
                .runs
                .last()
                .is_some_and(|r| matches!(r.state, RunState::Active | RunState::Paused))
    }

    /// The earliest time a released session is deleted: the floor
    /// ([`broca_wire::role::MIN_HOLD_DAYS`]) from the later of its release and its last
    /// activity; `None` while it is not released.
    pub fn release_deadline(&self) -> Option<u64> {
        let r = self.released.as_ref()?;
        let from = r.at_unix_ms.max(self.activity_ms.unwrap_or(0));
        Some(from.saturating_add(floor_ms()))
    }

    /// When its storage policy deletes it, not counting a run that is not over: a release's
    /// deadline; `keep: {days}` its last activity plus the longer of the days and the floor;
    /// `keep: "none"` its last run's end plus the longer of the unreleased hold and the
    /// floor; `forever`, or no policy: never.
    fn policy_due(&self) -> Option<u64> {
        use broca_wire::role::{DAY_MS, UNRELEASED_HOLD_MS};
        use cortexkit_role_llm_runner::session_retention::Keep;
        if let Some(at) = self.release_deadline() {
            return Some(at);
        }
        let activity = self.activity_ms?;
        let hold = match self.policy.as_ref()?.keep {
            Keep::Days { days } => u64::from(days).saturating_mul(DAY_MS),
            Keep::None => UNRELEASED_HOLD_MS,
            _ => return None,
        };
        Some(activity.saturating_add(hold.max(floor_ms())))
    }

    /// When the session expires (llm-runner/v1 `retention`): never while it has no retention
    /// or a run that is not over (active, paused, queued or a steer not yet rendered); else
    /// its last activity plus its retention.
    ///
    /// Its storage policy or release (llm-runner/v1 `session_retention`) deletes it at
    /// [`Expiry::Delete`] when that comes first.
    pub fn expiry(&self) -> Expiry {
        let expires = self
            .retention
            .zip(self.activity_ms)
            .map(|(seconds, at)| at.saturating_add(seconds.saturating_mul(1000)));
        let deleted = self.policy_due();
        if expires.is_none() && deleted.is_none() {
            return Expiry::Never;
        }
        if self.is_held() {
            return Expiry::Held;
        }
        match (expires, deleted) {
            (Some(e), Some(d)) if e < d => Expiry::At(e),
            (_, Some(d)) => Expiry::Delete(d),
            (Some(e), None) => Expiry::At(e),
            (None, None) => Expiry::Never,
        }
    }
}

/// Whether `policy` ever acts on its own: it deletes the session (`keep` none or days) or
/// has the archive pack it. A `forever` policy without an archive day needs no listing and
/// no clock (a release still does).
pub fn policy_acts(policy: &cortexkit_role_llm_runner::session_retention::RetentionPolicy) -> bool {
    use cortexkit_role_llm_runner::session_retention::Keep;
    !matches!(policy.keep, Keep::Forever) || policy.archive_after_days > 0
}

/// The floor in milliseconds ([`broca_wire::role::MIN_HOLD_DAYS`]).
fn floor_ms() -> u64 {
    u64::from(broca_wire::role::MIN_HOLD_DAYS).saturating_mul(broca_wire::role::DAY_MS)
}
