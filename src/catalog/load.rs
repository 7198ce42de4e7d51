//! Where the catalog in use comes from: the built-in catalog, then a catalog service's entries
//! (`BROCA_CATALOG_URL`; a copy of its last good answer is kept owner-only in the state dir and
//! used while the service cannot be reached), then an override file (`BROCA_CATALOG_FILE`; its
//! last good contents are kept too, so a file that stops parsing is reported and the last good
//! catalog stays in use).

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use broca_io::net::{with_timeout, HttpClient, Request, Url};

use super::Catalog;

/// How long the catalog service may take to answer at start.
const SERVICE_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest catalog accepted from the service.
const SERVICE_BYTES_MAX: usize = 16 * 1024 * 1024;

/// Where to look.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// An override file.
    pub file: Option<PathBuf>,
    /// A catalog service (GET answers a catalog as JSON).
    pub url: Option<String>,
    /// Where the last good copies live (`<state-dir>/catalog`).
    pub cache_dir: PathBuf,
}

impl Sources {
    /// From `BROCA_CATALOG_FILE` and `BROCA_CATALOG_URL`, caching under `state_dir`.
    pub fn from_env(state_dir: &Path) -> Sources {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        Sources {
            file: var("BROCA_CATALOG_FILE").map(PathBuf::from),
            url: var("BROCA_CATALOG_URL"),
            cache_dir: state_dir.join("catalog"),
        }
    }

    fn service_cache(&self) -> PathBuf {
        self.cache_dir.join("service-last-good.json")
    }

    fn file_cache(&self) -> PathBuf {
        self.cache_dir.join("override-last-good.json")
    }
}

/// The catalog assembled from `src`, asking the catalog service, and what the operator
/// should be told about it (one line each: a source that failed and what was used instead).
pub async fn load(src: &Sources, http: &Rc<HttpClient>) -> (Catalog, Vec<String>) {
    let fetched = match &src.url {
        Some(url) => Some(fetch(url, http).await),
        None => None,
    };
    assemble(src, fetched)
}

/// The catalog from local sources only: the service's last good answer stands in for the
/// service (for checking a command line before anything starts).
pub fn load_local(src: &Sources) -> (Catalog, Vec<String>) {
    assemble(src, None)
}

fn assemble(
    src: &Sources,
    fetched: Option<Result<(String, Catalog), String>>,
) -> (Catalog, Vec<String>) {
    let mut catalog = Catalog::builtin();
    let mut notes = Vec::new();
    if let Some(url) = &src.url {
        match fetched {
            Some(Ok((text, service))) => {
                if let Err(e) = save(src, &src.service_cache(), text.as_bytes()) {
                    notes.push(format!("catalog service: cannot keep its answer: {e}"));
                }
                catalog = catalog.overlaid(&service);
            }
            failed => {
                let why = match failed {
                    Some(Err(e)) => format!("catalog service {url}: {e}; "),
                    _ => String::new(),
                };
                match last_good(&src.service_cache()) {
                    Some(Ok(cached)) => {
                        if !why.is_empty() {
                            notes.push(format!("{why}using its last good answer"));
                        }
                        catalog = catalog.overlaid(&cached);
                    }
                    Some(Err(c)) => notes.push(format!(
                        "{why}the cached catalog service answer is unusable ({c}); using the \
                         built-in catalog"
                    )),
                    None if !why.is_empty() => notes.push(format!(
                        "{why}no cached answer yet, using the built-in catalog"
                    )),
                    None => {}
                }
            }
        }
    }
    if let Some(file) = &src.file {
        let read = std::fs::read_to_string(file).map_err(|e| e.to_string());
        match read.and_then(|t| Catalog::parse(&t).map(|c| (t, c))) {
            Ok((text, over)) => {
                if let Err(e) = save(src, &src.file_cache(), text.as_bytes()) {
                    notes.push(format!("catalog file: cannot keep a copy: {e}"));
                }
                catalog = catalog.overlaid(&over);
            }
            Err(e) => match last_good(&src.file_cache()) {
                Some(Ok(kept)) => {
                    notes.push(format!(
                        "catalog file {}: {e}; keeping its last good contents",
                        file.display()
                    ));
                    catalog = catalog.overlaid(&kept);
                }
                _ => notes.push(format!(
                    "catalog file {}: {e}; no good copy of it yet, its entries are not used",
                    file.display()
                )),
            },
        }
    }
    let before = catalog.models.len();
    let known: Vec<String> = catalog.providers.iter().map(|p| p.id.clone()).collect();
    catalog.models.retain(|m| known.contains(&m.provider));
    if catalog.models.len() != before {
        notes.push(format!(
            "catalog: {} models name unknown providers and are left out",
            before - catalog.models.len()
        ));
    }
    (catalog, notes)
}

async fn fetch(url: &str, http: &Rc<HttpClient>) -> Result<(String, Catalog), String> {
    let parsed = Url::parse(url)?;
    if !parsed.scheme.is_tls() && !parsed.is_loopback() {
        return Err("plain http is accepted only for loopback hosts".into());
    }
    let req = Request {
        method: "GET",
        url: &parsed,
        path: if parsed.prefix.is_empty() { "/" } else { "" },
        headers: &[("accept", "application/json")],
        body: b"",
    };
    let work = async {
        let mut resp = http.send(&req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = resp
            .body(SERVICE_BYTES_MAX)
            .await
            .map_err(|e| e.to_string())?;
        if status != 200 {
            return Err(format!("HTTP {status}"));
        }
        let text = String::from_utf8(body).map_err(|_| "the answer is not UTF-8".to_string())?;
        let catalog = Catalog::parse(&text)?;
        Ok((text, catalog))
    };
    with_timeout(SERVICE_TIMEOUT, work)
        .await
        .unwrap_or_else(|()| Err(format!("no answer within {} s", SERVICE_TIMEOUT.as_secs())))
}

fn save(src: &Sources, path: &Path, bytes: &[u8]) -> Result<(), String> {
    crate::owner_only::create_dir(&src.cache_dir)
        .and_then(|()| crate::owner_only::write_file(path, bytes))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The kept copy at `path`: `None` when there is none.
fn last_good(path: &Path) -> Option<Result<Catalog, String>> {
    if !path.exists() {
        return None;
    }
    Some(
        crate::owner_only::read_private(path)
            .and_then(|b| String::from_utf8(b).map_err(|_| "not UTF-8".into()))
            .and_then(|t| Catalog::parse(&t)),
    )
}
