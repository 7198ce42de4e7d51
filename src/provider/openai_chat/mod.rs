//! The OpenAI Chat Completions family: `POST /v1/chat/completions` streamed as server-sent
//! events, usage asked for with `stream_options.include_usage`.

pub mod normalize;
pub mod render;

use crate::{Aliases, AuthContext, Rendered, StreamNormalizer, WireFamily};
use broca_protocol::model::CredentialProblem;
use broca_protocol::{ErrorClass, Request};

/// The family.
pub struct Family;

impl WireFamily for Family {
    fn id(&self) -> &'static str {
        broca_protocol::family::Family::OpenAiChat.id()
    }

    fn render(&self, req: &Request, aliases: &Aliases) -> Rendered {
        render::render(req, aliases)
    }

    fn authorize(
        &self,
        rendered: &mut Rendered,
        auth: &AuthContext<'_>,
    ) -> Result<(), CredentialProblem> {
        bearer(rendered, auth.credential.api_key(self.id())?);
        Ok(())
    }

    fn normalizer(&self, aliases: Aliases) -> Box<dyn StreamNormalizer> {
        Box::new(normalize::Normalizer::new(aliases))
    }

    fn classify_body(&self, _status: u16, body: &[u8]) -> Option<(ErrorClass, String)> {
        classify_openai_body(body)
    }
}

/// `Authorization: Bearer <secret>`.
pub(crate) fn bearer(rendered: &mut Rendered, secret: &str) {
    rendered
        .headers
        .push(("authorization".into(), format!("Bearer {secret}")));
}

/// The class an OpenAI error body gives (by its code and type).
pub(crate) fn classify_openai_body(body: &[u8]) -> Option<(ErrorClass, String)> {
    let e = crate::error_body(body)?;
    let class = normalize::classify(e.kind.as_deref(), e.code.as_deref());
    let label = e.code.or(e.kind).unwrap_or_else(|| "error".into());
    Some((class, format!("{label}: {}", e.message)))
}
