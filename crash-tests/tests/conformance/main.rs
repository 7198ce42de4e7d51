//! The ecosystem's llm-runner/v1 conformance suite (`cortexkit-role-llm-runner-conformance`),
//! run against the real `broca module` process over the daemon's route, with the scripted
//! model and tool provider outside broca's process (see `subject.rs`). The test fails on any
//! failed case (but one the suite's own cases contradict, or one awaiting a capability broca
//! does not declare yet, each checked as such: report.rs), on a
//! declared kill point no case killed at, on a kill ledger without a real process kill, and
//! on a `broca` binary older than its sources.
//!
//! `BROCA_CONFORMANCE_DOC=1` also writes docs/conformance.md from the report: the declared
//! capabilities, the verdict, and every case by outcome.

#[path = "../../../tests/support/mod.rs"]
#[allow(dead_code, unused_imports)]
mod support;

mod adopt;
mod bus;
mod commands;
mod daemon;
mod import;
mod kills;
mod media;
mod model;
mod numbers;
mod pruning;
mod report;
mod retention;
mod route;
mod start;
mod structured;
mod subject;
mod tools;

use cortexkit_role_harness::KillMechanism;
use cortexkit_role_llm_runner_conformance::{
    progress::SuiteProgress, run_suite_with, CaseOutcome, SuiteOptions,
};

/// The `broca` binary the suite grades is not older than the sources it is built from (a
/// stale binary would grade what the code was, not what it is).
fn binary_is_current() {
    let bin = support::broca_bin();
    let built = std::fs::metadata(&bin)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    let root = support::repo_root();
    let mut newest: Option<(std::time::SystemTime, std::path::PathBuf)> = None;
    let mut dirs: Vec<std::path::PathBuf> = ["src", "io", "shards", "Cargo.toml", "Cargo.lock"]
        .iter()
        .map(|d| root.join(d))
        .collect();
    while let Some(path) = dirs.pop() {
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path).into_iter().flatten().flatten() {
                dirs.push(entry.path());
            }
        } else if let Ok(t) = meta.modified() {
            if newest.as_ref().is_none_or(|(n, _)| t > *n) {
                newest = Some((t, path));
            }
        }
    }
    if let Some((t, path)) = newest {
        assert!(
            t <= built,
            "{} is older than {}: build it first (`cargo build --bin broca`; `cargo test \
             --workspace` does)",
            bin.display(),
            path.display()
        );
    }
}

#[test]
fn broca_passes_the_llm_runner_v1_conformance_suite() {
    binary_is_current();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // BROCA_CONFORMANCE_WORK keeps the state roots (and each broca's log) for a look after.
    let work = tempfile::tempdir().unwrap();
    let kept = std::env::var_os("BROCA_CONFORMANCE_WORK").map(std::path::PathBuf::from);
    let work_dir = kept.unwrap_or_else(|| work.path().to_path_buf());
    let (report, declared) = rt.block_on(async {
        let subject = subject::Subject::new().await;
        let options = SuiteOptions::new().with_progress(|event| {
            if let SuiteProgress::CaseFinished {
                case,
                outcome,
                elapsed_ms,
            } = event
            {
                if !matches!(outcome, CaseOutcome::Skipped { .. }) {
                    eprintln!("{case}: {} ({elapsed_ms} ms)", report::word(outcome));
                }
            }
        });
        let report = run_suite_with(&subject, &work_dir.join("suite"), options)
            .await
            .expect("the suite starts");
        let declared = subject_declared(&subject);
        (report, declared)
    });
    println!("{}", report.render());
    if std::env::var_os("BROCA_CONFORMANCE_DOC").is_some() {
        let doc = report::document(&report, &declared, &kills::points());
        let path = support::repo_root().join("docs/conformance.md");
        std::fs::write(&path, doc).unwrap();
        eprintln!("wrote {}", path.display());
    }
    let problems = report::problems(&report, &declared);
    assert!(problems.is_empty(), "the suite found: {problems:#?}");
    assert!(
        report
            .kills
            .iter()
            .any(|k| k.mechanism == KillMechanism::FaultHookThenProcessKill),
        "the kill ledger holds no real process kill: {:?}",
        report.kills
    );
    let points: Vec<&str> = report.kills.iter().map(|k| k.point.as_str()).collect();
    for (point, _) in kills::points() {
        assert!(
            points.contains(&point.as_str()),
            "no case killed broca at {point}, a point it declares: {points:?}"
        );
    }
}

fn subject_declared(subject: &subject::Subject) -> Vec<String> {
    use cortexkit_role_llm_runner_conformance::LlmRunnerSubject;
    subject.capabilities().iter().map(|c| c.name()).collect()
}
