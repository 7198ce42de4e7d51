//! The catalog service client: one GET of the catalog (`BROCA_CATALOG_URL` or serve's
//! `catalog_url`) on broca's own HTTP client, its text handed to broca-catalog to assemble
//! with the built-in catalog and the override file. (In module mode the catalog can come from
//! the fusiform module instead, over a daemon route: `broca_tools::modules`.)

use std::rc::Rc;
use std::time::Duration;

use broca_catalog::CatalogError;
use broca_io::net::{with_timeout, HttpClient, Request, Url};

/// How long the catalog service may take to answer.
const SERVICE_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest catalog accepted from the service.
const SERVICE_BYTES_MAX: usize = 16 * 1024 * 1024;

/// The service's answer as text (a status other than 200, a body that is not UTF-8, or no
/// answer in time is an error naming it).
pub async fn fetch(url: &str, http: &Rc<HttpClient>) -> Result<String, CatalogError> {
    let unavailable = |why: String| CatalogError::Unavailable(why);
    let parsed = Url::parse(url).map_err(|e| unavailable(e.to_string()))?;
    if !parsed.scheme.is_tls() && !parsed.is_loopback() {
        return Err(unavailable(
            "plain http is accepted only for loopback hosts".into(),
        ));
    }
    let req = Request {
        method: "GET",
        url: &parsed,
        path: if parsed.prefix.is_empty() { "/" } else { "" },
        headers: &[("accept", "application/json")],
        body: b"",
    };
    let work = async {
        let mut resp = http
            .send(&req)
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        let status = resp.status();
        let body = resp
            .body(SERVICE_BYTES_MAX)
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        if status != 200 {
            return Err(unavailable(format!("HTTP {status}")));
        }
        String::from_utf8(body).map_err(|_| unavailable("the answer is not UTF-8".into()))
    };
    with_timeout(SERVICE_TIMEOUT, work)
        .await
        .unwrap_or_else(|()| {
            Err(unavailable(format!(
                "no answer within {} s",
                SERVICE_TIMEOUT.as_secs()
            )))
        })
}
