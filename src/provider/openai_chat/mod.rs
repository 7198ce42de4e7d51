//! OpenAI Chat Completions (`POST /v1/chat/completions`, streamed as server-sent events).

pub mod normalize;
