//! The interface between a run's driver and a model: a client opens a stream of canonical
//! events for a request. The provider crate implements it over the network; tests and
//! benches implement it with scripted models.

use std::future::Future;

use crate::{ClassifiedError, Request, StreamEvent, Usage};

/// A failed model attempt, classified where it arose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub error: ClassifiedError,
    pub usage: Option<Usage>,
}

/// What admission asks of the model side before it writes anything: whether the build
/// speaks a provider's wire family, and whether a credential resolves to one that family
/// takes. Nothing here writes or keeps a secret.
pub trait ProviderCheck {
    /// How this build speaks `family`; `Err` says that it does not.
    fn family(&self, family: &str) -> Result<FamilyTraits, UnknownFamily>;
    /// Resolves `credential_id` for `family` (the secret fetched into memory, checked to be
    /// of a kind the family takes, and dropped); `Err` says what is missing or unusable,
    /// revealing no secret.
    fn credential(&self, family: &str, credential_id: &str) -> Result<(), CredentialProblem>;
}

/// A wire family this build does not speak, with the ones it does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownFamily {
    pub family: String,
    pub known: Vec<&'static str>,
}

impl std::fmt::Display for UnknownFamily {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "this build does not speak the {} wire family; the families it speaks are {}",
            self.family,
            self.known.join(", ")
        )
    }
}

impl std::error::Error for UnknownFamily {}

/// Why a credential did not resolve: what is wrong (never the secret), and whether its
/// source is out (the vault unreachable or answering "try later": asking again later may
/// work) rather than a verdict on the credential (absent, refused, malformed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialProblem {
    pub message: String,
    pub outage: bool,
}

impl CredentialProblem {
    /// Its source is out; the credential itself may be fine.
    pub fn outage(message: impl Into<String>) -> CredentialProblem {
        CredentialProblem {
            message: message.into(),
            outage: true,
        }
    }
}

impl From<String> for CredentialProblem {
    /// A verdict on the credential.
    fn from(message: String) -> CredentialProblem {
        CredentialProblem {
            message,
            outage: false,
        }
    }
}

impl From<&str> for CredentialProblem {
    /// A verdict on the credential.
    fn from(message: &str) -> CredentialProblem {
        CredentialProblem::from(message.to_string())
    }
}

impl std::fmt::Display for CredentialProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// What admission needs to know of a wire family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FamilyTraits {
    /// The family's requests mark prompt-cache breakpoints (a cache policy of `auto` does
    /// something); a family that caches by itself, or not at all, marks none.
    pub marks_cache: bool,
}

/// A check that admits every family and credential: for models that call no provider
/// (scripted models in tests, simulations and benches).
#[derive(Debug, Clone, Copy, Default)]
pub struct AnyProvider;

impl ProviderCheck for AnyProvider {
    fn family(&self, _family: &str) -> Result<FamilyTraits, UnknownFamily> {
        Ok(FamilyTraits { marks_cache: false })
    }

    fn credential(&self, _family: &str, _credential_id: &str) -> Result<(), CredentialProblem> {
        Ok(())
    }
}

/// Calls a model: opens a stream of canonical events for a request.
pub trait ModelClient: 'static {
    type Stream: ModelStream;
    /// What admission asks of this client's providers.
    fn check(&self) -> &dyn ProviderCheck;
    /// Starts the call. An error here is a failed attempt before any output.
    fn open(&self, request: &Request) -> impl Future<Output = Result<Self::Stream, Failure>>;
}

/// One model call's canonical events.
pub trait ModelStream {
    /// The next event; `None` when the step ended normally; `Some(Err)` when the attempt
    /// failed (its partial output is dropped).
    fn next(&mut self) -> impl Future<Output = Option<Result<StreamEvent, Failure>>>;
}
