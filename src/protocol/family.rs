//! The wire families broca speaks, typed: each family's id is spelled once here, with the
//! facts core and protocol need of it (the media types it renders, which structured-output
//! modes its provider enforces, its strict schema subset). Every fact is an exhaustive match,
//! so a family added here is a compile error wherever a fact of it is missing.

/// A wire family (the catalog's `provider.family`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    AnthropicMessages,
    OpenAiChat,
    OpenAiResponses,
    Gemini,
    CodeAssist,
    BedrockConverse,
    ChatGpt,
    /// broca's own deterministic demo model (docs/demo.md): no wire, answered in process.
    Demo,
}

/// Every image and document type broca renders.
const MEDIA_ALL: &[&str] = &[
    "image/png",
    "image/jpeg",
    "image/gif",
    "image/webp",
    "application/pdf",
];
/// Gemini takes PNG, JPEG and WebP images (not GIF) and PDF documents inline.
const MEDIA_GEMINI: &[&str] = &["image/png", "image/jpeg", "image/webp", "application/pdf"];

/// How a family's strict mode narrows a JSON Schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StrictSubset {
    /// Every property of an object is required (OpenAI's routes).
    pub all_required: bool,
    /// The keywords Gemini's schema subset does not take are refused.
    pub gemini_keywords: bool,
}

impl Family {
    /// The families with a wire, in the order error messages list them.
    pub const WIRE: [Family; 7] = [
        Family::AnthropicMessages,
        Family::OpenAiChat,
        Family::OpenAiResponses,
        Family::Gemini,
        Family::CodeAssist,
        Family::BedrockConverse,
        Family::ChatGpt,
    ];

    /// The ids of [`Family::WIRE`], in its order.
    pub const WIRE_IDS: [&'static str; 7] = {
        let mut ids = [""; 7];
        let mut i = 0;
        while i < ids.len() {
            ids[i] = Family::WIRE[i].id();
            i += 1;
        }
        ids
    };

    /// The family's id, as catalogs and the WAL's frozen config spell it.
    pub const fn id(self) -> &'static str {
        match self {
            Family::AnthropicMessages => "anthropic-messages",
            Family::OpenAiChat => "openai-chat",
            Family::OpenAiResponses => "openai-responses",
            Family::Gemini => "gemini",
            Family::CodeAssist => "code-assist",
            Family::BedrockConverse => "bedrock-converse",
            Family::ChatGpt => "chatgpt",
            Family::Demo => "demo",
        }
    }

    /// The family an id names (`None`: one this build does not speak).
    pub fn parse(id: &str) -> Option<Family> {
        Family::WIRE
            .into_iter()
            .chain([Family::Demo])
            .find(|f| f.id() == id)
    }

    /// The media types the family renders, in the order `session.head.input` lists them.
    /// The demo model takes none.
    pub const fn mimes(self) -> &'static [&'static str] {
        match self {
            Family::AnthropicMessages
            | Family::BedrockConverse
            | Family::OpenAiChat
            | Family::OpenAiResponses
            | Family::ChatGpt => MEDIA_ALL,
            Family::Gemini | Family::CodeAssist => MEDIA_GEMINI,
            Family::Demo => &[],
        }
    }

    /// Which structured-output modes the family, as broca speaks it, can ask its provider to
    /// enforce: `(final text, tool input)`.
    pub const fn enforces(self) -> (bool, bool) {
        match self {
            // output_config.format and strict tools.
            Family::AnthropicMessages => (true, true),
            // response_format / text.format json_schema, and strict functions.
            Family::OpenAiChat | Family::OpenAiResponses => (true, true),
            // responseJsonSchema; its function declarations are not constrained.
            Family::Gemini => (true, false),
            Family::CodeAssist | Family::BedrockConverse | Family::ChatGpt | Family::Demo => {
                (false, false)
            }
        }
    }

    /// How the family's strict mode narrows a schema.
    pub const fn strict_subset(self) -> StrictSubset {
        StrictSubset {
            all_required: matches!(self, Family::OpenAiChat | Family::OpenAiResponses),
            gemini_keywords: matches!(self, Family::Gemini),
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_reads_back_from_its_id_and_no_id_is_spelled_twice() {
        let all: Vec<Family> = Family::WIRE.into_iter().chain([Family::Demo]).collect();
        for f in &all {
            assert_eq!(Family::parse(f.id()), Some(*f));
        }
        let mut ids: Vec<&str> = all.iter().map(|f| f.id()).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), all.len(), "each id names one family");
        assert_eq!(
            Family::parse("anthropic"),
            None,
            "a provider is not a family"
        );
    }

    #[test]
    fn the_families_facts_are_what_their_providers_take() {
        assert!(Family::AnthropicMessages.mimes().contains(&"image/gif"));
        assert!(!Family::Gemini.mimes().contains(&"image/gif"));
        assert!(Family::Demo.mimes().is_empty());
        assert_eq!(Family::Gemini.enforces(), (true, false));
        assert!(Family::OpenAiResponses.strict_subset().all_required);
        assert!(!Family::AnthropicMessages.strict_subset().all_required);
    }
}
