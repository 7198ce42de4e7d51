//! Anthropic Messages (`POST /v1/messages`, streamed as server-sent events).

pub mod normalize;
