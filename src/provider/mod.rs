//! Provider wire families: one folder per family, each a renderer (frozen config + canonical
//! transcript -> request bytes) and a normalizer (wire events -> canonical stream events).
//! Today: the Anthropic Messages normalizer; the renderers and the transport come next.

pub mod anthropic;

use crate::protocol::{ClassifiedError, StreamEvent};

/// What a normalizer makes of one wire event.
#[derive(Debug, Clone, PartialEq)]
pub enum Normalized {
    /// Canonical events (possibly none, e.g. for a ping).
    Events(Vec<StreamEvent>),
    /// The provider reported an error in the stream, classified here.
    Error(ClassifiedError),
}
