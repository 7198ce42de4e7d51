//! The ecosystem's llm-runner/v1 conformance suite (`cortexkit-role-llm-runner-conformance`),
//! run against the real `broca module` process over the daemon's route, with the scripted
//! model and tool provider outside broca's process (see `subject.rs`). The test fails on any
//! failed case, and on a kill ledger without a real process kill.
//!
//! `BROCA_CONFORMANCE_DOC=1` also writes docs/conformance.md from the report: the declared
//! capabilities, the verdict, and every case by outcome.

#[path = "../../../tests/support/mod.rs"]
#[allow(dead_code, unused_imports)]
mod support;

mod daemon;
mod model;
mod report;
mod subject;
mod tools;

use cortexkit_role_harness::KillMechanism;
use cortexkit_role_llm_runner_conformance::{
    progress::SuiteProgress, run_suite_with, CaseOutcome, SuiteOptions, SuiteVerdict,
};

#[test]
fn broca_passes_the_llm_runner_v1_conformance_suite() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // BROCA_CONFORMANCE_WORK keeps the state roots (and each broca's log) for a look after.
    let work = tempfile::tempdir().unwrap();
    let kept = std::env::var_os("BROCA_CONFORMANCE_WORK").map(std::path::PathBuf::from);
    let work_dir = kept.unwrap_or_else(|| work.path().to_path_buf());
    let report = rt.block_on(async {
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
    let (report, declared) = report;
    println!("{}", report.render());
    if std::env::var_os("BROCA_CONFORMANCE_DOC").is_some() {
        let doc = report::document(&report, &declared);
        let path = support::repo_root().join("docs/conformance.md");
        std::fs::write(&path, doc).unwrap();
        eprintln!("wrote {}", path.display());
    }
    let failed: Vec<_> = report
        .cases
        .iter()
        .filter(|c| matches!(c.outcome, CaseOutcome::Failed { .. }))
        .map(|c| c.case)
        .collect();
    let unexplained: Vec<_> = failed
        .iter()
        .filter(|c| !report::CANNOT_PASS.iter().any(|(k, _)| k == *c))
        .collect();
    assert!(unexplained.is_empty(), "failed cases: {unexplained:?}");
    // A case listed as one broca cannot pass that passes now: the list is out of date.
    for (case, _) in report::CANNOT_PASS {
        assert!(
            failed.contains(case),
            "{case} is listed as one broca cannot pass, and it did not fail: take it off the list"
        );
    }
    assert!(
        report
            .kills
            .iter()
            .any(|k| k.mechanism == KillMechanism::FaultHookThenProcessKill),
        "the kill ledger holds no real process kill: {:?}",
        report.kills
    );
    if let SuiteVerdict::Failed { reasons } = &report.verdict {
        let other: Vec<_> = reasons
            .iter()
            .filter(|r| !report::CANNOT_PASS.iter().any(|(k, _)| r.starts_with(k)))
            .collect();
        assert!(other.is_empty(), "the suite failed: {other:?}");
    }
}

fn subject_declared(subject: &subject::Subject) -> Vec<String> {
    use cortexkit_role_llm_runner_conformance::LlmRunnerSubject;
    subject.capabilities().iter().map(|c| c.name()).collect()
}
