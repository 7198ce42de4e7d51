//! Real processes killed at durable boundaries: `broca serve` with aimock as the provider and
//! tests/peers/counting_mcp.py as its tool server (it appends every call to a file before it
//! answers) runs a send whose model asks for two tool calls. Each cut starts serve with
//! `BROCA_CRASH_AT=<point>:<nth>` (the process aborts right after that boundary is durable), or
//! SIGKILLs it after a seeded random delay; then serve restarts on the same state dir, the send
//! is retried with its send_id, and the invariants are checked. `mid_write` tears a batch
//! write (its first half on disk, the rest not) and aborts before its sync.
//!
//! - each tool call happened at most once (counted by the tool server);
//! - exactly one terminal record per run; interrupted never reported as cancelled;
//! - an acknowledged send survives, and the retried send_id answers the same run;
//! - the transcript read after a restart equals the one replayed from the WAL again, and every
//!   WAL verifies;
//! - the store agrees with the WALs, and the exported facts are the WAL's model steps and
//!   failed attempts.
//!
//! Every cut runs twice: with plain kills (a kill keeps what was written), and in the
//! power-loss mode (`BROCA_POWER_LOSS`: writes stay in memory until their fdatasync, each sync
//! 50 ms late, and files whose directory was never synced are removed after the kill), where
//! `admitted` aborts once the send is answered and `intent` once a dispatched call has run,
//! durable or not: a missing wait for durability then loses what the action relied on.
//!
//! The suite fails when any planned cut was not reached (its process did not die at that
//! point) or the time budget cut the plan short. `BROCA_CRASH_KILLS=N` sets the random kills
//! per pass (default 4), `BROCA_CRASH_SECS` bounds each mode's run (default 300 s).
//! `BROCA_CRASH_CUTS=N` is the soak mode: N cuts per mode, cycling through the plan (each pass
//! with new random seeds), with no time bound unless `BROCA_CRASH_SECS` is given and a progress
//! line every 100 cuts. The output ends with the counts and each cut point's outcomes.

#[path = "../../tests/support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use broca_crash_tests::mix;
use serde_json::{json, Value};
use support::serve::{start_env, Serve};
use support::{broca, dump_all, fixture, peers_dir, Aimock};

#[derive(Default, Debug)]
struct Counts {
    cuts: u64,
    killed: u64,
    not_reached: u64,
    invariants: u64,
    torn_writes: u64,
    files_lost: u64,
}

/// One JSON-RPC call that tolerates a server dying under it: `None` when no whole answer came.
fn try_rpc(s: &Serve, method: &str, params: Value) -> Option<(u16, Value)> {
    let mut p = json!({"project_root": "/crash", "harness": "h", "session": "s"});
    p.as_object_mut()
        .unwrap()
        .extend(params.as_object().unwrap().clone());
    let body = json!({"method": method, "params": p}).to_string();
    let raw = format!(
        "POST /v1/rpc HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        s.handle,
        body.len()
    );
    let mut c = TcpStream::connect(&s.addr).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(20))).ok()?;
    c.write_all(raw.as_bytes()).ok()?;
    let mut all = Vec::new();
    c.read_to_end(&mut all).ok()?;
    let text = String::from_utf8_lossy(&all);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.get(9..12)?.parse().ok()?;
    Some((status, serde_json::from_str(body).ok()?))
}

fn send(s: &Serve) -> Option<(u16, Value)> {
    try_rpc(
        s,
        "session.send",
        json!({"prompt": "record two", "model": "anthropic/m", "send_id": "k1", "max_steps": 4}),
    )
}

struct Cut<'a> {
    state: PathBuf,
    calls: PathBuf,
    config: PathBuf,
    peer: &'a Aimock,
    /// The power-loss ledger, when the killed process runs in that mode.
    ledger: Option<PathBuf>,
}

impl Cut<'_> {
    fn new<'a>(root: &Path, name: &str, peer: &'a Aimock, mode: Mode) -> Cut<'a> {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let calls = dir.join("calls.jsonl");
        let config = dir.join("tools.json");
        let cfg = json!({"mcp": [{"name": "counting",
            "command": ["python3", peers_dir().join("counting_mcp.py")],
            "env": {"COUNT_FILE": calls}}]});
        std::fs::write(&config, cfg.to_string()).unwrap();
        Cut {
            state: dir.join("state"),
            calls,
            config,
            peer,
            ledger: (mode == Mode::PowerLoss).then(|| dir.join("power-loss.ledger")),
        }
    }

    /// The environment of a process this cut kills: the crash plan, and the power-loss mode
    /// (writes held until their fdatasync, each sync 50 ms late: a slow disk) when asked.
    fn kill_env<'e>(&'e self, plan: Option<&'e str>) -> Vec<(&'e str, &'e str)> {
        let mut env = Vec::new();
        if let Some(plan) = plan {
            env.push(("BROCA_CRASH_AT", plan));
        }
        if let Some(ledger) = &self.ledger {
            env.push(("BROCA_POWER_LOSS", ledger.to_str().unwrap()));
            env.push(("BROCA_POWER_LOSS_SYNC_MS", "50"));
        }
        env
    }

    /// After a kill in the power-loss mode, what a power cut takes too: files whose directory
    /// entry was never made durable. Answers how many were removed.
    fn cut_power(&self) -> usize {
        match &self.ledger {
            Some(ledger) => broca_io::power_loss::cut_power(ledger).unwrap().len(),
            None => 0,
        }
    }

    fn serve(&self, env: &[(&str, &str)]) -> Serve {
        start_env(
            &self.state,
            self.peer,
            &[
                "--tools-config",
                self.config.to_str().unwrap(),
                "--grace-secs",
                "1",
            ],
            env,
        )
    }

    /// `broca run` of the send on this cut's state dir.
    fn run(&self, env: &[(&str, &str)]) -> std::process::Output {
        broca(&self.state)
            .envs(env.iter().copied())
            .env("ANTHROPIC_API_KEY", "sk-crash-test-0123456789")
            .args(["run", "--model", "anthropic/m", "--base-url"])
            .arg(self.peer.url())
            .arg("--tools-config")
            .arg(&self.config)
            .args([
                "--project-root",
                "/crash",
                "--harness",
                "h",
                "--session",
                "s",
            ])
            .args([
                "--send-id",
                "k1",
                "--max-steps",
                "4",
                "--json",
                "record two",
            ])
            .output()
            .unwrap()
    }

    /// The invariants that the files alone tell: at most once per call, one terminal per run,
    /// the WALs verify, the store and the facts agree with the WALs.
    fn check_files(&self, what: &str, counts: &mut Counts) {
        let text = std::fs::read_to_string(&self.calls).unwrap_or_default();
        let mut per_note: HashMap<String, u32> = HashMap::new();
        for line in text.lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            *per_note
                .entry(v["arguments"]["note"].as_str().unwrap_or("").to_string())
                .or_default() += 1;
        }
        assert!(
            per_note.values().all(|n| *n <= 1),
            "{what}: a call ran twice: {per_note:?}"
        );
        let records = dump_all(&self.state);
        let mut terminals: HashMap<String, u32> = HashMap::new();
        for r in &records {
            let run = r["record"]["run_id"].as_str().unwrap_or("").to_string();
            match r["kind"].as_str() {
                Some("run_started") => {
                    terminals.entry(run).or_default();
                }
                Some("run_finished" | "run_paused") => *terminals.entry(run).or_default() += 1,
                _ => {}
            }
        }
        assert!(
            terminals.values().all(|n| *n == 1),
            "{what}: terminals per run {terminals:?}"
        );
        assert!(
            !records.iter().any(|r| r["record"]["reason"] == "cancelled"),
            "{what}: nothing cancelled a run"
        );
        let verify = broca(&self.state).args(["wal", "verify"]).output().unwrap();
        assert!(
            verify.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&verify.stdout)
        );
        let export = broca(&self.state)
            .args(["export", "usage"])
            .output()
            .unwrap();
        assert!(export.status.success(), "{what}");
        let facts = String::from_utf8_lossy(&export.stdout).lines().count();
        let attempts = records
            .iter()
            .filter(|r| {
                matches!(
                    r["kind"].as_str(),
                    Some("model_step_finished" | "model_attempt_finished")
                )
            })
            .count();
        assert_eq!(
            facts, attempts,
            "{what}: one fact per step and failed attempt"
        );
        let check = broca(&self.state)
            .args(["store", "check"])
            .output()
            .unwrap();
        assert!(
            check.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&check.stdout)
        );
        counts.invariants += 6;
    }

    /// Restarts serve, retries the send, waits for its run to end, and checks every invariant.
    fn check(&self, acked: Option<String>, what: &str, counts: &mut Counts) {
        let s = self.serve(&[]);
        let (status, r) =
            send(&s).unwrap_or_else(|| panic!("{what}: the retried send got no answer"));
        assert_eq!(status, 200, "{what}: {r}");
        let run_id = r["result"]["run_id"].as_str().unwrap().to_string();
        if let Some(first) = &acked {
            assert_eq!(
                &run_id, first,
                "{what}: the retried send_id answers the acknowledged run"
            );
            counts.invariants += 1;
        }
        let until = Instant::now() + Duration::from_secs(30);
        let status = loop {
            let st = try_rpc(&s, "run.status", json!({"run_id": run_id}))
                .map(|(_, v)| v["result"].clone())
                .unwrap_or(Value::Null);
            if st["state"].is_string() && st["state"] != "active" {
                break st;
            }
            assert!(Instant::now() < until, "{what}: the run never ended: {st}");
            std::thread::sleep(Duration::from_millis(50));
        };
        let state = status["state"].as_str().unwrap().to_string();
        assert_ne!(state, "cancelled", "{what}: nothing cancelled this run");
        if state == "interrupted" {
            let named = status["indeterminate_tool_calls"].as_array().unwrap();
            assert!(
                named.iter().all(|c| c == "call_rec_1" || c == "call_rec_2"),
                "{what}: {status}"
            );
        }
        counts.invariants += 2;
        check_attribution(&s, &run_id, &status, what);
        counts.invariants += 1;
        let read_before = try_rpc(&s, "session.read", json!({})).unwrap().1;
        stop(s);
        self.check_files(what, counts);

        // The transcript replayed after another restart is the same.
        let s = self.serve(&[]);
        let read_after = try_rpc(&s, "session.read", json!({})).unwrap().1;
        stop(s);
        assert_eq!(
            read_before, read_after,
            "{what}: the transcript changed across a restart"
        );
        counts.invariants += 1;
    }
}

/// Stops serve with SIGTERM and waits for it.
/// The ended run's calls as the role reads them (`dispatch_attribution`, `run.tool_calls`):
/// none left indeterminate, each with its key; a call the run names as of unknown outcome is
/// closed with an `outcome_unknown` result (in the commit that ended the run) and listed
/// `indeterminate`, never as having run or not; a call sent names its module.
fn check_attribution(s: &Serve, run_id: &str, status: &Value, what: &str) {
    let page = try_rpc(s, "session.read", json!({})).unwrap().1;
    let messages = page["result"]["messages"].as_array().unwrap();
    let attributions: Vec<&Value> = messages
        .iter()
        .flat_map(|m| m["tool_calls"].as_array().into_iter().flatten())
        .collect();
    for a in &attributions {
        assert_eq!(
            a["indeterminate"], false,
            "{what}: {a} is left open after its run ended"
        );
        assert!(a["call_key"].is_string(), "{what}: {a} has no key");
    }
    let listed = try_rpc(s, "run.tool_calls", json!({"run_id": run_id}))
        .unwrap()
        .1;
    let calls = listed["result"]["calls"].as_array().unwrap();
    let unknown: Vec<&Value> = status["indeterminate_tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .collect();
    for c in calls {
        let id = &c["tool_call_id"];
        let outcome = c["outcome"].as_str().unwrap();
        if unknown.contains(&id) {
            assert_eq!(outcome, "indeterminate", "{what}: {c}");
            let closed = messages.iter().any(|m| {
                m["message"]["tool_use_id"] == *id && m["message"]["reason"] == "outcome_unknown"
            });
            assert!(closed, "{what}: {id} is not closed with outcome_unknown");
        } else {
            assert!(
                ["succeeded", "failed", "not_executed", "refused"].contains(&outcome),
                "{what}: {c}"
            );
        }
        if outcome == "succeeded" || outcome == "failed" {
            assert_eq!(c["dispatched_to"], "mcp:counting", "{what}: {c}");
            assert!(c["result_ordinal"].is_u64(), "{what}: {c}");
        }
    }
}

fn stop(mut s: Serve) {
    // SAFETY: signalling a child this test started.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
    let until = Instant::now() + Duration::from_secs(15);
    while s.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < until, "serve did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for a serve that should die by itself; SIGKILLs it when it does not. Answers
/// whether it died of a signal of its own (the abort).
fn wait_abort(s: &mut Serve) -> bool {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = s.child.try_wait().unwrap() {
            return status.signal() == Some(libc::SIGABRT);
        }
        if Instant::now() > until {
            let _ = s.child.kill();
            let _ = s.child.wait();
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How the killed processes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// A kill keeps everything written (the page cache survives a process).
    Kill,
    /// A kill loses what a power cut would (see `broca_io::power_loss`).
    PowerLoss,
}

#[test]
fn kills_at_every_boundary_and_at_random_keep_every_invariant() {
    kill_everywhere(Mode::Kill);
}

#[test]
fn power_losses_at_every_boundary_and_at_random_keep_every_invariant() {
    kill_everywhere(Mode::PowerLoss);
}

/// One planned cut: a named boundary of `broca serve`, a named boundary of `broca run`, or a
/// SIGKILL after a seeded delay.
#[derive(Clone, Copy, Debug)]
enum Plan {
    Serve(&'static str, u32),
    Run(&'static str, u32),
    Random(u64),
}

/// Named boundaries: the send's run passes each of these once or twice.
const SERVE_CUTS: [(&str, u32); 11] = [
    ("admitted", 1),
    ("step_started", 1),
    ("step", 1),
    ("intent", 1),
    ("tool_result", 1),
    ("tool_result", 2),
    ("step_started", 2),
    ("step", 2),
    ("terminal", 1),
    // Batch writes: the lease record's, RunStarted's, then the run's own. Records the run
    // does not wait for ride on the next one it waits for (or get a write of their own
    // after 50 ms), so the run writes at least two batches of its own: the tool intent's
    // and RunFinished's. The cuts tear the third and the fourth.
    ("mid_write", 3),
    ("mid_write", 4),
];

/// `broca run` cut at a boundary, then run again with the same send_id.
const RUN_CUTS: [(&str, u32); 3] = [("intent", 1), ("tool_result", 1), ("step", 2)];

/// The cuts of one mode's run. Without `BROCA_CRASH_CUTS`, every named boundary once and
/// `random_kills` random kills. With it (the soak mode), `total` cuts cycling through the
/// same plan, each pass with random kills of fresh seeds.
fn plan(total: Option<u64>, random_kills: u64) -> Vec<Plan> {
    let one_pass = |pass: u64| {
        let mut cuts: Vec<Plan> = SERVE_CUTS.iter().map(|&(p, n)| Plan::Serve(p, n)).collect();
        cuts.extend(RUN_CUTS.iter().map(|&(p, n)| Plan::Run(p, n)));
        cuts.extend((0..random_kills).map(|k| Plan::Random(pass * random_kills + k)));
        cuts
    };
    match total {
        None => one_pass(0),
        Some(total) => (0..)
            .flat_map(one_pass)
            .take(usize::try_from(total).unwrap_or(usize::MAX))
            .collect(),
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a whole number"))
    })
}

fn kill_everywhere(mode: Mode) {
    let started = Instant::now();
    let total = env_u64("BROCA_CRASH_CUTS");
    // The soak mode runs until its cuts are done unless a budget is given.
    let budget = Duration::from_secs(env_u64("BROCA_CRASH_SECS").unwrap_or(if total.is_some() {
        u64::MAX / 4
    } else {
        300
    }));
    let random_kills = env_u64("BROCA_CRASH_KILLS").unwrap_or(4);
    let plan = plan(total, random_kills);
    let planned = plan.len();
    let peer = Aimock::start(&fixture("tools.json"));
    let root = tempfile::tempdir().unwrap();
    let mut counts = Counts::default();
    // Per cut point: (killed, missed).
    let mut per_point: Vec<(String, u64, u64)> = Vec::new();
    let mut tally = |what: String, killed: bool| {
        let at = match per_point.iter().position(|(w, _, _)| *w == what) {
            Some(at) => at,
            None => {
                per_point.push((what, 0, 0));
                per_point.len() - 1
            }
        };
        if killed {
            per_point[at].1 += 1;
        } else {
            per_point[at].2 += 1;
        }
    };

    for (i, cut_plan) in plan.iter().enumerate() {
        if started.elapsed() > budget {
            break;
        }
        if total.is_some() && i > 0 && i % 100 == 0 {
            eprintln!(
                "{mode:?}: {i} of {planned} cuts in {:.0} s, {} killed, {} not reached",
                started.elapsed().as_secs_f64(),
                counts.killed,
                counts.not_reached
            );
        }
        // Each cut keeps its own folder until its checks pass.
        let dir = root.path().join(format!("cut-{i}"));
        match *cut_plan {
            Plan::Serve(point, nth) => {
                let what = format!("{point}:{nth}");
                let cut = Cut::new(&dir, &what.replace(':', "-"), &peer, mode);
                let mut s = cut.serve(&cut.kill_env(Some(&what)));
                let acked = send(&s)
                    .filter(|(status, _)| *status == 200)
                    .and_then(|(_, r)| r["result"]["run_id"].as_str().map(str::to_string));
                counts.cuts += 1;
                let killed = wait_abort(&mut s);
                if killed {
                    counts.killed += 1;
                    counts.torn_writes += u64::from(point == "mid_write");
                } else {
                    counts.not_reached += 1;
                }
                tally(what.clone(), killed);
                drop(s);
                counts.files_lost += cut.cut_power() as u64;
                cut.check(acked, &what, &mut counts);
            }
            // `broca run` cut at a boundary, then run again with the same send_id: the run a
            // crash left open is resumed first, the send answers that run, and no call ran
            // twice.
            Plan::Run(point, nth) => {
                let what = format!("run-{point}-{nth}");
                let cut = Cut::new(&dir, &what, &peer, mode);
                let plan = format!("{point}:{nth}");
                let first = cut.run(&cut.kill_env(Some(&plan)));
                counts.cuts += 1;
                let killed = first.status.signal() == Some(libc::SIGABRT);
                if killed {
                    counts.killed += 1;
                } else {
                    counts.not_reached += 1;
                }
                tally(what.clone(), killed);
                counts.files_lost += cut.cut_power() as u64;
                // The same send_id again: the open run is resumed (interrupted when its calls'
                // outcome is unknown) and answered; nothing new is admitted.
                let again = cut.run(&[]);
                let stdout = String::from_utf8_lossy(&again.stdout);
                let last: Value = serde_json::from_str(stdout.lines().last().unwrap_or(""))
                    .unwrap_or_else(|_| {
                        panic!(
                            "{what}: no run.result line: {}",
                            String::from_utf8_lossy(&again.stderr)
                        )
                    });
                let started: Vec<Value> = dump_all(&cut.state)
                    .into_iter()
                    .filter(|r| r["kind"] == "run_started")
                    .collect();
                assert_eq!(started.len(), 1, "{what}: the send_id admitted one run");
                assert_eq!(last["run_id"], started[0]["record"]["run_id"], "{what}");
                assert_ne!(last["state"], "cancelled", "{what}");
                counts.invariants += 2;
                cut.check_files(&what, &mut counts);
            }
            // SIGKILL after a seeded delay, wherever the run is.
            Plan::Random(seed) => {
                let what = format!("sigkill-{seed}");
                let cut = Cut::new(&dir, &what, &peer, mode);
                let mut s = cut.serve(&cut.kill_env(None));
                let delay = Duration::from_millis(mix(seed) % 150);
                let t = Instant::now();
                let acked = send(&s)
                    .filter(|(status, _)| *status == 200)
                    .and_then(|(_, r)| r["result"]["run_id"].as_str().map(str::to_string));
                std::thread::sleep(delay.saturating_sub(t.elapsed()));
                counts.cuts += 1;
                let alive = s.child.try_wait().unwrap().is_none();
                let _ = s.child.kill(); // SIGKILL
                let status = s.child.wait().unwrap();
                let killed = alive && status.signal() == Some(libc::SIGKILL);
                // A serve that died before the kill died of something else: a failure.
                if killed {
                    counts.killed += 1;
                } else {
                    counts.not_reached += 1;
                }
                // Random kills are tallied together: each has its own seed.
                tally("sigkill".into(), killed);
                drop(s);
                counts.files_lost += cut.cut_power() as u64;
                cut.check(acked, &what, &mut counts);
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    let summary: Vec<String> = per_point
        .iter()
        .map(|(what, killed, missed)| match missed {
            0 => format!("{what}={killed} killed"),
            _ => format!("{what}={killed} killed, {missed} MISSED"),
        })
        .collect();
    println!(
        "{mode:?}: crash cuts tried: {} of {planned} planned in {:.0} s; kills that ended a real process: {}; boundaries not reached: {}; invariants checked: {}; faults injected (writes torn in a real process): {}; files lost to the power cut: {}\n  {}",
        counts.cuts, started.elapsed().as_secs_f64(), counts.killed, counts.not_reached,
        counts.invariants, counts.torn_writes,
        counts.files_lost, summary.join(" ")
    );
    assert_eq!(
        counts.cuts as usize, planned,
        "{mode:?}: the time budget ({budget:?}) cut the planned cuts short: {counts:?}"
    );
    assert_eq!(
        counts.not_reached,
        0,
        "{mode:?}: cut points not reached: {}",
        summary.join(" ")
    );
}
