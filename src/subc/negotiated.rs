//! What the daemon's HELLO_ACK settled, as broca uses it (sans-IO): the wire version (checked
//! at registration: `connect`), the daemon's machine id (validated; a name shown in health,
//! never an authority), the ops and capabilities it serves (whether broca may own scopes,
//! whether it takes `catalog.update`), and whether it offered managed storage (broca keeps
//! its own state dir either way).

use subc_protocol::MachineId;
use subc_protocol::ModuleHelloAckBody;

/// The values broca takes from the daemon's HELLO_ACK.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Negotiated {
    /// The daemon's machine id, when it gave a well-formed one.
    pub machine_id: Option<String>,
    /// The ops the daemon says it serves to modules (empty: it does not say).
    pub ops: Vec<String>,
    pub capabilities: Vec<String>,
    pub storage_offered: bool,
}

impl Negotiated {
    /// The values of `ack`, and a note for each one broca cannot use as given.
    pub fn of(ack: &ModuleHelloAckBody) -> (Negotiated, Vec<String>) {
        let mut notes = Vec::new();
        let machine_id = match ack.machine_id.as_deref().map(MachineId::parse) {
            Some(Ok(id)) => Some(id.as_str().to_string()),
            Some(Err(e)) => {
                notes.push(format!(
                    "the daemon's machine id is malformed ({e}); not used"
                ));
                None
            }
            None => None,
        };
        let n = Negotiated {
            machine_id,
            ops: ack.subc_ops.clone(),
            capabilities: ack.subc_capabilities.clone(),
            storage_offered: ack.storage.is_some(),
        };
        (n, notes)
    }

    /// Whether the daemon serves `op` to modules (a daemon that lists no ops is taken to
    /// serve those of its wire version).
    pub fn serves(&self, op: &str) -> bool {
        self.ops.is_empty() || self.ops.iter().any(|o| o == op)
    }

    /// Whether the daemon advertises `capability`.
    pub fn advertises(&self, capability: &str) -> bool {
        self.capabilities.iter().any(|c| c == capability)
    }

    /// Whether the daemon admits scoped routes and takes an owner's scope ops.
    pub fn admits_scopes(&self) -> bool {
        self.advertises(crate::scope::CAPABILITY)
            && self.serves(subc_protocol::scope::SCOPE_SYNC_OP)
            && self.serves(subc_protocol::scope::SCOPE_APPLY_OP)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(v: serde_json::Value) -> ModuleHelloAckBody {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_acks_values_are_taken_as_given_or_named_when_unusable() {
        let good = ack(serde_json::json!({"negotiated_ver": 2,
            "subc_ops": ["route.open", "catalog.update", "scope.sync", "scope.apply"],
            "subc_capabilities": ["scopes/v1"], "machine_id": "0123456789abcdef0123456789abcdef",
            "storage": {"kind": "sqlite"}}));
        let (n, notes) = Negotiated::of(&good);
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(
            n.machine_id.as_deref(),
            Some("0123456789abcdef0123456789abcdef")
        );
        assert!(n.admits_scopes() && n.serves("catalog.update") && n.storage_offered);

        // A malformed machine id is dropped with a note; scopes/v1 without the owner's ops
        // is no scopes.
        let odd = ack(
            serde_json::json!({"negotiated_ver": 2, "subc_ops": ["route.open"],
            "subc_capabilities": ["scopes/v1"], "machine_id": "NOT-A-MACHINE"}),
        );
        let (n, notes) = Negotiated::of(&odd);
        assert_eq!(n.machine_id, None);
        assert!(notes[0].contains("malformed"), "{notes:?}");
        assert!(!n.admits_scopes());
        assert!(!n.serves("catalog.update"));
        assert!(!n.storage_offered);

        // An older daemon names no machine and lists no ops: it serves its version's.
        let old = ack(serde_json::json!({"negotiated_ver": 2, "subc_ops": [],
            "subc_capabilities": []}));
        let (n, notes) = Negotiated::of(&old);
        assert!(notes.is_empty() && n.machine_id.is_none());
        assert!(n.serves("catalog.update") && !n.admits_scopes());
    }
}
