//! Folding a model step's canonical stream events into its content blocks, usage and finish
//! reason. Blocks keep the order in which the stream opened them.

use broca_protocol::{Block, FinishReason, Json, StreamEvent, Usage};

/// A completed model step.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub content: Vec<Block>,
    pub usage: Usage,
    pub finish_reason: FinishReason,
    pub request_id: Option<String>,
    /// The provider's quota as its answer said it.
    pub quota: Option<broca_protocol::Quota>,
}

#[derive(Debug)]
enum Part {
    Text(String),
    Thinking {
        text: String,
        signature: Option<String>,
    },
    Tool {
        index: u32,
        id: String,
        name: String,
        args: String,
    },
}

/// Accumulates one attempt's stream.
#[derive(Debug, Default)]
pub struct StepAccumulator {
    parts: Vec<Part>,
    usage: Usage,
    finish: Option<FinishReason>,
    request_id: Option<String>,
    quota: Option<broca_protocol::Quota>,
}

impl StepAccumulator {
    /// Folds in one event.
    pub fn push(&mut self, ev: StreamEvent) {
        match ev {
            StreamEvent::TextDelta(t) => match self.parts.last_mut() {
                Some(Part::Text(text)) => text.push_str(&t),
                _ => self.parts.push(Part::Text(t)),
            },
            StreamEvent::ThinkingDelta(t) => match self.parts.last_mut() {
                Some(Part::Thinking {
                    text,
                    signature: None,
                }) => text.push_str(&t),
                _ => self.parts.push(Part::Thinking {
                    text: t,
                    signature: None,
                }),
            },
            StreamEvent::Quota(q) => self.quota = Some(q),
            StreamEvent::PartSignature(sig) => self.parts.push(Part::Thinking {
                text: String::new(),
                signature: Some(sig),
            }),
            StreamEvent::ThinkingSignature(sig) => match self.parts.last_mut() {
                Some(Part::Thinking { signature, .. }) => *signature = Some(sig),
                _ => self.parts.push(Part::Thinking {
                    text: String::new(),
                    signature: Some(sig),
                }),
            },
            StreamEvent::ToolCallStart { index, id, name } => self.parts.push(Part::Tool {
                index,
                id,
                name,
                args: String::new(),
            }),
            StreamEvent::ToolCallArgsDelta { index, json } => {
                if let Some(Part::Tool { args, .. }) = self
                    .parts
                    .iter_mut()
                    .rev()
                    .find(|p| matches!(p, Part::Tool { index: i, .. } if *i == index))
                {
                    args.push_str(&json);
                }
            }
            StreamEvent::ToolCallEnd { .. } => {}
            StreamEvent::Usage(u) => self.usage.merge(&u),
            StreamEvent::Finish { reason, request_id } => {
                self.finish = Some(reason);
                if request_id.is_some() {
                    self.request_id = request_id;
                }
            }
        }
    }

    /// The index the part the last event added to has in the step's content.
    pub fn last_part(&self) -> Option<u32> {
        self.parts.len().checked_sub(1).map(|i| i as u32)
    }

    /// The index in the step's content of the tool call the stream numbers `index`, and the
    /// call's id.
    pub fn tool_part(&self, index: u32) -> Option<(u32, String)> {
        self.parts
            .iter()
            .enumerate()
            .rev()
            .find_map(|(i, p)| match p {
                Part::Tool { index: t, id, .. } if *t == index => Some((i as u32, id.clone())),
                _ => None,
            })
    }

    /// The step. Tool arguments that are not a JSON object are kept as a JSON string of the
    /// raw text (see [`invalid_arguments`]): recorded as produced, never dispatched.
    pub fn finish(self) -> Step {
        let has_tools = self.parts.iter().any(|p| matches!(p, Part::Tool { .. }));
        let content = self
            .parts
            .into_iter()
            .map(|p| match p {
                Part::Text(text) => Block::Text { text },
                Part::Thinking { text, signature } => Block::Thinking { text, signature },
                Part::Tool { id, name, args, .. } => {
                    let input = if args.trim().is_empty() {
                        Json::empty_object()
                    } else {
                        match Json::from_text(args.clone()) {
                            Ok(json) if json.is_object() => json,
                            _ => Json::from_value(&serde_json::Value::String(args)),
                        }
                    };
                    Block::ToolUse { id, name, input }
                }
            })
            .collect();
        let finish_reason = self.finish.unwrap_or(if has_tools {
            FinishReason::ToolUse
        } else {
            FinishReason::EndTurn
        });
        Step {
            content,
            usage: self.usage,
            finish_reason,
            request_id: self.request_id,
            quota: self.quota,
        }
    }
}

/// The raw text of tool arguments that were not a JSON object, if so.
pub fn invalid_arguments(input: &Json) -> Option<String> {
    if input.is_object() {
        return None;
    }
    match serde_json::from_str::<serde_json::Value>(input.get()) {
        Ok(serde_json::Value::String(raw)) => Some(raw),
        _ => Some(input.get().to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_fold_into_blocks_in_stream_order() {
        let mut acc = StepAccumulator::default();
        for ev in [
            StreamEvent::ThinkingDelta("hm".into()),
            StreamEvent::ThinkingSignature("sig==".into()),
            StreamEvent::TextDelta("Hel".into()),
            StreamEvent::TextDelta("lo".into()),
            StreamEvent::ToolCallStart {
                index: 0,
                id: "c1".into(),
                name: "ls".into(),
            },
            StreamEvent::ToolCallArgsDelta {
                index: 0,
                json: "{\"pa".into(),
            },
            StreamEvent::ToolCallArgsDelta {
                index: 0,
                json: "th\":\"/\"}".into(),
            },
            StreamEvent::ToolCallStart {
                index: 1,
                id: "c2".into(),
                name: "rm".into(),
            },
            StreamEvent::ToolCallArgsDelta {
                index: 1,
                json: "{broken".into(),
            },
            StreamEvent::Usage(Usage {
                input: Some(3),
                ..Usage::default()
            }),
            StreamEvent::Usage(Usage {
                output: Some(9),
                ..Usage::default()
            }),
        ] {
            acc.push(ev);
        }
        let step = acc.finish();
        assert_eq!(step.finish_reason, FinishReason::ToolUse);
        assert_eq!(
            step.usage,
            Usage {
                input: Some(3),
                output: Some(9),
                ..Usage::default()
            }
        );
        assert_eq!(
            step.content[0],
            Block::Thinking {
                text: "hm".into(),
                signature: Some("sig==".into())
            }
        );
        assert_eq!(
            step.content[1],
            Block::Text {
                text: "Hello".into()
            }
        );
        assert_eq!(
            step.content[2],
            Block::ToolUse {
                id: "c1".into(),
                name: "ls".into(),
                input: Json::from_text(r#"{"path":"/"}"#.into()).unwrap()
            }
        );
        let Block::ToolUse { input, .. } = &step.content[3] else {
            panic!()
        };
        assert_eq!(invalid_arguments(input).as_deref(), Some("{broken"));
    }
}
