//! Whether a run admitted by an earlier start can be resumed by this build: the bytes it
//! renders must be the bytes the run was admitted with.

use broca_catalog as catalog;
use broca_wal::runrec::FrozenConfig;

/// Why a run frozen at admission cannot be resumed by this build; its display is the reason
/// the run is sealed with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotResumable {
    /// Another renderer version renders other bytes.
    Renderer { then: u32, now: u32 },
    /// The run's model no longer resolves.
    Unresolved(catalog::ResolveError),
    /// The entry's wire family changed.
    Family {
        spec: String,
        provider: String,
        then: String,
        now: String,
    },
    /// An entry recorded before entries were frozen whole changed.
    Digest {
        spec: String,
        then: String,
        now: String,
    },
}

impl std::fmt::Display for NotResumable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("resume refused: ")?;
        match self {
            NotResumable::Renderer { then, now } => write!(
                f,
                "the run was rendered with renderer version {then}, and this build renders \
                 version {now}"
            ),
            NotResumable::Unresolved(e) => write!(f, "{e}"),
            NotResumable::Family {
                spec,
                provider,
                then,
                now,
            } => write!(
                f,
                "the catalog entry of {spec} changed incompatibly: provider `{provider}` was \
                 the {then} family at admission and is {now} now"
            ),
            NotResumable::Digest { spec, then, now } => write!(
                f,
                "the catalog entry of {spec} changed since the run was admitted (digest \
                 {then} then, {now} now)"
            ),
        }
    }
}

/// Whether a run frozen with `config` can be resumed by this build: same renderer version, and
/// a catalog entry with the same digest. `Err` says what drifted.
pub fn check_resumable(
    config: &FrozenConfig,
    catalog: &catalog::Catalog,
) -> Result<(), NotResumable> {
    if config.renderer_version != catalog::RENDERER_VERSION {
        return Err(NotResumable::Renderer {
            then: config.renderer_version,
            now: catalog::RENDERER_VERSION,
        });
    }
    let spec = format!("{}/{}", config.provider, config.model);
    let now = catalog.resolve(&spec).map_err(NotResumable::Unresolved)?;
    match &config.catalog {
        // The run keeps its frozen limits and prices; only another wire family is refused.
        Some(frozen) if frozen.provider.family != now.provider.family => {
            Err(NotResumable::Family {
                spec,
                provider: frozen.provider.id.clone(),
                then: frozen.provider.family.clone(),
                now: now.provider.family.clone(),
            })
        }
        Some(_) => Ok(()),
        // A run recorded before entries were frozen whole: any change is refused.
        None if now.digest() != config.catalog_digest => Err(NotResumable::Digest {
            spec,
            then: config.catalog_digest.clone(),
            now: now.digest(),
        }),
        None => Ok(()),
    }
}
