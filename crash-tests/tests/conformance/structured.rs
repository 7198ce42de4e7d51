//! What the structured-output cases need of the adapter: routes whose catalog row states
//! schema support (an override catalog file with one provider per stated answer, each a
//! provider-wide `*` row, all on the scripted model), and the schemas a model request
//! carried, read from the request as the scripted model received it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cortexkit_role_llm_runner::structured_output::SUBMIT_RESULT_TOOL;
use cortexkit_role_llm_runner_conformance::ModelRequestObservation;
use serde_json::{json, Value};

/// Each session's stated support (`None`: the catalog does not say), and the sessions whose
/// model takes media (an image and a PDF, PNG alone of the images) or only text.
#[derive(Clone, Default)]
pub struct Support(
    Arc<Mutex<HashMap<String, Option<bool>>>>,
    Arc<Mutex<HashMap<String, bool>>>,
);

impl Support {
    pub fn set(&self, session: &str, supported: Option<bool>) {
        self.0
            .lock()
            .unwrap()
            .insert(session.to_string(), supported);
    }

    /// The catalog provider the session's sends name: the wire's own provider (whose rows
    /// state nothing), or its variant whose `*` row states `supported`.
    /// The session's sends name a provider whose models take media, or only text.
    pub fn set_media(&self, session: &str, accepts: bool) {
        self.1.lock().unwrap().insert(session.to_string(), accepts);
    }

    pub fn provider(&self, session: &str, wire: &str) -> String {
        match self.1.lock().unwrap().get(session) {
            Some(true) => return format!("{wire}-vision"),
            Some(false) => return format!("{wire}-text-only"),
            None => {}
        }
        match self.0.lock().unwrap().get(session).copied().flatten() {
            None => wire.to_string(),
            Some(true) => format!("{wire}-schemas"),
            Some(false) => format!("{wire}-no-schemas"),
        }
    }
}

/// The override catalog: for each wire the scripted model speaks, a provider whose models all
/// constrain output to schemas and one whose models all do not.
pub fn catalog(model_url: &str) -> Value {
    let mut providers = Vec::new();
    let mut models = Vec::new();
    for (wire, family, env) in [
        ("anthropic", "anthropic-messages", "ANTHROPIC_API_KEY"),
        ("openai", "openai-chat", "OPENAI_API_KEY"),
    ] {
        for (suffix, supported) in [("schemas", true), ("no-schemas", false)] {
            let id = format!("{wire}-{suffix}");
            providers.push(json!({"id": id, "family": family, "base_url": model_url,
                "credential_env": env}));
            models.push(json!({"provider": id, "model": "*",
                "capability": {"structured_output": supported}}));
        }
        for (suffix, capability) in [
            (
                "vision",
                json!({"input_modalities": ["text", "image", "pdf"],
                "input_mime_types": ["image/png", "application/pdf"]}),
            ),
            ("text-only", json!({"input_modalities": ["text"]})),
        ] {
            let id = format!("{wire}-{suffix}");
            providers.push(json!({"id": id, "family": family, "base_url": model_url,
                "credential_env": env}));
            models.push(json!({"provider": id, "model": "*", "capability": capability}));
        }
    }
    json!({"sources": ["the conformance adapter's routes"], "providers": providers,
        "models": models})
}

/// The request's schemas: the one shaping its final text (Anthropic's
/// `output_config.format`, the chat wire's `response_format`), and `submit_result`'s input
/// schema.
pub fn observe(body: &Value, seen: ModelRequestObservation) -> ModelRequestObservation {
    let final_text = [
        &body["output_config"]["format"]["schema"],
        &body["response_format"]["json_schema"]["schema"],
    ]
    .into_iter()
    .find(|s| !s.is_null())
    .cloned();
    let submit = body["tools"].as_array().and_then(|tools| {
        tools.iter().find_map(|t| {
            if t["name"] == SUBMIT_RESULT_TOOL {
                Some(t["input_schema"].clone())
            } else if t["function"]["name"] == SUBMIT_RESULT_TOOL {
                Some(t["function"]["parameters"].clone())
            } else {
                None
            }
        })
    });
    let seen = match final_text {
        Some(schema) => seen.with_final_text_schema(schema),
        None => seen,
    };
    match submit {
        Some(schema) => seen.with_submit_result_schema(schema),
        None => seen,
    }
}
