//! What replay says of a record that does not fit where it stands in the log.

/// A record that does not fit where it stands in the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayError {
    pub seq: u64,
    pub reason: Misfit,
}

impl std::fmt::Display for ReplayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "record seq {}: {}", self.seq, self.reason)
    }
}

/// Why a record does not fit where it stands: the log holds what no writer appends, so it is
/// corrupt there (replay stops, the WAL is left as it is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Misfit {
    /// A record of run `run_id` while no run is open.
    NoOpenRun { run_id: String },
    /// A record of run `run_id` while run `open` is the open one.
    NotTheOpenRun { run_id: String, open: String },
    /// A retraction of a submission nothing queued has.
    RetractedUnknown { submission_id: String },
    /// A RunStarted while another run has no terminal record.
    StartedWhileOpen { run_id: String, open: String },
    /// A run id used twice.
    RunIdReused { run_id: String },
    /// A steered send, or a step or run delivering one, that does not fit: no open run to
    /// join, or no steer waiting at that seq.
    SteerMisfit { seq: u64, why: &'static str },
    /// An upload record that does not fit the uploads before it.
    UploadMisfit {
        upload_id: String,
        why: &'static str,
    },
    /// A run that delivers a submission not queued.
    SubmissionNotQueued {
        run_id: String,
        submission_id: String,
    },
    /// Steps go up by one.
    StepOutOfOrder {
        run_id: String,
        step: u32,
        previous: u32,
    },
    /// A tool result no intent waits for.
    StrayResult { call_id: String, batch_id: String },
    /// An imported episode while a run has no terminal record.
    ImportWhileOpen { import_id: String, open: String },
    /// A summary that does not fit the conversation it stands in for.
    CompactionMisfit {
        run_id: String,
        replaced: u64,
        why: &'static str,
    },
    /// An accepted compaction view that is not a view, or not newer than the one before.
    ViewMisfit { provider: String, why: String },
    /// A frame that does not decode (at its offset in the file).
    Undecodable { offset: u64, reason: String },
}

impl std::fmt::Display for Misfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Misfit::NoOpenRun { run_id } => write!(f, "{run_id}: no run is open"),
            Misfit::NotTheOpenRun { run_id, open } => {
                write!(f, "{run_id}: the open run is {open}")
            }
            Misfit::RetractedUnknown { submission_id } => write!(
                f,
                "submission {submission_id} is retracted, but nothing queued has that id"
            ),
            Misfit::StartedWhileOpen { run_id, open } => write!(
                f,
                "run {run_id} started while run {open} has no terminal record"
            ),
            Misfit::RunIdReused { run_id } => write!(f, "run id {run_id} is reused"),
            Misfit::SteerMisfit { seq, why } => write!(f, "steered send {seq}: {why}"),
            Misfit::UploadMisfit { upload_id, why } => write!(f, "upload {upload_id}: {why}"),
            Misfit::SubmissionNotQueued {
                run_id,
                submission_id,
            } => write!(
                f,
                "run {run_id} delivers submission {submission_id}, which is not queued"
            ),
            Misfit::StepOutOfOrder {
                run_id,
                step,
                previous,
            } => write!(
                f,
                "step {step} of run {run_id} follows step {previous} (steps go up by one)"
            ),
            Misfit::StrayResult { call_id, batch_id } => write!(
                f,
                "a result for tool call {call_id} of batch {batch_id}, which its intent does \
                 not wait for"
            ),
            Misfit::ImportWhileOpen { import_id, open } => write!(
                f,
                "import {import_id} while run {open} has no terminal record"
            ),
            Misfit::CompactionMisfit {
                run_id,
                replaced,
                why,
            } => write!(
                f,
                "run {run_id}'s summary of the first {replaced} messages does not fit: {why}"
            ),
            Misfit::ViewMisfit { provider, why } => {
                write!(f, "a view accepted from {provider} does not fit: {why}")
            }
            Misfit::Undecodable { offset, reason } => write!(f, "at offset {offset}: {reason}"),
        }
    }
}
