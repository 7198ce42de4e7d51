//! A deterministic simulation of the run loop under crashes: seeded scenarios of sends, tool
//! steps and transient failures, cut at every record boundary (durable, and torn in the middle
//! of the write), then reopened, resumed and continued. After each schedule the invariants of
//! the durability contract are checked against the WAL and the tools' own dispatch counts.
//!
//! BROCA_SIM_SEEDS sets the number of seeds (default 60; a long mode is a larger number).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use broca::core::admission::SendRequest;
use broca::protocol::{Block, Message};
use broca::session::{ActorError, CrashPlan, SessionActor};
use broca::wal::runrec::FinishKind;
use broca::wal::verify::read_and_scan;
use broca::wal::writer::wal_path;
use broca::wal::{scan, Record, SessionTriple, Verdict};
use broca_io::{Committer, LogConfig};
use broca_shards::run_local;
use broca_testkit::{mix, CountingTools, Script, ScriptedModel};

type Actor = SessionActor<ScriptedModel, CountingTools>;

fn triple() -> SessionTriple {
    SessionTriple::new("/sim", "sim", "s").unwrap()
}

struct Scenario {
    script: Script,
    sends: Vec<SendRequest>,
}

fn scenario(seed: u64) -> Scenario {
    let r = mix(seed);
    let script = Script {
        seed,
        calls_per_step_max: 1 + (r % 3) as u32,
        tool_step_percent: 50 + r % 50,
        tool_steps_max: 1 + ((r >> 8) % 3) as u32,
        transient_percent: if (r >> 16) % 4 == 0 { 30 } else { 0 },
        report_usage: true,
        unreported_steps: Vec::new(),
        tools: vec!["echo".into(), "write".into()],
        thinking_bytes: 0,
    };
    let sends = (0..1 + (r >> 24) % 3)
        .map(|i| SendRequest {
            prompt: format!("task {i} of seed {seed}"),
            model: "scripted/sim".into(),
            send_id: Some(format!("send-{i}")),
            max_steps: Some(2 + ((r >> 32) % 4) as u32),
            ..SendRequest::default()
        })
        .collect();
    Scenario { script, sends }
}

async fn open(dir: &Path, s: &Scenario, tools: &CountingTools, plan: CrashPlan) -> Actor {
    let a = SessionActor::opener(
        dir,
        &triple(),
        Rc::new(ScriptedModel::new(s.script.clone())),
        Rc::new(tools.clone()),
    )
    .tool_specs(CountingTools::specs(&["echo", "write"]))
    .log(LogConfig::default())
    .committer(Committer::default())
    .crash_plan(plan)
    .timer_permille(0)
    .open()
    .await
    .expect("open the session");
    a
}

/// What the first life saw before it crashed.
struct Crash {
    seq: u64,
    acked_runs: Vec<(String, String)>, // (send_id, run_id)
    live_transcript: Vec<std::sync::Arc<Message>>,
}

/// Life 1: runs the scenario, crashing after `k` appends. `None` when it finished first.
fn crash_life(
    dir: &Path,
    s: &Scenario,
    tools: &CountingTools,
    k: u64,
    durable: bool,
) -> Option<Crash> {
    run_local(async {
        let plan = CrashPlan {
            after_appends: Some(k),
            durable,
        };
        let mut a = open(dir, s, tools, plan).await;
        let mut acked = Vec::new();
        for req in &s.sends {
            let step = async {
                let reply = a.send(req).await?;
                acked.push((req.send_id.clone().unwrap(), reply.run_id));
                a.run_admitted().await
            };
            match step.await {
                Ok(_) => {}
                Err(ActorError::Crashed { seq }) => {
                    return Some(Crash {
                        seq,
                        acked_runs: acked,
                        live_transcript: a.state().transcript.clone(),
                    })
                }
                Err(e) => panic!("life 1 failed: {e}"),
            }
        }
        a.close().await.expect("close");
        None
    })
    .expect("executor")
}

/// Tears the record `seq` if it is the last one in the file: the crash came mid-write.
fn tear_last_record(path: &Path, seq: u64, salt: u64) -> bool {
    let mut bytes = std::fs::read(path).unwrap();
    let s = scan(&bytes).unwrap();
    let Some(last) = s.frames.last().filter(|f| f.seq == seq) else {
        return false;
    };
    let cut = last.offset + 1 + salt % (last.len - 1);
    bytes[cut as usize..(last.offset + last.len) as usize].fill(0);
    std::fs::write(path, &bytes).unwrap();
    true
}

#[derive(Default)]
struct Counts {
    schedules: u64,
    torn: u64,
    resumed: u64,
    interrupted: u64,
    invariants: u64,
}

fn check_schedule(seed: u64, k: u64, durable: bool, counts: &mut Counts) -> bool {
    let s = scenario(seed);
    let dir = tempdir();
    let tools = CountingTools::default();
    let Some(crash) = crash_life(dir.path(), &s, &tools, k, durable) else {
        return false;
    };
    let path = wal_path(dir.path(), &triple());
    let torn = !durable && tear_last_record(&path, crash.seq, mix(seed ^ k));
    counts.torn += u64::from(torn);
    let ctx = format!("seed {seed}, crash after append {k} (durable {durable}, torn {torn})");

    // Life 2: reopen, check the replayed prefix, resume, retry the acknowledged sends, finish.
    let before_retry_bytes = std::cell::RefCell::new(Vec::new());
    run_local(async {
        let mut a = open(dir.path(), &s, &tools, CrashPlan::default()).await;
        let replayed = a.state().transcript.clone();
        check_prefix(&replayed, &crash.live_transcript, durable && !torn, &ctx);
        if let Some((_, outcome)) = a.resume().await.expect("resume") {
            counts.resumed += 1;
            assert_ne!(
                outcome.reason,
                Some(FinishKind::Cancelled),
                "{ctx}: interrupted reported as cancelled"
            );
            counts.interrupted += u64::from(outcome.reason == Some(FinishKind::Interrupted));
        }
        for (send_id, run_id) in &crash.acked_runs {
            a.writer().log().sync().await.unwrap();
            *before_retry_bytes.borrow_mut() = std::fs::read(&path).unwrap();
            let req = s
                .sends
                .iter()
                .find(|r| r.send_id.as_ref() == Some(send_id))
                .unwrap();
            let reply = a.send(req).await.expect("retry an acknowledged send");
            assert_eq!(
                &reply.run_id, run_id,
                "{ctx}: a retried send_id returned another run"
            );
            assert!(reply.existing, "{ctx}");
            assert_eq!(
                std::fs::read(&path).unwrap(),
                *before_retry_bytes.borrow(),
                "{ctx}: a retry wrote"
            );
        }
        for req in &s.sends {
            let reply = a.send(req).await.expect("send");
            if !reply.existing {
                a.run_admitted().await.expect("run");
            }
        }
        a.close().await.expect("close");
    })
    .expect("executor");
    counts.invariants += check_wal(&path, &tools, &crash, &ctx);
    counts.schedules += 1;
    true
}

/// The replayed transcript is the durable prefix of what the live session had: equal when
/// every record was durable, else a prefix (the torn or lost record's effect missing).
fn check_prefix(
    replayed: &[std::sync::Arc<Message>],
    live: &[std::sync::Arc<Message>],
    all_durable: bool,
    ctx: &str,
) {
    if all_durable {
        assert_eq!(
            replayed, live,
            "{ctx}: replay differs from the durable prefix"
        );
        return;
    }
    assert!(
        replayed.len() <= live.len(),
        "{ctx}: replay invented messages"
    );
    if let Some((last, head)) = replayed.split_last() {
        assert_eq!(
            head,
            &live[..head.len()],
            "{ctx}: replay altered the prefix"
        );
        let live_last = &live[head.len()];
        assert_eq!(last.role, live_last.role, "{ctx}");
        assert_eq!(
            last.content[..],
            live_last.content[..last.content.len()],
            "{ctx}"
        );
    }
}

fn check_wal(path: &Path, tools: &CountingTools, crash: &Crash, ctx: &str) -> u64 {
    let (bytes, sc) = read_and_scan(path).unwrap();
    assert_eq!(sc.verdict, Verdict::Clean, "{ctx}");
    let records = sc.decode(&bytes).unwrap().records;
    let mut checked = 0;
    let mut terminals: HashMap<String, u32> = HashMap::new();
    let mut started = Vec::new();
    let mut batches = HashSet::new();
    let mut steps = HashSet::new();
    let mut intended = HashSet::new();
    // A durable model step is never redone: after a run's ModelStepFinished, the next record
    // of that run that is a model step comes only after the step's tools or a new send.
    let mut step_awaits_tools: HashMap<String, bool> = HashMap::new();
    for (_, r) in &records {
        match r {
            Record::ModelStepFinished(m) => {
                let redone = step_awaits_tools.insert(m.run_id.clone(), true) == Some(true);
                assert!(
                    !redone,
                    "{ctx}: run {} recorded model step {} right after another one: a durable \
                     step was redone",
                    m.run_id, m.step
                );
            }
            Record::ToolResult(t) => {
                step_awaits_tools.insert(t.run_id.clone(), false);
            }
            _ => {}
        }
        match r {
            Record::RunStarted(r) => {
                assert!(
                    !started.contains(&r.run_id),
                    "{ctx}: run id {} reused",
                    r.run_id
                );
                started.push(r.run_id.clone());
            }
            Record::RunFinished(f) => {
                *terminals.entry(f.run_id.clone()).or_default() += 1;
                assert_ne!(f.reason, FinishKind::Cancelled, "{ctx}: nobody cancelled");
            }
            Record::RunPaused(p) => *terminals.entry(p.run_id.clone()).or_default() += 1,
            Record::StepStarted(st) => {
                assert!(
                    steps.insert((st.run_id.clone(), st.step)),
                    "{ctx}: step {} of {} reused",
                    st.step,
                    st.run_id
                );
            }
            Record::ToolDispatchIntent(i) => {
                assert!(
                    batches.insert(i.batch_id.clone()),
                    "{ctx}: batch id {} reused",
                    i.batch_id
                );
                intended.extend(i.calls.iter().map(|c| c.id.clone()));
            }
            _ => {}
        }
    }
    for run in &started {
        assert_eq!(
            terminals.get(run),
            Some(&1),
            "{ctx}: run {run} needs exactly one terminal"
        );
        checked += 1;
    }
    for (id, n) in tools.dispatched.borrow().iter() {
        assert_eq!(*n, 1, "{ctx}: tool call {id} dispatched {n} times");
        assert!(
            intended.contains(id),
            "{ctx}: {id} dispatched without a durable intent"
        );
        checked += 2;
    }
    for (_, run_id) in &crash.acked_runs {
        assert!(
            started.contains(run_id),
            "{ctx}: acknowledged run {run_id} lost"
        );
        checked += 1;
    }
    // No dangling tool call except in a last run that ended interrupted.
    let s = broca::core::Session::replay(records.iter().map(|(q, r)| (*q, r.clone()))).unwrap();
    let dangling = s.unresolved_calls.len();
    let last_interrupted = s
        .runs
        .last()
        .is_some_and(|r| r.state == broca::core::RunState::Finished(FinishKind::Interrupted));
    assert!(
        dangling == 0 || last_interrupted,
        "{ctx}: {dangling} tool calls left dangling"
    );
    for m in &s.transcript {
        for b in &m.content {
            if let Block::ToolResult { content, .. } = b {
                assert!(!content.is_empty(), "{ctx}");
            }
        }
    }
    checked + 2
}

fn tempdir() -> tempfile::TempDir {
    // tmpfs where there is one: the simulation tests the logic, the WAL tests test the disk.
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::tempdir_in(&shm) {
            return d;
        }
    }
    tempfile::tempdir().unwrap()
}

#[test]
fn crashes_at_every_record_boundary_keep_the_durability_contract() {
    let seeds: u64 = std::env::var("BROCA_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let mut counts = Counts::default();
    for seed in 0..seeds {
        for durable in [true, false] {
            let mut k = 1;
            while check_schedule(seed, k, durable, &mut counts) {
                k += 1;
                assert!(k < 10_000, "seed {seed}: the scenario does not end");
            }
        }
    }
    println!(
        "{} schedules ({} torn mid-write), {} resumes ({} interrupted), {} invariants checked",
        counts.schedules, counts.torn, counts.resumed, counts.interrupted, counts.invariants
    );
    assert!(
        counts.schedules >= 1_000,
        "only {} schedules",
        counts.schedules
    );
    assert!(counts.torn > 0 && counts.resumed > 0 && counts.interrupted > 0);
}

/// broca-core alone (no executor, no disk, no clock: `broca_crash_tests::core_sim`), each
/// seeded scenario cut after every append, once keeping only the durable prefix (a power
/// loss) and once keeping every record (a kill), then replayed, resumed and finished. Backoffs
/// and silent streams run on the simulated clock. `BROCA_CORE_SIM_SEEDS` (default 150).
#[test]
fn core_alone_keeps_the_contract_under_a_simulated_clock() {
    use broca_crash_tests::core_sim::{live, Life, Log, Observed, Scenario};
    let seeds: u64 = std::env::var("BROCA_CORE_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    let (mut schedules, mut timeouts, mut resumed_interrupted) = (0u64, 0u64, 0u64);
    for seed in 0..seeds {
        let sc = Scenario::from_seed(seed);
        let appends = {
            let mut seen = Observed::default();
            let mut life = Life::new(&sc, &mut seen, Log::default(), 1_000_000);
            live(&mut life, false).expect("an uncut life ends");
            life.log.records.len()
        };
        for k in 1..=appends {
            for power_loss in [true, false] {
                let ctx =
                    format!("core seed {seed}, cut after append {k}, power loss {power_loss}");
                let mut seen = Observed::default();
                let (mut log, now) = {
                    let mut life = Life::new(&sc, &mut seen, Log::default(), 1_000_000);
                    life.crash_after = Some(k);
                    assert!(
                        live(&mut life, false).is_err(),
                        "{ctx}: the cut was reached"
                    );
                    (life.log.clone(), life.now_ms)
                };
                if !power_loss {
                    log.durable = log.records.len();
                }
                let mut life = Life::new(&sc, &mut seen, log, now + 5_000);
                live(&mut life, true).unwrap_or_else(|_| panic!("{ctx}: the second life ends"));
                let log = life.log.clone();
                drop(life);
                check_core_log(&log.records, &seen, &ctx);
                resumed_interrupted += u64::from(log.records.iter().any(|(_, r)| {
                    matches!(r, Record::RunFinished(f) if f.reason == FinishKind::Interrupted)
                }));
                timeouts += seen.timeouts;
                schedules += 1;
            }
        }
    }
    println!(
        "core alone: {schedules} schedules, {timeouts} timeouts handed in, {resumed_interrupted} \
         runs interrupted by a cut"
    );
    assert!(schedules > 0 && timeouts > 0 && resumed_interrupted > 0);
}

fn check_core_log(
    records: &[(u64, Record)],
    seen: &broca_crash_tests::core_sim::Observed,
    ctx: &str,
) {
    for (id, n) in &seen.dispatched {
        assert_eq!(*n, 1, "{ctx}: tool call {id} dispatched {n} times");
    }
    let mut terminals: HashMap<&str, u32> = HashMap::new();
    let mut awaiting_tools: HashMap<&str, bool> = HashMap::new();
    for (_, r) in records {
        match r {
            Record::RunStarted(s) => {
                terminals.entry(&s.run_id).or_default();
            }
            Record::RunFinished(f) => {
                assert_ne!(f.reason, FinishKind::Cancelled, "{ctx}: nobody cancelled");
                *terminals.entry(&f.run_id).or_default() += 1;
            }
            Record::RunPaused(p) => *terminals.entry(&p.run_id).or_default() += 1,
            Record::ModelStepFinished(m) => {
                let redone = awaiting_tools.insert(&m.run_id, true) == Some(true);
                assert!(
                    !redone,
                    "{ctx}: a durable model step of {} was redone",
                    m.run_id
                );
            }
            Record::ToolResult(t) => {
                awaiting_tools.insert(&t.run_id, false);
            }
            _ => {}
        }
    }
    for (run, n) in &terminals {
        assert_eq!(*n, 1, "{ctx}: run {run} has {n} terminals");
    }
    for (send_id, run_id) in &seen.acked {
        assert!(
            terminals.contains_key(run_id.as_str()),
            "{ctx}: acknowledged send {send_id} (run {run_id}) was lost"
        );
    }
}
