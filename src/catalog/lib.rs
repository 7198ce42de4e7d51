//! The model catalog (the brief's broca-catalog role): providers (wire family, base URL, the
//! environment variable of their default credential) and models (context window, max output,
//! prices). The built-in catalog ships in `builtin.json`; an override file and a catalog
//! service add or replace entries (`load.rs`). A model the catalog does not list is accepted
//! for a known provider, with its limits and prices absent.
//!
//! The entry a send resolves is frozen into its RunStarted (with a digest); a run always uses
//! its frozen entry, and a resume whose entry drifted incompatibly (another wire family) is
//! refused.
//!
//! Where things are: the model catalog: built-in entries, overrides and the service's answer
//! with owner-only last-good copies, fusiform's answer read into entries

pub mod fusiform;
pub mod load;

use std::fmt;
use std::sync::{Arc, OnceLock, RwLock};

use serde::{Deserialize, Serialize};

/// The version of the renderers this build ships; frozen into every run.
pub const RENDERER_VERSION: u32 = 1;

/// A provider's catalog entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderEntry {
    pub id: String,
    pub family: String,
    pub base_url: String,
    /// The environment variable that holds the default credential.
    pub credential_env: String,
}

/// What a model costs, per `unit` of tokens, in `currency`. A price not listed is unknown,
/// never zero.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prices {
    pub currency: String,
    /// `per_million_tokens`.
    pub unit: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<f64>,
    /// Long-context prices: a request whose total input is above a tier's threshold is
    /// charged at that tier's prices (the highest threshold it passes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tiers: Vec<PriceTier>,
}

/// Prices for requests whose total input is above `above_input_tokens`; a price the tier
/// does not list is the base price.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceTier {
    pub above_input_tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<f64>,
}

/// A model as a catalog lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    pub provider: String,
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prices: Option<Prices>,
    /// What the model can do, where the catalog states it (absent: unknown).
    #[serde(default, skip_serializing_if = "Capability::is_unstated")]
    pub capability: Capability,
}

/// What a model can do, as a catalog row states it; a capability not stated is unknown,
/// never `false`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capability {
    /// Whether the route constrains output to a JSON Schema (final text and tool input).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_output: Option<bool>,
    /// The input modalities the model takes (`text`, `image`, `pdf`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_modalities: Option<Vec<String>>,
    /// The media types the model takes, where narrower than what its family renders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_mime_types: Option<Vec<String>>,
}

impl Capability {
    pub fn is_unstated(&self) -> bool {
        self.structured_output.is_none()
            && self.input_modalities.is_none()
            && self.input_mime_types.is_none()
    }
}

/// The model name of a provider-wide row: its facts hold for every model of the provider
/// that has no row of its own (a self-hosted server whose models all share them).
pub const ANY_MODEL: &str = "*";

/// A model's catalog entry, as resolved at admission and frozen into the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelEntry {
    pub provider: ProviderEntry,
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prices: Option<Prices>,
    #[serde(default, skip_serializing_if = "Capability::is_unstated")]
    pub capability: Capability,
}

/// A whole catalog.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catalog {
    /// Where the entries' facts come from, and when they were taken (the built-in catalog
    /// says; an override or the catalog service may).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<String>,
    #[serde(default)]
    pub providers: Vec<ProviderEntry>,
    #[serde(default)]
    pub models: Vec<ModelSpec>,
}

impl Catalog {
    /// The catalog this build ships.
    pub fn builtin() -> Catalog {
        serde_json::from_str(include_str!("builtin.json")).expect("the built-in catalog parses")
    }

    /// Parses a catalog (or overrides) from JSON, checking each entry.
    pub fn parse(text: &str) -> Result<Catalog, CatalogError> {
        let c: Catalog =
            serde_json::from_str(text).map_err(|e| CatalogError::Json(e.to_string()))?;
        for p in &c.providers {
            if p.id.is_empty() || p.id.contains('/') {
                return Err(CatalogError::entry(
                    &p.id,
                    "a provider id must be non-empty, without `/`",
                ));
            }
            check_base_url(&p.id, &p.base_url)?;
        }
        for m in &c.models {
            let id = format!("{}/{}", m.provider, m.model);
            if m.model.is_empty() {
                return Err(CatalogError::entry(&id, "a model has no name"));
            }
            if let Some(p) = &m.prices {
                let mut all = vec![p.input, p.output, p.cache_read, p.cache_write];
                for t in &p.tiers {
                    all.extend([t.input, t.output, t.cache_read, t.cache_write]);
                }
                if p.tiers
                    .windows(2)
                    .any(|w| w[0].above_input_tokens >= w[1].above_input_tokens)
                {
                    return Err(CatalogError::entry(
                        &id,
                        "price tiers must be listed by rising above_input_tokens",
                    ));
                }
                if all.iter().flatten().any(|v| !v.is_finite() || *v < 0.0) {
                    return Err(CatalogError::entry(&id, "prices must be finite and >= 0"));
                }
                if p.unit != "per_million_tokens" {
                    return Err(CatalogError::entry(
                        &id,
                        format!("price unit `{}` is not per_million_tokens", p.unit),
                    ));
                }
            }
        }
        Ok(c)
    }

    /// This catalog with `over`'s providers and models added, replacing entries of the same
    /// provider id, or the same provider and model.
    pub fn overlaid(mut self, over: &Catalog) -> Catalog {
        for p in &over.providers {
            match self.providers.iter_mut().find(|q| q.id == p.id) {
                Some(q) => *q = p.clone(),
                None => self.providers.push(p.clone()),
            }
        }
        for m in &over.models {
            match self
                .models
                .iter_mut()
                .find(|n| n.provider == m.provider && n.model == m.model)
            {
                Some(n) => *n = m.clone(),
                None => self.models.push(m.clone()),
            }
        }
        debug_assert!(
            over.providers
                .iter()
                .all(|p| self.providers.iter().any(|q| q.id == p.id)),
            "every overriding provider is in the result"
        );
        self
    }

    /// Every model names a provider of the catalog.
    pub fn check_consistent(&self) -> Result<(), CatalogError> {
        for m in &self.models {
            if !self.providers.iter().any(|p| p.id == m.provider) {
                return Err(CatalogError::entry(
                    &format!("{}/{}", m.provider, m.model),
                    "the model names an unknown provider",
                ));
            }
        }
        Ok(())
    }

    /// Resolves `provider/model`. `Err` names what is wrong.
    pub fn resolve(&self, spec: &str) -> Result<ModelEntry, ResolveError> {
        if spec.len() > MODEL_SPEC_BYTES_MAX {
            return Err(ResolveError::TooLong { bytes: spec.len() });
        }
        if let Some(c) = spec.chars().find(|c| c.is_control() || c.is_whitespace()) {
            let spec = spec.escape_debug().to_string();
            return Err(ResolveError::Character { spec, c });
        }
        let (provider, model) = spec
            .split_once('/')
            .filter(|(p, m)| !p.is_empty() && !m.is_empty())
            .ok_or_else(|| ResolveError::NotProviderModel { spec: spec.into() })?;
        let entry = self
            .providers
            .iter()
            .find(|p| p.id == provider)
            .ok_or_else(|| ResolveError::UnknownProvider {
                provider: provider.into(),
                known: self.providers.iter().map(|p| p.id.clone()).collect(),
            })?;
        let row = |name: &str| {
            self.models
                .iter()
                .find(|m| m.provider == provider && m.model == name)
        };
        let listed = row(model).or_else(|| row(ANY_MODEL));
        debug_assert!(spec.len() <= MODEL_SPEC_BYTES_MAX && !model.contains(char::is_whitespace));
        Ok(ModelEntry {
            provider: entry.clone(),
            model: model.to_string(),
            context_window: listed.and_then(|m| m.context_window),
            max_output: listed.and_then(|m| m.max_output),
            prices: listed.and_then(|m| m.prices.clone()),
            capability: listed.map(|m| m.capability.clone()).unwrap_or_default(),
        })
    }
}

/// A base URL's shape: `scheme://host[:port][/prefix]` with a scheme broca speaks (the
/// transport parses it fully when it connects).
fn check_base_url(id: &str, url: &str) -> Result<(), CatalogError> {
    let bad = |problem: String| CatalogError::entry(id, problem);
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad(format!("base URL `{url}` has no scheme://")))?;
    if !matches!(scheme, "http" | "https" | "ws" | "wss") {
        return Err(bad(format!(
            "base URL `{url}`: scheme `{scheme}` is not http(s) or ws(s)"
        )));
    }
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    if host.is_empty() || host.contains(char::is_whitespace) {
        return Err(bad(format!("base URL `{url}` has no host")));
    }
    if rest.contains(['?', '#']) {
        return Err(bad(format!("base URL `{url}` has a query or fragment")));
    }
    Ok(())
}

/// The longest `PROVIDER/MODEL` admission takes.
pub const MODEL_SPEC_BYTES_MAX: usize = 256;

impl ModelEntry {
    /// blake3 of the entry's canonical JSON: frozen into RunStarted.
    pub fn digest(&self) -> String {
        let bytes = serde_json::to_vec(self).expect("catalog entries serialize");
        let digest = blake3::hash(&bytes).to_hex()[..32].to_string();
        debug_assert!(
            digest.bytes().all(|b| b.is_ascii_hexdigit()),
            "a digest is hex"
        );
        digest
    }

    /// Why a run admitted with `self` cannot resume with `now`, if it cannot: another wire
    /// family renders other bytes. Limits, prices and the base URL may change (the run keeps
    /// its frozen values; the base URL is where the next call goes).
    pub fn incompatible_with(&self, now: &ModelEntry) -> Option<String> {
        (self.provider.family != now.provider.family).then(|| {
            format!(
                "provider `{}` was the {} family at admission and is {} now",
                self.provider.id, self.provider.family, now.provider.family
            )
        })
    }
}

fn installed() -> &'static RwLock<Arc<Catalog>> {
    static CURRENT: OnceLock<RwLock<Arc<Catalog>>> = OnceLock::new();
    CURRENT.get_or_init(|| RwLock::new(Arc::new(Catalog::builtin())))
}

/// Makes `catalog` the one this process resolves with (the built-in one until then).
pub fn install(catalog: Catalog) {
    *installed().write().expect("the catalog lock") = Arc::new(catalog);
}

/// The catalog in use.
pub fn current() -> Arc<Catalog> {
    installed().read().expect("the catalog lock").clone()
}

/// The providers of the catalog in use.
pub fn providers() -> Vec<ProviderEntry> {
    current().providers.clone()
}

/// The provider `id`, when the catalog in use knows it.
pub fn provider(id: &str) -> Option<ProviderEntry> {
    current().providers.iter().find(|p| p.id == id).cloned()
}

/// Resolves `provider/model` in the catalog in use.
pub fn resolve(spec: &str) -> Result<ModelEntry, ResolveError> {
    current().resolve(spec)
}

/// A catalog (or overrides) that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CatalogError {
    /// The text is not a catalog's JSON.
    Json(String),
    /// One entry (a provider id, or PROVIDER/MODEL) breaks a rule.
    Entry { id: String, problem: String },
    /// The file could not be read or written.
    File {
        path: std::path::PathBuf,
        message: String,
    },
    /// A kept copy that is not private to this user.
    Private(broca_owner_only::OwnerOnlyError),
    /// The catalog service gave no answer (how it failed).
    Unavailable(String),
}

impl CatalogError {
    fn entry(id: &str, problem: impl Into<String>) -> CatalogError {
        CatalogError::Entry {
            id: id.into(),
            problem: problem.into(),
        }
    }
}

impl fmt::Display for CatalogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CatalogError::Json(message) => f.write_str(message),
            CatalogError::Entry { id, problem } => write!(f, "`{id}`: {problem}"),
            CatalogError::File { path, message } => write!(f, "{}: {message}", path.display()),
            CatalogError::Private(e) => write!(f, "{e}"),
            CatalogError::Unavailable(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for CatalogError {}

/// Why a `PROVIDER/MODEL` does not resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolveError {
    TooLong {
        bytes: usize,
    },
    /// A space or control character (the spec escaped).
    Character {
        spec: String,
        c: char,
    },
    NotProviderModel {
        spec: String,
    },
    UnknownProvider {
        provider: String,
        known: Vec<String>,
    },
}

impl fmt::Display for ResolveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResolveError::TooLong { bytes } => write!(
                f,
                "model has {bytes} bytes; the limit is {MODEL_SPEC_BYTES_MAX}"
            ),
            ResolveError::Character { spec, c } => write!(
                f,
                "model `{spec}` holds {c:?}: a model id has no spaces or control characters"
            ),
            ResolveError::NotProviderModel { spec } => {
                write!(f, "model `{spec}` is not PROVIDER/MODEL")
            }
            ResolveError::UnknownProvider { provider, known } => write!(
                f,
                "unknown provider `{provider}` (known: {})",
                known.join(", ")
            ),
        }
    }
}

impl std::error::Error for ResolveError {}

impl From<ResolveError> for String {
    fn from(e: ResolveError) -> String {
        e.to_string()
    }
}

impl From<CatalogError> for String {
    fn from(e: CatalogError) -> String {
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_catalog_is_consistent_and_resolves_listed_and_unlisted_models() {
        let c = Catalog::builtin();
        c.check_consistent().unwrap();
        let sonnet = c.resolve("anthropic/claude-sonnet-4-5").unwrap();
        assert_eq!(sonnet.context_window, Some(200_000));
        assert_eq!(sonnet.prices.as_ref().unwrap().output, Some(15.0));
        for bad in [
            "anthropic/m\r\nx-injected: 1",
            "anthropic/a b",
            "anthropic/\u{0}",
        ] {
            let e = c.resolve(bad).unwrap_err();
            assert!(matches!(e, ResolveError::Character { .. }), "{e}");
            let e = e.to_string();
            assert!(e.contains("no spaces or control characters"), "{e}");
            assert!(!e.contains('\n') && !e.contains('\r'), "{e}");
        }
        assert_eq!(
            c.resolve(&format!("anthropic/{}", "m".repeat(300))),
            Err(ResolveError::TooLong { bytes: 310 })
        );
        let other = c.resolve("anthropic/some-new-model").unwrap();
        assert_eq!((other.context_window, other.prices), (None, None));
        assert!(c
            .resolve("nope/x")
            .unwrap_err()
            .to_string()
            .contains("unknown provider `nope`"));
        assert_eq!(
            c.resolve("anthropic"),
            Err(ResolveError::NotProviderModel {
                spec: "anthropic".into()
            })
        );
    }

    #[test]
    fn every_builtin_provider_lists_models_with_their_limits_and_prices() {
        let c = Catalog::builtin();
        // Billed by subscription: no per-token prices to list.
        let unpriced = ["code-assist", "chatgpt"];
        for p in c.providers.iter().filter(|p| p.id != "demo") {
            let models: Vec<&ModelSpec> = c.models.iter().filter(|m| m.provider == p.id).collect();
            assert!(models.len() >= 4, "{}: {} models", p.id, models.len());
            for m in models {
                let name = format!("{}/{}", p.id, m.model);
                assert!(
                    m.context_window.is_some() && m.max_output.is_some(),
                    "{name}: limits"
                );
                let prices = m.prices.as_ref();
                if unpriced.contains(&p.id.as_str()) {
                    assert!(prices.is_none(), "{name} is billed by subscription");
                } else {
                    let prices = prices.unwrap_or_else(|| panic!("{name}: prices"));
                    assert!(prices.input.is_some() && prices.output.is_some(), "{name}");
                }
            }
        }
        assert!(
            c.sources.iter().any(|s| s.contains("2025-11")),
            "{:?}",
            c.sources
        );
    }

    #[test]
    fn overrides_replace_and_add_entries() {
        let over = Catalog::parse(
            r#"{"models": [
                {"provider": "anthropic", "model": "claude-sonnet-4-5", "context_window": 1000000,
                 "prices": {"currency": "USD", "unit": "per_million_tokens", "input": 6.0}},
                {"provider": "openai", "model": "my-finetune"}]}"#,
        )
        .unwrap();
        let c = Catalog::builtin().overlaid(&over);
        let s = c.resolve("anthropic/claude-sonnet-4-5").unwrap();
        assert_eq!(s.context_window, Some(1_000_000));
        assert_eq!(s.prices.unwrap().output, None, "absent stays absent");
        assert!(c.models.iter().any(|m| m.model == "my-finetune"));
    }

    #[test]
    fn bad_catalogs_say_what_is_wrong() {
        for (text, want) in [
            (
                r#"{"models": [{"provider": "x", "model": ""}]}"#,
                "has no name",
            ),
            (
                r#"{"models": [{"provider": "x", "model": "m", "prices": {"currency": "USD", "unit": "per_token", "input": 1}}]}"#,
                "not per_million_tokens",
            ),
            (
                r#"{"models": [{"provider": "x", "model": "m", "prices": {"currency": "USD", "unit": "per_million_tokens", "input": -1}}]}"#,
                ">= 0",
            ),
            (
                r#"{"providers": [{"id": "a/b", "family": "f", "base_url": "https://h", "credential_env": "K"}]}"#,
                "without `/`",
            ),
            (r#"{"modles": []}"#, "unknown field"),
        ] {
            let err = Catalog::parse(text).unwrap_err().to_string();
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn only_a_family_change_is_incompatible() {
        let c = Catalog::builtin();
        let then = c.resolve("openai/gpt-5").unwrap();
        let mut now = then.clone();
        now.prices = None;
        now.context_window = Some(1);
        assert_eq!(then.incompatible_with(&now), None);
        now.provider.family = "openai-responses".into();
        assert!(then
            .incompatible_with(&now)
            .unwrap()
            .contains("openai-chat family"));
    }
}
