//! The built-in compaction's costs in broca, the model's time left out: one compaction step
//! (deciding it is due, cutting, the summary's request, then the step's request that carries
//! the summary) on a conversation at a 32k-token limit, and the replay of a session whose WAL
//! holds 50 summaries. Run: `cargo bench -p broca-bench --bench compaction`.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use broca::core::compaction::SUMMARY_SYSTEM;
use broca::core::machine::{Command, Event, RunMachine};
use broca::core::Session;
use broca::protocol::compaction::Compaction;
use broca::protocol::{Block, Message, Role};
use broca::wal::runrec::{FrozenConfig, ResultBlock};
use broca::wal::verify::read_and_scan;
use broca::wal::writer::wal_path;
use broca::wal::{Record, SessionTriple, WalWriter};
use broca_bench::runs::started;
use broca_io::{Committer, LogConfig};
use criterion::Criterion;

/// A run at the 32k limit with the built-in compaction on.
fn config() -> FrozenConfig {
    broca_bench::runs::config(Some(LIMIT), Some(Compaction::summarize()))
}

/// The model's answer: the summary to a summary's request, else a call while `call` names
/// one, else a closing text.
fn answer(m: &mut RunMachine, summary: bool, call: Option<String>, now: u64) {
    let text = if summary { SUMMARY } else { "Done." };
    broca_bench::runs::answer(m, call.filter(|_| !summary), text, now);
}

const LIMIT: u64 = 32_000;
const RESULT_BYTES: usize = 2_000;
const SUMMARY: &str = "The user is working through a long task in numbered turns; every tool \
call so far returned its result and nothing failed. Files touched: src/lib.rs, src/main.rs. \
Open items: the last turn's question.";

/// Drives runs of eight tool steps each, every record appended to a real WAL in `dir` and
/// applied to the session, until `compactions` summaries are recorded: the WAL's path.
fn build_wal(dir: &Path, compactions: usize) -> std::path::PathBuf {
    let t = SessionTriple::new("/bench", "compaction", "s").unwrap();
    broca_shards::run_local(async {
        let (mut w, _) = WalWriter::open(dir, &t, LogConfig::default(), Committer::default())
            .await
            .unwrap();
        let mut session = Session::default();
        let mut seq = 0u64;
        let mut summaries = 0;
        let mut run = 0;
        while summaries < compactions {
            run += 1;
            let run_id = format!("run_{run}");
            let first =
                Record::RunStarted(Box::new(started(&run_id, format!("turn {run}"), config())));
            w.append(&first).await.unwrap();
            seq += 1;
            session.apply(seq, first).unwrap();
            let mut m = RunMachine::start_with_steers(
                run_id,
                config(),
                session.transcript.clone(),
                session.compacted.clone(),
                Vec::<broca::core::machine::Waiting>::new(),
                0,
            );
            let mut calls_left = 8;
            while !m.is_done() {
                let Some(cmd) = m.poll_command() else {
                    unreachable!("a run in flight always has a command to perform")
                };
                match cmd {
                    Command::Append { record, wait } => {
                        summaries += usize::from(matches!(record, Record::ContextCompacted(_)));
                        w.append(&record).await.unwrap();
                        seq += 1;
                        session.apply(seq, record).unwrap();
                        if wait {
                            m.handle(Event::Durable, 0);
                        }
                    }
                    Command::CallModel { request, .. } => {
                        let summary = request.system.as_deref() == Some(SUMMARY_SYSTEM);
                        let call = (!summary && calls_left > 0).then(|| {
                            calls_left -= 1;
                            format!("c{run}_{calls_left}")
                        });
                        answer(&mut m, summary, call, 0);
                    }
                    Command::Dispatch { calls, .. } => {
                        for c in calls {
                            m.handle(
                                Event::ToolResult(ResultBlock {
                                    call_id: c.id,
                                    content: "x".repeat(RESULT_BYTES),
                                    is_error: false,
                                    reason: None,
                                    size: None,
                                    parts: Vec::new(),
                                }),
                                0,
                            );
                        }
                    }
                    Command::Finish(o) => {
                        assert_eq!(o.reason.map(|r| r.as_str()), Some("completed"), "{o:?}");
                    }
                    Command::AbortModel | Command::Display(_) => {}
                }
            }
        }
        w.close().await.unwrap();
    })
    .unwrap();
    wal_path(dir, &t)
}

/// A conversation of `turns` tool steps after a prompt (about 510 tokens each).
fn conversation(turns: usize) -> Vec<Arc<Message>> {
    let mut t = vec![Arc::new(Message::user_text("go"))];
    for i in 0..turns {
        t.push(Arc::new(Message {
            role: Role::Assistant,
            content: vec![Block::ToolUse {
                id: format!("c{i}"),
                name: "echo".into(),
                input: broca::protocol::Json::empty_object(),
            }],
        }));
        t.push(Arc::new(Message {
            role: Role::User,
            content: vec![Block::ToolResult {
                tool_use_id: format!("c{i}"),
                content: "x".repeat(RESULT_BYTES),
                is_error: false,
            }],
        }));
    }
    t
}

/// One compaction step on `transcript` (over the threshold at its start): the summary's
/// request, its answer recorded, then the first step's request carrying it. The bytes of the
/// summary's record.
fn compaction_step(transcript: &[Arc<Message>]) -> usize {
    let mut m = RunMachine::start("run_c".into(), config(), transcript.to_vec(), 0);
    let mut record_bytes = 0;
    let mut payload = Vec::new();
    let mut asked = 0;
    loop {
        match m.poll_command() {
            Some(Command::CallModel { request, .. }) => {
                asked += 1;
                if asked == 2 {
                    assert_ne!(request.system.as_deref(), Some(SUMMARY_SYSTEM));
                    std::hint::black_box(&request);
                    return record_bytes;
                }
                assert_eq!(request.system.as_deref(), Some(SUMMARY_SYSTEM));
                answer(&mut m, true, None, 0);
            }
            Some(Command::Append { record, wait }) => {
                if let Record::ContextCompacted(_) = &record {
                    record.encode_payload(&mut payload);
                    record_bytes = payload.len();
                }
                if wait {
                    m.handle(Event::Durable, 0);
                }
            }
            Some(_) => {}
            None => panic!("the machine stopped before the step's request"),
        }
    }
}

fn replay(path: &Path) -> (usize, usize, usize) {
    let (bytes, scan) = read_and_scan(path).unwrap();
    let s = Session::replay_scan(&scan, &bytes).unwrap();
    (
        scan.frames.len(),
        s.transcript.len(),
        s.compacted.map_or(0, |c| c.replaced),
    )
}

fn median(mut f: impl FnMut(), n: usize) -> Duration {
    let mut times: Vec<Duration> = (0..n)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed()
        })
        .collect();
    times.sort();
    times[n / 2]
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    // 52 tool steps: about 26,500 tokens, past 80% of the 32k limit.
    let transcript = conversation(52);
    let record_bytes = compaction_step(&transcript);
    let mut g = c.benchmark_group("compaction");
    g.bench_function("compaction_step_32k", |b| {
        b.iter(|| compaction_step(&transcript))
    });
    g.finish();

    let dir = if Path::new("/dev/shm").is_dir() {
        tempfile::tempdir_in("/dev/shm").unwrap()
    } else {
        tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap()
    };
    let path = build_wal(dir.path(), 50);
    let (frames, messages, replaced) = replay(&path);
    let bytes = std::fs::metadata(&path).unwrap().len();
    let mut g = c.benchmark_group("compaction_replay");
    g.sample_size(10).measurement_time(Duration::from_secs(5));
    g.bench_function("replay_50_compactions", |b| b.iter(|| replay(&path)));
    g.finish();
    c.final_summary();

    let step = median(
        || {
            compaction_step(&transcript);
        },
        101,
    );
    let replayed = median(
        || {
            replay(&path);
        },
        11,
    );
    println!(
        "\ncompaction step (32k limit, {} messages): median of 101 {:.1} µs; its record {} bytes",
        transcript.len(),
        step.as_secs_f64() * 1e6,
        record_bytes
    );
    println!(
        "replay with 50 compactions: {frames} records, {messages} messages ({replaced} replaced by \
         the last summary), {:.1} MB; median of 11 {:.2} ms",
        bytes as f64 / 1e6,
        replayed.as_secs_f64() * 1e3
    );
}
