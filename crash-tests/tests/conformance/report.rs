//! docs/conformance.md from a suite report, and the two kinds of failure the test accepts: a
//! case the suite's own cases contradict, and a case awaiting a capability not declared yet.

use std::collections::BTreeMap;

use cortexkit_role_llm_runner_conformance::{Capability, CaseOutcome, SuiteReport, SuiteVerdict};

/// A case no runner of tool-provider modules can pass, because another case of the suite pins
/// the opposite, and why. The test accepts its failure only when the failure is that
/// contradiction (its reason says `evidence`) and the pinning case passed; if it ever passes,
/// or fails for another reason, the test fails.
pub struct Contradiction {
    pub case: &'static str,
    /// The passing case that pins the rule `case` asks to break.
    pub pinned_by: &'static str,
    /// What the failure's reason says when it is this contradiction.
    pub evidence: &'static str,
    pub why: &'static str,
}

pub const CONTRADICTIONS: &[Contradiction] = &[Contradiction {
    case: "display_without_limits_is_whole",
    pinned_by: "tool_result_too_large_is_error",
    evidence: "and a result of 152 bytes, not the whole call",
    why: "the case has the scripted tool provider answer 131,072 bytes of text and asks for \
          them whole on the display row; the role's §11.3.1 (pinned, and checked by \
          `tool_result_too_large_is_error` with 65,537 bytes) has the runner replace any \
          provider result over 65,536 model-visible bytes with `tool_result_too_large`, never \
          keep or cut it. broca keeps the pinned rule: the row shows the 152-byte discard \
          text it stored",
}];

/// A case of a declared group that needs a part of broca still to be built, which comes with
/// a capability broca does not declare yet. The test accepts its failure only while that
/// capability is undeclared and only when the failure is the missing part (its reason says
/// `evidence`); once the capability is declared, or if the case passes, the test fails until
/// the case is taken off this list.
pub struct Awaiting {
    pub case: &'static str,
    /// The capability whose building brings the missing part.
    pub needs: &'static str,
    pub evidence: &'static str,
    pub why: &'static str,
}

pub const AWAITING: &[Awaiting] = &[];

/// Cases the adapter declines, and why in broca's words (the suite's own reason names only the
/// hook the adapter leaves unanswered).
pub const DECLINED: &[(&str, &str)] = &[
    ("media_descriptors_stable_across_pages", "its tool result is 3.5 MB of text; broca keeps tool-provider/v1's 64 KiB model-visible limit (a larger answer is discarded as `tool_result_too_large`), so no tool of broca's returns one, and the adapter offers no such result"),
    ("media_descriptors_frame_budget", "its mixed-size multipart tool result is megabytes of text, over the same 64 KiB limit; the adapter offers no multipart result"),
];

/// Why broca does not declare a capability yet, one line each (the skipped cases are grouped
/// by it).
pub const NOT_DECLARED: &[(&str, &str)] = &[
    (
        "host_metadata_change",
        "broca is its own host: nothing outside the role changes a session's metadata",
    ),
    (
        "kill_at:RetentionTombstoned",
        "in module mode a first send must name a storage policy (`session_retention.required`), \
         so the case killing after a legacy `retention` expiry cannot start its session; \
         tests/retention.rs kills broca at `retention_tombstoned` through serve",
    ),
];

/// One word for an outcome, for the progress lines.
pub fn word(outcome: &CaseOutcome) -> &'static str {
    match outcome {
        CaseOutcome::Passed | CaseOutcome::PassedWithInapplicableRule { .. } => "passed",
        CaseOutcome::Failed { .. } => "FAILED",
        CaseOutcome::Skipped { .. } | CaseOutcome::SkippedWithReason { .. } => "skipped",
        CaseOutcome::Inapplicable { .. } => "not applicable",
    }
}

/// What is wrong with the report, for the test to fail on: a failed case that is not a
/// contradiction of the suite's own cases, or a contradiction that no longer holds.
pub fn problems(report: &SuiteReport, declared: &[String]) -> Vec<String> {
    let passed = |case: &str| {
        matches!(
            report.outcome(case),
            Some(CaseOutcome::Passed | CaseOutcome::PassedWithInapplicableRule { .. })
        )
    };
    let mut out = Vec::new();
    for case in &report.cases {
        let CaseOutcome::Failed { reason } = &case.outcome else {
            continue;
        };
        if let Some(a) = AWAITING.iter().find(|a| a.case == case.case) {
            if declared.iter().any(|d| d == a.needs) {
                out.push(format!(
                    "{} awaits `{}`, which is declared now: it must pass",
                    case.case, a.needs
                ));
            } else if !reason.contains(a.evidence) {
                out.push(format!(
                    "{} failed for another reason than the part it awaits: {reason}",
                    case.case
                ));
            }
            continue;
        }
        match CONTRADICTIONS.iter().find(|c| c.case == case.case) {
            None => out.push(format!("{} failed: {reason}", case.case)),
            Some(c) if !reason.contains(c.evidence) => out.push(format!(
                "{} failed for another reason than the contradiction it is listed for: {reason}",
                case.case
            )),
            Some(c) if !passed(c.pinned_by) => out.push(format!(
                "{} is listed as contradicted by {}, which did not pass",
                case.case, c.pinned_by
            )),
            Some(_) => {}
        }
    }
    for c in CONTRADICTIONS {
        if !matches!(report.outcome(c.case), Some(CaseOutcome::Failed { .. })) {
            out.push(format!(
                "{} is listed as contradicted and did not fail: take it off the list",
                c.case
            ));
        }
    }
    for a in AWAITING {
        if !matches!(report.outcome(a.case), Some(CaseOutcome::Failed { .. })) {
            out.push(format!(
                "{} is listed as awaiting `{}` and did not fail: take it off the list",
                a.case, a.needs
            ));
        }
    }
    out
}

fn names(capabilities: &[Capability]) -> String {
    capabilities
        .iter()
        .map(|c| c.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// One line of text (a reason may hold newlines).
fn flat(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The cases by outcome, as lines of the page.
#[derive(Default)]
struct Lines {
    passed: Vec<String>,
    failed: Vec<String>,
    inapplicable: Vec<String>,
    /// Skipped cases by the capabilities they miss.
    skipped: BTreeMap<String, Vec<String>>,
    skipped_count: usize,
}

fn lines(report: &SuiteReport) -> Lines {
    let mut l = Lines::default();
    for case in &report.cases {
        match &case.outcome {
            CaseOutcome::Passed => l.passed.push(format!("- `{}`", case.case)),
            CaseOutcome::PassedWithInapplicableRule { reason } => l.passed.push(format!(
                "- `{}` (one rule not applicable: {})",
                case.case,
                flat(reason)
            )),
            CaseOutcome::Failed { reason } => {
                l.failed
                    .push(format!("- `{}`: {}", case.case, flat(reason)))
            }
            CaseOutcome::Inapplicable { reason } => {
                let ours = DECLINED
                    .iter()
                    .find(|(c, _)| *c == case.case)
                    .map(|(_, why)| format!(" (broca: {why})"))
                    .unwrap_or_default();
                l.inapplicable
                    .push(format!("- `{}`: {}{ours}", case.case, flat(reason)))
            }
            CaseOutcome::Skipped { missing } | CaseOutcome::SkippedWithReason { missing, .. } => {
                l.skipped_count += 1;
                l.skipped
                    .entry(names(missing))
                    .or_default()
                    .push(format!("`{}`", case.case));
            }
        }
    }
    l
}

fn verdict(report: &SuiteReport) -> String {
    match &report.verdict {
        SuiteVerdict::Passed => "passed".to_string(),
        SuiteVerdict::ConformingForDeclaredCapabilities { .. } => {
            "conforming for the declared capabilities (cases needing undeclared ones were not run)"
                .to_string()
        }
        SuiteVerdict::Failed { reasons } => format!("failed: {}", flat(&reasons.join("; "))),
    }
}

/// Why a group of skipped cases is not run: the first of its missing capabilities broca
/// names a reason for.
fn skip_reason(missing: &str) -> &'static str {
    missing
        .split(", ")
        .find_map(|m| {
            NOT_DECLARED
                .iter()
                .find(|(c, _)| *c == m)
                .map(|(_, why)| *why)
        })
        .unwrap_or("not declared")
}

/// The page: declared capabilities, verdict, counts, kills, then every case by outcome.
pub fn document(report: &SuiteReport, declared: &[String], points: &[(String, String)]) -> String {
    let l = lines(report);
    let mut out = String::new();
    out.push_str("# llm-runner/v1 conformance\n\n");
    out.push_str(
        "The ecosystem's conformance suite (`cortexkit-role-llm-runner-conformance` 0.17.0, for \
         the role crate `cortexkit-role-llm-runner` 0.8.0) run against the real `broca module` \
         process over the daemon's route (crash-tests/tests/conformance/). This page is \
         generated by one command, which builds the binary it grades first (the test refuses a \
         `broca` binary older than the sources):\n\n\
         ```\ncargo build --bin broca && BROCA_CONFORMANCE_DOC=1 cargo test -p broca-crash-tests --test conformance\n```\n\n",
    );
    out.push_str(&format!("Verdict: **{}**.\n\n", verdict(report)));
    out.push_str(&format!(
        "| outcome | cases |\n|---|---|\n| passed | {} |\n| failed | {} |\n| not applicable | {} |\n| skipped (capability not declared) | {} |\n| total | {} |\n\n",
        l.passed.len(),
        l.failed.len(),
        l.inapplicable.len(),
        l.skipped_count,
        report.cases.len()
    ));
    out.push_str("## Declared capabilities\n\n");
    for name in declared {
        out.push_str(&format!("- `{name}`\n"));
    }
    out.push_str(
        "\n## Kill points\n\nEach point the role names that broca's durable boundaries have is \
         declared to the harness; a kill arms broca's crash hook for that boundary in the running \
         process (`BROCA_CRASH_ARM`), which aborts the process right after the boundary's record \
         is durable (a real process kill, SIGABRT), and the harness restarts broca on the same \
         state root.\n\n| point | broca's boundary |\n|---|---|\n",
    );
    for (point, how) in points {
        out.push_str(&format!("| `{point}` | {how} |\n"));
    }
    out.push_str("\nKills made in this run:\n\n");
    if report.kills.is_empty() {
        out.push_str("None.\n");
    }
    for kill in &report.kills {
        out.push_str(&format!("- at `{}` by {}\n", kill.point, kill.mechanism));
    }
    document_cases(&mut out, &l);
    out
}

fn document_cases(out: &mut String, l: &Lines) {
    out.push_str(&format!("\n## Failed ({})\n\n", l.failed.len()));
    if l.failed.is_empty() {
        out.push_str("None.\n");
    }
    for line in &l.failed {
        out.push_str(line);
        out.push('\n');
    }
    if !l.failed.is_empty() {
        out.push_str("\nWhy, for each case the suite's own cases contradict:\n\n");
        for c in CONTRADICTIONS {
            out.push_str(&format!(
                "- `{}` (contradicted by `{}`): {}\n",
                c.case,
                c.pinned_by,
                flat(c.why)
            ));
        }
        out.push_str("\nWhy, for each case awaiting a part of broca still to be built:\n\n");
        for a in AWAITING {
            out.push_str(&format!(
                "- `{}` (awaits `{}`): {}\n",
                a.case,
                a.needs,
                flat(a.why)
            ));
        }
    }
    for (title, lines) in [("Passed", &l.passed), ("Not applicable", &l.inapplicable)] {
        out.push_str(&format!("\n## {title} ({})\n\n", lines.len()));
        for line in lines.iter() {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.push_str(&format!(
        "\n## Skipped ({}), by the capability they need\n\n",
        l.skipped_count
    ));
    for (missing, cases) in &l.skipped {
        out.push_str(&format!(
            "- needs {missing} ({}): {}. {}\n",
            cases.len(),
            skip_reason(missing),
            cases.join(", ")
        ));
    }
}
