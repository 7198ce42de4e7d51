//! Part numbers as broca's model requests showed them (cortexkit-role-compaction A3): only a
//! session whose plan names a compaction provider shows them, so the suite's part-tag fixture
//! (the session of `delivery_order_template_part_gone_refused`) is given such a plan. A part's
//! number is read from the requests the scripted model received: the text block that is the
//! part's stored text behind a `§N§ ` prefix. The part's stored text comes from the session's
//! WAL, read as a reader; the number is never recomputed.

use serde_json::{json, Map, Value};

use crate::subject::{Subject, HARNESS};

/// The compaction provider the fixtures' plans name (no such module runs: their sessions are
/// read, packed, and their requests observed).
pub const COMPACTOR: &str = "conformance-compactor";

/// The sessions the suite names a part of by its number.
const PART_TAG_FIXTURE: &str = "cf-order-part-gone-";

/// A plan's compaction item naming [`COMPACTOR`].
pub fn compaction_item() -> Value {
    json!({"provider": COMPACTOR, "preset": "head", "params": {}})
}

/// Gives the part-tag fixture's plan its compaction provider.
pub fn with_provider(session: &str, plan: &mut Map<String, Value>) {
    if session.starts_with(PART_TAG_FIXTURE) {
        plan.insert("compaction_item".into(), compaction_item());
    }
}

impl Subject {
    /// The number broca's requests showed part `part` of message `mid` of `session` with.
    pub(crate) fn number_shown(&self, session: &str, mid: &str, part: &str) -> Option<u64> {
        let text = self.stored_text(session, mid, part)?;
        self.model
            .requests(session)
            .iter()
            .rev()
            .flat_map(crate::model::rendered_texts)
            .find_map(|shown| {
                let rest = shown.strip_prefix('§')?;
                let (digits, rest) = rest.split_once("§ ")?;
                (rest == text).then(|| digits.parse().ok())?
            })
    }

    /// The text block `part` of message `mid`, as the session's WAL holds it.
    fn stored_text(&self, session: &str, mid: &str, part: &str) -> Option<String> {
        use broca::core::entries::Body;
        let root = self.live.root()?;
        let triple =
            broca::wal::SessionTriple::new(broca::daemon::NO_WORKDIR_ROOT, HARNESS, session)
                .ok()?;
        let path = broca::wal::writer::wal_path(&root.join("state").join("wal"), &triple);
        let read =
            broca::read::read::read_session(&path, broca::read::read::Keep::Entries).ok()??;
        let entry = read
            .session
            .entries?
            .list
            .into_iter()
            .find(|e| e.mid == mid)?;
        let Body::Message(m) = entry.body else {
            return None;
        };
        match m.content.get(part.parse::<usize>().ok()?)? {
            broca::protocol::Block::Text { text } => Some(text.clone()),
            _ => None,
        }
    }
}
