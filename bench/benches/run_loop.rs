//! The run loop's costs without I/O: state machine transitions per second, and replay of a
//! 100,000-record WAL (read, scan, decode, rebuild). Run: `cargo bench -p broca-bench --bench
//! run_loop`.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

use broca::core::machine::{Command, Event, RunMachine};
use broca::core::Session;
use broca::protocol::{FinishReason, Message, StreamEvent, Usage};
use broca::session::SessionActor;
use broca::wal::runrec::{CachePolicy, FrozenConfig, ResultBlock, StopConditions};
use broca::wal::verify::read_and_scan;
use broca::wal::writer::wal_path;
use broca::wal::SessionTriple;
use broca_io::{Committer, LogConfig};
use broca_testkit::{CountingTools, Script, ScriptedModel};
use criterion::{Criterion, Throughput};

const STEPS_PER_RUN: u32 = 50;
const DELTAS_PER_STEP: usize = 20;

fn config() -> FrozenConfig {
    FrozenConfig {
        provider: "scripted".into(),
        model: "bench".into(),
        credential_id: "env:NONE".into(),
        renderer_version: 1,
        catalog_digest: "x".into(),
        catalog: None,
        system: None,
        tools: CountingTools::specs(&["echo"]).into(),
        tools_digest: "y".into(),
        generation: Default::default(),
        stop: StopConditions {
            max_steps: STEPS_PER_RUN,
            max_total_tokens: None,
            max_cost_micros: None,
            input_cap: None,
        },
        context_limit: None,
        cache_policy: CachePolicy::Auto,
        directives: Vec::new(),
        structured_output: None,
        route_decision_id: None,
        compaction: None,
        retention: None,
        retention_policy: None,
        title: None,
        plan: None,
    }
}

/// Drives one run of STEPS_PER_RUN tool steps through the machine; returns the events fed.
fn one_run() -> u64 {
    let mut m = RunMachine::start(
        "run_bench".into(),
        config(),
        vec![Message::user_text("go").into()],
        0,
    );
    let mut events = 0u64;
    let mut feed = |m: &mut RunMachine, ev: Event| {
        m.handle(ev, events);
        events += 1;
        let mut durable = false;
        while let Some(cmd) = m.poll_command() {
            durable |= matches!(cmd, Command::Append { wait: true, .. });
            std::hint::black_box(&cmd);
        }
        durable
    };
    for step in 0..STEPS_PER_RUN {
        for _ in 0..DELTAS_PER_STEP {
            feed(&mut m, Event::Stream(StreamEvent::TextDelta("tok ".into())));
        }
        let id = format!("c{step}");
        feed(
            &mut m,
            Event::Stream(StreamEvent::ToolCallStart {
                index: 0,
                id: id.clone(),
                name: "echo".into(),
            }),
        );
        feed(
            &mut m,
            Event::Stream(StreamEvent::ToolCallArgsDelta {
                index: 0,
                json: "{\"a\":1}".into(),
            }),
        );
        feed(&mut m, Event::Stream(StreamEvent::ToolCallEnd { index: 0 }));
        feed(
            &mut m,
            Event::Stream(StreamEvent::Usage(Usage {
                input: Some(10),
                output: Some(5),
                ..Usage::default()
            })),
        );
        feed(
            &mut m,
            Event::Stream(StreamEvent::Finish {
                reason: FinishReason::ToolUse,
                request_id: None,
            }),
        );
        feed(&mut m, Event::StepEnded);
        feed(&mut m, Event::Durable);
        feed(
            &mut m,
            Event::ToolResult(ResultBlock {
                call_id: id,
                content: "ok".into(),
                is_error: false,
                reason: None,
                size: None,
                parts: Vec::new(),
            }),
        );
    }
    feed(&mut m, Event::Durable); // the terminal record
    assert!(m.is_done());
    events
}

/// A WAL of at least `records` records written by real runs of the session actor.
fn build_wal(dir: &Path, records: u64) -> std::path::PathBuf {
    let t = SessionTriple::new("/bench", "replay", "s").unwrap();
    broca_shards::run_local(async {
        let script = Script {
            tool_step_percent: 100,
            tool_steps_max: 8,
            calls_per_step_max: 3,
            ..Script::default()
        };
        let tools = CountingTools::default();
        let mut a =
            SessionActor::opener(dir, &t, Rc::new(ScriptedModel::new(script)), Rc::new(tools))
                .tool_specs(CountingTools::specs(&["echo"]))
                .log(LogConfig::default())
                .committer(Committer::default())
                .open()
                .await
                .unwrap();
        let mut i = 0;
        while a.writer().next_seq() < records {
            let req = broca::core::SendRequest {
                prompt: format!("task {i}"),
                model: "scripted/bench".into(),
                max_steps: Some(10),
                ..Default::default()
            };
            a.send(&req).await.unwrap();
            a.run_admitted().await.unwrap();
            i += 1;
        }
        a.close().await.unwrap();
    })
    .unwrap();
    wal_path(dir, &t)
}

fn replay(path: &Path) -> (usize, usize) {
    let (bytes, scan) = read_and_scan(path).unwrap();
    let s = Session::replay_scan(&scan, &bytes).unwrap();
    (scan.frames.len(), s.transcript.len())
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let per_run = one_run();
    let mut g = c.benchmark_group("run_loop");
    g.throughput(Throughput::Elements(per_run));
    g.bench_function("machine_transitions", |b| b.iter(one_run));
    g.finish();

    // The WAL is built on tmpfs where there is one (building 100,000 records with real
    // fsyncs takes minutes); replay reads it from memory either way after the first read.
    let dir = if Path::new("/dev/shm").is_dir() {
        tempfile::tempdir_in("/dev/shm").unwrap()
    } else {
        tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap()
    };
    let path = build_wal(dir.path(), 100_000);
    let (n, messages) = replay(&path);
    let bytes = std::fs::metadata(&path).unwrap().len();
    let mut g = c.benchmark_group("replay");
    g.sample_size(10).measurement_time(Duration::from_secs(10));
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("replay_100k_records", |b| b.iter(|| replay(&path)));
    g.finish();
    c.final_summary();

    let t0 = Instant::now();
    let mut times: Vec<Duration> = (0..11)
        .map(|_| {
            let s = Instant::now();
            replay(&path);
            s.elapsed()
        })
        .collect();
    times.sort();
    println!(
        "\nreplay: {n} records, {messages} messages, {:.1} MB; median of 11 runs {:.1} ms ({:.1} s total)",
        bytes as f64 / 1e6,
        times[5].as_secs_f64() * 1e3,
        t0.elapsed().as_secs_f64()
    );
    println!("machine: {per_run} events per run of {STEPS_PER_RUN} tool steps");
}
