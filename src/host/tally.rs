//! Process-wide counters by one label (an outcome, a state), for the families the shards do
//! not count themselves: a handful of label values each, so a short list under a lock.

use std::sync::Mutex;

/// Counts by label value, in first-seen order.
pub(crate) struct Tally {
    counts: Mutex<Vec<(&'static str, u64)>>,
}

impl Tally {
    pub(crate) const fn new() -> Tally {
        Tally {
            counts: Mutex::new(Vec::new()),
        }
    }

    /// One more of `value`.
    pub(crate) fn add(&self, value: &'static str) {
        if let Ok(mut counts) = self.counts.lock() {
            match counts.iter_mut().find(|(v, _)| *v == value) {
                Some((_, n)) => *n += 1,
                None => counts.push((value, 1)),
            }
        }
    }

    /// The counter family `name` (labelled `label`) in the Prometheus text format.
    pub(crate) fn render(&self, name: &str, help: &str, label: &str) -> String {
        let mut out = format!("# HELP {name} {help}\n# TYPE {name} counter\n");
        if let Ok(counts) = self.counts.lock() {
            for (value, n) in counts.iter() {
                out.push_str(&format!("{name}{{{label}=\"{value}\"}} {n}\n"));
            }
        }
        out
    }

    /// The counts as a JSON object (`health.check`'s metrics).
    pub(crate) fn json(&self) -> serde_json::Value {
        let counts = self.counts.lock().map(|c| c.clone()).unwrap_or_default();
        serde_json::Value::Object(
            counts
                .into_iter()
                .map(|(v, n)| (v.to_string(), n.into()))
                .collect(),
        )
    }
}
