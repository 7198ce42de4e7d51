//! A compaction provider's costs in broca (docs/compaction-providers.md), the provider's and
//! the model's time left out: one model request of a provider's session rendered through its
//! view (the transcript numbered, the view's render plan, the messages made from it), a view
//! handed over checked against the transcript, and the replay of a session whose WAL holds 50
//! accepted views. The sessions are runs of eight tool steps with 2,000-byte results, every
//! record appended to a real WAL and applied, a view accepted after each run (a head standing
//! in for everything before, a cut through the run's last entry).
//! Run: `cargo bench -p broca-bench --bench compaction_view`.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::Path;
use std::time::{Duration, Instant};

use broca::ck::{neutral, provided};
use broca::core::machine::{Command, Event, RunMachine};
use broca::core::Session;
use broca::wal::runrec::ResultBlock;
use broca::wal::verify::read_and_scan;
use broca::wal::viewrec::ViewAccepted;
use broca::wal::writer::wal_path;
use broca::wal::{Record, SessionTriple, WalWriter};
use broca_bench::runs::{answer, config, started};
use broca_io::{Committer, LogConfig};
use cortexkit_role_compaction::read::Role;
use cortexkit_role_compaction::rules::{EditCost, ProviderRules, SignedParts};
use cortexkit_role_compaction::view::{Edit, EditOp, InsertAt, InsertedMessage, View};
use criterion::Criterion;

const RESULT_BYTES: usize = 2_000;
const STEPS: usize = 8;

fn rules() -> ProviderRules {
    ProviderRules::new(SignedParts::None, EditCost::Suffix)
}

/// The view a provider hands over after `version` runs: a head standing in for everything
/// through the newest entry, which a cut leaves out.
fn view_after(numbered: &[cortexkit_role_compaction::read::Entry], version: u64) -> View {
    let head = InsertedMessage::new(
        "head",
        Role::User,
        vec![format!(
            "Runs 1 to {version}: every tool call read src/lib.rs and succeeded."
        )],
    );
    let through = numbered.last().expect("entries").mid.clone();
    View::seal(
        version,
        vec![
            Edit::new(
                version,
                EditOp::Insert {
                    at: InsertAt::Start,
                    message: head,
                },
            ),
            Edit::new(version, EditOp::Cut { through }),
        ],
    )
}

/// Runs `runs` runs of eight tool steps into a real WAL in `dir`, a view accepted after each
/// (checked as broca checks one): the WAL's path, and the session as appended.
fn build_wal(dir: &Path, runs: usize) -> (std::path::PathBuf, Session) {
    let t = SessionTriple::new("/bench", "views", "s").unwrap();
    let session = broca_shards::run_local(async {
        let (mut w, _) = WalWriter::open(dir, &t, LogConfig::default(), Committer::default())
            .await
            .unwrap();
        let mut session = Session::with_entries();
        let mut seq = 0u64;
        for run in 1..=runs {
            let run_id = format!("run_{run}");
            let first = Record::RunStarted(Box::new(started(
                &run_id,
                format!("Go on with {run_id}."),
                config(None, None),
            )));
            w.append(&first).await.unwrap();
            seq += 1;
            session.apply(seq, first).unwrap();
            let mut m =
                RunMachine::start(run_id, config(None, None), session.transcript.clone(), 0);
            let mut calls_left = STEPS;
            while !m.is_done() {
                let Some(cmd) = m.poll_command() else {
                    unreachable!("a run in flight always has a command to perform")
                };
                match cmd {
                    Command::Append { record, wait } => {
                        w.append(&record).await.unwrap();
                        seq += 1;
                        session.apply(seq, record).unwrap();
                        if wait {
                            m.handle(Event::Durable, 0);
                        }
                    }
                    Command::CallModel { .. } => {
                        let call = (calls_left > 0).then(|| {
                            calls_left -= 1;
                            format!("c{run}_{calls_left}")
                        });
                        answer(&mut m, call, "Done.", 0);
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
                    Command::Finish(_) | Command::AbortModel | Command::Display(_) => {}
                }
            }
            let numbered = neutral::transcript(session.entries.as_ref().unwrap(), 0);
            let view = view_after(&numbered, run as u64);
            provided::check(&numbered, session.view.as_deref(), &view, &rules()).unwrap();
            let record = Record::ViewAccepted(Box::new(ViewAccepted {
                provider: "ck-compactor".into(),
                view: serde_json::to_value(&view).unwrap(),
                at_unix_ms: 0,
            }));
            w.append(&record).await.unwrap();
            seq += 1;
            session.apply(seq, record).unwrap();
        }
        w.close().await.unwrap();
        session
    })
    .unwrap();
    (wal_path(dir, &t), session)
}

/// One request of the session rendered through its view, its numbering `kept` from the
/// request before (as a session's actor keeps it: only the newest entries are numbered again):
/// how many messages it carries.
fn request(session: &Session, kept: &mut neutral::Numbered) -> usize {
    let entries = session.entries.as_ref().unwrap();
    let numbered = kept.refresh(entries);
    let messages = provided::request_messages(
        numbered,
        &entries.list,
        &session.transcript,
        session.view.as_deref(),
    )
    .expect("the view plans");
    std::hint::black_box(&messages);
    messages.len()
}

/// The first request after a restart: the whole transcript numbered.
fn first_request(session: &Session) -> usize {
    request(session, &mut neutral::Numbered::default())
}

/// The next view handed over, checked against the transcript numbered whole (the first check
/// after the readers' cache took the session in).
fn check(session: &Session) {
    check_kept(session, &mut neutral::Numbered::default());
}

/// The next view handed over, checked against the transcript with its numbering `kept` from
/// the check or read before (as the readers' cache keeps it, `ReadSession::numbered`).
fn check_kept(session: &Session, kept: &mut neutral::Numbered) {
    let numbered = kept.refresh(session.entries.as_ref().unwrap());
    let next = view_after(numbered, session.view.as_ref().map_or(1, |v| v.version + 1));
    provided::check(numbered, session.view.as_deref(), &next, &rules()).unwrap();
}

fn replay(path: &Path) -> (usize, usize, u64) {
    let (bytes, scan) = read_and_scan(path).unwrap();
    let s = Session::with_entries()
        .replay_scan_into(&scan, &bytes)
        .unwrap();
    (
        scan.frames.len(),
        s.entries.as_ref().unwrap().list.len(),
        s.view.as_ref().map_or(0, |v| v.version),
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
    let dir = if Path::new("/dev/shm").is_dir() {
        tempfile::tempdir_in("/dev/shm").unwrap()
    } else {
        tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap()
    };
    let (_, small) = build_wal(dir.path(), 5);
    let big = dir.path().join("big");
    std::fs::create_dir_all(&big).unwrap();
    let (path, session) = build_wal(&big, 50);
    let sent = first_request(&session);
    let (mut kept_small, mut kept) = (neutral::Numbered::default(), neutral::Numbered::default());
    let mut g = c.benchmark_group("compaction_view");
    g.bench_function("request_through_view_5_runs", |b| {
        b.iter(|| request(&small, &mut kept_small))
    });
    g.bench_function("request_through_view_50_runs", |b| {
        b.iter(|| request(&session, &mut kept))
    });
    g.bench_function("first_request_through_view_50_runs", |b| {
        b.iter(|| first_request(&session))
    });
    g.bench_function("view_check_50_runs", |b| b.iter(|| check(&session)));
    let mut kept_check = neutral::Numbered::default();
    g.bench_function("view_check_kept_50_runs", |b| {
        b.iter(|| check_kept(&session, &mut kept_check))
    });
    g.finish();
    let mut g = c.benchmark_group("compaction_view_replay");
    g.sample_size(10).measurement_time(Duration::from_secs(5));
    g.bench_function("replay_50_views", |b| b.iter(|| replay(&path)));
    g.finish();
    c.final_summary();

    let entries = session.entries.as_ref().unwrap().list.len();
    let small_entries = small.entries.as_ref().unwrap().list.len();
    let at_5 = median(
        || {
            request(&small, &mut kept_small);
        },
        101,
    );
    let at_50 = median(
        || {
            request(&session, &mut kept);
        },
        101,
    );
    let first = median(
        || {
            first_request(&session);
        },
        101,
    );
    let checked = median(|| check(&session), 101);
    let checked_kept = median(|| check_kept(&session, &mut kept_check), 101);
    let (frames, replayed_entries, version) = replay(&path);
    let replayed = median(
        || {
            replay(&path);
        },
        11,
    );
    let bytes = std::fs::metadata(&path).unwrap().len();
    println!(
        "\nrequest through the view: {small_entries} entries, median of 101 {:.1} µs; \
         {entries} entries ({sent} messages sent), median of 101 {:.1} µs",
        at_5.as_secs_f64() * 1e6,
        at_50.as_secs_f64() * 1e6
    );
    println!(
        "the first request after a restart at {entries} entries (all numbered): median of 101 \
         {:.1} µs",
        first.as_secs_f64() * 1e6
    );
    println!(
        "a view checked at {entries} entries: median of 101 {:.1} µs (numbered whole), {:.1} µs \
         (the numbering kept)",
        checked.as_secs_f64() * 1e6,
        checked_kept.as_secs_f64() * 1e6
    );
    println!(
        "replay with 50 views: {frames} records, {replayed_entries} entries, view {version}, \
         {:.1} MB; median of 11 {:.2} ms",
        bytes as f64 / 1e6,
        replayed.as_secs_f64() * 1e3
    );
}
