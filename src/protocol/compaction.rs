//! A run's built-in compaction (docs/compaction.md): when the next request would come close
//! to the context limit, the older turns are summarized by the run's own model and the
//! summary stands in for them in every later request. What a send asks for, and what
//! admission freezes with the run: the mode and its two thresholds.

use serde::{Deserialize, Serialize};

/// The one mode that summarizes (`off` is a send's way to say none).
pub const SUMMARIZE: &str = "summarize";
/// A send's way to turn compaction off.
pub const OFF: &str = "off";
/// When the next request's estimate reaches this share of the context limit, older turns
/// are summarized: room is left for the answer and for the summary's own request.
pub const AT_PERCENT_DEFAULT: u8 = 80;
/// The most recent turns kept as they are, as a share of the context limit.
pub const KEEP_PERCENT_DEFAULT: u8 = 25;
/// The bounds a send's thresholds are checked against.
pub const AT_PERCENT_RANGE: std::ops::RangeInclusive<u8> = 50..=95;
pub const KEEP_PERCENT_RANGE: std::ops::RangeInclusive<u8> = 5..=50;

/// A run's compaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Compaction {
    /// `summarize` (a send may also say `off`; a frozen run holds only `summarize`).
    pub mode: Mode,
    /// The share of the context limit at which older turns are summarized.
    #[serde(default = "at_default")]
    pub at_percent: u8,
    /// The share of the context limit kept as the most recent turns.
    #[serde(default = "keep_default")]
    pub keep_percent: u8,
}

/// What a send asks of compaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Summarize,
    Off,
}

fn at_default() -> u8 {
    AT_PERCENT_DEFAULT
}

fn keep_default() -> u8 {
    KEEP_PERCENT_DEFAULT
}

/// Why a send's compaction cannot be taken: the member out of its range, or a summary that
/// would not make room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompactionRefused {
    AtPercent,
    KeepPercent,
    NoRoom { keep_percent: u8, at_percent: u8 },
}

impl std::fmt::Display for CompactionRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CompactionRefused::AtPercent => write!(
                f,
                "compaction.at_percent must be {} to {}",
                AT_PERCENT_RANGE.start(),
                AT_PERCENT_RANGE.end()
            ),
            CompactionRefused::KeepPercent => write!(
                f,
                "compaction.keep_percent must be {} to {}",
                KEEP_PERCENT_RANGE.start(),
                KEEP_PERCENT_RANGE.end()
            ),
            CompactionRefused::NoRoom {
                keep_percent,
                at_percent,
            } => write!(
                f,
                "compaction.keep_percent ({keep_percent}) must be at least 10 below \
                 compaction.at_percent ({at_percent}), or a summary would not make room"
            ),
        }
    }
}

impl Compaction {
    /// Summarizing at the default thresholds.
    pub fn summarize() -> Compaction {
        Compaction {
            mode: Mode::Summarize,
            at_percent: AT_PERCENT_DEFAULT,
            keep_percent: KEEP_PERCENT_DEFAULT,
        }
    }

    /// Why a send's compaction cannot be taken, naming the member.
    pub fn check(&self) -> Result<(), CompactionRefused> {
        if !AT_PERCENT_RANGE.contains(&self.at_percent) {
            return Err(CompactionRefused::AtPercent);
        }
        if !KEEP_PERCENT_RANGE.contains(&self.keep_percent) {
            return Err(CompactionRefused::KeepPercent);
        }
        if self.keep_percent.saturating_add(10) > self.at_percent {
            return Err(CompactionRefused::NoRoom {
                keep_percent: self.keep_percent,
                at_percent: self.at_percent,
            });
        }
        Ok(())
    }

    /// The estimate, in tokens, at which older turns are summarized under `limit`.
    pub fn trigger(&self, limit: u64) -> u64 {
        limit.saturating_mul(u64::from(self.at_percent)) / 100
    }

    /// The tokens of recent turns kept as they are under `limit`.
    pub fn keep(&self, limit: u64) -> u64 {
        limit.saturating_mul(u64::from(self.keep_percent)) / 100
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_send_names_the_mode_and_takes_the_default_thresholds() {
        let c: Compaction = serde_json::from_str(r#"{"mode":"summarize"}"#).unwrap();
        assert_eq!(c, Compaction::summarize());
        assert_eq!(c.trigger(32_000), 25_600);
        assert_eq!(c.keep(32_000), 8_000);
        let off: Compaction = serde_json::from_str(r#"{"mode":"off"}"#).unwrap();
        assert_eq!(off.mode, Mode::Off);
        assert!(serde_json::from_str::<Compaction>(r#"{"mode":"shrink"}"#).is_err());
        assert!(serde_json::from_str::<Compaction>(r#"{"mode":"off","x":1}"#).is_err());
    }

    #[test]
    fn thresholds_out_of_bounds_are_named() {
        let mut c = Compaction::summarize();
        c.at_percent = 99;
        assert!(c.check().unwrap_err().to_string().contains("at_percent"));
        c.at_percent = 60;
        c.keep_percent = 55;
        assert!(c.check().unwrap_err().to_string().contains("keep_percent"));
        c.at_percent = 55;
        c.keep_percent = 50;
        assert!(c
            .check()
            .unwrap_err()
            .to_string()
            .contains("at least 10 below"));
        c.keep_percent = 50;
        c.at_percent = 60;
        assert!(c.check().is_ok());
    }
}
