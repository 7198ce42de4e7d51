//! The last event a normalizer's fast path read, as a template: its bytes, with holes where
//! the values that change from one event of a stream to the next stood (a delta's text, a
//! sequence number, Gemini's running usage totals, Bedrock's padding). An event whose bytes
//! outside the holes are the template's is the same JSON document but for those values, so
//! it reads as the template did, with its own values; only the holes are read.

use crate::scan::{string_end, Raw};

/// A value that may change from one event to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hole {
    /// The delta's text: a JSON string, read.
    Text,
    /// A JSON string that is not read (padding).
    Str,
    /// A count the normalizer reads (its slot in [`Counts`]): a non-negative integer.
    Count(usize),
    /// A non-negative integer that is not read (a total, a sequence number).
    Other,
}

/// The counts a normalizer reads through the holes (Gemini: prompt, candidates, cached
/// content, thoughts, tool-use prompt).
pub(crate) type Counts = [Option<u64>; 5];

#[derive(Debug, Default)]
pub(crate) struct Template {
    valid: bool,
    /// The bytes outside the holes, in order.
    literal: Vec<u8>,
    /// Each hole, after the literal bytes up to this index of `literal`.
    holes: Vec<(usize, Hole)>,
}

impl Template {
    pub(crate) fn forget(&mut self) {
        self.valid = false;
    }

    /// Records `data` with holes at `spans` (byte ranges of `data`, in any order, not
    /// overlapping).
    pub(crate) fn record(&mut self, data: &str, spans: &mut [(usize, usize, Hole)]) {
        spans.sort_unstable_by_key(|s| s.0);
        self.literal.clear();
        self.holes.clear();
        let b = data.as_bytes();
        let mut at = 0;
        for &(start, end, hole) in spans.iter() {
            assert!(at <= start, "holes do not overlap");
            assert!(
                start <= end && end <= b.len(),
                "a hole lies inside the event"
            );
            self.literal.extend_from_slice(&b[at..start]);
            self.holes.push((self.literal.len(), hole));
            at = end;
        }
        self.literal.extend_from_slice(&b[at..]);
        assert_eq!(self.holes.len(), spans.len());
        self.valid = true;
    }

    /// The text and the counts at the holes of `data`, when all its other bytes are the
    /// template's; `None` otherwise (or when a hole does not hold a value of its kind).
    pub(crate) fn fill<'a>(&self, data: &'a str) -> Option<(Raw<'a>, Counts)> {
        if !self.valid {
            return None;
        }
        let b = data.as_bytes();
        let (mut at, mut from) = (0, 0);
        let (mut text, mut counts) = (None, [None; 5]);
        for &(end, hole) in &self.holes {
            let lit = &self.literal[from..end];
            if !b.get(at..)?.starts_with(lit) {
                return None;
            }
            at += lit.len();
            from = end;
            match hole {
                Hole::Text | Hole::Str => {
                    if b.get(at) != Some(&b'"') {
                        return None;
                    }
                    let (end, escaped) = string_end(b, at)?;
                    if hole == Hole::Text {
                        text = Some(Raw::Str {
                            quoted: data.get(at..end)?,
                            escaped,
                        });
                    }
                    at = end;
                }
                Hole::Count(_) | Hole::Other => {
                    let n = b[at..].iter().take_while(|c| c.is_ascii_digit()).count();
                    let v = Raw::Scalar(data.get(at..at + n)?).u64()?;
                    if let Hole::Count(k) = hole {
                        counts[k] = Some(v);
                    }
                    at += n;
                }
            }
        }
        (b.get(at..)? == &self.literal[from..]).then_some(())?;
        Some((text?, counts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_holes_may_differ() {
        let first = r#"{"a": "x","p": "pad","u": {"n": 12,"m": 3},"z": 1}"#;
        let mut t = Template::default();
        assert_eq!(t.fill(first), None, "nothing recorded yet");
        let at = |s: &str| first.find(s).unwrap();
        t.record(
            first,
            &mut [
                (at("12"), at("12") + 2, Hole::Count(1)),
                (at("\"x\""), at("\"x\"") + 3, Hole::Text),
                (at("3}"), at("3}") + 1, Hole::Count(3)),
                (at("1}"), at("1}") + 1, Hole::Other),
                (at("\"pad\""), at("\"pad\"") + 5, Hole::Str),
            ],
        );
        let (text, counts) = t
            .fill(r#"{"a": "y\"z","p": "padding","u": {"n": 130,"m": 0},"z": 7}"#)
            .unwrap();
        assert_eq!(text.string().unwrap(), "y\"z");
        assert_eq!(counts, [None, Some(130), None, Some(0), None]);
        for other in [
            r#"{"a": "x","p": "pad","u": {"n": 12,"m": 3},"y": 2}"#,
            r#"{"a": "x","p": "pad","u": {"n": 12,"m": 3},"z": -2}"#,
            r#"{"a": "x","p": "pad","u": {"n": 12,"m": 3},"z": 1} "#,
            r#"{"a": "x","p": "pad","u": {"n": 12,"m": 3},"z": "#,
            r#"{"a": x,"p": "pad","u": {"n": 12,"m": 3},"z": 1}"#,
            r#"{"a": "x","p": "pad","u": {"n": -1,"m": 3},"z": 1}"#,
            r#"{"a": "x","p": "pad","u": {"n": 1.5,"m": 3},"z": 1}"#,
            r#"{"a": "x","p": "pad","u": {"n": 012,"m": 3},"z": 1}"#,
            r#"{"a": "x","p": "pad","u": {"n": ,"m": 3},"z": 1}"#,
            r#"{"a": "x", "b": "y","p": "pad","u": {"n": 12,"m": 3},"z": 1}"#,
            r#"{"a": "x","p": 1,"u": {"n": 12,"m": 3},"z": 1}"#,
            r#"{"a": "x"#,
            "",
        ] {
            assert_eq!(t.fill(other), None, "{other}");
        }
        t.forget();
        assert_eq!(t.fill(first), None);
    }
}
