//! Session identity: the triple (project_root, harness, session) and the address derived from
//! it, which names the session's WAL file and picks its shard.

use std::fmt;

/// The most bytes one component of a triple may have.
pub const TRIPLE_COMPONENT_BYTES_MAX: usize = 4096;

/// A session's identity. Changing any component addresses a different WAL.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct SessionTriple {
    pub project_root: String,
    pub harness: String,
    pub session: String,
}

/// The 128-bit session address: blake3 over the length-prefixed triple, shown as 32 hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionAddr(pub [u8; 16]);

/// A component of a triple that is empty (`bytes` 0) or over
/// [`TRIPLE_COMPONENT_BYTES_MAX`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TripleError {
    /// `project_root`, `harness` or `session`.
    pub component: &'static str,
    pub bytes: usize,
}

impl std::fmt::Display for TripleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.bytes {
            0 => write!(f, "{} is empty", self.component),
            n => write!(
                f,
                "{} has {n} bytes; the limit is {TRIPLE_COMPONENT_BYTES_MAX}",
                self.component
            ),
        }
    }
}

impl std::error::Error for TripleError {}

impl From<TripleError> for String {
    fn from(e: TripleError) -> String {
        e.to_string()
    }
}

impl SessionTriple {
    /// A triple, or the reason it is not one (an empty or oversized component).
    pub fn new(
        project_root: impl Into<String>,
        harness: impl Into<String>,
        session: impl Into<String>,
    ) -> Result<SessionTriple, TripleError> {
        let triple = SessionTriple {
            project_root: project_root.into(),
            harness: harness.into(),
            session: session.into(),
        };
        for (component, value) in triple.components() {
            if value.is_empty() {
                return Err(TripleError {
                    component,
                    bytes: 0,
                });
            }
            if value.len() > TRIPLE_COMPONENT_BYTES_MAX {
                return Err(TripleError {
                    component,
                    bytes: value.len(),
                });
            }
        }
        Ok(triple)
    }

    fn components(&self) -> [(&'static str, &str); 3] {
        [
            ("project_root", &self.project_root),
            ("harness", &self.harness),
            ("session", &self.session),
        ]
    }

    /// The canonical bytes: each component as a u64 little-endian length, then its bytes.
    /// Length prefixes keep ("ab","c") and ("a","bc") apart.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            24 + self.project_root.len() + self.harness.len() + self.session.len(),
        );
        for (_, value) in self.components() {
            out.extend_from_slice(&(value.len() as u64).to_le_bytes());
            out.extend_from_slice(value.as_bytes());
        }
        out
    }

    /// The session's address.
    pub fn address(&self) -> SessionAddr {
        let digest = blake3::hash(&self.canonical_bytes());
        let mut addr = [0u8; 16];
        addr.copy_from_slice(&digest.as_bytes()[..16]);
        SessionAddr(addr)
    }
}

impl SessionAddr {
    /// The key a session's shard is picked by: the address's first eight bytes (uniform, as
    /// the address is a digest).
    pub fn shard_key(&self) -> u64 {
        let [a, b, c, d, e, f, g, h, ..] = self.0;
        u64::from_le_bytes([a, b, c, d, e, f, g, h])
    }

    /// The WAL file name: `<address>.wal`.
    pub fn wal_file_name(&self) -> String {
        format!("{self}.wal")
    }

    /// A stable 64-bit value of the address, for picking a shard.
    pub fn route_key(&self) -> u64 {
        u64::from_le_bytes(self.0[..8].try_into().expect("8 bytes"))
    }
}

impl fmt::Display for SessionAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_prefixes_keep_shifted_components_apart() {
        let a = SessionTriple::new("ab", "c", "s").unwrap();
        let b = SessionTriple::new("a", "bc", "s").unwrap();
        assert_ne!(a.address(), b.address());
        assert_eq!(
            a.address(),
            SessionTriple::new("ab", "c", "s").unwrap().address()
        );
    }

    #[test]
    fn the_address_is_32_hex_digits_and_names_the_file() {
        let addr = SessionTriple::new("/p", "h", "s").unwrap().address();
        let name = addr.wal_file_name();
        assert_eq!(name.len(), 32 + 4);
        assert!(name[..32].chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn empty_and_oversized_components_are_refused() {
        let empty = SessionTriple::new("", "h", "s").unwrap_err();
        assert_eq!((empty.component, empty.bytes), ("project_root", 0));
        assert_eq!(empty.to_string(), "project_root is empty");
        let long = "x".repeat(TRIPLE_COMPONENT_BYTES_MAX + 1);
        let e = SessionTriple::new("/p", "h", long).unwrap_err();
        assert_eq!(
            (e.component, e.bytes),
            ("session", TRIPLE_COMPONENT_BYTES_MAX + 1)
        );
    }
}
