//! The session's uploads as its actor answers them (llm-runner/v1 §9.12): a begin recorded
//! (`UploadBegun`) before its id is answered, appends written into the content store's part,
//! a commit's bytes checked and synced before `UploadCommitted` is durable, and the bytes a
//! model request needs loaded just before it goes out. Each refusal writes nothing and leaves
//! the upload as it was. Owner-only: a caller who could not send into the session is refused
//! `scope_owner_mismatch`.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use broca_core::replay::uploads::{UploadState, OPEN_UPLOADS_MAX};
use broca_io::blocking::{run, Kind};
use broca_protocol::media::MediaBytes;
use broca_protocol::model::ModelClient;
use broca_tools::ToolRunner;
use broca_wal::runrec::{UploadBegun, UploadCommitted};
use broca_wal::Record;
use broca_wire::request::uploads::UploadOp;
use broca_wire::{Code, RpcError};
use serde_json::{json, Value};

use crate::content::{CommitRefusal, ContentStore, SESSION_MEDIA_BYTES_MAX, UPLOAD_BYTES_MAX};
use crate::SessionActor;

/// This process's id among the processes that wrote the session: an upload begun by another
/// and never committed is gone.
pub fn process_boot() -> u64 {
    static BOOT: OnceLock<u64> = OnceLock::new();
    *BOOT.get_or_init(|| crate::now_unix_ms() * 1000 + u64::from(std::process::id() % 1000))
}

fn unknown(id: &str) -> RpcError {
    RpcError::new(
        Code::UnknownUpload,
        format!("no upload `{}` in this session", id.escape_debug()),
    )
}

fn io_error(what: &str, e: &std::io::Error) -> RpcError {
    if broca_io::fs::storage_full(e.raw_os_error()) {
        return RpcError::new(Code::StorageFull, format!("{what}: {e}"));
    }
    RpcError::new(Code::Internal, format!("{what}: {e}"))
}

impl<P: ModelClient, T: ToolRunner> SessionActor<P, T> {
    /// The session's content store.
    pub fn content(&self) -> ContentStore {
        ContentStore::new(self.triple.address().media_dir(&self.wal_dir))
    }

    /// Answers an upload operation of `caller`.
    pub async fn upload(
        &mut self,
        op: UploadOp,
        caller: &broca_wire::Caller,
    ) -> Result<Value, RpcError> {
        // The owner's, or a plan sender's (llm-runner/v1 `delivery_order`), for their sends.
        if !broca_core::admission::may_send(caller, &self.state) {
            return Err(RpcError::refusal(&broca_wire::Refusal::ScopeOwnerMismatch));
        }
        match op {
            UploadOp::Begin {
                mime,
                bytes,
                sha256,
            } => self.begin(mime, bytes, sha256, caller).await,
            UploadOp::Append {
                upload_id,
                offset,
                data,
            } => self.append_upload(upload_id, offset, data).await,
            UploadOp::Status { upload_id } => Ok(self.upload_status(&upload_id).await),
            UploadOp::Commit { upload_id } => self.commit(upload_id).await,
            UploadOp::Refused { error, .. } => Err(error),
        }
    }

    async fn begin(
        &mut self,
        mime: String,
        bytes: u64,
        sha256: String,
        caller: &broca_wire::Caller,
    ) -> Result<Value, RpcError> {
        let invalid = |why: String| RpcError::new(Code::InvalidParams, why).with_field("bytes");
        if bytes > UPLOAD_BYTES_MAX {
            return Err(invalid(format!(
                "an upload is at most {UPLOAD_BYTES_MAX} bytes, not {bytes}"
            )));
        }
        let held: u64 = self.state.uploads.values().map(|u| u.begun.bytes).sum();
        if held.saturating_add(bytes) > SESSION_MEDIA_BYTES_MAX {
            return Err(invalid(format!(
                "this session's uploads hold {held} bytes; {bytes} more would pass its limit \
                 of {SESSION_MEDIA_BYTES_MAX}"
            )));
        }
        if self.state.open_uploads() >= OPEN_UPLOADS_MAX {
            return Err(RpcError::new(
                Code::SessionBusy,
                format!("this session has {OPEN_UPLOADS_MAX} uploads open; commit them first"),
            ));
        }
        let upload_id = self.next_id("upl");
        let store = self.content();
        let id = upload_id.clone();
        run(Kind::Media, move || store.begin(&id))
            .await
            .map_err(|e| io_error("the session's content store", &e))?;
        let record = UploadBegun {
            upload_id: upload_id.clone(),
            mime,
            bytes,
            sha256,
            boot: self.state.boot,
            at_unix_ms: crate::now_unix_ms(),
            principal: caller.principal.clone(),
        };
        self.append(Record::UploadBegun(record), true)
            .await
            .map_err(|e| e.to_rpc_error())?;
        Ok(json!({ "upload_id": upload_id }))
    }

    async fn append_upload(
        &mut self,
        upload_id: String,
        offset: u64,
        data: Vec<u8>,
    ) -> Result<Value, RpcError> {
        let declared = match self.state.upload(&upload_id) {
            UploadState::Unknown => return Err(unknown(&upload_id)),
            UploadState::Gone => return Err(gone(&upload_id)),
            UploadState::Committed(_) => {
                return Err(RpcError::new(
                    Code::InvalidParams,
                    format!("upload `{upload_id}` is committed; it takes no more bytes"),
                )
                .with_field("upload_id"))
            }
            UploadState::Open(u) => u.begun.bytes,
        };
        let store = self.content();
        let received = {
            let store = store.clone();
            let id = upload_id.clone();
            run(Kind::Media, move || store.received(&id)).await
        };
        match cortexkit_role_llm_runner::attachments::check_append(
            received,
            declared,
            offset,
            data.len(),
        ) {
            Ok(()) => {}
            Err("upload_offset_mismatch") => {
                return Err(RpcError::new(
                    Code::UploadOffsetMismatch,
                    format!("upload `{upload_id}` holds {received} bytes; append at {received}"),
                )
                .with_detail("received", received.into()))
            }
            Err("upload_chunk_too_large") => {
                return Err(RpcError::new(
                    Code::UploadChunkTooLarge,
                    "an append carries at most 2097152 decoded bytes",
                ))
            }
            Err(_) => {
                return Err(RpcError::new(
                    Code::UploadSizeMismatch,
                    format!(
                        "upload `{upload_id}` was declared {declared} bytes; {} more at \
                         {received} would pass it",
                        data.len()
                    ),
                ))
            }
        }
        let id = upload_id.clone();
        let n = data.len() as u64;
        let received = run(Kind::Media, move || store.append(&id, offset, &data))
            .await
            .map_err(|e| io_error("the session's content store", &e))?;
        debug_assert!(
            received == offset + n && received <= declared,
            "an append lands where it was asked, within the declared size"
        );
        Ok(json!({ "received": received }))
    }

    async fn upload_status(&self, upload_id: &str) -> Value {
        match self.state.upload(upload_id) {
            UploadState::Unknown | UploadState::Gone => json!({"state": "gone", "received": 0}),
            UploadState::Committed(u) => json!({"state": "committed", "received": u.begun.bytes}),
            UploadState::Open(_) => {
                let store = self.content();
                let id = upload_id.to_string();
                let received = run(Kind::Media, move || store.received(&id)).await;
                json!({"state": "open", "received": received})
            }
        }
    }

    async fn commit(&mut self, upload_id: String) -> Result<Value, RpcError> {
        let begun = match self.state.upload(&upload_id) {
            UploadState::Unknown => return Err(unknown(&upload_id)),
            UploadState::Gone => return Err(gone(&upload_id)),
            UploadState::Committed(u) => return Ok(committed(&u.begun)),
            UploadState::Open(u) => u.begun.clone(),
        };
        let store = self.content();
        let (id, bytes, sha) = (upload_id.clone(), begun.bytes, begun.sha256.clone());
        let checked = run(Kind::Media, move || store.commit(&id, bytes, &sha))
            .await
            .map_err(|e| io_error("the session's content store", &e))?;
        match checked {
            Ok(()) => {}
            Err(CommitRefusal::Size) => {
                return Err(RpcError::new(
                    Code::UploadSizeMismatch,
                    format!(
                        "upload `{upload_id}` holds another size than the {} bytes declared",
                        begun.bytes
                    ),
                ))
            }
            Err(CommitRefusal::Sha256) => {
                return Err(RpcError::new(
                    Code::UploadSha256Mismatch,
                    format!("upload `{upload_id}`'s bytes do not have the SHA-256 declared"),
                ))
            }
        }
        let record = UploadCommitted {
            upload_id,
            at_unix_ms: crate::now_unix_ms(),
        };
        self.append(Record::UploadCommitted(record), true)
            .await
            .map_err(|e| e.to_rpc_error())?;
        Ok(committed(&begun))
    }
}

/// The bytes of the media blocks in `request`'s messages that its model takes (a model of
/// `family` with `facts`), read from `store` and checked against their digests. A media file
/// missing or changed is an error naming it: the model is never sent other bytes than the
/// send attached.
pub(crate) async fn load_media(
    store: ContentStore,
    family: &str,
    facts: &broca_protocol::media::InputFacts,
    request: &broca_protocol::Request,
) -> std::io::Result<MediaBytes> {
    let wanted: Vec<String> = request
        .messages
        .iter()
        .flat_map(|m| m.content.iter())
        .filter_map(|b| match b {
            broca_protocol::Block::Media(m) if facts.takes(family, &m.mime) => {
                Some(m.sha256.clone())
            }
            _ => None,
        })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if wanted.is_empty() {
        return Ok(MediaBytes::default());
    }
    run(Kind::Media, move || {
        let mut map = BTreeMap::new();
        for sha in wanted {
            let data = store.load(&sha)?;
            map.insert(sha, Arc::<[u8]>::from(data));
        }
        Ok(MediaBytes(Arc::new(map)))
    })
    .await
}

/// A tool's answer in parts, kept: each image in `store` (synced) and named by its digest,
/// and the text the model reads in its place (the text parts in order, each image as a note
/// that it follows the results). `Err` names what could not be kept.
pub(crate) async fn keep_tool_parts(
    store: ContentStore,
    parts: Vec<broca_tools::ToolPart>,
) -> std::io::Result<(String, Vec<broca_wal::runrec::ResultPart>)> {
    use broca_tools::ToolPart;
    use broca_wal::runrec::ResultPart;
    run(Kind::Media, move || {
        let mut texts = Vec::with_capacity(parts.len());
        let mut kept = Vec::with_capacity(parts.len());
        for p in parts {
            match p {
                ToolPart::Text(text) => {
                    texts.push(text.clone());
                    kept.push(ResultPart::Text { text });
                }
                ToolPart::Image { mime, data } => {
                    let sha256 = store.put(&data)?;
                    let m = broca_protocol::media::Media {
                        kind: broca_protocol::media::kind::IMAGE.into(),
                        mime,
                        bytes: data.len() as u64,
                        sha256,
                    };
                    texts.push(format!(
                        "[image {} of {} bytes (sha256 {}): it follows the tool results]",
                        m.mime,
                        m.bytes,
                        &m.sha256[..12]
                    ));
                    kept.push(ResultPart::Media(m));
                }
            }
        }
        Ok((texts.join("\n"), kept))
    })
    .await
}

fn gone(id: &str) -> RpcError {
    RpcError::new(
        Code::UploadGone,
        format!(
            "upload `{}` was lost before its commit (broca restarted); upload it again",
            id.escape_debug()
        ),
    )
}

fn committed(b: &UploadBegun) -> Value {
    json!({"state": "committed", "sha256": b.sha256, "mime": b.mime, "bytes": b.bytes})
}
