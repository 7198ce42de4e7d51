//! The OpenAI Responses family: `POST /v1/responses` streamed as server-sent events, or the
//! same request as a `response.create` message over a WebSocket (a `wss://` base URL; `ws://`
//! on loopback) answered with the same events, one per message.

pub mod normalize;
pub mod render;

use broca_io::net::Scheme;
use broca_protocol::model::CredentialProblem;

use crate::{Aliases, AuthContext, Framing, Rendered, StreamNormalizer, WireFamily};
use broca_protocol::{ErrorClass, Request};

/// The family.
pub struct Family;

impl WireFamily for Family {
    fn id(&self) -> &'static str {
        broca_protocol::family::Family::OpenAiResponses.id()
    }

    fn render(&self, req: &Request, aliases: &Aliases) -> Rendered {
        render::render(req, aliases)
    }

    fn authorize(
        &self,
        rendered: &mut Rendered,
        auth: &AuthContext<'_>,
    ) -> Result<(), CredentialProblem> {
        super::openai_chat::bearer(rendered, auth.credential.api_key(self.id())?);
        Ok(())
    }

    fn framing(&self, scheme: Scheme) -> Framing {
        match scheme {
            Scheme::Ws | Scheme::Wss => Framing::WebSocket,
            Scheme::Http | Scheme::Https => Framing::Sse,
        }
    }

    fn websocket_message(&self, rendered: &Rendered) -> Option<String> {
        Some(render::websocket_message(rendered))
    }

    fn normalizer(&self, aliases: Aliases) -> Box<dyn StreamNormalizer> {
        Box::new(normalize::Normalizer::new(aliases))
    }

    fn classify_body(&self, _status: u16, body: &[u8]) -> Option<(ErrorClass, String)> {
        super::openai_chat::classify_openai_body(body)
    }
}
