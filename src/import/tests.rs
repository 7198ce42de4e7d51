//! The readers on logs the real CLIs wrote (tests/fixtures/import, recorded by its
//! record.sh against aimock): what each becomes, continuations, re-imports, and bad logs.

use broca_protocol::{Block, Role};
use broca_wal::importrec::EpisodeImported;

use super::*;

fn fixture(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/../../tests/fixtures/import/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn import(
    format: Format,
    bytes: &[u8],
    prior: Option<&Prior>,
    open: &[String],
) -> Result<Plan, ImportError> {
    let id = identify(format, "log.jsonl", bytes)?;
    plan(format, "log.jsonl", bytes, &id, prior, open, &mut |_| {})
}

fn episode(plan: Plan) -> EpisodeImported {
    match plan {
        Plan::Episode(e) => *e,
        Plan::Nothing { import_id } => panic!("nothing to import (as {import_id})"),
    }
}

fn prior_of(e: &EpisodeImported) -> Prior {
    Prior {
        import_id: "imp_1".into(),
        bytes: e.origin.bytes,
        blake3: e.origin.blake3.clone(),
        last_line: e.origin.last_line,
        diverged: false,
    }
}

/// Each message as role and its blocks in short: `T:text`, `U:id:name`, `R:id:content`.
fn shape(e: &EpisodeImported) -> Vec<String> {
    e.messages
        .iter()
        .map(|m| {
            let blocks: Vec<String> = m
                .content
                .iter()
                .map(|b| match b {
                    Block::Text { text } => {
                        let first = text.lines().next().unwrap_or("");
                        format!("T:{}", &first[..first.len().min(24)])
                    }
                    Block::ToolUse { id, name, .. } => format!("U:{id}:{name}"),
                    Block::ToolResult {
                        tool_use_id,
                        content,
                        is_error,
                    } => format!(
                        "R:{tool_use_id}:{}{}",
                        &content[..content.len().min(15)],
                        if *is_error { ":error" } else { "" }
                    ),
                    Block::Thinking { .. } => "thinking".into(),
                    Block::Media(m) => format!("M:{}", m.mime),
                })
                .collect();
            let role = if m.role == Role::User {
                "user"
            } else {
                "assistant"
            };
            format!("{role} {}", blocks.join(" | "))
        })
        .collect()
}

#[test]
fn a_claude_code_session_becomes_its_conversation_with_the_usage_it_reported() {
    let bytes = fixture("claude_tool.jsonl");
    let id = identify(Format::ClaudeCode, "f", &bytes).unwrap();
    assert_eq!(id.session, "c91ccee2-1853-4b59-a4f2-6a0b195a4ad9");
    assert_eq!(id.cwd.as_deref(), Some("/tmp/imp/home/work"));
    let e = episode(import(Format::ClaudeCode, &bytes, None, &[]).unwrap());
    assert_eq!(
        shape(&e),
        [
            "user T:fixture-tool: please pri",
            "assistant T:I'll run it. | U:toolu_fixture_1:Bash",
            "user R:toolu_fixture_1:imported-hello",
            "assistant T:The command printed impo",
        ]
    );
    // The caller's tool ids and arguments are kept as the log has them.
    let Block::ToolUse { input, .. } = &e.messages[1].content[1] else {
        panic!("a tool call")
    };
    let input: serde_json::Value = serde_json::from_str(input.get()).unwrap();
    assert_eq!(input["command"], "echo imported-hello");
    // One usage per provider message (each split line repeats it), in canonical measures.
    let usage: Vec<_> = e
        .usage
        .iter()
        .map(|u| (u.message, u.usage.input, u.usage.output, u.usage.cache_read))
        .collect();
    assert_eq!(
        usage,
        [
            (1, Some(200), Some(30), Some(0)),
            (3, Some(220), Some(9), Some(0))
        ]
    );
    assert_eq!(e.usage[0].model.as_deref(), Some("claude-opus-5-5"));
    assert!(e.usage[0].response_id.is_some());
    assert!(e.outcome_unknown.is_empty() && e.pending.is_empty());
    assert_eq!(
        (e.origin.first_line, e.origin.last_line, e.origin.bytes),
        (1, 29, bytes.len() as u64)
    );
    assert_eq!(e.origin.blake3, blake3::hash(&bytes).to_hex().as_str());
}

#[test]
fn a_claude_code_session_killed_in_a_tool_call_then_resumed_never_counts_the_call_a_success() {
    let killed = fixture("claude_killed.jsonl");
    let resumed = fixture("claude_resumed.jsonl");
    let first = episode(import(Format::ClaudeCode, &killed, None, &[]).unwrap());
    assert_eq!(first.pending, ["toolu_fixture_2"]);
    assert!(first.outcome_unknown.is_empty());
    // The longer log appends only its new lines; Claude Code's placeholder for the
    // interrupted call is an unknown outcome, not the tool's answer.
    let tail = episode(
        import(
            Format::ClaudeCode,
            &resumed,
            Some(&prior_of(&first)),
            &first.pending,
        )
        .unwrap(),
    );
    assert_eq!(tail.origin.first_line, first.origin.last_line + 1);
    assert_eq!(tail.origin.continues.as_deref(), Some("imp_1"));
    assert_eq!(tail.outcome_unknown, ["toolu_fixture_2"]);
    assert!(tail.pending.is_empty());
    assert_eq!(
        shape(&tail),
        [
            "user R:toolu_fixture_2:outcome unknown:error",
            "assistant T:No response requested.",
            "user T:continue after the kill",
            "assistant T:Picking up after the int",
        ]
    );
    let Block::ToolResult { content, .. } = &tail.messages[0].content[0] else {
        panic!("a result")
    };
    assert!(content.contains("[Tool call interrupted"), "{content}");
    // The harness's own message reported zeros it never measured: left out, with a note.
    assert_eq!(tail.usage.len(), 1);
    assert!(tail.notes.iter().any(|n| n.note.contains("<synthetic>")));
    // The whole resumed log at once comes to the same conversation.
    let whole = episode(import(Format::ClaudeCode, &resumed, None, &[]).unwrap());
    assert_eq!(shape(&whole), [shape(&first), shape(&tail)].concat());
}

#[test]
fn a_codex_rollout_becomes_its_conversation_with_the_usage_of_each_response() {
    let bytes = fixture("codex_tool.jsonl");
    let id = identify(Format::Codex, "f", &bytes).unwrap();
    assert_eq!(id.session, "01a232bc-d3ba-7ee3-a285-c64ceebc75b8");
    let e = episode(import(Format::Codex, &bytes, None, &[]).unwrap());
    assert_eq!(
        shape(&e),
        [
            "user T:<environment_context> | T:codex-tool: please print",
            "assistant T:Running it. | U:call_codex_1:exec_command",
            "user R:call_codex_1:Chunk ID: a357f",
            "assistant T:The command printed impo",
        ]
    );
    let usage: Vec<_> = e
        .usage
        .iter()
        .map(|u| (u.message, u.usage.input, u.usage.output, u.usage.reasoning))
        .collect();
    assert_eq!(
        usage,
        [
            (1, Some(300), Some(20), Some(0)),
            (3, Some(220), Some(9), Some(0))
        ]
    );
    assert_eq!(e.usage[1].model.as_deref(), Some("gpt-5.1-codex"));
    // Reasoning encrypted for its provider and the harness's instructions are left out,
    // each with a note naming its line.
    assert!(e
        .notes
        .iter()
        .any(|n| n.note.contains("reasoning") && n.line == 11));
    assert!(e.notes.iter().any(|n| n.note.contains("developer")));
}

#[test]
fn a_codex_session_killed_in_a_tool_call_then_resumed_resolves_the_call_as_outcome_unknown() {
    let killed = fixture("codex_killed.jsonl");
    let resumed = fixture("codex_resumed.jsonl");
    let first = episode(import(Format::Codex, &killed, None, &[]).unwrap());
    assert_eq!(first.pending, ["call_codex_2"]);
    let tail = episode(
        import(
            Format::Codex,
            &resumed,
            Some(&prior_of(&first)),
            &first.pending,
        )
        .unwrap(),
    );
    // Codex went on without writing any output for the call: unknown, never a success.
    assert_eq!(tail.outcome_unknown, ["call_codex_2"]);
    assert_eq!(
        shape(&tail),
        [
            "user R:call_codex_2:outcome unknown:error | T:continue after the kill",
            "assistant T:Picking up after the int",
        ]
    );
    // The placeholder Codex writes for an aborted call is an unknown outcome too.
    let mut aborted = killed.clone();
    aborted.extend_from_slice(
        br#"{"type":"response_item","payload":{"type":"function_call_output","call_id":"call_codex_2","output":"aborted"}}"#,
    );
    aborted.push(b'\n');
    let e = episode(import(Format::Codex, &aborted, None, &[]).unwrap());
    assert_eq!(e.outcome_unknown, ["call_codex_2"]);
    assert!(e.pending.is_empty());
}

#[test]
fn the_same_log_again_is_nothing_and_a_different_one_under_the_same_id_is_refused() {
    let bytes = fixture("claude_tool.jsonl");
    let e = episode(import(Format::ClaudeCode, &bytes, None, &[]).unwrap());
    let prior = prior_of(&e);
    assert_eq!(
        import(Format::ClaudeCode, &bytes, Some(&prior), &[]).unwrap(),
        Plan::Nothing {
            import_id: "imp_1".into()
        }
    );
    let mut changed = bytes.clone();
    let at = changed.len() / 2;
    changed[at] ^= 0x20;
    let err = import(Format::ClaudeCode, &changed, Some(&prior), &[]).unwrap_err();
    assert_eq!(err.code.as_str(), "import_conflict", "{err}");
    let shorter = &bytes[..bytes.len() - 200];
    let err = import(Format::ClaudeCode, shorter, Some(&prior), &[]).unwrap_err();
    assert_eq!(err.code.as_str(), "import_conflict", "{err}");
    // A session that went on in broca after the import takes no appended tail.
    let killed = fixture("claude_killed.jsonl");
    let first = episode(import(Format::ClaudeCode, &killed, None, &[]).unwrap());
    let diverged = Prior {
        diverged: true,
        ..prior_of(&first)
    };
    let resumed = fixture("claude_resumed.jsonl");
    let err = import(Format::ClaudeCode, &resumed, Some(&diverged), &[]).unwrap_err();
    assert_eq!(err.code.as_str(), "import_diverged", "{err}");
    assert!(err.message.contains("line 23"), "{err}");
}

#[test]
fn a_malformed_line_is_an_error_naming_file_and_line_and_a_cut_last_line_waits() {
    let bytes = fixture("codex_tool.jsonl");
    let lines: Vec<&[u8]> = bytes.split_inclusive(|&b| b == b'\n').collect();
    let mut bad = lines[..9].concat();
    bad.extend_from_slice(b"{\"type\": \"response_item\", \"payload\": \n");
    bad.extend_from_slice(&lines[9..].concat());
    let err = import(Format::Codex, &bad, None, &[]).unwrap_err();
    assert_eq!(
        (err.code.as_str(), err.line),
        ("import_malformed", Some(10)),
        "{err}"
    );
    assert!(
        err.to_string().starts_with("log.jsonl:10: not a JSON line"),
        "{err}"
    );
    // A known line of the wrong shape is refused too.
    let mut broken = lines[..9].concat();
    broken.extend_from_slice(b"{\"type\":\"response_item\"}\n");
    let err = import(Format::Codex, &broken, None, &[]).unwrap_err();
    assert_eq!(err.line, Some(10), "{err}");
    // A log cut inside its last line: the complete lines are taken, the cut one waits,
    // and the log once complete appends it and the rest.
    let cut_at = lines[..13].concat().len() + 40;
    let cut = &bytes[..cut_at];
    let first = episode(import(Format::Codex, cut, None, &[]).unwrap());
    assert_eq!(first.origin.bytes as usize, lines[..13].concat().len());
    assert_eq!(first.origin.last_line, 13);
    assert!(first
        .notes
        .iter()
        .any(|n| n.line == 14 && n.note.contains("incomplete")));
    let rest = episode(
        import(
            Format::Codex,
            &bytes,
            Some(&prior_of(&first)),
            &first.pending,
        )
        .unwrap(),
    );
    assert_eq!(rest.origin.first_line, 14);
    let whole = episode(import(Format::Codex, &bytes, None, &[]).unwrap());
    assert_eq!(
        [shape(&first), shape(&rest)].concat().len(),
        shape(&whole).len() + 1,
        "the split falls inside the assistant's turn: two messages where one was"
    );
    // A log with no conversation at all is refused, not imported empty.
    let meta_only = lines[..2].concat();
    let err = import(Format::Codex, &meta_only, None, &[]).unwrap_err();
    assert_eq!(err.code.as_str(), "import_empty", "{err}");
}

#[test]
fn thinking_that_can_be_sent_back_is_kept_and_the_rest_dropped_with_a_note() {
    let lines = [
        r#"{"type":"user","sessionId":"t1","cwd":"/p","message":{"role":"user","content":"think"}}"#,
        r#"{"type":"assistant","sessionId":"t1","message":{"id":"m1","role":"assistant","model":"claude-x","content":[{"type":"thinking","thinking":"step one","signature":"EqQBsig=="}]}}"#,
        r#"{"type":"assistant","sessionId":"t1","message":{"id":"m1","role":"assistant","model":"claude-x","content":[{"type":"thinking","thinking":"unsigned","signature":""}]}}"#,
        r#"{"type":"assistant","sessionId":"t1","message":{"id":"m1","role":"assistant","model":"claude-x","content":[{"type":"redacted_thinking","data":"opaque"}]}}"#,
        r#"{"type":"assistant","sessionId":"t1","message":{"id":"m1","role":"assistant","model":"claude-x","content":[{"type":"text","text":"done"}],"usage":{"input_tokens":3,"output_tokens":2}}}"#,
        r#"{"type":"user","isSidechain":true,"sessionId":"t1","message":{"role":"user","content":"a subagent's prompt"}}"#,
    ];
    let bytes = (lines.join("\n") + "\n").into_bytes();
    let e = episode(import(Format::ClaudeCode, &bytes, None, &[]).unwrap());
    assert_eq!(shape(&e), ["user T:think", "assistant thinking | T:done"]);
    let Block::Thinking { text, signature } = &e.messages[1].content[0] else {
        panic!("a thinking block")
    };
    assert_eq!(
        (text.as_str(), signature.as_deref()),
        ("step one", Some("EqQBsig=="))
    );
    let notes: Vec<(u64, &str)> = e.notes.iter().map(|n| (n.line, n.note.as_str())).collect();
    assert!(
        notes[0].0 == 3 && notes[0].1.contains("without its signature"),
        "{notes:?}"
    );
    assert!(
        notes[1].0 == 4 && notes[1].1.contains("redacted"),
        "{notes:?}"
    );
    // Usage the log left out stays out: no cache counts reported, none invented.
    assert_eq!(e.usage[0].usage.cache_read, None);
    assert_eq!(e.usage[0].usage.input, Some(3));
}
