//! The demo model (`demo/tour`), for a first run with no provider key and no network: a
//! deterministic script that streams a greeting, asks for one harmless built-in tool
//! (`demo_word_count`, which counts the words of the prompt, slowly enough to kill broca in
//! the middle of it), and answers with what the tool said. It runs through broca's whole
//! durable loop like any model (the run, its steps, the tool's dispatch intent and result in
//! the WAL), and costs nothing.

use crate::{Block, FinishReason, Message, Request, Role, StreamEvent, ToolSpec, Usage};

/// The demo's wire family (no wire: the script runs in broca).
pub const FAMILY: &str = crate::family::Family::Demo.id();
/// The demo model's built-in tool.
pub const WORD_COUNT: &str = "demo_word_count";
/// The route of the demo's built-in tool.
pub const WORD_COUNT_ROUTE: &str = "builtin:demo_word_count";
/// How long the built-in tool takes (a window to try `kill -9` in the middle of a tool call).
pub const WORD_COUNT_MS: u64 = 1_500;
/// The pause between the script's text deltas, for a visible stream.
pub const DELTA_MS: u64 = 40;

/// The built-in tool's spec, offered to a demo run.
pub fn word_count_spec() -> ToolSpec {
    ToolSpec {
        name: WORD_COUNT.into(),
        description: "Counts the words of a text (the demo model's harmless built-in tool).".into(),
        input_schema: serde_json::json!({
            "type": "object",
            "properties": {"text": {"type": "string", "description": "the text to count"}},
            "required": ["text"],
            "additionalProperties": false,
        }),
        route: WORD_COUNT_ROUTE.into(),
        reply: None,
    }
}

/// An input the built-in tool does not take: it says what it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotText;

impl std::fmt::Display for NotText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("demo_word_count takes {\"text\": \"...\"}")
    }
}

/// The built-in tool: the words of `input.text`, or why the input is not one.
pub fn count_words(input: &serde_json::Value) -> Result<String, NotText> {
    let text = input.get("text").and_then(|t| t.as_str()).ok_or(NotText)?;
    let n = text.split_whitespace().count();
    Ok(format!("{n} word{}", if n == 1 { "" } else { "s" }))
}

/// The text of a message's text blocks.
fn text_of(m: &Message) -> String {
    m.content
        .iter()
        .filter_map(|b| match b {
            Block::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The script's answer to `request`, as the events a provider's stream would give, each with
/// the pause before it (ms). The first step greets and calls the tool on the latest prompt;
/// once the tool has answered (or its outcome is unknown), the next step says what it got.
pub fn answer(request: &Request) -> Vec<(u64, StreamEvent)> {
    let last_user = request
        .messages
        .iter()
        .rev()
        .find(|m| m.role == Role::User)
        .map(|m| m.as_ref());
    let tool_answer = last_user.and_then(|m| {
        m.content.iter().find_map(|b| match b {
            Block::ToolResult {
                content, is_error, ..
            } => Some((content.clone(), *is_error)),
            _ => None,
        })
    });
    let input = request
        .messages
        .iter()
        .map(|m| text_of(m).len() as u64)
        .sum::<u64>()
        / 4
        + 1;
    match tool_answer {
        None => {
            let prompt = last_user.map(text_of).unwrap_or_default();
            greeting(&prompt, request.messages.len(), input)
        }
        Some((content, is_error)) => closing(&content, is_error, input),
    }
}

/// The words of `text`, one delta each.
fn say(text: &str, events: &mut Vec<(u64, StreamEvent)>) {
    for word in text.split_inclusive(' ') {
        events.push((DELTA_MS, StreamEvent::TextDelta(word.to_string())));
    }
}

/// The first step: a greeting, then the built-in tool called on `prompt` (the call's id
/// from the request's `messages` count).
fn greeting(prompt: &str, messages: usize, input: u64) -> Vec<(u64, StreamEvent)> {
    let mut events = Vec::new();
    say(
        "Hello from broca's demo model. Everything you see is written to this \
         session's log before it happens. I'll count the words of your message with \
         a built-in tool.",
        &mut events,
    );
    let args = serde_json::json!({ "text": prompt }).to_string();
    events.push((
        DELTA_MS,
        StreamEvent::ToolCallStart {
            index: 0,
            id: format!("demo_{messages}"),
            name: WORD_COUNT.into(),
        },
    ));
    events.push((
        0,
        StreamEvent::ToolCallArgsDelta {
            index: 0,
            json: args,
        },
    ));
    events.push((0, StreamEvent::ToolCallEnd { index: 0 }));
    events.push((0, usage(input, 40)));
    events.push((
        0,
        StreamEvent::Finish {
            reason: FinishReason::ToolUse,
            request_id: None,
        },
    ));
    events
}

/// The last step: what the tool answered (or that its outcome is unknown), and the loop's end.
fn closing(content: &str, is_error: bool, input: u64) -> Vec<(u64, StreamEvent)> {
    let mut events = Vec::new();
    let said = if is_error {
        format!(
            "The tool did not answer cleanly ({content}). broca never runs a call \
             twice when it cannot know whether it ran."
        )
    } else {
        format!("The tool says your message has {content}.")
    };
    say(
        &format!(
            "{said} That was the whole loop: a model step, a durable tool call, its \
             result, and this answer. Try `kill -9` on broca while the tool runs, then \
             start it again."
        ),
        &mut events,
    );
    events.push((0, usage(input, 50)));
    events.push((
        0,
        StreamEvent::Finish {
            reason: FinishReason::EndTurn,
            request_id: None,
        },
    ));
    events
}

fn usage(input: u64, output: u64) -> StreamEvent {
    StreamEvent::Usage(Usage {
        input: Some(input),
        output: Some(output),
        ..Usage::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn request(messages: Vec<Message>) -> Request {
        Request {
            provider: "demo".into(),
            model: "tour".into(),
            credential_id: String::new(),
            system: None,
            messages: messages.into_iter().map(Arc::new).collect(),
            tools: Arc::from(vec![word_count_spec()]),
            generation: Default::default(),
            prompt_cache: false,
            route: None,
            shape: None,
            media: Default::default(),
        }
    }

    #[test]
    fn the_script_calls_the_tool_then_answers_with_its_result() {
        let first = answer(&request(vec![Message::user_text("count these four words")]));
        let args: String = first
            .iter()
            .filter_map(|(_, e)| match e {
                StreamEvent::ToolCallArgsDelta { json, .. } => Some(json.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(args, r#"{"text":"count these four words"}"#);
        assert!(matches!(
            first.last(),
            Some((
                _,
                StreamEvent::Finish {
                    reason: FinishReason::ToolUse,
                    ..
                }
            ))
        ));
        let input: serde_json::Value = serde_json::from_str(&args).unwrap();
        let counted = count_words(&input).unwrap();
        assert_eq!(counted, "4 words");
        let second = answer(&request(vec![
            Message::user_text("count these four words"),
            Message {
                role: Role::User,
                content: vec![Block::ToolResult {
                    tool_use_id: "demo_1".into(),
                    content: counted,
                    is_error: false,
                }],
            },
        ]));
        let text: String = second
            .iter()
            .filter_map(|(_, e)| match e {
                StreamEvent::TextDelta(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert!(text.contains("your message has 4 words"), "{text}");
        assert!(matches!(
            second.last(),
            Some((
                _,
                StreamEvent::Finish {
                    reason: FinishReason::EndTurn,
                    ..
                }
            ))
        ));
        assert!(count_words(&serde_json::json!({"txt": 1})).is_err());
    }
}
