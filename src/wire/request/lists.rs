//! broca's listing methods, beside the role's: `sessions.list` (every session the daemon
//! holds, newest activity first, filtered) and `runs.list` (one session's runs, newest
//! first). Both are paged by opaque cursors; their params are read strictly.

use serde::Deserialize;

/// A page's size: the default, and the most answered.
pub const LIST_LIMIT: (u32, u32) = (50, 500);

/// The run states a filter may name (`none`: a session with no run yet).
pub const RUN_STATES: [&str; 8] = [
    "active",
    "paused",
    "completed",
    "max_steps",
    "cancelled",
    "interrupted",
    "error",
    "none",
];

fn default_limit() -> u32 {
    LIST_LIMIT.0
}

/// `sessions.list`'s params.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionsList {
    /// Only the sessions of this project root (as the WAL spells it).
    #[serde(default)]
    pub project_root: Option<String>,
    /// Only the sessions of this harness.
    #[serde(default)]
    pub harness: Option<String>,
    /// Only the sessions whose last run is in this state (`none`: no run yet).
    #[serde(default)]
    pub state: Option<String>,
    /// Only the sessions active at or after this time (Unix ms).
    #[serde(default)]
    pub since_ms: Option<u64>,
    #[serde(default = "default_limit")]
    pub limit: u32,
    /// Where the previous page ended (its `next_cursor`).
    #[serde(default)]
    pub cursor: Option<String>,
}

/// `runs.list`'s params (besides the session).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunsList {
    /// Only the runs in this state.
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default = "default_limit")]
    pub limit: u32,
    /// Where the previous page ended (its `next_cursor`).
    #[serde(default)]
    pub cursor: Option<String>,
}

/// What a list's params break: the field, and why.
pub type Fault = (&'static str, String);

fn check_limit(limit: u32) -> Result<(), Fault> {
    if limit == 0 || limit > LIST_LIMIT.1 {
        return Err((
            "limit",
            format!("`limit` must be 1 to {}, not {limit}", LIST_LIMIT.1),
        ));
    }
    Ok(())
}

fn check_state(state: &Option<String>, none_allowed: bool) -> Result<(), Fault> {
    match state {
        Some(s) if !RUN_STATES.contains(&s.as_str()) || (s == "none" && !none_allowed) => {
            let known: Vec<&str> = RUN_STATES
                .iter()
                .copied()
                .filter(|k| none_allowed || *k != "none")
                .collect();
            Err((
                "state",
                format!(
                    "`state` must be one of {}, not `{}`",
                    known.join(", "),
                    s.escape_debug()
                ),
            ))
        }
        _ => Ok(()),
    }
}

impl SessionsList {
    pub fn check(&self) -> Result<(), Fault> {
        check_limit(self.limit)?;
        check_state(&self.state, true)?;
        if let Some(c) = &self.cursor {
            SessionCursor::decode(c).ok_or((
                "cursor",
                "`cursor` is not a sessions.list cursor".to_string(),
            ))?;
        }
        Ok(())
    }
}

impl RunsList {
    pub fn check(&self) -> Result<(), Fault> {
        check_limit(self.limit)?;
        check_state(&self.state, false)?;
        if let Some(c) = &self.cursor {
            run_cursor(c).ok_or(("cursor", "`cursor` is not a runs.list cursor".to_string()))?;
        }
        Ok(())
    }
}

/// Where a sessions.list page ended: the last session's activity time and address (the
/// order is newest activity first, then address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct SessionCursor {
    pub active_ms: u64,
    pub address: [u8; 16],
}

impl SessionCursor {
    pub fn encode(&self) -> String {
        let hex: String = self.address.iter().map(|b| format!("{b:02x}")).collect();
        format!("s1.{}.{hex}", self.active_ms)
    }

    pub fn decode(text: &str) -> Option<SessionCursor> {
        let mut parts = text.strip_prefix("s1.")?.split('.');
        let active_ms = parts.next()?.parse().ok()?;
        let hex = parts.next()?;
        if parts.next().is_some() || hex.len() != 32 {
            return None;
        }
        let mut address = [0u8; 16];
        for (i, b) in address.iter_mut().enumerate() {
            *b = u8::from_str_radix(hex.get(i * 2..i * 2 + 2)?, 16).ok()?;
        }
        Some(SessionCursor { active_ms, address })
    }
}

/// A runs.list cursor: the run after which the page goes on (its RunStarted seq).
pub fn run_cursor(text: &str) -> Option<u64> {
    text.strip_prefix("r1.")?.parse().ok()
}

/// The runs.list cursor after the run started at `seq`.
pub fn run_cursor_after(seq: u64) -> String {
    format!("r1.{seq}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_read_back_and_refuse_what_is_not_theirs() {
        let c = SessionCursor {
            active_ms: 1_700_000_000_123,
            address: [0xab; 16],
        };
        assert_eq!(SessionCursor::decode(&c.encode()), Some(c));
        for bad in [
            "",
            "s1.",
            "s1.12",
            "s1.x.abab",
            "r1.5",
            &format!("{}.9", c.encode()),
        ] {
            assert_eq!(SessionCursor::decode(bad), None, "{bad}");
        }
        assert_eq!(run_cursor(&run_cursor_after(42)), Some(42));
        assert_eq!(run_cursor("s1.5"), None);
    }

    #[test]
    fn limits_and_states_are_checked_by_name() {
        let list = |v: serde_json::Value| serde_json::from_value::<SessionsList>(v).unwrap();
        assert_eq!(list(serde_json::json!({})).limit, 50);
        assert_eq!(
            list(serde_json::json!({"limit": 0})).check().unwrap_err().0,
            "limit"
        );
        assert_eq!(
            list(serde_json::json!({"limit": 501}))
                .check()
                .unwrap_err()
                .0,
            "limit"
        );
        assert_eq!(
            list(serde_json::json!({"state": "done"}))
                .check()
                .unwrap_err()
                .0,
            "state"
        );
        assert!(list(serde_json::json!({"state": "none"})).check().is_ok());
        let runs: RunsList = serde_json::from_value(serde_json::json!({"state": "none"})).unwrap();
        assert_eq!(runs.check().unwrap_err().0, "state");
        assert!(serde_json::from_value::<RunsList>(serde_json::json!({"since_ms": 1})).is_err());
    }
}
