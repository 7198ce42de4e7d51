//! The fusiform model catalog's `catalog.get` answer (fusiform-protocol's
//! `CatalogGetResponse`) read as catalog entries broca can overlay on its own. Only facts
//! fusiform states are taken; a fact that is null, absent, withheld, unpriced, a stated zero
//! (fusiform cannot tell "free" from "not published") or borrowed from another provider's
//! row (`inherited_from`: not the route's own price) stays unknown, never defaulted.
//!
//! Facts used: `limit.context`, `limit.output`, `capability.structured_output` (when served), and the `rate.input|output|cache_read|
//! cache_write` rates (per million tokens, `units × 10^-exponent` of the currency; only USD
//! is taken, as broca's budgets are in USD), with their `.above_context.<n>` tiers.
//! fusiform's provider ids are models.dev's; each maps onto broca's providers of the same
//! API (`openai` onto both OpenAI families, `google` onto Gemini, `amazon-bedrock` onto
//! Bedrock).

use std::collections::BTreeMap;

use fusiform_protocol::CatalogGetResponse;
use serde_json::Value;

use crate::{Catalog, CatalogError, ModelSpec, PriceTier, Prices};

/// The facts broca reads of each model, by key prefix (what a `catalog.get` asks for:
/// fusiform answers only those, a fraction of the whole catalog).
pub const FACT_PREFIXES: &[&str] = &[
    "existence",
    "limit.",
    "rate.",
    "capability.structured_output",
    "capability.input_modalities",
];

/// broca's providers for one of fusiform's (models.dev's) provider ids.
fn providers_of(fusiform: &str) -> &'static [&'static str] {
    match fusiform {
        "anthropic" => &["anthropic"],
        "openai" => &["openai", "openai-responses"],
        "google" => &["gemini"],
        "amazon-bedrock" => &["bedrock"],
        _ => &[],
    }
}

/// A `catalog.get` answer read: its version (the change mark) and the catalog it gives.
#[derive(Debug, Clone, PartialEq)]
pub struct Read {
    pub catalog_version: i64,
    pub catalog: Catalog,
    /// What was left unknown that a reader may want to know of.
    pub notes: Vec<String>,
}

/// Reads a `catalog.get` answer.
pub fn read(answer: &Value) -> Result<Read, CatalogError> {
    let r: CatalogGetResponse = serde_json::from_value(answer.clone()).map_err(|e| {
        CatalogError::Json(format!("a catalog.get answer that does not decode: {e}"))
    })?;
    let mut models = Vec::new();
    let mut notes = Vec::new();
    for (id, facts) in &r.models {
        let Some((provider, model)) = id.split_once('/') else {
            notes.push(format!("`{id}` is not provider/model: left out"));
            continue;
        };
        let targets = providers_of(provider);
        if targets.is_empty() || model.is_empty() {
            continue;
        }
        if facts
            .get("existence")
            .is_some_and(|v| v == &Value::Bool(false))
        {
            continue;
        }
        let spec_of = |p: &str| ModelSpec {
            provider: p.to_string(),
            model: model.to_string(),
            context_window: limit(facts.get("limit.context")),
            max_output: limit(facts.get("limit.output")),
            prices: prices(facts, &mut Vec::new()),
            capability: crate::Capability {
                structured_output: facts
                    .get("capability.structured_output")
                    .and_then(Value::as_bool),
                input_modalities: facts.get("capability.input_modalities").and_then(strings),
                input_mime_types: None,
            },
        };
        let mut unknown = Vec::new();
        let _ = prices(facts, &mut unknown);
        if !unknown.is_empty() {
            notes.push(format!("{id}: {} left unknown", unknown.join(", ")));
        }
        models.extend(targets.iter().map(|p| spec_of(p)));
    }
    let source = format!(
        "fusiform catalog.get ({}), catalog_version {}, resolved at {} ms",
        r.source, r.catalog_version, r.resolved_at_ms
    );
    Ok(Read {
        catalog_version: r.catalog_version,
        catalog: Catalog {
            sources: vec![source],
            providers: Vec::new(),
            models,
        },
        notes,
    })
}

/// A limit: a positive integer, else unknown (fusiform serves a published 0 as null).
fn limit(v: Option<&Value>) -> Option<u64> {
    v.and_then(Value::as_u64).filter(|n| *n > 0)
}

const CLASSES: [&str; 4] = ["input", "output", "cache_read", "cache_write"];

/// The model's USD prices per million tokens, when fusiform states any; each rate it does not
/// state as this provider's own price is named in `unknown`.
fn prices(facts: &BTreeMap<String, Value>, unknown: &mut Vec<String>) -> Option<Prices> {
    let mut p = Prices {
        currency: "USD".into(),
        unit: "per_million_tokens".into(),
        input: None,
        output: None,
        cache_read: None,
        cache_write: None,
        tiers: Vec::new(),
    };
    let mut tiers: BTreeMap<u64, PriceTier> = BTreeMap::new();
    let mut any = false;
    for (key, value) in facts {
        let Some(rest) = key.strip_prefix("rate.") else {
            continue;
        };
        let (class, tier) = match rest.split_once(".above_context.") {
            Some((c, n)) => match n.parse::<u64>() {
                Ok(n) => (c, Some(n)),
                Err(_) => continue,
            },
            None => (rest, None),
        };
        if !CLASSES.contains(&class) {
            continue;
        }
        let Some(usd) = usd_per_million(facts, value, 0) else {
            unknown.push(key.clone());
            continue;
        };
        any = true;
        let slot = match tier {
            None => &mut p,
            Some(n) => {
                let t = tiers.entry(n).or_insert(PriceTier {
                    above_input_tokens: n,
                    input: None,
                    output: None,
                    cache_read: None,
                    cache_write: None,
                });
                match class {
                    "input" => t.input = Some(usd),
                    "output" => t.output = Some(usd),
                    "cache_read" => t.cache_read = Some(usd),
                    _ => t.cache_write = Some(usd),
                }
                continue;
            }
        };
        match class {
            "input" => slot.input = Some(usd),
            "output" => slot.output = Some(usd),
            "cache_read" => slot.cache_read = Some(usd),
            _ => slot.cache_write = Some(usd),
        }
    }
    p.tiers = tiers.into_values().collect();
    any.then_some(p)
}

/// A rate's value in USD per million tokens, when it is this provider's own stated price.
fn usd_per_million(facts: &BTreeMap<String, Value>, v: &Value, depth: u8) -> Option<f64> {
    match v.get("state")?.as_str()? {
        "priced" => {
            if v.get("inherited_from").is_some_and(|i| !i.is_null()) {
                return None;
            }
            if v.pointer("/unit_provenance/kind").and_then(Value::as_str) == Some("unknown") {
                return None;
            }
            if !v.get("currency")?.as_str()?.eq_ignore_ascii_case("USD") {
                return None;
            }
            let units = v.get("units")?.as_i64()?;
            let exponent = u32::try_from(v.get("exponent")?.as_u64()?).ok()?;
            if units < 0 || exponent > 18 {
                return None;
            }
            Some(units as f64 / 10f64.powi(exponent as i32))
        }
        // Billed at another key's rate: that key's value (one step, no loops).
        "billed_as" if depth == 0 => {
            let target = facts.get(v.get("key")?.as_str()?)?;
            usd_per_million(facts, target, 1)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stated_facts_are_taken_and_the_rest_stay_unknown() {
        let answer = json!({
            "source": "models.dev", "resolved_at_ms": 1_786_488_349_024i64,
            "catalog_version": 1_786_488_349_025i64,
            "models": {
                "anthropic/claude-sonnet-4-5": {
                    "limit.context": 200000, "limit.output": null,
                    "rate.input": {"state": "priced", "units": 3_000_000_000i64, "exponent": 9, "currency": "USD"},
                    "rate.output": {"state": "stated_zero"},
                    "rate.cache_read": {"state": "unpriced", "reason": "missing_rate"},
                    "rate.cache_write": {"state": "billed_as", "key": "rate.input"},
                    "rate.input.above_context.200000": {"state": "priced", "units": 6, "exponent": 0, "currency": "USD"}
                },
                "openai/gpt-x": {
                    "rate.input": {"state": "priced", "units": 125, "exponent": 2, "currency": "USD",
                                   "inherited_from": {"provider_id": "other", "family": "x", "auth_method": null}},
                    "limit.context": 0
                },
                "openrouter/whatever": {"limit.context": 1}
            }
        });
        let r = read(&answer).unwrap();
        assert_eq!(r.catalog_version, 1_786_488_349_025);
        let sonnet = r
            .catalog
            .models
            .iter()
            .find(|m| m.model == "claude-sonnet-4-5")
            .unwrap();
        assert_eq!(sonnet.provider, "anthropic");
        assert_eq!(sonnet.context_window, Some(200000));
        assert_eq!(sonnet.max_output, None, "null stays unknown");
        let p = sonnet.prices.as_ref().unwrap();
        assert_eq!(p.input, Some(3.0));
        assert_eq!(p.output, None, "a stated zero is not taken as free");
        assert_eq!(p.cache_read, None);
        assert_eq!(p.cache_write, Some(3.0), "billed as the input rate");
        assert_eq!(p.tiers.len(), 1);
        assert_eq!(
            (p.tiers[0].above_input_tokens, p.tiers[0].input),
            (200000, Some(6.0))
        );
        // Both OpenAI families; a borrowed price and a 0 limit are unknown.
        let gpt: Vec<&ModelSpec> = r
            .catalog
            .models
            .iter()
            .filter(|m| m.model == "gpt-x")
            .collect();
        assert_eq!(gpt.len(), 2);
        assert!(gpt
            .iter()
            .all(|m| m.prices.is_none() && m.context_window.is_none()));
        assert!(!r.catalog.models.iter().any(|m| m.model == "whatever"));
        assert!(
            r.notes.iter().any(|n| n.contains("rate.output")),
            "{:?}",
            r.notes
        );
        // What it gives overlays the built-in catalog and resolves.
        let c = Catalog::builtin().overlaid(&r.catalog);
        c.check_consistent().unwrap();
        let e = c.resolve("anthropic/claude-sonnet-4-5").unwrap();
        assert_eq!(e.max_output, None);
    }

    #[test]
    fn a_broken_answer_is_an_error() {
        assert!(read(&json!({"models": 3})).is_err());
    }
}

/// A fact that is a list of strings (anything else is not stated).
fn strings(v: &Value) -> Option<Vec<String>> {
    v.as_array()?
        .iter()
        .map(|s| s.as_str().map(str::to_string))
        .collect()
}
