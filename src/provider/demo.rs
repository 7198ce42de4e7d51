//! The demo model's family (`demo`, `broca_protocol::demo`): no wire and no credential. Its
//! requests are answered in broca by the demo script (`HttpModelStream`'s scripted source);
//! this family exists so admission and the catalog treat `demo/tour` like any model.

use broca_protocol::{ErrorClass, Request};

use crate::{
    alias::Aliases, credential, AuthContext, CredentialProblem, FormatError, Normalized, Rendered,
    StreamNormalizer, WireFamily,
};

pub struct Family;

impl WireFamily for Family {
    fn id(&self) -> &'static str {
        broca_protocol::demo::FAMILY
    }

    /// What the script reads is the canonical request itself: nothing is rendered.
    fn render(&self, _req: &Request, _aliases: &Aliases) -> Rendered {
        Rendered {
            path: String::new(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// Keyless: whatever credential is named, none is used.
    fn takes(&self, _credential: &credential::Credential) -> Result<(), CredentialProblem> {
        Ok(())
    }

    fn authorize(
        &self,
        _rendered: &mut Rendered,
        _auth: &AuthContext<'_>,
    ) -> Result<(), CredentialProblem> {
        Ok(())
    }

    fn normalizer(&self, _aliases: Aliases) -> Box<dyn StreamNormalizer> {
        Box::new(Scripted)
    }

    fn classify_body(&self, _status: u16, _body: &[u8]) -> Option<(ErrorClass, String)> {
        None
    }
}

/// The script's events are canonical already: nothing to normalize.
struct Scripted;

impl StreamNormalizer for Scripted {
    fn push(&mut self, _event: Option<&str>, _data: &str) -> Result<Normalized, FormatError> {
        Err(FormatError("the demo model has no wire to read".into()))
    }
}
