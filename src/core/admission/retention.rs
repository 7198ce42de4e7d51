//! A send's session-level retention (llm-runner/v1 `retention`, docs/retention.md) and its
//! run's title: their bounds, and the session's lower-only policy.

use cortexkit_role_llm_runner::session_retention::RetentionPolicy;

use super::{Refusal, SendRequest, Session};

/// The session's retention after a send asking `asked` (llm-runner/v1 `retention`): the
/// first send's freezes it (absent: kept forever); a later send may shorten it, and leaves it
/// as it is when it names none; it never lengthens, and a session first sent without one
/// never gets one.
pub(crate) fn session_retention(
    session: &Session,
    asked: Option<u64>,
) -> Result<Option<u64>, Refusal> {
    let sent =
        !session.runs.is_empty() || !session.queued.is_empty() || !session.retracted.is_empty();
    if !sent {
        return Ok(asked);
    }
    match (session.retention, asked) {
        (current, None) => Ok(current),
        (None, Some(_)) => Err(Refusal::InvalidField {
            field: "retention",
            why: "this session's first send named no retention, so it is kept forever; a \
                  later send cannot give it one"
                .into(),
        }),
        (Some(current), Some(asked)) if asked > current => Err(Refusal::InvalidField {
            field: "retention",
            why: format!(
                "this session's retention is {current} s and only gets shorter; {asked} s \
                 would lengthen it"
            ),
        }),
        (Some(_), Some(asked)) => Ok(Some(asked)),
    }
}

/// A send's `retention_policy` (llm-runner/v1 `session_retention`) decoded and checked:
/// never beside `retention`; `backup: true` is refused `backup_unsupported`.
pub(super) fn policy(req: &SendRequest) -> Result<Option<RetentionPolicy>, Refusal> {
    use broca_wire::{decode_policy, PolicyRefusal};
    let Some(v) = &req.retention_policy else {
        return Ok(None);
    };
    if req.retention.is_some() {
        return Err(Refusal::InvalidField {
            field: "retention_policy",
            why: "send either `retention` (seconds) or `retention_policy`, not both".into(),
        });
    }
    match decode_policy(v) {
        Ok(p) => Ok(Some(p)),
        Err(PolicyRefusal::Backup) => {
            Err(Refusal::BackupUnsupported(broca_wire::BACKUP_REASON.into()))
        }
        Err(PolicyRefusal::Field(path)) => Err(Refusal::InvalidField {
            field: policy_field(&path),
            why: PolicyRefusal::Field(path).message(),
        }),
    }
}

/// A policy member's path as a refusal names it (an unknown member: the policy itself).
fn policy_field(path: &str) -> &'static str {
    match path {
        "retention_policy.keep" => "retention_policy.keep",
        "retention_policy.keep.days" => "retention_policy.keep.days",
        "retention_policy.archive_after_days" => "retention_policy.archive_after_days",
        "retention_policy.backup" => "retention_policy.backup",
        "retention_policy.request_dumps" => "retention_policy.request_dumps",
        _ => "retention_policy",
    }
}

/// A released session takes no more sends until it is deleted (`session_released`, with
/// the earliest deletion time).
pub(super) fn unreleased(session: &Session) -> Result<(), Refusal> {
    match session.release_deadline() {
        Some(delete_after_ms) => Err(Refusal::SessionReleased { delete_after_ms }),
        None => Ok(()),
    }
}

/// A send's `retention_policy` against the session's: a frozen (starter) policy may be
/// repeated or left out, never changed (`retention_conflict`, naming it); where `required`,
/// a session's first send must name one (`retention_required`).
pub(super) fn policy_fits(
    session: &Session,
    asked: Option<&RetentionPolicy>,
    required: bool,
) -> Result<(), Refusal> {
    match (&session.policy, asked) {
        (Some(frozen), Some(asked)) if frozen != asked => Err(Refusal::RetentionConflict {
            frozen: serde_json::to_value(frozen).expect("a policy serializes"),
        }),
        // A session its host started is not new: it has the runner's policy until an
        // adoption names one.
        (None, None) if required && session.is_new() => Err(Refusal::RetentionRequired),
        _ => Ok(()),
    }
}

/// The longest run title, in bytes.
pub const TITLE_BYTES_MAX: usize = 512;

/// A send's `title` within its bounds: at most [`TITLE_BYTES_MAX`] bytes, no control
/// characters.
pub(super) fn title(req: &SendRequest) -> Result<Option<String>, Refusal> {
    let Some(t) = &req.title else {
        return Ok(None);
    };
    if t.len() > TITLE_BYTES_MAX || t.chars().any(char::is_control) {
        return Err(Refusal::InvalidField {
            field: "title",
            why: format!("a title is at most {TITLE_BYTES_MAX} bytes, without control characters"),
        });
    }
    Ok(Some(t.clone()))
}

/// A send's `retention` within its bounds: positive, and at most the longest this runner
/// keeps a session.
pub(super) fn retention(req: &SendRequest) -> Result<Option<u64>, Refusal> {
    let max_seconds = broca_wire::role::RETENTION_MAX_SECONDS;
    match req.retention {
        Some(0) => Err(Refusal::InvalidField {
            field: "retention",
            why: "retention must be at least 1 second (absent: kept forever)".into(),
        }),
        Some(asked) if asked > max_seconds => {
            Err(Refusal::RetentionAboveMax { asked, max_seconds })
        }
        other => Ok(other),
    }
}
