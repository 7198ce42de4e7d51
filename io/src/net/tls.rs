//! TLS client configuration: rustls with the webpki root certificates (plus any a user adds
//! through `SSL_CERT_FILE`), SNI, and ALPN `http/1.1`. The connection itself is driven
//! sans-IO in [`super::conn`].

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

/// A client configuration trusting the webpki roots and `extra` certificates.
pub fn client_config(
    extra: &[CertificateDer<'static>],
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    for cert in extra {
        roots
            .add(cert.clone())
            .map_err(|e| TlsError::Setup(format!("a trusted certificate is not usable: {e}")))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Setup(format!("TLS setup: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The certificates of a PEM file (for `SSL_CERT_FILE`). `Err` names the file.
pub fn pem_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let file = |problem: String| TlsError::CertificateFile {
        path: path.to_path_buf(),
        problem,
    };
    let certs: Result<Vec<_>, _> = CertificateDer::pem_file_iter(path)
        .map_err(|e| file(format!("cannot read certificates: {e}")))?
        .collect();
    let certs = certs.map_err(|e| file(format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(file("holds no PEM certificate".into()));
    }
    Ok(certs)
}

/// A TLS configuration that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsError {
    /// A certificate file (`SSL_CERT_FILE`) that cannot be used.
    CertificateFile { path: PathBuf, problem: String },
    /// rustls refused the setup or a certificate.
    Setup(String),
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TlsError::CertificateFile { path, problem } => {
                write!(f, "{}: {problem}", path.display())
            }
            TlsError::Setup(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for TlsError {}

impl From<TlsError> for String {
    fn from(e: TlsError) -> String {
        e.to_string()
    }
}

/// The default configuration: webpki roots, plus the certificates of `SSL_CERT_FILE` when set.
pub fn default_client_config() -> Result<Arc<rustls::ClientConfig>, TlsError> {
    match std::env::var_os("SSL_CERT_FILE") {
        Some(path) => client_config(&pem_certificates(Path::new(&path))?),
        None => client_config(&[]),
    }
}
