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
    let (sha, offset, length) = (req.sha256.clone(), req.offset, req.length);
    let (data, size) = broca_io::blocking::run(broca_io::blocking::Kind::Media, move || {
        store.read(&sha, offset, length)
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
