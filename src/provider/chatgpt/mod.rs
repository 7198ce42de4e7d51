//! The ChatGPT/Codex family (`chatgpt/MODEL`): the Responses family against the ChatGPT
//! backend (`https://chatgpt.com/backend-api/codex`, `POST /responses`), over server-sent
//! events or, with a `wss://` base URL, `response.create` messages over a WebSocket. What is
//! particular to the backend (which headers go, how a refusal and a usage-limit answer are
//! classified, how its quota headers are read) is in [`policy`].

pub mod policy;

use broca_io::net::Scheme;
use broca_protocol::model::CredentialProblem;

use crate::{
    openai_responses, Aliases, AuthContext, Framing, Rendered, StreamNormalizer, WireFamily,
};
use broca_protocol::{ErrorClass, Quota, Request};

/// The family.
pub struct Family;

impl WireFamily for Family {
    fn id(&self) -> &'static str {
        broca_protocol::family::Family::ChatGpt.id()
    }

    fn render(&self, req: &Request, aliases: &Aliases) -> Rendered {
        let mut r = openai_responses::render::render(req, aliases);
        r.path = "/responses".into();
        r
    }

    fn takes(&self, credential: &crate::credential::Credential) -> Result<(), CredentialProblem> {
        policy::account(credential, self.id()).map(|_| ())
    }

    fn authorize(
        &self,
        rendered: &mut Rendered,
        auth: &AuthContext<'_>,
    ) -> Result<(), CredentialProblem> {
        let (token, account) = policy::account(auth.credential, self.id())?;
        rendered.headers.extend(policy::headers(token, &account));
        Ok(())
    }

    fn framing(&self, scheme: Scheme) -> Framing {
        openai_responses::Family.framing(scheme)
    }

    fn websocket_message(&self, rendered: &Rendered) -> Option<String> {
        Some(openai_responses::render::websocket_message(rendered))
    }

    fn normalizer(&self, aliases: Aliases) -> Box<dyn StreamNormalizer> {
        Box::new(policy::Refusals::new(
            openai_responses::Family.normalizer(aliases),
        ))
    }

    fn classify_body(&self, status: u16, body: &[u8]) -> Option<(ErrorClass, String)> {
        policy::classify_body(status, body)
    }

    fn retry_after_body(&self, body: &[u8]) -> Option<u64> {
        policy::usage_limit_reset_ms(body)
    }

    fn quota(&self, header: &dyn Fn(&str) -> Option<String>) -> Option<Quota> {
        policy::quota(header)
    }
}
