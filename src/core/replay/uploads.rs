//! The session's uploads (llm-runner/v1 `attachments`) as its WAL tells them: each begun
//! upload, whether it was committed, and what a send naming it attaches. The bytes are the
//! session's content store's (broca-session); this is what admission and `upload_status`
//! decide from. An upload begun by another process (`boot`) and never committed is gone: its
//! bytes were not durable.

use std::collections::HashMap;

use broca_protocol::media::Media;
use broca_wal::runrec::{UploadBegun, UploadCommitted};

use super::misfit::Misfit;
use super::Session;

/// One upload of the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upload {
    pub begun: UploadBegun,
    /// When its commit was recorded.
    pub committed_at: Option<u64>,
}

impl Upload {
    /// The media block a send naming it attaches.
    pub fn media(&self) -> Media {
        Media {
            kind: broca_protocol::media::kind_of(&self.begun.mime)
                .unwrap_or(broca_protocol::media::kind::DOCUMENT)
                .to_string(),
            mime: self.begun.mime.clone(),
            bytes: self.begun.bytes,
            sha256: self.begun.sha256.clone(),
        }
    }
}

/// Where an upload stands for a caller of this session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UploadState<'a> {
    /// No upload of that id in this session (also one of another session's).
    Unknown,
    /// Begun by a process that stopped before its commit.
    Gone,
    /// Taking bytes.
    Open(&'a Upload),
    Committed(&'a Upload),
}

/// Why a send's `content` is refused (nothing is written).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContentRefusal {
    UnknownUpload(String),
    UploadGone(String),
    NotCommitted(String),
    /// The model the send runs on does not take this media type.
    Unsupported {
        upload_id: String,
        mime: String,
    },
}

/// How many uploads a session keeps track of at once (begun and not yet sent or lost): a
/// begin past it is refused.
pub const OPEN_UPLOADS_MAX: usize = 64;

impl Session {
    /// Where upload `id` stands, for the process the session lives in (`boot`).
    pub fn upload(&self, id: &str) -> UploadState<'_> {
        self.upload_in(id, self.boot)
    }

    /// Where upload `id` stands for the process started at `boot` (a reader's replay has no
    /// process of its own).
    pub fn upload_in(&self, id: &str, boot: u64) -> UploadState<'_> {
        match self.uploads.get(id) {
            None => UploadState::Unknown,
            Some(u) if u.committed_at.is_some() => UploadState::Committed(u),
            Some(u) if u.begun.boot != boot => UploadState::Gone,
            Some(u) => UploadState::Open(u),
        }
    }

    /// How many of the session's uploads are open in this process.
    pub fn open_uploads(&self) -> usize {
        self.uploads
            .values()
            .filter(|u| u.committed_at.is_none() && u.begun.boot == self.boot)
            .count()
    }

    /// The media a send's upload ids attach, in order, each checked as committed in this
    /// session and taken by a model of `family` with `facts`.
    pub fn attach(
        &self,
        ids: &[String],
        boot: u64,
        family: &str,
        facts: &broca_protocol::media::InputFacts,
    ) -> Result<Vec<Media>, ContentRefusal> {
        let mut media = Vec::with_capacity(ids.len());
        for id in ids {
            let u = match self.upload_in(id, boot) {
                UploadState::Unknown => return Err(ContentRefusal::UnknownUpload(id.clone())),
                UploadState::Gone => return Err(ContentRefusal::UploadGone(id.clone())),
                UploadState::Open(_) => return Err(ContentRefusal::NotCommitted(id.clone())),
                UploadState::Committed(u) => u,
            };
            media.push(u.media());
        }
        for (m, id) in media.iter().zip(ids) {
            if !facts.takes(family, &m.mime) {
                return Err(ContentRefusal::Unsupported {
                    upload_id: id.clone(),
                    mime: m.mime.clone(),
                });
            }
        }
        Ok(media)
    }

    /// The media the session's history references, by SHA-256 (what `session.media_read`
    /// may serve).
    pub fn referenced_media(&self, sha256: &str) -> Option<Media> {
        self.transcript.iter().find_map(|m| {
            m.content.iter().find_map(|b| match b {
                broca_protocol::Block::Media(x) if x.sha256 == sha256 => Some(x.clone()),
                _ => None,
            })
        })
    }

    pub(super) fn apply_upload_begun(&mut self, r: UploadBegun) -> Result<(), Misfit> {
        if self.uploads.contains_key(&r.upload_id) {
            return Err(Misfit::UploadMisfit {
                upload_id: r.upload_id,
                why: "it was begun before",
            });
        }
        self.uploads.insert(
            r.upload_id.clone(),
            Upload {
                begun: r,
                committed_at: None,
            },
        );
        Ok(())
    }

    pub(super) fn apply_upload_committed(&mut self, r: UploadCommitted) -> Result<(), Misfit> {
        match self.uploads.get_mut(&r.upload_id) {
            Some(u) if u.committed_at.is_none() => {
                u.committed_at = Some(r.at_unix_ms);
                Ok(())
            }
            Some(_) => Err(Misfit::UploadMisfit {
                upload_id: r.upload_id,
                why: "it was committed before",
            }),
            None => Err(Misfit::UploadMisfit {
                upload_id: r.upload_id,
                why: "it was never begun",
            }),
        }
    }
}

/// The uploads of a session by id.
pub type Uploads = HashMap<String, Upload>;
