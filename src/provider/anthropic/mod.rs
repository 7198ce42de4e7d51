//! The Anthropic Messages family: `POST /v1/messages` streamed as server-sent events.

pub mod normalize;
pub mod render;

use crate::{Aliases, AuthContext, Rendered, StreamNormalizer, WireFamily};
use broca_protocol::model::CredentialProblem;
use broca_protocol::{ErrorClass, Request};

/// The family.
pub struct Family;

impl WireFamily for Family {
    fn id(&self) -> &'static str {
        broca_protocol::family::Family::AnthropicMessages.id()
    }

    fn render(&self, req: &Request, aliases: &Aliases) -> Rendered {
        render::render(req, aliases)
    }

    fn marks_cache(&self) -> bool {
        true
    }

    fn authorize(
        &self,
        rendered: &mut Rendered,
        auth: &AuthContext<'_>,
    ) -> Result<(), CredentialProblem> {
        let key = auth.credential.api_key(self.id())?;
        rendered.headers.push(("x-api-key".into(), key.into()));
        Ok(())
    }

    fn normalizer(&self, aliases: Aliases) -> Box<dyn StreamNormalizer> {
        Box::new(normalize::Normalizer::new(aliases))
    }

    fn classify_body(&self, _status: u16, body: &[u8]) -> Option<(ErrorClass, String)> {
        let e = super::error_body(body)?;
        let kind = e.kind.as_deref().unwrap_or("error");
        Some((
            normalize::classify(kind, &e.message),
            format!("{kind}: {}", e.message),
        ))
    }
}
