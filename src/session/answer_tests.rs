//! Every session command answered in each of its three states: no actor holding the session,
//! its actor idle, and a run of it being driven. Where the states must agree (a command that
//! finds nothing to act on, a refusal, a read), the answers are compared whole.

use std::rc::Rc;

use futures_channel::oneshot;

use broca_core::admission::{SendRequest, Unprepared};
use broca_core::machine::RunMachine;
use broca_testkit::{CountingTools, Script, ScriptedModel};
use broca_wal::SessionTriple;
use broca_wire::{Caller, CancelAt};

use crate::command::SessionCommand;
use crate::{After, SessionActor, Unopened};

type Actor = SessionActor<ScriptedModel, CountingTools>;

/// Reads a command's answer once it was given (a status of a session no actor holds is read
/// from its WAL on the blocking pool: waited for, at most 5 s).
type Answer = Box<dyn FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = String>>>>;

fn reply<V: std::fmt::Debug + 'static>() -> (oneshot::Sender<V>, Answer) {
    let (tx, rx) = oneshot::channel();
    let read = move || -> std::pin::Pin<Box<dyn std::future::Future<Output = String>>> {
        Box::pin(async move {
            let wait = glommio::timer::sleep(std::time::Duration::from_secs(5));
            let answer = async { Some(rx.await) };
            match futures_lite::future::or(answer, async {
                wait.await;
                None
            })
            .await
            {
                Some(Ok(v)) => format!("{v:?}"),
                Some(Err(_)) => "dropped".to_string(),
                None => "not answered in 5 s".to_string(),
            }
        })
    };
    (tx, Box::new(read))
}

fn triple() -> SessionTriple {
    SessionTriple::new("/proj", "test", "answers").expect("a triple")
}

fn stranger() -> Caller {
    Caller {
        principal: Some("reserved:someone-else".into()),
        ..Caller::default()
    }
}

fn send(send_id: &str) -> SendRequest {
    SendRequest {
        prompt: "hello".into(),
        model: "scripted/m1".into(),
        send_id: Some(send_id.into()),
        max_steps: Some(4),
        ..SendRequest::default()
    }
}

/// The commands whose answers must agree across states, each with how to read its answer.
/// `run` is a run of the session that is not the one being driven.
fn agreeing(run: &str) -> Vec<(SessionCommand, Answer)> {
    let mut out: Vec<(SessionCommand, Answer)> = Vec::new();
    let (r, a) = reply();
    let mut unknown_model = send("refused");
    unknown_model.model = "nosuch/model".into();
    let admission = Box::new(prepared(&unknown_model));
    assert!(admission.is_err(), "a send of an unknown model is refused");
    out.push((
        SessionCommand::Send {
            admission,
            reply: r,
        },
        a,
    ));
    let (r, a) = reply();
    let run_id = Some("run_that_never_was".to_string());
    out.push((SessionCommand::Status { run_id, reply: r }, a));
    for caller in [Caller::operator(), stranger()] {
        let (r, a) = reply();
        let (run_id, at) = (run.to_string(), CancelAt::Now);
        out.push((
            SessionCommand::Cancel {
                run_id,
                at,
                caller,
                reply: r,
            },
            a,
        ));
    }
    let (r, a) = reply();
    let submission_id = "sub_that_never_was".to_string();
    let caller = Caller::operator();
    out.push((
        SessionCommand::Retract {
            submission_id,
            caller,
            reply: r,
        },
        a,
    ));
    let (r, a) = reply();
    out.push((
        SessionCommand::LateResult {
            late: late(),
            reply: r,
        },
        a,
    ));
    let (r, a) = reply();
    let call_key = "broca-cmd:unknown".to_string();
    out.push((
        SessionCommand::CommandStatus {
            call_key,
            caller: Caller::operator(),
            reply: r,
        },
        a,
    ));
    let (r, a) = reply();
    let request = Box::new(
        cortexkit_role_llm_runner::user_commands::UserCommandRequest::new("nosuch", "", "inv_1"),
    );
    out.push((
        SessionCommand::UserCommand {
            request,
            caller: Caller::operator(),
            reply: r,
        },
        a,
    ));
    let (r, a) = reply();
    let (call_key, entries) = ("broca-cmd:unknown".to_string(), Vec::new());
    out.extend(changes());
    out.push((
        SessionCommand::CommandLate {
            call_key,
            entries,
            reply: r,
        },
        a,
    ));
    out
}

/// The commands whose answers agree, with a release: nothing to release in a session never
/// written.
fn never_written() -> Vec<(SessionCommand, Answer)> {
    let mut out = agreeing("run_1");
    let (r, a) = reply();
    let caller = Caller::operator();
    out.push((SessionCommand::Release { caller, reply: r }, a));
    out
}

/// The commands that change a session, each with nothing to change.
fn changes() -> Vec<(SessionCommand, Answer)> {
    use cortexkit_role_llm_runner::session_change::{RefreshPolicyRequest, RefreshRequest};
    let caller = Caller::operator;
    let mut out: Vec<(SessionCommand, Answer)> = Vec::new();
    let (r, a) = reply();
    let request = Box::new(RefreshRequest {
        plan: serde_json::Map::new(),
        policy: "next_turn".into(),
        generation: 1,
    });
    let (identity, plan) = ("plan-1".to_string(), None);
    let refresh = SessionCommand::Refresh {
        request,
        identity,
        plan,
        caller: caller(),
        reply: r,
    };
    out.push((refresh, a));
    let (r, a) = reply();
    let request = Box::new(RefreshPolicyRequest::new(1, "next_turn", "c1"));
    out.push((
        SessionCommand::RefreshPolicy {
            request,
            caller: caller(),
            reply: r,
        },
        a,
    ));
    let (r, a) = reply();
    let send_id = "s9".to_string();
    out.push((
        SessionCommand::FlushPrefix {
            send_id,
            caller: caller(),
            reply: r,
        },
        a,
    ));
    let (r, a) = reply();
    let (call_key, answer) = ("broca-cmd:unknown".to_string(), command_reply());
    out.push((
        SessionCommand::CommandReplied {
            call_key,
            answer,
            reply: r,
        },
        a,
    ));
    let (r, a) = reply();
    let op = broca_wire::request::uploads::UploadOp::Status {
        upload_id: "up_none".into(),
    };
    out.push((
        SessionCommand::Upload {
            op,
            caller: caller(),
            reply: r,
        },
        a,
    ));
    out
}

fn command_reply() -> broca_wal::cmdrec::CommandReply {
    broca_wal::cmdrec::CommandReply {
        state: "failed".into(),
        text: "lost".into(),
        job: None,
    }
}

fn late() -> broca_tools::late::LateResult {
    broca_tools::late::LateResult {
        module: "m".into(),
        scope_ref: "s".into(),
        call_key: "broca:nosuch".into(),
        event_id: "e1".into(),
        outcome: "result".into(),
        content: "late".into(),
        is_error: false,
        settled_at_unix_ms: 1,
        command: None,
    }
}

/// A send as admission's first part leaves it.
fn prepared(req: &SendRequest) -> Result<broca_core::admission::Prepared, Unprepared> {
    let catalog = broca_catalog::current();
    let specs = CountingTools::specs(&["echo"]);
    broca_core::admission::prepare(req, &specs, &catalog, &broca_protocol::model::AnyProvider)
}

async fn open(dir: &std::path::Path) -> Actor {
    let tools = CountingTools::default();
    let model = ScriptedModel::new(Script::default());
    SessionActor::opener(dir, &triple(), Rc::new(model), Rc::new(tools))
        .tool_specs(CountingTools::specs(&["echo"]))
        .timer_permille(0)
        .open()
        .await
        .expect("the session opens")
}

/// Answers each command with the actor (and `run`'s machine, when one is driven).
async fn answers(
    actor: &mut Actor,
    mut run: Option<&mut RunMachine>,
    cmds: Vec<(SessionCommand, Answer)>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (cmd, read) in cmds {
        let name = cmd.name();
        let after = actor.answer(cmd, run.as_deref_mut()).await;
        assert!(matches!(after, After::Serve), "{name}: {after:?}");
        out.push(format!("{name}: {}", read().await));
    }
    out
}

/// The machine of the run the actor admitted last (as `run_admitted` starts it).
fn machine(actor: &Actor) -> RunMachine {
    let open = actor.state.open.clone().expect("a run was admitted");
    let run = &actor.state.runs[open.index];
    RunMachine::start_with_steers(
        run.run_id.clone(),
        run.config.clone(),
        actor.state.transcript.clone(),
        actor.state.compacted.clone(),
        Vec::<broca_core::machine::Waiting>::new(),
        crate::now_unix_ms(),
    )
}

#[test]
fn a_session_never_written_answers_alike_with_and_without_an_actor() {
    broca_testkit::install_scripted_provider();
    let unopened_dir = tempfile::tempdir().expect("a folder");
    let idle_dir = tempfile::tempdir().expect("a folder");
    broca_shards::run_local(async move {
        let wal = broca_wal_writer::wal_path(unopened_dir.path(), &triple());
        let mut without = Vec::new();
        for (cmd, read) in never_written() {
            let name = cmd.name();
            let done = crate::answer_unopened(&wal, cmd);
            assert!(matches!(done, Unopened::Answered), "{name}: {done:?}");
            glommio::yield_if_needed().await;
            without.push(format!("{name}: {}", read().await));
        }
        assert!(
            !wal.exists(),
            "answering a session never written creates no WAL"
        );
        let mut actor = open(idle_dir.path()).await;
        let idle = answers(&mut actor, None, never_written()).await;
        assert_eq!(without, idle, "no actor and an idle actor answer alike");
        // What waits for rest: the keeper's, in both.
        let (reply, _) = oneshot::channel();
        let done = crate::answer_unopened(&wal, SessionCommand::Expire { reply });
        assert!(matches!(done, Unopened::Expire(_)));
        let (reply, _) = oneshot::channel();
        let after = actor.answer(SessionCommand::Expire { reply }, None).await;
        assert!(matches!(after, After::Expire(_)));
    })
    .expect("an executor");
}

#[test]
fn an_idle_session_and_one_running_answer_alike() {
    let dir = tempfile::tempdir().expect("a folder");
    broca_shards::run_local(async move {
        let mut actor = open(dir.path()).await;
        let first = actor.send(&send("s1")).await.expect("admitted");
        actor.run_admitted().await.expect("the run ends");
        let idle = answers(&mut actor, None, agreeing(&first.run_id)).await;
        // The same session with a second run admitted and its machine in hand.
        let second = actor.send(&send("s2")).await.expect("admitted");
        assert_ne!(second.run_id, first.run_id);
        let mut m = machine(&actor);
        let running = answers(&mut actor, Some(&mut m), agreeing(&first.run_id)).await;
        assert_eq!(
            idle, running,
            "an idle session and a running one answer alike"
        );
        // A repeated send names its run in both states, and starts nothing during a run.
        let (r, a) = reply();
        let admission = Box::new(prepared(&send("s1")));
        let after = actor
            .answer(
                SessionCommand::Send {
                    admission,
                    reply: r,
                },
                Some(&mut m),
            )
            .await;
        assert!(matches!(after, After::Serve));
        assert!(
            a().await.contains(&first.run_id),
            "the repeat names the first run"
        );
        // What waits for rest is answered at once during a run.
        let (tx, read) = reply();
        let after = actor
            .answer(SessionCommand::Close { reply: tx }, Some(&mut m))
            .await;
        assert!(matches!(after, After::Serve));
        assert_eq!(read().await, "false", "a running session does not close");
        let (tx, read) = reply();
        let after = actor
            .answer(SessionCommand::Expire { reply: tx }, Some(&mut m))
            .await;
        assert!(matches!(after, After::Serve));
        assert_eq!(read().await, "None", "a running session never expires");
        // A cancel of the run being driven is the one answer that differs: it reaches it.
        let (tx, read) = reply();
        let (run_id, at, caller) = (second.run_id.clone(), CancelAt::Now, Caller::operator());
        actor
            .answer(
                SessionCommand::Cancel {
                    run_id,
                    at,
                    caller,
                    reply: tx,
                },
                Some(&mut m),
            )
            .await;
        assert_eq!(read().await, "Ack");
    })
    .expect("an executor");
}
