//! A send's session-level retention (llm-runner/v1 `retention`, docs/retention.md) and its
//! run's title: their bounds, and the session's lower-only policy.

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
