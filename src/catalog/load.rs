//! Where the catalog in use comes from: the built-in catalog, then a catalog service's entries
//! (`BROCA_CATALOG_URL`; a copy of its last good answer is kept owner-only in the state dir and
//! used while the service cannot be reached), then an override file (`BROCA_CATALOG_FILE`; its
//! last good contents are kept too, so a file that stops parsing is reported and the last good
//! catalog stays in use). In module mode the service may be the fusiform catalog module instead
//! (`BROCA_CATALOG_MODULE`, its `catalog.get` answer read by `fusiform::read`), with the same
//! last good copy.

use std::path::{Path, PathBuf};

use super::{Catalog, CatalogError};

/// Where to look.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// An override file.
    pub file: Option<PathBuf>,
    /// A catalog service (GET answers a catalog as JSON).
    pub url: Option<String>,
    /// The fusiform catalog module asked in module mode (`catalog.get` over a daemon route);
    /// it stands in for `url`.
    pub module: Option<String>,
    /// Where the last good copies live (`<state-dir>/catalog`).
    pub cache_dir: PathBuf,
}

impl Sources {
    /// From `BROCA_CATALOG_FILE`, `BROCA_CATALOG_URL` and `BROCA_CATALOG_MODULE`, caching under
    /// `state_dir`.
    pub fn from_env(state_dir: &Path) -> Sources {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        Sources {
            file: var("BROCA_CATALOG_FILE").map(PathBuf::from),
            url: var("BROCA_CATALOG_URL"),
            module: var("BROCA_CATALOG_MODULE"),
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

/// The catalog assembled from `src` with the catalog service's answer (`fetched`: its text,
/// or why it could not be had; the caller asks the service), and what the operator should
/// be told about it (one line each: a source that failed and what was used instead).
pub fn load(
    src: &Sources,
    fetched: Option<Result<String, CatalogError>>,
) -> (Catalog, Vec<String>) {
    let parsed = fetched.map(|r| r.and_then(|text| Catalog::parse(&text).map(|c| (text, c))));
    assemble(src, parsed)
}

/// The catalog from local sources only: the service's last good answer stands in for the
/// service (for checking a command line before anything starts).
pub fn load_local(src: &Sources) -> (Catalog, Vec<String>) {
    assemble(src, None)
}

fn assemble(
    src: &Sources,
    fetched: Option<Result<(String, Catalog), CatalogError>>,
) -> (Catalog, Vec<String>) {
    let mut catalog = Catalog::builtin();
    let mut notes = Vec::new();
    let service = match (&src.module, &src.url) {
        (Some(m), _) => Some(format!("module {m}")),
        (None, Some(url)) => Some(url.clone()),
        (None, None) => None,
    };
    if let Some(url) = &service {
        if let Some(over) = service_layer(src, url, fetched, &mut notes) {
            catalog = catalog.overlaid(&over);
        }
    }
    if let Some(file) = &src.file {
        if let Some(over) = file_layer(src, file, &mut notes) {
            catalog = catalog.overlaid(&over);
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

/// What the catalog service adds: its answer (kept as the last good one), else the last good
/// one; each failure said in `notes`.
fn service_layer(
    src: &Sources,
    url: &str,
    fetched: Option<Result<(String, Catalog), CatalogError>>,
    notes: &mut Vec<String>,
) -> Option<Catalog> {
    let why = match fetched {
        Some(Ok((text, service))) => {
            if let Err(e) = save(src, &src.service_cache(), text.as_bytes()) {
                notes.push(format!("catalog service: cannot keep its answer: {e}"));
            }
            return Some(service);
        }
        Some(Err(e)) => format!("catalog service {url}: {e}; "),
        None => String::new(),
    };
    match last_good(&src.service_cache()) {
        Some(Ok(cached)) => {
            if !why.is_empty() {
                notes.push(format!("{why}using its last good answer"));
            }
            Some(cached)
        }
        Some(Err(c)) => {
            notes.push(format!(
                "{why}the cached catalog service answer is unusable ({c}); using the built-in \
                 catalog"
            ));
            None
        }
        None if !why.is_empty() => {
            notes.push(format!(
                "{why}no cached answer yet, using the built-in catalog"
            ));
            None
        }
        None => None,
    }
}

/// What the override file adds (kept as its last good copy), else its last good copy.
fn file_layer(src: &Sources, file: &Path, notes: &mut Vec<String>) -> Option<Catalog> {
    let read = std::fs::read_to_string(file).map_err(|e| CatalogError::File {
        path: file.to_path_buf(),
        message: e.to_string(),
    });
    match read.and_then(|t| Catalog::parse(&t).map(|c| (t, c))) {
        Ok((text, over)) => {
            if let Err(e) = save(src, &src.file_cache(), text.as_bytes()) {
                notes.push(format!("catalog file: cannot keep a copy: {e}"));
            }
            Some(over)
        }
        Err(e) => match last_good(&src.file_cache()) {
            Some(Ok(kept)) => {
                notes.push(format!(
                    "catalog file {}: {e}; keeping its last good contents",
                    file.display()
                ));
                Some(kept)
            }
            _ => {
                notes.push(format!(
                    "catalog file {}: {e}; no good copy of it yet, its entries are not used",
                    file.display()
                ));
                None
            }
        },
    }
}

fn save(src: &Sources, path: &Path, bytes: &[u8]) -> Result<(), CatalogError> {
    broca_owner_only::create_dir(&src.cache_dir)
        .and_then(|()| broca_owner_only::write_file(path, bytes))
        .map_err(|e| CatalogError::File {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
}

/// The kept copy at `path`: `None` when there is none.
fn last_good(path: &Path) -> Option<Result<Catalog, CatalogError>> {
    if !path.exists() {
        return None;
    }
    Some(
        broca_owner_only::read_private(path)
            .map_err(CatalogError::Private)
            .and_then(|b| {
                String::from_utf8(b).map_err(|_| CatalogError::File {
                    path: path.to_path_buf(),
                    message: "not UTF-8".into(),
                })
            })
            .and_then(|t| Catalog::parse(&t)),
    )
}
