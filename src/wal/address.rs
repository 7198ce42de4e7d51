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

/// Why a triple is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TripleError {
    /// A component is empty.
    Empty { component: &'static str },
    /// A component is over [`TRIPLE_COMPONENT_BYTES_MAX`].
    TooLong {
        component: &'static str,
        bytes: usize,
    },
    /// A component holds a control character (`at`: its byte offset): a name printed by a
    /// listing would carry it raw to the terminal.
    Control {
        component: &'static str,
        at: usize,
        c: char,
    },
    /// The project root is not an absolute path (one folder has one spelling: `/` first).
    Relative,
}

impl std::fmt::Display for TripleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TripleError::Empty { component } => write!(f, "{component} is empty"),
            TripleError::TooLong { component, bytes } => write!(
                f,
                "{component} has {bytes} bytes; the limit is {TRIPLE_COMPONENT_BYTES_MAX}"
            ),
            TripleError::Control { component, at, c } => write!(
                f,
                "{component} holds the control character {c:?} at byte {at}; names take none"
            ),
            TripleError::Relative => write!(
                f,
                "project_root is not an absolute path (it must start with `/`)"
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
    /// A triple, or the reason it is not one: an empty or oversized component, a control
    /// character in any, a project root that is not absolute. The project root is taken in
    /// its one spelling: `.` and empty components dropped, `..` applied (never above `/`), no
    /// trailing `/` ([`normal_root`]); symbolic links are not followed (the folder need not
    /// exist on this machine).
    pub fn new(
        project_root: impl Into<String>,
        harness: impl Into<String>,
        session: impl Into<String>,
    ) -> Result<SessionTriple, TripleError> {
        let root: String = project_root.into();
        if root.is_empty() {
            return Err(TripleError::Empty {
                component: "project_root",
            });
        }
        let triple = SessionTriple {
            project_root: normal_root(&root).ok_or(TripleError::Relative)?,
            harness: harness.into(),
            session: session.into(),
        };
        for (component, value) in triple.components() {
            if value.is_empty() {
                return Err(TripleError::Empty { component });
            }
            if value.len() > TRIPLE_COMPONENT_BYTES_MAX {
                return Err(TripleError::TooLong {
                    component,
                    bytes: value.len(),
                });
            }
            if let Some((at, c)) = value.char_indices().find(|(_, c)| c.is_control()) {
                return Err(TripleError::Control { component, at, c });
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

/// `root` in its one spelling (see [`SessionTriple::new`]), or `None` when it is not
/// absolute.
pub fn normal_root(root: &str) -> Option<String> {
    if !root.starts_with('/') {
        return None;
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in root.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    let mut out = String::with_capacity(root.len());
    for p in &parts {
        out.push('/');
        out.push_str(p);
    }
    if out.is_empty() {
        out.push('/');
    }
    Some(out)
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

    /// The session's content store (its attachments, named by SHA-256): a folder of its own
    /// under `media/` beside the WAL folder `wal_dir`.
    pub fn media_dir(&self, wal_dir: &std::path::Path) -> std::path::PathBuf {
        wal_dir
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."))
            .join("media")
            .join(self.to_string())
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
        let a = SessionTriple::new("/p", "ab", "c").unwrap();
        let b = SessionTriple::new("/p", "a", "bc").unwrap();
        assert_ne!(a.address(), b.address());
        assert_eq!(
            a.address(),
            SessionTriple::new("/p", "ab", "c").unwrap().address()
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
        assert_eq!(
            empty,
            TripleError::Empty {
                component: "project_root"
            }
        );
        assert_eq!(empty.to_string(), "project_root is empty");
        let long = "x".repeat(TRIPLE_COMPONENT_BYTES_MAX + 1);
        let e = SessionTriple::new("/p", "h", long).unwrap_err();
        assert_eq!(
            e,
            TripleError::TooLong {
                component: "session",
                bytes: TRIPLE_COMPONENT_BYTES_MAX + 1
            }
        );
    }

    #[test]
    fn control_characters_are_refused_in_every_component() {
        for (root, harness, session, component) in [
            ("/p\0q", "h", "s", "project_root"),
            ("/p", "h\x1b[2J", "s", "harness"),
            ("/p", "h", "s\n", "session"),
            ("/p", "h", "s\u{85}", "session"),
        ] {
            match SessionTriple::new(root, harness, session) {
                Err(TripleError::Control { component: c, .. }) => assert_eq!(c, component),
                other => panic!("{root:?} {harness:?} {session:?}: {other:?}"),
            }
        }
        let e = SessionTriple::new("/p", "h", "a\tb").unwrap_err();
        assert_eq!(
            e.to_string(),
            "session holds the control character '\\t' at byte 1; names take none"
        );
        // Other characters are names like any.
        SessionTriple::new("/päth/ü", "h ü", "s-✓").unwrap();
    }

    #[test]
    fn a_project_root_is_absolute_and_has_one_spelling() {
        assert_eq!(
            SessionTriple::new("proj", "h", "s").unwrap_err(),
            TripleError::Relative
        );
        assert_eq!(
            SessionTriple::new("./proj", "h", "s").unwrap_err(),
            TripleError::Relative
        );
        let one = SessionTriple::new("/home/u/proj", "h", "s").unwrap();
        for spelling in [
            "/home/u/proj/",
            "/home/u/./proj",
            "//home//u/proj//",
            "/home/u/x/../proj",
            "/home/u/proj/.",
        ] {
            let t = SessionTriple::new(spelling, "h", "s").unwrap();
            assert_eq!(t.project_root, "/home/u/proj", "{spelling}");
            assert_eq!(t.address(), one.address(), "{spelling}");
        }
        assert_eq!(normal_root("/").as_deref(), Some("/"));
        assert_eq!(normal_root("/..").as_deref(), Some("/"));
        assert_eq!(normal_root("/../a/..").as_deref(), Some("/"));
    }
}
