//! TLS client configuration: rustls with the webpki root certificates (plus any a user adds
//! through `SSL_CERT_FILE`), SNI, and ALPN `http/1.1`. The connection itself is driven
//! sans-IO in [`super::conn`].

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

/// A client configuration trusting the webpki roots and `extra` certificates.
pub fn client_config(
    extra: &[CertificateDer<'static>],
) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    for cert in extra {
        roots
            .add(cert.clone())
            .map_err(|e| format!("a trusted certificate is not usable: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The certificates of a PEM file (for `SSL_CERT_FILE`). `Err` names the file.
pub fn pem_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{}: cannot read certificates: {e}", path.display()))?
        .collect();
    let certs =
        certs.map_err(|e| format!("{}: not a PEM certificate file: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: holds no PEM certificate", path.display()));
    }
    Ok(certs)
}

/// The default configuration: webpki roots, plus the certificates of `SSL_CERT_FILE` when set.
pub fn default_client_config() -> Result<Arc<rustls::ClientConfig>, String> {
    match std::env::var_os("SSL_CERT_FILE") {
        Some(path) => client_config(&pem_certificates(Path::new(&path))?),
        None => client_config(&[]),
    }
}
