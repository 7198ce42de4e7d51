//! What a send must be on its own, whatever the session holds: its send_id and prompt
//! within their limits, its credential id, its stop conditions within their bounds, a family
//! this build speaks and a credential that resolves, the prices a cost budget needs, the
//! tools it names, its compaction; and the WAL's copy of its catalog entry. A child of
//! `admission`, called by its `resolve`.

use super::*;

/// The run's compaction as the send asked for it: `off` or none is none.
pub(super) fn compaction(
    req: &SendRequest,
) -> Result<Option<broca_protocol::compaction::Compaction>, Refusal> {
    use broca_protocol::compaction::Mode;
    let Some(c) = req.compaction else {
        return Ok(None);
    };
    if c.mode == Mode::Off {
        return Ok(None);
    }
    c.check().map_err(|why| Refusal::InvalidField {
        field: "compaction",
        why: why.to_string(),
    })?;
    Ok(Some(c))
}

/// What a send must be whatever its model: a send_id and a prompt within their limits.
pub(super) fn check_request(req: &SendRequest) -> Result<(), Refusal> {
    let invalid = |why: String| Err(Refusal::InvalidParams(why));
    if let Some(send_id) = &req.send_id {
        if send_id.is_empty() || send_id.len() > SEND_ID_BYTES_MAX {
            return invalid(format!("send_id must have 1 to {SEND_ID_BYTES_MAX} bytes"));
        }
    }
    if req.sender.is_some() {
        return Err(Refusal::InvalidField {
            field: "sender",
            why: "a send's sender is its route's attested principal, never a request field".into(),
        });
    }
    // A template send's text is its template's rendering, made once its session is known.
    let templated = req.order.as_ref().is_some_and(|o| o.template.is_some());
    if req.prompt.is_empty() && !templated {
        return invalid("prompt is empty".into());
    }
    if req.prompt.len() > PROMPT_BYTES_MAX {
        return invalid(format!(
            "prompt has {} bytes; the limit is {PROMPT_BYTES_MAX}",
            req.prompt.len()
        ));
    }
    Ok(())
}

/// A credential id is an id (checked once the model resolves).
pub(super) fn check_credential_id(req: &SendRequest) -> Result<(), Refusal> {
    match &req.credential_id {
        // Never echo it: a secret pasted where an id belongs must not reach a log.
        Some(id) if !broca_protocol::is_credential_id(id) => Err(Refusal::InvalidParams(
            "credential_id must be env:NAME, file:NAME or vault:NAME (an id, never a secret)"
                .into(),
        )),
        _ => Ok(()),
    }
}

/// The run's stop conditions: its steps, its budgets and the session's input cap, each
/// within its bounds.
pub(super) fn stop_conditions(req: &SendRequest) -> Result<StopConditions, Refusal> {
    let max_steps = req.max_steps.unwrap_or(MAX_STEPS_DEFAULT);
    if !(1..=MAX_STEPS_LIMIT).contains(&max_steps) {
        return Err(Refusal::InvalidParams(format!(
            "max_steps must be 1 to {MAX_STEPS_LIMIT}"
        )));
    }
    if req.context_limit == Some(0) {
        return Err(Refusal::InvalidParams(
            "context_limit must be positive".into(),
        ));
    }
    if req.max_input_tokens == Some(0) {
        return Err(Refusal::InvalidField {
            field: "budget.max_input_tokens",
            why: "budget.max_input_tokens must be at least 1".into(),
        });
    }
    let budget = req.budget.clone().unwrap_or_default();
    for (field, value) in [
        ("stop_when.max_total_tokens", budget.max_total_tokens),
        ("stop_when.max_cost_micros", budget.max_cost_micros),
    ] {
        if value == Some(0) {
            return Err(Refusal::InvalidField {
                field,
                why: format!("{field} must be positive"),
            });
        }
    }
    Ok(StopConditions {
        max_steps,
        max_total_tokens: budget.max_total_tokens,
        max_cost_micros: budget.max_cost_micros,
        input_cap: req.max_input_tokens.map(|limit| InputCap {
            limit,
            spent: 0,
            unmeasured: false,
        }),
    })
}

/// The provider's family traits and the credential id the run uses, once this build speaks
/// the family and the credential resolves (its secret never leaves the check).
pub(super) fn check_provider(
    req: &SendRequest,
    entry: &catalog::ModelEntry,
    providers: &dyn ProviderCheck,
) -> Result<(broca_protocol::model::FamilyTraits, String), Refusal> {
    let spec = format!("{}/{}", entry.provider.id, entry.model);
    let family = &entry.provider.family;
    let traits = providers.family(family).map_err(|why| {
        Refusal::UnsupportedProvider(format!("{spec}: provider `{}`: {why}", entry.provider.id))
    })?;
    // A keyless provider (the demo model) names no credential variable: nothing to resolve.
    if entry.provider.credential_env.is_empty() && req.credential_id.is_none() {
        return Ok((traits, "none".to_string()));
    }
    let credential_id = req
        .credential_id
        .clone()
        .unwrap_or_else(|| format!("env:{}", entry.provider.credential_env));
    providers.credential(family, &credential_id).map_err(|p| {
        let why = format!("{spec}: {}", p.message);
        if p.outage {
            Refusal::CredentialUnavailable(why)
        } else {
            Refusal::AuthRequired(why)
        }
    })?;
    Ok((traits, credential_id))
}

/// A cost budget needs the prices of every measure the run's requests are billed for.
pub(super) fn check_priced(
    entry: &catalog::ModelEntry,
    cache_policy: CachePolicy,
) -> Result<(), Refusal> {
    let lacking = match entry.prices.as_ref() {
        None => Some("prices"),
        Some(p) if p.input.is_none() => Some("an input price"),
        Some(p) if p.output.is_none() => Some("an output price"),
        Some(p) if cache_policy == CachePolicy::Auto && p.cache_write.is_none() => Some(
            "a cache_write price (its requests write prompt caches; cache_policy off writes none)",
        ),
        Some(_) => None,
    };
    match lacking {
        Some(lacking) => Err(Refusal::BudgetUnpriced(format!(
            "a cost budget needs the model's prices, and the catalog has no {lacking} for {}/{}",
            entry.provider.id, entry.model
        ))),
        None => Ok(()),
    }
}

pub(super) fn select_tools(
    all: &[ToolSpec],
    wanted: Option<&[String]>,
) -> Result<Vec<ToolSpec>, Refusal> {
    let chosen: Vec<&ToolSpec> = match wanted {
        None => all.iter().collect(),
        Some(names) => {
            let mut chosen = Vec::with_capacity(names.len());
            for name in names {
                let found: Vec<&ToolSpec> = all.iter().filter(|t| &t.name == name).collect();
                if found.is_empty() {
                    return Err(Refusal::InvalidParams(format!("unknown tool `{name}`")));
                }
                chosen.extend(found);
            }
            chosen
        }
    };
    for (i, t) in chosen.iter().enumerate() {
        if chosen[..i].iter().any(|u| u.name == t.name) {
            return Err(Refusal::ToolNameCollision(t.name.clone()));
        }
    }
    Ok(chosen.into_iter().cloned().collect())
}

/// The WAL's copy of a catalog entry (the same fields, so the same digest).
pub fn freeze(entry: &catalog::ModelEntry) -> broca_wal::runrec::CatalogEntry {
    use broca_wal::runrec::{CatalogEntry, CatalogPriceTier, CatalogPrices, CatalogProvider};
    let p = &entry.provider;
    CatalogEntry {
        provider: CatalogProvider {
            id: p.id.clone(),
            family: p.family.clone(),
            base_url: p.base_url.clone(),
            credential_env: p.credential_env.clone(),
        },
        model: entry.model.clone(),
        context_window: entry.context_window,
        max_output: entry.max_output,
        prices: entry.prices.as_ref().map(|x| CatalogPrices {
            currency: x.currency.clone(),
            unit: x.unit.clone(),
            input: x.input,
            output: x.output,
            cache_read: x.cache_read,
            cache_write: x.cache_write,
            tiers: x
                .tiers
                .iter()
                .map(|t| CatalogPriceTier {
                    above_input_tokens: t.above_input_tokens,
                    input: t.input,
                    output: t.output,
                    cache_read: t.cache_read,
                    cache_write: t.cache_write,
                })
                .collect(),
        }),
        capability: (!entry.capability.is_unstated()).then(|| {
            broca_wal::runrec::CatalogCapability {
                structured_output: entry.capability.structured_output,
                input_modalities: entry.capability.input_modalities.clone(),
                input_mime_types: entry.capability.input_mime_types.clone(),
            }
        }),
    }
}
