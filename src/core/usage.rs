//! Usage export facts: every model attempt and step of a run yields one immutable spend fact,
//! derived from the WAL alone. A fact carries only the measures the provider reported (absent
//! is not zero, from the stream to the export) and the charge basis: the catalog prices frozen
//! into the run at admission.
//!
//! `fact_id` is blake3 over the canonical bytes of the identity fields (session, run, step,
//! attempt, kind), so an optional field added later changes neither those bytes nor the id.

use serde::{Deserialize, Serialize};

use broca_protocol::Usage;
use broca_wal::runrec::CatalogPrices as Prices;
use broca_wal::runrec::FrozenConfig;
use broca_wal::Record;

/// What a fact counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FactKind {
    /// A model step that completed.
    Step,
    /// A model attempt that failed (its usage, when the provider reported any, was spent).
    Attempt,
}

/// The prices a fact is charged at: the catalog entry frozen at admission.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChargeBasis {
    pub catalog_digest: String,
    #[serde(flatten)]
    pub prices: Prices,
}

/// One spend fact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpendFact {
    pub fact_id: String,
    pub kind: FactKind,
    /// The session address (hex).
    pub session: String,
    pub run_id: String,
    pub step: u32,
    pub attempt: u32,
    pub provider: String,
    pub model: String,
    pub credential_id: String,
    /// Exactly the measures the provider reported.
    pub usage: Usage,
    /// Absent when the catalog had no prices for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub charge_basis: Option<ChargeBasis>,
    /// When the step or attempt ended (the run's admission time for logs written before
    /// steps carried a time).
    pub at_unix_ms: u64,
    /// The WAL record the fact comes from.
    pub wal_seq: u64,
}

/// The identity fields, in their canonical order.
#[derive(Serialize)]
struct Identity<'a> {
    session: &'a str,
    run_id: &'a str,
    step: u32,
    attempt: u32,
    kind: FactKind,
}

/// blake3 of the identity fields' canonical JSON, hex (32 characters).
pub fn fact_id(session: &str, run_id: &str, step: u32, attempt: u32, kind: FactKind) -> String {
    let bytes = serde_json::to_vec(&Identity {
        session,
        run_id,
        step,
        attempt,
        kind,
    })
    .expect("identity fields serialize");
    blake3::hash(&bytes).to_hex()[..32].to_string()
}

/// Turns a session's records into facts, in log order. Keeps each run's frozen config from its
/// RunStarted, so it can be fed the records in several parts.
#[derive(Default)]
pub struct FactDeriver {
    session: String,
    runs: std::collections::HashMap<String, (FrozenConfig, u64)>,
}

impl FactDeriver {
    pub fn new(session: &str) -> FactDeriver {
        FactDeriver {
            session: session.to_string(),
            runs: Default::default(),
        }
    }

    /// The fact `record` (at `seq`) yields, if any.
    pub fn push(&mut self, seq: u64, record: &Record) -> Option<SpendFact> {
        let (run_id, step, attempt, kind, usage, at) = match record {
            Record::RunStarted(r) => {
                self.runs
                    .insert(r.run_id.clone(), (r.config.clone(), r.at_unix_ms));
                return None;
            }
            Record::ModelStepFinished(r) => (
                &r.run_id,
                r.step,
                r.attempt,
                FactKind::Step,
                r.usage,
                r.at_unix_ms,
            ),
            Record::ModelAttemptFinished(r) => (
                &r.run_id,
                r.step,
                r.attempt,
                FactKind::Attempt,
                r.usage.unwrap_or_default(),
                r.at_unix_ms,
            ),
            _ => return None,
        };
        let (config, started) = self.runs.get(run_id)?;
        Some(SpendFact {
            fact_id: fact_id(&self.session, run_id, step, attempt, kind),
            kind,
            session: self.session.clone(),
            run_id: run_id.clone(),
            step,
            attempt,
            provider: config.provider.clone(),
            model: config.model.clone(),
            credential_id: config.credential_id.clone(),
            usage,
            charge_basis: config.catalog.as_ref().and_then(|e| {
                e.prices.clone().map(|prices| ChargeBasis {
                    catalog_digest: config.catalog_digest.clone(),
                    prices,
                })
            }),
            at_unix_ms: at.unwrap_or(*started),
            wal_seq: seq,
        })
    }
}

/// The CSV header of [`to_csv_row`].
pub const CSV_HEADER: &str = "fact_id,kind,session,run_id,step,attempt,provider,model,credential_id,input_tokens,output_tokens,cache_read_tokens,cache_write_tokens,reasoning_tokens,currency,price_unit,input_price,output_price,cache_read_price,cache_write_price,at_unix_ms,wal_seq";

/// One CSV row; an absent measure or price is an empty cell, never 0.
pub fn to_csv_row(f: &SpendFact) -> String {
    fn opt<T: ToString>(v: Option<T>) -> String {
        v.map(|v| v.to_string()).unwrap_or_default()
    }
    fn text(s: &str) -> String {
        if s.contains([',', '"', '\n', '\r']) {
            format!("\"{}\"", s.replace('"', "\"\""))
        } else {
            s.to_string()
        }
    }
    let p = f.charge_basis.as_ref().map(|b| &b.prices);
    [
        text(&f.fact_id),
        text(match f.kind {
            FactKind::Step => "step",
            FactKind::Attempt => "attempt",
        }),
        text(&f.session),
        text(&f.run_id),
        f.step.to_string(),
        f.attempt.to_string(),
        text(&f.provider),
        text(&f.model),
        text(&f.credential_id),
        opt(f.usage.input),
        opt(f.usage.output),
        opt(f.usage.cache_read),
        opt(f.usage.cache_write),
        opt(f.usage.reasoning),
        text(p.map_or("", |p| p.currency.as_str())),
        text(p.map_or("", |p| p.unit.as_str())),
        opt(p.and_then(|p| p.input)),
        opt(p.and_then(|p| p.output)),
        opt(p.and_then(|p| p.cache_read)),
        opt(p.and_then(|p| p.cache_write)),
        f.at_unix_ms.to_string(),
        f.wal_seq.to_string(),
    ]
    .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fact_id_depends_only_on_the_identity_fields() {
        let a = fact_id("s", "run_1", 1, 1, FactKind::Step);
        assert_eq!(a.len(), 32);
        assert_eq!(a, fact_id("s", "run_1", 1, 1, FactKind::Step));
        assert_ne!(a, fact_id("s", "run_1", 1, 1, FactKind::Attempt));
        assert_ne!(a, fact_id("s", "run_1", 1, 2, FactKind::Step));
        // The canonical bytes are pinned: changing them would change every exported id.
        assert_eq!(
            serde_json::to_string(&Identity {
                session: "s",
                run_id: "r",
                step: 1,
                attempt: 2,
                kind: FactKind::Attempt
            })
            .unwrap(),
            r#"{"session":"s","run_id":"r","step":1,"attempt":2,"kind":"attempt"}"#
        );
    }

    #[test]
    fn absent_measures_are_empty_csv_cells() {
        let f = SpendFact {
            fact_id: "f".into(),
            kind: FactKind::Step,
            session: "s".into(),
            run_id: "r".into(),
            step: 1,
            attempt: 1,
            provider: "p".into(),
            model: "m,1".into(),
            credential_id: "env:K".into(),
            usage: Usage {
                output: Some(7),
                ..Usage::default()
            },
            charge_basis: None,
            at_unix_ms: 5,
            wal_seq: 9,
        };
        assert_eq!(
            to_csv_row(&f),
            "f,step,s,r,1,1,p,\"m,1\",env:K,,7,,,,,,,,,,5,9"
        );
        assert_eq!(
            CSV_HEADER.split(',').count(),
            to_csv_row(&f).split(',').count() - 1
        );
    }
}
