//! `broca send --attach FILE`: each file uploaded into the session's content store before the
//! send (llm-runner/v1 `session.upload_begin`, `upload_append` in chunks of 2 MiB,
//! `upload_commit`), named in the send's `content` in the order given. A file's media type is
//! its extension's; an upload cut off is begun again whole.

use std::path::Path;

use broca_wire::request::Method;
use serde_json::{json, Value};

use super::client::Daemon;

/// The media types broca carries, by extension.
const TYPES: &[(&str, &str)] = &[
    ("png", "image/png"),
    ("jpg", "image/jpeg"),
    ("jpeg", "image/jpeg"),
    ("gif", "image/gif"),
    ("webp", "image/webp"),
    ("pdf", "application/pdf"),
];

/// The largest file `--attach` takes (the daemon's limit of one upload).
const FILE_BYTES_MAX: u64 = 64 * 1024 * 1024;

/// The media type of `path`, by its extension.
fn mime_of(path: &Path) -> Result<&'static str, String> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    TYPES
        .iter()
        .find(|(e, _)| *e == ext)
        .map(|(_, m)| *m)
        .ok_or_else(|| {
            format!(
                "--attach {}: broca carries PNG, JPEG, GIF and WebP images and PDF documents \
                 (by extension: .png, .jpg, .jpeg, .gif, .webp, .pdf)",
                path.display()
            )
        })
}

/// Uploads each of `files` into the session `session` (its triple's params): their upload ids,
/// in order.
pub(super) fn upload_files(
    daemon: &Daemon,
    session: &Value,
    files: &[std::path::PathBuf],
) -> Result<Vec<String>, String> {
    files.iter().map(|f| upload(daemon, session, f)).collect()
}

fn upload(daemon: &Daemon, session: &Value, path: &Path) -> Result<String, String> {
    let what = |e: &dyn std::fmt::Display| format!("--attach {}: {e}", path.display());
    let mime = mime_of(path)?;
    let meta = std::fs::metadata(path).map_err(|e| what(&e))?;
    if !meta.is_file() {
        return Err(what(&"not a regular file"));
    }
    if meta.len() > FILE_BYTES_MAX {
        return Err(what(&format!(
            "{} bytes, over the {FILE_BYTES_MAX} an upload may hold",
            meta.len()
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| what(&e))?;
    let sha256 = cortexkit_role_llm_runner::content_digest::sha256_hex(&bytes);
    let call = |method: &str, extra: Value| -> Result<Value, String> {
        let mut p = session.clone();
        for (k, v) in extra.as_object().into_iter().flatten() {
            p[k.as_str()] = v.clone();
        }
        daemon.rpc(method, p).map_err(|e| match e.to_string() {
            m if m.starts_with("unknown_session") => what(&format!(
                "{m} (send the session a first prompt; attachments go into a session that exists)"
            )),
            m => what(&m),
        })
    };
    let begun = call(
        Method::UploadBegin.as_str(),
        json!({"mime": mime, "bytes": bytes.len(), "sha256": sha256}),
    )?;
    let id = begun["upload_id"]
        .as_str()
        .ok_or_else(|| what(&"the daemon answered no upload id"))?
        .to_string();
    let chunk = cortexkit_role_llm_runner::attachments::CHUNK_MAX;
    for (i, part) in bytes.chunks(chunk).enumerate() {
        let data = broca_protocol::media::base64(part);
        call(
            Method::UploadAppend.as_str(),
            json!({"upload_id": id, "offset": i * chunk, "data": data}),
        )?;
    }
    call(Method::UploadCommit.as_str(), json!({"upload_id": id}))?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_files_type_is_its_extensions() {
        assert_eq!(mime_of(Path::new("a/shot.PNG")).unwrap(), "image/png");
        assert_eq!(mime_of(Path::new("doc.pdf")).unwrap(), "application/pdf");
        let e = mime_of(Path::new("notes.txt")).unwrap_err();
        assert!(e.contains("notes.txt") && e.contains(".pdf"), "{e}");
    }
}
