//! Person-only commands in the domain alone (llm-runner/v1 `user_commands`): what a plan's
//! answers freeze, what an invocation comes to before anything is written, and what the
//! records of a relayed command answer.

use broca_fetch_plan::commands::{
    answer, call_key, outcome_unknown, relay, Relay, UserCommands, PROGRESS_KEPT, RETAINED_MS,
};
use broca_fetch_plan::plan::{Arrived, Plan};
use broca_wal::cmdrec::{CommandReply, UserCommandRecord};
use broca_wal::planrec::FrozenPlan;
use broca_wal::SessionTriple;
use broca_wire::Refusal;
use cortexkit_role_llm_runner::user_commands::UserCommandRequest;
use cortexkit_role_tool_provider::catalog::CatalogAnswer;
use cortexkit_role_tool_provider::user_command::UserCommand;
use serde_json::{json, Value};

fn triple() -> SessionTriple {
    SessionTriple::new("/p", "h", "s").unwrap()
}

/// A plan of `providers`, each answering with the commands named, no tools.
fn frozen(providers: &[(&str, &[&str])], interactive: Option<bool>) -> Result<FrozenPlan, Refusal> {
    let items: Vec<Value> = providers
        .iter()
        .map(|(p, _)| json!({"provider": p, "params": {}}))
        .collect();
    let mut plan = json!({"tool_items": items});
    if let Some(i) = interactive {
        plan["interactive"] = json!(i);
    }
    let plan = Plan::read(&plan)?;
    let answers = providers
        .iter()
        .map(|(p, names)| {
            let commands = names
                .iter()
                .map(|n| UserCommand::new(*n, format!("{n} of {p}")))
                .collect();
            Ok(Arrived {
                answer: CatalogAnswer::new("g1", format!("c-{p}")).with_user_commands(commands),
                specs: Vec::new(),
            })
        })
        .collect();
    plan.admit(answers)
}

fn request(command: &str, id: &str) -> UserCommandRequest {
    UserCommandRequest::new(command, "  verbatim input\n", id)
}

fn reply(state: &str, text: &str) -> CommandReply {
    CommandReply {
        state: state.into(),
        text: text.into(),
        job: None,
    }
}

#[test]
fn a_plan_freezes_its_providers_commands_and_the_baseline_lists_them() {
    let plan = frozen(
        &[
            ("tools-a", &["ctx-status", "ctx-wrapup"]),
            ("tools-b", &["deploy"]),
        ],
        None,
    )
    .unwrap();
    let names: Vec<(&str, &str)> = plan
        .user_commands
        .iter()
        .map(|c| (c.provider.as_str(), c.name.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("tools-a", "ctx-status"),
            ("tools-a", "ctx-wrapup"),
            ("tools-b", "deploy")
        ]
    );
    let baseline: cortexkit_role_llm_runner::baseline::BaselineReply =
        serde_json::from_value(broca_fetch_plan::plan::baseline(&plan, Vec::new())).unwrap();
    let listed = baseline.baseline.unwrap().user_commands;
    assert_eq!(listed.len(), 3);
    assert_eq!(listed[2].provider, "tools-b");
    assert_eq!(listed[2].command.name, "deploy");
    // No commands: the member is left out, so such a baseline keeps its bytes.
    let plain = frozen(&[("tools-a", &[])], None).unwrap();
    let value = broca_fetch_plan::plan::baseline(&plain, Vec::new());
    assert!(value["baseline"].get("user_commands").is_none(), "{value}");
}

#[test]
fn one_command_name_from_two_providers_is_refused_naming_both() {
    let e = frozen(
        &[("tools-a", &["ctx-status"]), ("tools-b", &["ctx-status"])],
        None,
    )
    .unwrap_err();
    assert_eq!(
        e,
        Refusal::UserCommandCollision {
            name: "ctx-status".into(),
            providers: vec!["tools-a".into(), "tools-b".into()],
        }
    );
    let e = broca_wire::RpcError::refusal(&e);
    assert_eq!(e.code.as_str(), "user_command_collision");
    assert_eq!(e.detail["providers"], json!(["tools-a", "tools-b"]));
}

#[test]
fn a_plan_no_person_drives_freezes_no_command_and_refuses_every_invocation() {
    let plan = frozen(&[("tools-a", &["ctx-status"])], Some(false)).unwrap();
    assert!(plan.user_commands.is_empty() && !plan.interactive);
    let e = relay(
        &triple(),
        Some(&plan),
        &UserCommands::default(),
        "o",
        &request("ctx-status", "i1"),
        1,
    )
    .unwrap_err();
    assert_eq!(e, Refusal::NoPerson);
    assert_eq!(
        Plan::read(&json!({"interactive": "no"})).unwrap_err(),
        Refusal::InvalidField {
            field: "plan.interactive",
            why: "`plan.interactive` must be a boolean".into()
        }
    );
}

#[test]
fn an_invocation_is_recorded_before_it_is_forwarded_and_a_retry_never_forwards_again() {
    let plan = frozen(&[("tools-a", &["ctx-status"])], None).unwrap();
    let mut commands = UserCommands::default();
    let t = triple();
    // Unknown names (and sessions without a plan) are refused naming the command.
    for plan in [Some(&plan), None] {
        let e = relay(&t, plan, &commands, "o", &request("nope", "i1"), 1).unwrap_err();
        assert_eq!(
            e,
            Refusal::UnknownUserCommand {
                command: "nope".into()
            }
        );
    }
    let Relay::New {
        call_key: key,
        provider,
        record,
    } = relay(
        &t,
        Some(&plan),
        &commands,
        "o",
        &request("ctx-status", "i1"),
        5,
    )
    .unwrap()
    else {
        panic!("a new invocation is forwarded");
    };
    assert_eq!(provider, "tools-a");
    assert_eq!(key, call_key(&t, "o", "i1"));
    assert_ne!(
        key,
        call_key(&t, "other-owner", "i1"),
        "the owner is part of the identity"
    );
    commands.apply(&record);
    // Recorded, not answered: a retry may find it lost (outcome_unknown is the actor's).
    let again = relay(
        &t,
        Some(&plan),
        &commands,
        "o",
        &request("ctx-status", "i1"),
        6,
    )
    .unwrap();
    assert_eq!(
        again,
        Relay::Unanswered {
            call_key: key.clone()
        }
    );
    commands.apply(&UserCommandRecord::Replied {
        call_key: key.clone(),
        reply: outcome_unknown(),
        at_unix_ms: 7,
    });
    // A later reply never replaces the first one stored.
    commands.apply(&UserCommandRecord::Replied {
        call_key: key.clone(),
        reply: reply("done", "late"),
        at_unix_ms: 8,
    });
    let stored = relay(&t, Some(&plan), &commands, "o", &request("other", "i1"), 9).unwrap();
    let Relay::Stored { reply: first, .. } = stored else {
        panic!("a retry is answered from the session");
    };
    assert_eq!(first.state, "outcome_unknown");
    assert!(first.text.contains("may have run"));
    let a = answer(&key, &first);
    let decoded: cortexkit_role_llm_runner::user_commands::UserCommandAnswer =
        serde_json::from_value(a).unwrap();
    assert!(decoded.reply.is_outcome_unknown());
}

#[test]
fn an_accepted_command_keeps_its_progress_in_order_once_each_then_its_result() {
    let mut commands = UserCommands::default();
    let key = "broca-cmd:k".to_string();
    commands.apply(&UserCommandRecord::Invoked {
        call_key: key.clone(),
        invocation_id: "i".into(),
        owner: "o".into(),
        command: "ctx-wrapup".into(),
        provider: "tools-a".into(),
        at_unix_ms: 1,
    });
    commands.apply(&UserCommandRecord::Replied {
        call_key: key.clone(),
        reply: reply("accepted", "working"),
        at_unix_ms: 2,
    });
    assert_eq!(
        commands.awaiting().collect::<Vec<_>>(),
        [(key.as_str(), "tools-a")]
    );
    for (e, t) in [("e1", "one"), ("e2", "two"), ("e1", "one again")] {
        commands.apply(&UserCommandRecord::Progress {
            call_key: key.clone(),
            event_id: e.into(),
            text: t.into(),
            at_unix_ms: 3,
        });
    }
    let status = commands.get(&key, 3).unwrap().status();
    assert_eq!(status["state"], "accepted");
    assert_eq!(status["progress"], json!(["one", "two"]));
    assert!(commands.has_entry(&key, "e2") && !commands.has_entry(&key, "e3"));
    commands.apply(&UserCommandRecord::Settled {
        call_key: key.clone(),
        event_id: Some("e3".into()),
        reply: reply("done", "finished"),
        at_unix_ms: 10,
    });
    let status = commands.get(&key, 10).unwrap().status();
    assert_eq!(
        (status["state"].as_str(), status["text"].as_str()),
        (Some("done"), Some("finished"))
    );
    assert_eq!(commands.awaiting().count(), 0);
    // Kept 24 h after the terminal result, then forgotten.
    assert!(commands.get(&key, 10 + RETAINED_MS - 1).is_some());
    assert!(commands.get(&key, 10 + RETAINED_MS).is_none());
}

#[test]
fn a_status_carries_the_latest_twenty_progress_texts() {
    let mut commands = UserCommands::default();
    commands.apply(&UserCommandRecord::Invoked {
        call_key: "k".into(),
        invocation_id: "i".into(),
        owner: "o".into(),
        command: "c".into(),
        provider: "p".into(),
        at_unix_ms: 1,
    });
    commands.apply(&UserCommandRecord::Replied {
        call_key: "k".into(),
        reply: reply("accepted", "w"),
        at_unix_ms: 1,
    });
    for i in 0..30 {
        commands.apply(&UserCommandRecord::Progress {
            call_key: "k".into(),
            event_id: format!("e{i}"),
            text: format!("p{i}"),
            at_unix_ms: 1,
        });
    }
    let status = commands.get("k", 1).unwrap().status();
    let progress = status["progress"].as_array().unwrap();
    assert_eq!(progress.len(), PROGRESS_KEPT);
    assert_eq!(
        (progress[0].as_str(), progress[19].as_str()),
        (Some("p10"), Some("p29"))
    );
    let decoded: cortexkit_role_llm_runner::user_commands::UserCommandStatus =
        serde_json::from_value(status).unwrap();
    decoded.check().unwrap();
}

#[test]
fn the_records_read_back_as_written() {
    let r = UserCommandRecord::Settled {
        call_key: "k".into(),
        event_id: None,
        reply: CommandReply {
            state: "done".into(),
            text: "t".into(),
            job: Some("j".into()),
        },
        at_unix_ms: 1,
    };
    let rec = broca_wal::Record::UserCommand(Box::new(r));
    let mut out = Vec::new();
    rec.encode_payload(&mut out);
    assert!(String::from_utf8_lossy(&out).contains("\"event\":\"settled\""));
    assert_eq!(broca_wal::Record::decode(rec.kind(), &out).unwrap(), rec);
    assert_eq!(
        broca_wal::Record::kind_name(rec.kind()),
        Some("user_command")
    );
}
