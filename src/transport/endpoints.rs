//! Where each provider's requests go: the catalog's base URL, or an override
//! (`BROCA_BASE_URL_<PROVIDER>`, serve's config, `--base-url`); plain http and ws only to
//! loopback hosts.

use std::collections::HashMap;

use broca_catalog as catalog;
use broca_io::net::Url;

/// Base URLs per provider, beyond the catalog's.
#[derive(Debug, Clone, Default)]
pub struct Endpoints {
    overrides: HashMap<String, Url>,
}

/// The environment variable that overrides `provider`'s base URL.
pub fn base_url_var(provider: &str) -> String {
    let var = format!(
        "BROCA_BASE_URL_{}",
        provider.to_ascii_uppercase().replace('-', "_")
    );
    debug_assert!(!var.contains(['=', '\0']), "an environment variable's name");
    var
}

impl Endpoints {
    /// Overrides from `BROCA_BASE_URL_<PROVIDER>` for every catalog provider. `Err` names the
    /// variable whose URL is wrong.
    pub fn from_env() -> Result<Endpoints, EndpointError> {
        let mut e = Endpoints::default();
        for p in catalog::providers() {
            let var = base_url_var(&p.id);
            if let Some(v) = std::env::var(&var).ok().filter(|v| !v.is_empty()) {
                e.set(&p.id, &v).map_err(|err| EndpointError::Variable {
                    var,
                    error: Box::new(err),
                })?;
            }
        }
        Ok(e)
    }

    /// Overrides `provider`'s base URL. Plain http/ws only for loopback hosts.
    pub fn set(&mut self, provider: &str, url: &str) -> Result<(), EndpointError> {
        let url = Url::parse(url).map_err(EndpointError::Url)?;
        if !url.scheme.is_tls() && !url.is_loopback() {
            return Err(EndpointError::PlainRemote(url));
        }
        debug_assert!(
            url.scheme.is_tls() || url.is_loopback(),
            "plain only on loopback"
        );
        self.overrides.insert(provider.to_string(), url);
        Ok(())
    }

    /// The base URL for `provider`: an override, else `frozen` (the run's own entry).
    pub fn base_url_for(&self, provider: &str, frozen: &str) -> Result<Url, EndpointError> {
        match self.overrides.get(provider) {
            Some(u) => Ok(u.clone()),
            None => Url::parse(frozen).map_err(EndpointError::Url),
        }
    }

    /// The base URL for `provider`.
    pub fn base_url(&self, provider: &str) -> Result<Url, EndpointError> {
        if let Some(u) = self.overrides.get(provider) {
            return Ok(u.clone());
        }
        let entry = catalog::provider(provider)
            .ok_or_else(|| EndpointError::UnknownProvider(provider.to_string()))?;
        Url::parse(&entry.base_url).map_err(EndpointError::Url)
    }
}

/// A provider's base URL that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndpointError {
    Url(broca_io::net::UrlError),
    /// Plain http or ws to a host that is not loopback.
    PlainRemote(Url),
    UnknownProvider(String),
    /// The override variable `var` holds a URL that cannot be used.
    Variable {
        var: String,
        error: Box<EndpointError>,
    },
}

impl std::fmt::Display for EndpointError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EndpointError::Url(e) => write!(f, "{e}"),
            EndpointError::PlainRemote(url) => write!(
                f,
                "{url}: plain {} is accepted only for loopback hosts",
                url.scheme.as_str()
            ),
            EndpointError::UnknownProvider(p) => write!(f, "unknown provider `{p}`"),
            EndpointError::Variable { var, error } => write!(f, "{var}: {error}"),
        }
    }
}

impl std::error::Error for EndpointError {}

impl From<EndpointError> for String {
    fn from(e: EndpointError) -> String {
        e.to_string()
    }
}
