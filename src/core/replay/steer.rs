//! Steered sends as replay keeps them (a child of `replay`): accepted into the active run
//! (`SendSteered`), waiting for its next step boundary, rendered there (the StepStarted that
//! names them) or, when the run ended first, delivered as the next turn (a RunStarted naming
//! one). An interrupting send (`SendQueued` with `delivery: interrupt`) asks the open run to
//! stop, so a crash before its cancel is recorded still ends that run cancelled.

use std::sync::Arc;

use broca_protocol::{Block, Message, Role};
use broca_wal::runrec::{RunStarted, SendQueued, SendSteered, StepStarted};

use super::{prompt_digest, Misfit, Session};

/// A steered send accepted and not yet rendered.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingSteer {
    /// The seq of its `SendSteered` record: its message's id once rendered.
    pub seq: u64,
    /// The index of the run that accepted it.
    pub run: usize,
    pub record: Box<SendSteered>,
}

/// A keyed steered send, as a re-send of its send_id is answered.
#[derive(Debug, Clone, PartialEq)]
pub struct SteerSend {
    pub seq: u64,
    /// The index of the run that accepted it.
    pub accepted_by: usize,
    pub inputs_digest: String,
    pub prompt_digest: String,
    pub client_message_id: Option<String>,
    pub delivered: Option<SteerDelivered>,
    /// Its delivery as its identity compares it: `steer`, or its list's identity.
    pub delivery: String,
}

/// How a steered send was delivered (final once set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SteerDelivered {
    /// Rendered at a step boundary of the run of this index.
    Step { run: usize },
    /// It started the run of this index (its own run ended before rendering it).
    Turn { run: usize },
}

/// A steer a run accepted, and whether that run rendered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunSteer {
    pub seq: u64,
    pub send_id: Option<String>,
    /// Its key, when it has a send_id (its sender's namespace).
    pub key: Option<super::SendKey>,
    pub rendered: bool,
}

/// Puts a steered send's blocks (its prompt, then its media) into the conversation: into
/// the user message that ends it (the results of the step before, or the run's own prompt),
/// so every family takes them; else as a message of its own.
pub fn push_steer(transcript: &mut Vec<Arc<Message>>, blocks: Vec<Block>) {
    match transcript.last_mut() {
        // Copied first if a request in flight still shares it.
        Some(m) if m.role == Role::User => Arc::make_mut(m).content.extend(blocks),
        _ => transcript.push(Arc::new(Message {
            role: Role::User,
            content: blocks,
        })),
    }
}

/// A steered send's blocks: its prompt's text, then its media.
pub fn steer_blocks(r: &SendSteered) -> Vec<Block> {
    broca_protocol::user_blocks(&r.prompt, &r.media)
}

impl Session {
    /// A send steered into the open run.
    pub(super) fn apply_steered(&mut self, seq: u64, r: Box<SendSteered>) -> Result<(), Misfit> {
        let misfit = |why| Misfit::SteerMisfit { seq, why };
        let Some(open) = &self.open else {
            return Err(misfit("no run is open to join"));
        };
        let index = open.index;
        let run = &mut self.runs[index];
        if run.run_id != r.run_id {
            return Err(misfit("it names a run that is not the open one"));
        }
        // An ordered send that waited queued for a run now waits for this one's boundaries.
        if let Some(submission_id) = &r.submission_id {
            self.queued.retain(|q| &q.submission_id != submission_id);
        }
        let key = r
            .send_id
            .as_deref()
            .map(|id| self.send_key(r.principal.as_deref(), id));
        let run = &mut self.runs[index];
        run.steers.push(RunSteer {
            seq,
            send_id: r.send_id.clone(),
            key: key.clone(),
            rendered: false,
        });
        // Admission only ever shortens it: the latest send's is the session's.
        if r.retention.is_some() {
            self.retention = r.retention;
        }
        self.note_policy(r.retention_policy.as_ref());
        if let Some(key) = key {
            let send = SteerSend {
                seq,
                accepted_by: index,
                inputs_digest: r.inputs_digest.clone(),
                prompt_digest: prompt_digest(&r.prompt),
                client_message_id: r.client_message_id.clone(),
                delivered: None,
                delivery: r.order.as_ref().map_or_else(
                    || broca_wire::delivery::STEER.to_string(),
                    broca_protocol::delivery::SendOrder::identity,
                ),
            };
            self.steer_sends.insert(key, send);
        }
        self.pending_steers.push(PendingSteer {
            seq,
            run: index,
            record: r,
        });
        Ok(())
    }

    /// A queued send withdrawn before it started.
    pub(super) fn apply_retracted(
        &mut self,
        r: broca_wal::runrec::SendRetracted,
    ) -> Result<(), Misfit> {
        let Some(i) = self
            .queued
            .iter()
            .position(|q| q.submission_id == r.submission_id)
        else {
            // An ordered send waiting for a run's boundary.
            if let Some(q) = self.withdraw_waiting(&r.submission_id) {
                if let Some(send_id) = q.send_id.as_deref() {
                    let key = self.send_key(q.principal.as_deref(), send_id);
                    self.retracted.insert(key, (q, r.ended));
                }
                return Ok(());
            }
            return Err(Misfit::RetractedUnknown {
                submission_id: r.submission_id,
            });
        };
        let q = self.queued.remove(i);
        if let Some(send_id) = q.send_id.as_deref() {
            let key = self.send_key(q.principal.as_deref(), send_id);
            self.retracted.insert(key, (q, r.ended));
        }
        Ok(())
    }

    /// Takes the ordered send of `submission_id` off the sends waiting for a boundary (it
    /// was retracted, or ended undelivered), as the queued send it answers like from now on.
    pub(super) fn withdraw_waiting(&mut self, submission_id: &str) -> Option<SendQueued> {
        let i = self
            .pending_steers
            .iter()
            .position(|p| p.record.submission_id.as_deref() == Some(submission_id))?;
        let p = self.pending_steers.remove(i);
        if let Some(run) = self.runs.get_mut(p.run) {
            run.steers.retain(|s| s.seq != p.seq);
        }
        let r = *p.record;
        if let Some(id) = &r.send_id {
            let key = self.send_key(r.principal.as_deref(), id);
            self.steer_sends.remove(&key);
        }
        let config = self.runs.get(p.run).map(|v| v.config.clone())?;
        Some(SendQueued {
            submission_id: submission_id.to_string(),
            send_id: r.send_id,
            inputs_digest: r.inputs_digest,
            prompt: r.prompt,
            config,
            at_unix_ms: r.at_unix_ms,
            principal: r.principal,
            scope_owner: r.scope_owner,
            client_message_id: r.client_message_id,
            delivery: None,
            media: r.media,
            order: r.order,
            pre_user: r.pre_user,
        })
    }

    /// The steers a step renders join the conversation before its request, in its order.
    pub(super) fn apply_step_steers(&mut self, r: &StepStarted) -> Result<(), Misfit> {
        let Some(open) = self.open.as_ref().map(|o| o.index) else {
            return Ok(()); // the step itself was refused already
        };
        for &seq in &r.steers {
            let why = "a step renders it, but no steered send waits at that seq";
            let p = self.take_pending(seq, why)?;
            push_steer(&mut self.transcript, steer_blocks(&p.record));
            self.entry_count += 1;
            if p.run == open {
                if let Some(s) = self.runs[p.run].steers.iter_mut().find(|s| s.seq == seq) {
                    s.rendered = true;
                }
            }
            self.note_delivered(&p, SteerDelivered::Step { run: open });
        }
        Ok(())
    }

    /// A run that delivers a steer as its turn takes it off the pending ones.
    pub(super) fn apply_steer_turn(&mut self, r: &RunStarted, index: usize) -> Result<(), Misfit> {
        let Some(seq) = r.steer_seq else {
            return Ok(());
        };
        let why = "a run delivers it as its turn, but no steered send waits at that seq";
        let p = self.take_pending(seq, why)?;
        self.note_delivered(&p, SteerDelivered::Turn { run: index });
        Ok(())
    }

    /// Takes the steer waiting at `seq` off the pending ones (`why` names the misfit of none).
    fn take_pending(&mut self, seq: u64, why: &'static str) -> Result<PendingSteer, Misfit> {
        let Some(i) = self.pending_steers.iter().position(|p| p.seq == seq) else {
            return Err(Misfit::SteerMisfit { seq, why });
        };
        Ok(self.pending_steers.remove(i))
    }

    /// A keyed steer's receipt: how it was delivered (final).
    fn note_delivered(&mut self, p: &PendingSteer, how: SteerDelivered) {
        let key = p
            .record
            .send_id
            .as_deref()
            .map(|id| self.send_key(p.record.principal.as_deref(), id));
        if let Some(send) = key.and_then(|k| self.steer_sends.get_mut(&k)) {
            send.delivered = Some(how);
        }
    }

    /// The entries a step's steers add: one user entry each, its mid its `SendSteered` seq.
    pub(super) fn steered_note(&self, r: &StepStarted) -> crate::entries::Note {
        let run = self.open.as_ref().map(|o| o.index);
        let steers = r
            .steers
            .iter()
            .filter_map(|seq| self.pending_steers.iter().find(|p| p.seq == *seq))
            .map(|p| crate::entries::SteerNote {
                mid: p.seq,
                at: p.record.at_unix_ms,
                client_message_id: p.record.client_message_id.clone(),
                sender: p.record.principal.clone(),
                blocks: steer_blocks(&p.record),
                delivered: r
                    .delivered
                    .iter()
                    .find(|d| d.seq == p.seq)
                    .map(|d| (d.mode.clone(), d.tool_call_id.clone())),
            })
            .collect();
        crate::entries::Note::Steered {
            run,
            steers,
            at: r.at_unix_ms,
        }
    }

    /// An interrupting send queued behind the open run asks that run to stop.
    pub(super) fn note_interrupt(&mut self, q: &SendQueued) {
        if q.delivery.as_deref() == Some(broca_wire::delivery::INTERRUPT) {
            if let Some(open) = self.open.as_mut() {
                open.cancel_requested = true;
            }
        }
    }

    /// The send_ids of the steers run `index` accepted and did not render (absent before it
    /// ended).
    pub fn undelivered_steers(&self, index: usize) -> Vec<String> {
        self.runs[index]
            .steers
            .iter()
            .filter(|s| !s.rendered)
            .filter_map(|s| s.send_id.clone())
            .collect()
    }
}
