//! The model catalog: providers, their wire families and base URLs, and what is known of their
//! models. This is the built-in catalog; a model it does not list is accepted for a known
//! provider with its limits and prices absent.

use serde::Serialize;

/// The version of the renderers this build ships; frozen into every run.
pub const RENDERER_VERSION: u32 = 1;

/// A provider's catalog entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProviderEntry {
    pub id: &'static str,
    pub family: &'static str,
    pub base_url: &'static str,
    /// The environment variable that holds the default credential.
    pub credential_env: &'static str,
}

/// A model's catalog entry, as resolved at admission.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelEntry {
    pub provider: ProviderEntry,
    pub model: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_output: Option<u64>,
}

const PROVIDERS: &[ProviderEntry] = &[
    ProviderEntry {
        id: "anthropic",
        family: "anthropic-messages",
        base_url: "https://api.anthropic.com",
        credential_env: "ANTHROPIC_API_KEY",
    },
    ProviderEntry {
        id: "openai",
        family: "openai-chat",
        base_url: "https://api.openai.com",
        credential_env: "OPENAI_API_KEY",
    },
    ProviderEntry {
        id: "openai-responses",
        family: "openai-responses",
        base_url: "https://api.openai.com",
        credential_env: "OPENAI_API_KEY",
    },
    ProviderEntry {
        id: "gemini",
        family: "gemini",
        base_url: "https://generativelanguage.googleapis.com",
        credential_env: "GEMINI_API_KEY",
    },
    ProviderEntry {
        id: "bedrock",
        family: "bedrock-converse",
        base_url: "https://bedrock-runtime.us-east-1.amazonaws.com",
        credential_env: "AWS_ACCESS_KEY_ID",
    },
    ProviderEntry {
        id: "scripted",
        family: "scripted",
        base_url: "http://127.0.0.1",
        credential_env: "BROCA_SCRIPTED_KEY",
    },
];

/// The built-in providers.
pub fn providers() -> &'static [ProviderEntry] {
    PROVIDERS
}

/// The provider `id`, when the catalog knows it.
pub fn provider(id: &str) -> Option<&'static ProviderEntry> {
    PROVIDERS.iter().find(|p| p.id == id)
}

/// Resolves `provider/model`. `Err` names what is wrong.
pub fn resolve(spec: &str) -> Result<ModelEntry, String> {
    let (provider, model) = spec
        .split_once('/')
        .filter(|(p, m)| !p.is_empty() && !m.is_empty())
        .ok_or_else(|| format!("model `{spec}` is not PROVIDER/MODEL"))?;
    let entry = PROVIDERS.iter().find(|p| p.id == provider).ok_or_else(|| {
        let known: Vec<&str> = PROVIDERS.iter().map(|p| p.id).collect();
        format!(
            "unknown provider `{provider}` (known: {})",
            known.join(", ")
        )
    })?;
    Ok(ModelEntry {
        provider: entry.clone(),
        model: model.to_string(),
        context_window: None,
        max_output: None,
    })
}

impl ModelEntry {
    /// blake3 of the entry's canonical JSON: frozen into RunStarted, compared on resume.
    pub fn digest(&self) -> String {
        let bytes = serde_json::to_vec(self).expect("catalog entries serialize");
        blake3::hash(&bytes).to_hex()[..32].to_string()
    }
}
