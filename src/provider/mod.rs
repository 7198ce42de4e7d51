//! Provider wire families: one folder per family, each a renderer (frozen config + canonical
//! transcript -> request bytes) and a normalizer (wire events -> canonical stream events).
//! Today: the Anthropic Messages and OpenAI Chat normalizers; the renderers and the transport
//! come next.

pub mod anthropic;
pub mod openai_chat;

use crate::protocol::{ClassifiedError, StreamEvent};

/// What a normalizer makes of one wire event.
#[derive(Debug, Clone, PartialEq)]
pub enum Normalized {
    /// Canonical events (possibly none, e.g. for a ping).
    Events(Vec<StreamEvent>),
    /// The provider reported an error in the stream, classified here.
    Error(ClassifiedError),
}

/// A family's stream normalizer: one SSE event's data in, canonical events out.
pub trait StreamNormalizer {
    /// Normalizes one event's data; `Err` names a line that is not of this family.
    fn push(&mut self, data: &str) -> Result<Normalized, String>;
}

/// Decodes `chunks` as server-sent events and normalizes them (for the families' tests).
#[cfg(test)]
pub(crate) fn normalize_chunks<N: StreamNormalizer + Default>(
    chunks: &[&[u8]],
) -> Vec<StreamEvent> {
    let mut sse = broca_io::sse::SseDecoder::default();
    let mut n = N::default();
    let mut out = Vec::new();
    for c in chunks {
        let mut datas = Vec::new();
        sse.push(c, &mut |e| datas.push(e.data)).expect("valid SSE");
        for d in datas {
            match n.push(&d).expect("a known event") {
                Normalized::Events(evs) => out.extend(evs),
                Normalized::Error(e) => panic!("unexpected stream error {e:?}"),
            }
        }
    }
    out
}

/// Asserts that `stream` normalizes to `expected` whole and split at every byte boundary.
#[cfg(test)]
pub(crate) fn assert_every_split<N: StreamNormalizer + Default>(
    stream: &[u8],
    expected: &[StreamEvent],
) {
    assert_eq!(normalize_chunks::<N>(&[stream]), expected);
    for i in 0..=stream.len() {
        assert_eq!(
            normalize_chunks::<N>(&[&stream[..i], &stream[i..]]),
            expected,
            "split at {i}"
        );
    }
}
