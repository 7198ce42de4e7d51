//! The attachments requests (llm-runner/v1 §9.12, a child of `request`): an upload begun,
//! appended to, asked after and committed, and a read of media the session's history
//! references. Each parsed strictly by the role crate's own types; an append's `data` is
//! decoded here, so its size is checked on decoded bytes.

use base64::Engine;
use cortexkit_role_llm_runner::attachments::{
    check_chunk_size, MediaReadRequest, UploadAppendRequest, UploadBeginRequest,
    UploadCommitRequest, UploadStatusRequest,
};
use serde_json::{Map, Value};

use super::{invalid, strict, Method};
use crate::{Code, RpcError};

/// An operation on the session's uploads.
#[derive(Debug, Clone, PartialEq)]
pub enum UploadOp {
    Begin {
        mime: String,
        bytes: u64,
        sha256: String,
    },
    /// `data` decoded.
    Append {
        upload_id: String,
        offset: u64,
        data: Vec<u8>,
    },
    Status {
        upload_id: String,
    },
    Commit {
        upload_id: String,
    },
    /// An operation whose parameters are refused (`error`): answered once its caller is
    /// admitted, so a caller who may not upload learns only that (llm-runner/v1 §9.12).
    Refused {
        method: Method,
        error: RpcError,
    },
}

impl UploadOp {
    /// The upload the operation names (none for a begin).
    pub fn upload_id(&self) -> Option<&str> {
        match self {
            UploadOp::Begin { .. } | UploadOp::Refused { .. } => None,
            UploadOp::Append { upload_id, .. }
            | UploadOp::Status { upload_id }
            | UploadOp::Commit { upload_id } => Some(upload_id),
        }
    }
}

/// The parameters of an upload method (the session taken out already); parameters it refuses
/// are kept as [`UploadOp::Refused`].
pub(super) fn upload(method: Method, params: Map<String, Value>) -> UploadOp {
    parse_upload(method, params).unwrap_or_else(|error| UploadOp::Refused { method, error })
}

fn parse_upload(method: Method, params: Map<String, Value>) -> Result<UploadOp, RpcError> {
    Ok(match method {
        Method::UploadBegin => {
            let r: Box<UploadBeginRequest> = strict(params, method)?;
            if let Err(field) = r.check() {
                return Err(invalid(match field {
                    "sha256" => "`sha256` must be 64 lowercase hex digits (of the decoded bytes)",
                    _ => "`mime` must name the media type",
                })
                .with_field(field));
            }
            UploadOp::Begin {
                mime: r.mime,
                bytes: r.bytes,
                sha256: r.sha256,
            }
        }
        Method::UploadAppend => {
            let r: Box<UploadAppendRequest> = strict(params, method)?;
            let data = base64::engine::general_purpose::STANDARD
                .decode(r.data.as_bytes())
                .map_err(|e| invalid(format!("`data` is not base64: {e}")).with_field("data"))?;
            if check_chunk_size(data.len()).is_err() {
                return Err(RpcError::new(
                    Code::UploadChunkTooLarge,
                    format!(
                        "an append carries at most {} decoded bytes, not {}",
                        cortexkit_role_llm_runner::attachments::CHUNK_MAX,
                        data.len()
                    ),
                ));
            }
            UploadOp::Append {
                upload_id: r.upload_id,
                offset: r.offset,
                data,
            }
        }
        Method::UploadStatus => {
            let r: Box<UploadStatusRequest> = strict(params, method)?;
            UploadOp::Status {
                upload_id: r.upload_id,
            }
        }
        _ => {
            let r: Box<UploadCommitRequest> = strict(params, method)?;
            UploadOp::Commit {
                upload_id: r.upload_id,
            }
        }
    })
}

/// `session.media_read`'s parameters; `length` above a chunk is refused here, the offset
/// once the media's size is known.
pub(super) fn media_read(params: Map<String, Value>) -> Result<MediaReadRequest, RpcError> {
    let r: Box<MediaReadRequest> = strict(params, Method::MediaRead)?;
    if r.check(u64::MAX).is_err() {
        return Err(invalid(format!(
            "`length` is at most {} bytes",
            cortexkit_role_llm_runner::attachments::CHUNK_MAX
        ))
        .with_field("length"));
    }
    Ok(*r)
}

#[cfg(test)]
mod tests {
    use super::UploadOp;
    use crate::request::{parse, Request};
    use crate::RpcError;

    /// The refusal an upload request's parameters get (once its caller is admitted).
    fn refused(body: &[u8]) -> RpcError {
        match parse(body) {
            Ok(Request::Upload {
                op: UploadOp::Refused { error, .. },
                ..
            }) => error,
            Err(e) => e,
            other => panic!("not refused: {other:?}"),
        }
    }

    fn body(method: &str, params: &str) -> Vec<u8> {
        format!(
            r#"{{"method":"{method}","params":{{"project_root":"/p","harness":"h","session":"s",{params}}}}}"#
        )
        .into_bytes()
    }

    #[test]
    fn uploads_parse_strictly_and_name_what_is_wrong() {
        let sha = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        let r = parse(&body(
            "session.upload_begin",
            &format!(r#""mime":"image/png","bytes":3,"sha256":"{sha}""#),
        ))
        .unwrap();
        assert!(matches!(r, Request::Upload { .. }));
        let e = refused(&body(
            "session.upload_begin",
            r#""mime":"image/png","bytes":3,"sha256":"ABC""#,
        ));
        assert_eq!(e.detail["field"], "sha256");
        let e = refused(&body(
            "session.upload_append",
            r#""upload_id":"u","offset":0,"data":"%%%""#,
        ));
        assert_eq!(e.detail["field"], "data");
        let Request::Upload { op, .. } = parse(&body(
            "session.upload_append",
            r#""upload_id":"u","offset":0,"data":"YWJj""#,
        ))
        .unwrap() else {
            panic!("an append")
        };
        assert_eq!(op.upload_id(), Some("u"));
        let big = base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            vec![0u8; cortexkit_role_llm_runner::attachments::CHUNK_MAX + 1],
        );
        let e = refused(&body(
            "session.upload_append",
            &format!(r#""upload_id":"u","offset":0,"data":"{big}""#),
        ));
        assert_eq!(e.code.as_str(), "upload_chunk_too_large");
        let e = parse(&body(
            "session.media_read",
            &format!(r#""sha256":"{sha}","offset":0,"length":2097153"#),
        ))
        .unwrap_err();
        assert_eq!(e.detail["field"], "length");
        let e = refused(&body("session.upload_status", r#""upload_id":"u","x":1"#));
        assert_eq!(e.detail["field"], "x");
    }
}
