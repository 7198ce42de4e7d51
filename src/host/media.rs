//! `session.media_read` (llm-runner/v1 §9.12): bytes of media the session's history
//! references, read from its content store on the blocking pool. Admission is a read's: any
//! caller who may read the session may read its media; a digest the history does not
//! reference (another session's, an upload never sent) is `unknown_media`, whatever the
//! store holds.

use base64::Engine;
use cortexkit_role_llm_runner::attachments::MediaReadRequest;
use serde_json::{json, Value};

use broca_wal::SessionTriple;
use broca_wire::{Code, RpcError};

use crate::reads::with_session;
use crate::replies::invalid;
use crate::Host;

pub(crate) async fn media_read(
    ctx: &Host,
    t: SessionTriple,
    req: MediaReadRequest,
) -> Result<Value, RpcError> {
    let sha = req.sha256.clone();
    let media = with_session(ctx, &t, move |read| {
        read.and_then(|r| r.session.referenced_media(&sha))
    })
    .await?;
    let Some(media) = media else {
        return Err(RpcError::new(
            Code::UnknownMedia,
            "this session's history references no media of that SHA-256",
        ));
    };
    if req.offset > media.bytes {
        return Err(invalid(format!(
            "`offset` {} is past the media's end ({} bytes)",
            req.offset, media.bytes
        ))
        .with_field("offset"));
    }
    let store = broca_session::content::ContentStore::new(t.address().media_dir(&ctx.wal_dir));
    let wal = broca_wal_writer::wal_path(&ctx.wal_dir, &t);
    let (sha, offset, length) = (req.sha256.clone(), req.offset, req.length);
    let (data, size) = broca_io::blocking::run(broca_io::blocking::Kind::Media, move || {
        match store.read(&sha, offset, length) {
            // A packed session's media are in its container.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let bytes = broca_wal::archive::archived_media(&wal, &sha)
                    .map_err(|e| std::io::Error::other(e.to_string()))?
                    .ok_or(e)?;
                let size = bytes.len() as u64;
                let start = offset.min(size) as usize;
                let end = offset.saturating_add(length).min(size) as usize;
                Ok((bytes[start..end].to_vec(), size))
            }
            other => other,
        }
    })
    .await
    .map_err(|e| {
        RpcError::new(
            Code::Internal,
            format!("the session's media {} cannot be read: {e}", req.sha256),
        )
    })?;
    let mut answer = json!({"size": size, "mime": media.mime});
    if req.length > 0 {
        answer["data"] = base64::engine::general_purpose::STANDARD
            .encode(&data)
            .into();
    }
    Ok(answer)
}
