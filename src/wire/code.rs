//! Every error code the management surface answers, each spelled once, with its HTTP status
//! and its class: the one table the replies of `/v1/rpc`, the daemon's ERROR frames, the
//! subscription handshake and `broca import` take their codes from. A code the llm-runner/v1
//! role names is the role crate's constant.

use broca_protocol::ErrorClass;
use cortexkit_role_llm_runner::errors as role;

macro_rules! codes {
    ($($(#[$doc:meta])* $variant:ident = $text:expr, $status:literal, $class:ident;)*) => {
        /// A refusal's code: what went wrong, in one word a client can match.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Code {
            $($(#[$doc])* $variant,)*
        }

        impl Code {
            /// Every code, in the table's order.
            pub const ALL: &'static [Code] = &[$(Code::$variant,)*];

            /// The code as the wire spells it.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Code::$variant => $text,)*
                }
            }

            /// The HTTP status of an answer with this code.
            pub fn status(self) -> u16 {
                match self {
                    $(Code::$variant => $status,)*
                }
            }

            /// The error class of this code (whether retrying can help).
            pub fn class(self) -> ErrorClass {
                match self {
                    $(Code::$variant => ErrorClass::$class,)*
                }
            }
        }
    };
}

codes! {
    // Requests that do not parse or name what is not there.
    /// The body is not a request envelope `{"method", "params"}`.
    InvalidRequest = "invalid_request", 400, Permanent;
    /// A parameter is missing, malformed, out of range or unknown (`detail.field` names it).
    InvalidParams = role::INVALID_PARAMS, 400, Permanent;
    /// No method of that name.
    UnknownMethod = "unknown_method", 404, Permanent;
    /// The send asks for a delivery mode this runner does not serve.
    DeliveryUnsupported = role::DELIVERY_UNSUPPORTED, 400, Permanent;
    /// No run of that id in the session.
    UnknownRun = role::UNKNOWN_RUN, 404, Permanent;
    /// No send of that send_id in the session.
    UnknownSend = role::UNKNOWN_SEND, 404, Permanent;
    /// No message of that mid in the session.
    UnknownMid = role::UNKNOWN_MID, 404, Permanent;
    /// A read cursor of another history version.
    HistoryChanged = role::HISTORY_CHANGED, 409, Permanent;
    /// A `session.history` cursor of another session, or of history since rewritten.
    CursorExpired = role::CURSOR_EXPIRED, 409, Permanent;
    /// The session's retention ran out: its transcript is deleted (`detail.expired_at_ms`).
    Expired = role::EXPIRED, 410, Permanent;
    /// A `session.history` ordinal the session never assigned.
    UnknownOrdinal = role::UNKNOWN_ORDINAL, 404, Permanent;
    // Admission's refusals (nothing was written).
    /// The send_id was used before with other inputs.
    SendIdReuse = role::SEND_ID_REUSE, 409, Permanent;
    /// A run of the session is active (or the session is busy with another command).
    SessionBusy = "session_busy", 409, Transient;
    /// Two configured tools share a name the send offers.
    ToolNameCollision = role::TOOL_NAME_COLLISION, 409, Permanent;
    /// A later send's `plan` differs from the one the session froze (`detail.frozen`,
    /// `detail.sent`; llm-runner/v1 `plans`).
    PlanDrift = role::PLAN_DRIFT, 409, Permanent;
    /// A required plan item did not arrive within admission's deadline (`detail.provider`):
    /// nothing was written; retry.
    FetchUnavailable = role::FETCH_UNAVAILABLE, 503, Transient;
    /// A plan's preset-less `system_text` item names a provider the daemon's catalog does
    /// not list as serving a default text (`detail.provider`; llm-runner/v1
    /// `system_text_default`).
    SystemTextPresetRequired = role::SYSTEM_TEXT_PRESET_REQUIRED, 400, Permanent;
    /// The plan's fetched items disagree with its composition or with each other
    /// (`detail.differences`): the host plans again.
    PlanStale = role::PLAN_STALE, 409, Permanent;
    /// Two plan providers declare the same person-only command (`detail.name`,
    /// `detail.providers`; llm-runner/v1 `user_commands`).
    UserCommandCollision = role::USER_COMMAND_COLLISION, 409, Permanent;
    /// `session.user_command` names a command the session did not freeze
    /// (`detail.command`).
    UnknownUserCommand = role::UNKNOWN_USER_COMMAND, 404, Permanent;
    /// `session.user_command_status` names a call key the session does not hold.
    UnknownInvocation = role::UNKNOWN_INVOCATION, 404, Permanent;
    /// The session's plan says `interactive: false`: no person drives it.
    NoPerson = role::NO_PERSON, 409, Permanent;
    /// A `session.refresh` at or below the accepted generation that is not an identical
    /// repeat (`detail.accepted`; llm-runner/v1 `session_change`).
    GenerationStale = role::GENERATION_STALE, 409, Permanent;
    /// A change's rung the session does not support for a surface it touches
    /// (`detail.surface`, `detail.rung`).
    RungUnsupported = role::RUNG_UNSUPPORTED, 409, Permanent;
    /// `session.refresh_policy` names a generation a later refresh superseded
    /// (`detail.generation`, `detail.pending`).
    PendingSuperseded = role::PENDING_SUPERSEDED, 409, Permanent;
    /// `session.refresh_policy` names a generation already applied (`detail.applied_by`).
    AlreadyApplied = role::ALREADY_APPLIED, 409, Permanent;
    /// This runner does not declare the `user_commands` group (its config's `plans` is off).
    UserCommandsUnsupported = role::USER_COMMANDS_UNSUPPORTED, 400, Permanent;
    /// The session has an owner and the caller is not it.
    ScopeOwnerMismatch = role::SCOPE_OWNER_MISMATCH, 403, Permanent;
    /// The send_id's queued send was withdrawn before it started.
    SendRetracted = role::SEND_RETRACTED, 409, Permanent;
    /// A template send's `part_tag` slot names a part the request does not show
    /// (`detail.slot`; llm-runner/v1 `delivery_order`).
    TemplatePartGone = role::TEMPLATE_PART_GONE, 409, Permanent;
    /// A send's `pre_user` hook (a plan's step transform) gave no usable answer under
    /// `on_unavailable: refuse` (`detail.provider`): nothing was written.
    PreUserUnavailable = role::PRE_USER_UNAVAILABLE, 424, Permanent;
    /// The session's first send named no `retention_policy` where this runner requires one
    /// (llm-runner/v1 `session_retention`).
    RetentionRequired = role::RETENTION_REQUIRED, 400, Permanent;
    /// The send's `retention_policy` differs from the one the session froze (`detail.frozen`).
    RetentionConflict = role::RETENTION_CONFLICT, 409, Permanent;
    /// The session's owner released it: it takes no more sends until it is deleted
    /// (`detail.delete_after_ms`); then a send starts it afresh.
    SessionReleased = role::SESSION_RELEASED, 409, Transient;
    /// A `retention_policy` asks for a backup this runner cannot take (`detail.reason`).
    BackupUnsupported = role::BACKUP_UNSUPPORTED, 400, Permanent;
    /// The send's credential is missing or unusable (not 401: that answers the handle).
    AuthRequired = "auth_required", 400, AuthRequired;
    /// The credential's source is out for now.
    CredentialUnavailable = "credential_unavailable", 503, Transient;
    /// This build speaks no wire family of the provider.
    UnsupportedProvider = "unsupported_provider", 400, Permanent;
    /// A budget needs a measure the model's catalog entry cannot price.
    BudgetUnpriced = "budget_unpriced", 400, Permanent;
    // The daemon's own limits and state.
    /// broca is stopping: admission is closed.
    ShuttingDown = "shutting_down", 503, Transient;
    /// The session's shard has too many commands waiting.
    ShardBusy = "shard_busy", 503, Transient;
    /// Every session the shard keeps open is running.
    SessionLimit = "session_limit", 503, Transient;
    /// The session has too many commands waiting for its actor.
    SessionQueueFull = "session_queue_full", 503, Transient;
    /// The session could not be opened or read, or its shard did not answer.
    SessionUnavailable = "session_unavailable", 503, Transient;
    /// The store (the WALs' projections) could not be opened or read: what is answered
    /// from it alone (`sessions.list`) is not; everything else is.
    StoreUnavailable = "store_unavailable", 503, Transient;
    /// broca failed in a way the request did not cause (the message names what).
    Internal = "internal", 500, Transient;
    /// The process is out of file descriptors.
    TooManyOpenFiles = "too_many_open_files", 503, Transient;
    /// The file system holding the WALs is full: nothing was written; retry once space is
    /// freed (reads keep working).
    StorageFull = "storage_full", 503, Transient;
    // Imports.
    /// The log cannot be read (missing, not a file, not UTF-8 named).
    ImportUnreadable = "import_unreadable", 404, Permanent;
    /// The log is larger than a log may be.
    ImportTooLarge = "import_too_large", 413, Permanent;
    /// A line of the log is not what its format has (`file:line` names it).
    ImportMalformed = "import_malformed", 400, Permanent;
    /// The log holds no session.
    ImportEmpty = "import_empty", 400, Permanent;
    /// The log is not a continuation of what the session imported of it.
    ImportConflict = "import_conflict", 409, Permanent;
    /// The session went on after the import: a longer log can no longer be appended.
    ImportDiverged = "import_diverged", 409, Permanent;
    /// The log is outside the folders this daemon imports from (`import_roots`).
    ImportForbidden = "import_forbidden", 403, Permanent;
    // HTTP.
    /// No or a wrong bearer handle.
    Unauthorized = "unauthorized", 401, AuthRequired;
    /// The caller may read, not change (the web view's sign-in: no send, cancel, retraction
    /// or import).
    Forbidden = "forbidden", 403, Permanent;
    /// No route of that path.
    NotFound = "not_found", 404, Permanent;
    /// The path is served, not with that method.
    MethodNotAllowed = "method_not_allowed", 405, Permanent;
    /// The request stopped arriving.
    RequestTimeout = "request_timeout", 408, Permanent;
    /// A request head over the limit.
    HeadTooLarge = "head_too_large", 431, Permanent;
    /// A request body over the limit.
    BodyTooLarge = "body_too_large", 413, Permanent;
    /// A body without Content-Length.
    LengthRequired = "length_required", 411, Permanent;
    /// Bytes that are not an HTTP/1.1 request.
    MalformedRequest = "malformed_request", 400, Permanent;
    // The daemon's routes.
    /// A request on a route bound again since.
    StaleRouteEpoch = "stale_route_epoch", 409, Permanent;
    /// A request on a channel no route is bound on.
    UnknownChannel = "unknown_channel", 404, Permanent;
    /// A bind broca does not take.
    RouteRejected = "route_rejected", 400, Permanent;
    /// An answer larger than a frame carries.
    ReplyTooLarge = role::REPLY_TOO_LARGE, 413, Permanent;
    // Attachments (llm-runner/v1 §9.12); each refusal leaves the upload as it was.
    /// An upload into a session that was never written.
    UnknownSession = role::UNKNOWN_SESSION, 404, Permanent;
    /// No upload of that id in this session.
    UnknownUpload = role::UNKNOWN_UPLOAD, 404, Permanent;
    /// A send names an upload not yet committed.
    UploadNotCommitted = role::UPLOAD_NOT_COMMITTED, 409, Permanent;
    /// The upload was lost (begun in a process that stopped before its commit).
    UploadGone = role::UPLOAD_GONE, 410, Permanent;
    /// An append of more than 2 MiB of decoded bytes.
    UploadChunkTooLarge = role::UPLOAD_CHUNK_TOO_LARGE, 413, Permanent;
    /// An append at another offset than what was received (`detail.received`).
    UploadOffsetMismatch = role::UPLOAD_OFFSET_MISMATCH, 409, Permanent;
    /// An append past the declared size, or a commit of another size.
    UploadSizeMismatch = role::UPLOAD_SIZE_MISMATCH, 409, Permanent;
    /// A commit whose bytes have another SHA-256 than declared.
    UploadSha256Mismatch = role::UPLOAD_SHA256_MISMATCH, 409, Permanent;
    /// A send's media the model it would run on cannot take.
    MediaUnsupported = role::MEDIA_UNSUPPORTED, 400, Permanent;
    /// A digest this session's history does not reference.
    UnknownMedia = role::UNKNOWN_MEDIA, 404, Permanent;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_code_is_spelled_once_in_snake_case_with_an_error_status() {
        let mut seen = std::collections::HashSet::new();
        for code in Code::ALL {
            let text = code.as_str();
            assert!(seen.insert(text), "{text} is in the table twice");
            assert!(
                !text.is_empty()
                    && text
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{text} is not snake_case"
            );
            assert!(
                (400..600).contains(&code.status()),
                "{text}: {}",
                code.status()
            );
            // A server's own failure is worth retrying; a client's mistake is not, unless it
            // waits on the daemon (busy, stopping, out of something).
            if code.status() >= 500 {
                assert_ne!(code.class(), ErrorClass::Permanent, "{text}");
            }
        }
    }
}
