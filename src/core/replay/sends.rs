//! Where a send_id is looked up (llm-runner/v1 §9, §9.7). Each sender has its own namespace
//! of send_ids in a session: the owner's, and each named plan sender's (its module). A
//! successor's keyed send or status looks in its one predecessor's namespace first.

use broca_wal::runrec::{SendEnded, SendQueued};

use super::{Session, SteerSend};

/// A send's key: whose namespace it is in, and its send_id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SendKey {
    /// The named plan sender's module; `None` for the owner's sends (and any send of a
    /// session that has no owner yet).
    pub sender: Option<String>,
    pub send_id: String,
}

/// A send found by its key, where it is in its life.
#[derive(Debug, Clone, Copy)]
pub enum Found<'a> {
    /// A keyed steer or ordered send handed to a run.
    Steer(&'a SteerSend),
    /// The run (by index) it started.
    Run(usize),
    /// Waiting for its turn.
    Queued(&'a SendQueued),
    /// Withdrawn before it started (no end), or ended undelivered.
    Retracted(&'a SendQueued, Option<&'a SendEnded>),
}

impl Session {
    /// The namespace of a send from `principal`: the owner's (`None`) for one of the
    /// session's owners, no attested principal or a session without an owner; else the
    /// sender's module, as a plan's `senders` name it.
    pub fn sender_of(&self, principal: Option<&str>) -> Option<String> {
        let module = crate::admission::ordered::module_of(principal?);
        let owners = self.owners();
        let owned = owners.is_empty()
            || owners
                .iter()
                .any(|o| crate::admission::ordered::module_of(o) == module);
        (!owned).then(|| module.to_string())
    }

    /// The key of `send_id` sent by `principal`.
    pub fn send_key(&self, principal: Option<&str>, send_id: &str) -> SendKey {
        SendKey {
            sender: self.sender_of(principal),
            send_id: send_id.to_string(),
        }
    }

    /// The send `key` names: a steer's, a run's, a queued one's, a withdrawn or ended one's.
    pub fn find_send(&self, key: &SendKey) -> Option<Found<'_>> {
        if let Some(steer) = self.steer_sends.get(key) {
            return Some(Found::Steer(steer));
        }
        if let Some(&index) = self.by_send_id.get(key) {
            return Some(Found::Run(index));
        }
        if let Some(q) = self.queued.iter().find(|q| {
            q.send_id.as_deref() == Some(key.send_id.as_str())
                && self.sender_of(q.principal.as_deref()) == key.sender
        }) {
            return Some(Found::Queued(q));
        }
        self.retracted
            .get(key)
            .map(|(q, ended)| Found::Retracted(q, ended.as_ref()))
    }

    /// The send a keyed send or status from `principal` refers to (§9.7): in the namespace
    /// of the sender its plan entry `succeeds` first (a record there decides, a different
    /// payload never falls through), then in its own.
    pub fn lookup_send(&self, principal: Option<&str>, send_id: &str) -> Option<Found<'_>> {
        let own = self.send_key(principal, send_id);
        if let Some(module) = &own.sender {
            let senders = crate::admission::ordered::senders(self);
            let predecessor =
                cortexkit_role_llm_runner::sender_succession::predecessor(&senders, module);
            if let Some(predecessor) = predecessor {
                let key = SendKey {
                    sender: self.sender_of(Some(predecessor)),
                    send_id: send_id.to_string(),
                };
                if let Some(found) = self.find_send(&key) {
                    return Some(found);
                }
            }
        }
        self.find_send(&own)
    }
}

#[cfg(test)]
mod tests {
    use crate::admission::{admit_prepared, prepare, Admitted, SendRequest};
    use crate::replay::Session;
    use broca_wal::Record;
    use broca_wire::{Caller, Refusal};

    /// The session's first run, by its owner; the plan it froze names sender `a`, and `b`
    /// as `a`'s successor.
    fn session() -> Session {
        let mut s = Session::default();
        s.apply(1, started("r1", None, "reserved:owner")).unwrap();
        s.apply(2, crate::retention_tests::finished("r1", 1))
            .unwrap();
        let plan = serde_json::json!({"senders": [
            {"module": "a", "idle_start": true, "interrupt": true},
            {"module": "b", "idle_start": true, "succeeds": "a"},
            {"module": "c", "idle_start": true},
        ]});
        s.plan = Some(Box::new(
            serde_json::from_value(serde_json::json!({
                "plan": plan.to_string(), "identity": "p", "join_version": 1
            }))
            .unwrap(),
        ));
        s
    }

    fn request(prompt: &str, send_id: &str) -> SendRequest {
        SendRequest {
            prompt: prompt.into(),
            model: "anthropic/m".into(),
            send_id: Some(send_id.into()),
            ..Default::default()
        }
    }

    fn started(run_id: &str, send_id: Option<&str>, principal: &str) -> Record {
        let mut r = crate::replay::tests::started_with(
            run_id,
            prepare_send(&request("go", "x"), principal).config,
            0,
        );
        if let Record::RunStarted(r) = &mut r {
            r.send_id = send_id.map(str::to_string);
            r.principal = Some(principal.to_string());
            r.inputs_digest = crate::admission::inputs_digest(&request("go", "k"));
        }
        r
    }

    fn prepare_send(req: &SendRequest, principal: &str) -> crate::admission::Prepared {
        let mut p = prepare(
            req,
            &[],
            &broca_catalog::Catalog::builtin(),
            &broca_protocol::model::AnyProvider,
        )
        .unwrap_or_else(|u| panic!("{:?}", u.refusal));
        p.caller = Caller {
            principal: Some(principal.to_string()),
            ..Caller::default()
        };
        p
    }

    fn send(s: &Session, prompt: &str, principal: &str) -> Result<Admitted, Refusal> {
        let p = prepare_send(&request(prompt, "k"), principal);
        admit_prepared(p, s, "r-new".into(), 10)
    }

    #[test]
    fn each_sender_keys_its_own_send_ids_and_a_successor_finds_its_predecessors_first() {
        let mut s = session();
        // Sender `a` sends `k`; its run ends.
        s.apply(3, started("r2", Some("k"), "reserved:a")).unwrap();
        s.apply(4, crate::retention_tests::finished("r2", 2))
            .unwrap();
        // `a` re-sending it is answered with its run.
        assert!(matches!(
            send(&s, "go", "reserved:a"),
            Ok(Admitted::Existing { run_index: 1 })
        ));
        // The same send_id from the owner or from `c` is theirs: a new send each.
        assert!(matches!(
            send(&s, "go", "reserved:owner"),
            Ok(Admitted::New(_))
        ));
        assert!(matches!(send(&s, "go", "reserved:c"), Ok(Admitted::New(_))));
        // `b` succeeds `a`: the same payload is `a`'s send, another is a reuse (never a
        // fall-through to `b`'s own namespace).
        assert!(matches!(
            send(&s, "go", "reserved:b"),
            Ok(Admitted::Existing { run_index: 1 })
        ));
        assert!(matches!(
            send(&s, "other", "reserved:b"),
            Err(Refusal::SendIdReuse { .. })
        ));
        // Nothing of `a`'s is `c`'s to look up; the owner's own `k` is not `b`'s either.
        assert!(s.lookup_send(Some("reserved:c"), "k").is_none());
        s.apply(5, started("r3", Some("k2"), "reserved:owner"))
            .unwrap();
        assert!(s.lookup_send(Some("reserved:b"), "k2").is_none());
        assert!(s.lookup_send(Some("reserved:owner"), "k2").is_some());
    }

    #[test]
    fn a_sender_withdraws_only_its_own_submission_and_cancels_only_as_granted() {
        use crate::admission::{may_cancel, may_retract};
        let mut s = session();
        let who = |p: &str| Caller {
            principal: Some(p.to_string()),
            ..Caller::default()
        };
        s.queued.push(broca_wal::runrec::SendQueued {
            submission_id: "q1".into(),
            send_id: Some("k".into()),
            inputs_digest: "d".into(),
            prompt: "go".into(),
            config: prepare_send(&request("go", "k"), "reserved:a").config,
            at_unix_ms: 0,
            principal: Some("reserved:a".into()),
            scope_owner: None,
            client_message_id: None,
            delivery: None,
            media: Vec::new(),
            order: None,
            pre_user: Vec::new(),
        });
        // Its sender and the owner withdraw it; another sender and a stranger do not.
        assert!(may_retract(&who("reserved:a"), &s, "q1"));
        assert!(may_retract(&who("reserved:owner"), &s, "q1"));
        assert!(!may_retract(&who("reserved:c"), &s, "q1"));
        assert!(!may_retract(&who("reserved:x"), &s, "q1"));
        assert!(!may_retract(&Caller::default(), &s, "q1"));
        // `a` holds the interrupt grant: it cancels at `now`, never at a step boundary;
        // `c` holds none.
        assert!(may_cancel(&who("reserved:a"), &s, true));
        assert!(!may_cancel(&who("reserved:a"), &s, false));
        assert!(!may_cancel(&who("reserved:c"), &s, true));
        assert!(may_cancel(&who("reserved:owner"), &s, false));
    }
}
