//! Every shard's counters ([`ShardStats`], gathered over the mesh) and their exposition in
//! the Prometheus text format (`GET /metrics`): one family per row of [`FAMILIES`] (a shard
//! label on each sample), then the ones with labels of their own (errors by class, the fsync
//! latency histogram) and the daemon-wide mesh counter.

use std::cell::RefCell;

use broca_io::CommitStats;
use broca_wal::Record;

use crate::{Host, ShardMsg};

/// What one shard's runs ended with and its tool calls came to, counted as their records
/// are appended: runs by their finish reason (`paused` for a run waiting for its caller),
/// calls by the outcome `run.tool_calls` names.
#[derive(Debug, Default)]
pub struct Outcomes {
    runs: RefCell<Vec<(&'static str, u64)>>,
    calls: RefCell<Vec<(&'static str, u64)>>,
    /// Summaries of older turns recorded (the built-in compaction).
    compactions: std::cell::Cell<u64>,
}

fn bump(counts: &RefCell<Vec<(&'static str, u64)>>, name: &'static str) {
    let mut counts = counts.borrow_mut();
    match counts.iter_mut().find(|(n, _)| *n == name) {
        Some((_, count)) => *count += 1,
        None => counts.push((name, 1)),
    }
    debug_assert_eq!(
        counts.iter().filter(|(n, _)| *n == name).count(),
        1,
        "each outcome is counted on one row"
    );
}

impl Outcomes {
    /// Counts `record` when it ends a run or answers a call.
    pub fn record(&self, record: &Record) {
        match record {
            Record::RunFinished(f) => {
                bump(&self.runs, f.reason.as_str());
                tracing::info!(
                    run_id = %f.run_id,
                    reason = f.reason.as_str(),
                    indeterminate_tool_calls = f.indeterminate_tool_calls.len(),
                    "run finished"
                );
            }
            Record::RunPaused(p) => {
                bump(&self.runs, "paused");
                tracing::info!(run_id = %p.run_id, reason = %p.reason, "run paused");
            }
            Record::ToolResult(r) => bump(
                &self.calls,
                broca_core::entries::result_outcome(r.result.is_error, r.result.reason.as_deref()),
            ),
            Record::ContextCompacted(c) => {
                self.compactions.set(self.compactions.get() + 1);
                tracing::info!(
                    run_id = %c.run_id,
                    step = c.step,
                    replaced = c.replaced,
                    estimate_before = c.estimate_before,
                    "older turns summarized"
                );
            }
            _ => {}
        }
    }

    fn runs(&self) -> Vec<(&'static str, u64)> {
        self.runs.borrow().clone()
    }

    fn calls(&self) -> Vec<(&'static str, u64)> {
        self.calls.borrow().clone()
    }
}

/// One shard's counters, for /metrics.
#[derive(Debug, Clone, Default)]
pub struct ShardStats {
    pub shard: usize,
    pub sessions_live: usize,
    /// Idle sessions closed to stay within the open-sessions limit.
    pub sessions_evicted: u64,
    /// Commands refused because every open session was busy at the limit and the commands
    /// waiting for room were at their limit.
    pub sessions_refused_at_limit: u64,
    /// Commands that waited for room before their session opened.
    pub sessions_waited_for_room: u64,
    /// Commands waiting for room now.
    pub sessions_waiting_for_room: usize,
    pub sessions_waited_too_long: u64,
    pub runs_active: usize,
    pub commit: CommitStats,
    pub provider_bytes_in: u64,
    pub provider_bytes_out: u64,
    pub provider_connects: u64,
    /// The shard's held request prefixes (broca_provider::prefix): bytes held, and messages
    /// copied from them or rendered.
    pub render_prefix: broca_provider::prefix::PrefixStats,
    /// Failed model attempts by error class.
    pub model_errors: Vec<(broca_protocol::ErrorClass, u64)>,
    /// Accept-loop wakes that found nothing to do (an idle daemon has none).
    pub accept_wakes: u64,
    /// Failed accepts.
    pub accept_errors: u64,
    /// Connections closed with a 503 at once for lack of file descriptors.
    pub accept_shed: u64,
    /// Commands refused because their session's queue was full.
    pub inbox_full: u64,
    /// Batches kept for the next tick because the store's queue was full.
    pub projector_full: u64,
    /// Sessions that could not open their WAL for want of a file descriptor.
    pub out_of_descriptors: u64,
    /// Runs ended, by finish reason.
    pub runs_finished: Vec<(&'static str, u64)>,
    /// Tool calls answered, by outcome.
    pub tool_calls: Vec<(&'static str, u64)>,
    /// Summaries of older turns recorded (the built-in compaction).
    pub compactions: u64,
    /// Commands waiting in the shard's session inboxes.
    pub commands_waiting: usize,
    /// The shard's HTTP client by origin: its counters and the connections it keeps idle.
    pub egress: Vec<(String, broca_io::net::ClientStats, usize)>,
}

impl ShardStats {
    /// Counts `outcomes` holds, taken into these stats.
    pub(crate) fn with_outcomes(mut self, outcomes: &Outcomes) -> ShardStats {
        self.runs_finished = outcomes.runs();
        self.tool_calls = outcomes.calls();
        self.compactions = outcomes.compactions.get();
        self
    }
}

/// A metric family read from each shard's stats.
struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    value: fn(&ShardStats) -> u64,
}

const FAMILIES: &[Family] = &[
    Family {
        name: "broca_sessions_live",
        kind: "gauge",
        help: "Session actors in memory.",
        value: |s| s.sessions_live as u64,
    },
    Family {
        name: "broca_sessions_evicted_total",
        kind: "counter",
        help: "Idle sessions closed to stay within open_sessions_max.",
        value: |s| s.sessions_evicted,
    },
    Family {
        name: "broca_sessions_refused_at_limit_total",
        kind: "counter",
        help: "Commands refused (503 session_limit): every open session was running and \
               waiting_for_room_max commands already waited.",
        value: |s| s.sessions_refused_at_limit,
    },
    Family {
        name: "broca_sessions_waited_for_room_total",
        kind: "counter",
        help: "Commands that waited for a session to close (every open session running, or \
               descriptors short) before their own session opened.",
        value: |s| s.sessions_waited_for_room,
    },
    Family {
        name: "broca_sessions_waiting_for_room",
        kind: "gauge",
        help: "Commands waiting for room for their session now.",
        value: |s| s.sessions_waiting_for_room as u64,
    },
    Family {
        name: "broca_sessions_waited_too_long_total",
        kind: "counter",
        help: "Commands refused session_limit after waiting wait_for_room_secs for room.",
        value: |s| s.sessions_waited_too_long,
    },
    Family {
        name: "broca_runs_active",
        kind: "gauge",
        help: "Runs being driven.",
        value: |s| s.runs_active as u64,
    },
    Family {
        name: "broca_context_compactions_total",
        kind: "counter",
        help: "Summaries of older turns recorded by runs that summarize near their context limit.",
        value: |s| s.compactions,
    },
    Family {
        name: "broca_wal_appends_total",
        kind: "counter",
        help: "Records appended to WALs.",
        value: |s| s.commit.appends,
    },
    Family {
        name: "broca_wal_append_bytes_total",
        kind: "counter",
        help: "Bytes of records appended.",
        value: |s| s.commit.append_bytes,
    },
    Family {
        name: "broca_wal_fsyncs_total",
        kind: "counter",
        help: "fdatasync calls completed.",
        value: |s| s.commit.fsyncs,
    },
    Family {
        name: "broca_wal_defer_timeouts_total",
        kind: "counter",
        help: "Batches written because deferred records waited their 50 ms with nothing urgent to carry them.",
        value: |s| s.commit.defer_timeouts,
    },
    Family {
        name: "broca_wal_fsync_errors_total",
        kind: "counter",
        help: "fdatasync calls that failed.",
        value: |s| s.commit.fsync_errors,
    },
    Family {
        name: "broca_provider_bytes_in_total",
        kind: "counter",
        help: "Bytes received from providers.",
        value: |s| s.provider_bytes_in,
    },
    Family {
        name: "broca_provider_bytes_out_total",
        kind: "counter",
        help: "Bytes sent to providers.",
        value: |s| s.provider_bytes_out,
    },
    Family {
        name: "broca_provider_connects_total",
        kind: "counter",
        help: "Connections opened to providers.",
        value: |s| s.provider_connects,
    },
    Family {
        name: "broca_render_prefix_bytes",
        kind: "gauge",
        help: "Rendered request messages held for sessions' next requests.",
        value: |s| s.render_prefix.bytes as u64,
    },
    Family {
        name: "broca_render_messages_reused_total",
        kind: "counter",
        help: "Request messages copied from a session's held prefix instead of rendered.",
        value: |s| s.render_prefix.reused,
    },
    Family {
        name: "broca_render_messages_rendered_total",
        kind: "counter",
        help: "Request messages rendered.",
        value: |s| s.render_prefix.rendered,
    },
    Family {
        name: "broca_accept_wakes_total",
        kind: "counter",
        help: "Accept-loop wakes that found no connection (an idle daemon has none).",
        value: |s| s.accept_wakes,
    },
    Family {
        name: "broca_accept_errors_total",
        kind: "counter",
        help: "Failed accepts (out of descriptors, aborted connections).",
        value: |s| s.accept_errors,
    },
    Family {
        name: "broca_accept_shed_total",
        kind: "counter",
        help: "Connections closed at once with a 503: the process was out of file descriptors.",
        value: |s| s.accept_shed,
    },
    Family {
        name: "broca_session_queue_full_total",
        kind: "counter",
        help: "Commands refused 503 session_queue_full: the session's queue was full.",
        value: |s| s.inbox_full,
    },
    Family {
        name: "broca_projector_queue_full_total",
        kind: "counter",
        help: "Store batches held for the next tick: the store's queue was full.",
        value: |s| s.projector_full,
    },
    Family {
        name: "broca_sessions_out_of_descriptors_total",
        kind: "counter",
        help: "Sessions refused 503 session_unavailable: no file descriptor was left to open \
               their WAL.",
        value: |s| s.out_of_descriptors,
    },
];

/// Every shard's stats (a shard whose queue is full is left out rather than waited for).
pub(crate) async fn gather(ctx: &Host) -> Vec<ShardStats> {
    let mut stats: Vec<ShardStats> = Vec::new();
    for shard in 0..ctx.mesh.shards() {
        let (reply, wait) = futures_channel::oneshot::channel();
        if ctx.mesh.try_send(shard, ShardMsg::Stats(reply)).is_ok() {
            if let Ok(s) = wait.await {
                stats.push(s);
            }
        }
    }
    stats
}

/// The metrics text, asking every shard for its stats (a shard whose queue is full is left
/// out of this scrape rather than waited for).
pub async fn render(ctx: &Host) -> String {
    let stats = gather(ctx).await;
    let mut out = String::new();
    for f in FAMILIES {
        out.push_str(&format!(
            "# HELP {} {}\n# TYPE {} {}\n",
            f.name, f.help, f.name, f.kind
        ));
        for s in &stats {
            out.push_str(&format!(
                "{}{{shard=\"{}\"}} {}\n",
                f.name,
                s.shard,
                (f.value)(s)
            ));
        }
    }
    process_counters(&mut out, ctx);
    let wal_dir = ctx.wal_dir.clone();
    let mem = broca_io::blocking::run(broca_io::blocking::Kind::WalRead, move || {
        crate::memory::measure(&wal_dir)
    })
    .await;
    memory(&mut out, &mem);
    storage(&mut out, ctx);
    outcomes(&mut out, &stats);
    diagnostics(&mut out, ctx, &stats);
    fsync_histogram(&mut out, &stats);
    out
}

/// The process's own counters: step hints, trace spans, the mesh, plans, commands, changes,
/// the archive.
fn process_counters(out: &mut String, ctx: &Host) {
    if let Some((published, dropped, connects)) = ctx.step_hint_counts() {
        out.push_str(&format!(
            "# HELP broca_step_hints_total Step hints (step.finished.v1) handed to the daemon's bus, or dropped (queue full, bus unreachable).\n# TYPE broca_step_hints_total counter\nbroca_step_hints_total{{outcome=\"published\"}} {}\nbroca_step_hints_total{{outcome=\"dropped\"}} {}\n# HELP broca_bus_connects_total Connections made to the daemon's bus.\n# TYPE broca_bus_connects_total counter\nbroca_bus_connects_total {}\n",
            published, dropped, connects,
        ));
    }
    if let Some(t) = &ctx.traces {
        use std::sync::atomic::Ordering::Relaxed;
        out.push_str(&format!(
            "# HELP broca_trace_spans_total Trace spans exported over OTLP, dropped (queue full, or left at shutdown) or failed (the collector refused them or could not be reached).\n# TYPE broca_trace_spans_total counter\nbroca_trace_spans_total{{outcome=\"exported\"}} {}\nbroca_trace_spans_total{{outcome=\"dropped\"}} {}\nbroca_trace_spans_total{{outcome=\"failed\"}} {}\n",
            t.counts.exported.load(Relaxed),
            t.counts.dropped.load(Relaxed),
            t.counts.failed.load(Relaxed),
        ));
    }
    out.push_str(&format!(
        "# HELP broca_mesh_full_total Commands refused 503 shard_busy: their shard's queue was full.\n# TYPE broca_mesh_full_total counter\nbroca_mesh_full_total {}\n",
        ctx.mesh.full_count()
    ));
    out.push_str(&crate::plans::exposition());
    out.push_str(&crate::commands::exposition());
    out.push_str(&crate::change::exposition());
    out.push_str(&format!(
        "# HELP broca_archive_packed_total Sessions packed into sealed containers by this process.\n# TYPE broca_archive_packed_total counter\nbroca_archive_packed_total {}\n# HELP broca_archive_restored_total Archived sessions restored before a write by this process.\n# TYPE broca_archive_restored_total counter\nbroca_archive_restored_total {}\n",
        broca_archive::PACKED.load(std::sync::atomic::Ordering::Relaxed),
        broca_archive::RESTORED.load(std::sync::atomic::Ordering::Relaxed),
    ));
}

/// The process's memory by kind.
fn memory(out: &mut String, mem: &crate::memory::Memory) {
    out.push_str("# HELP broca_memory_bytes The process's memory by kind: `anonymous` (heap and stacks), `store_map` (the store's LMDB map: file-backed, reclaimable), `file` (other file-backed pages: the binary, its libraries), and apart from the resident set, `wal_page_cache` (the kernel's page cache of the WAL files).\n# TYPE broca_memory_bytes gauge\n");
    for (kind, bytes) in [
        ("anonymous", Some(mem.anonymous)),
        ("store_map", Some(mem.store_map)),
        ("file", Some(mem.file)),
        ("wal_page_cache", mem.wal_page_cache),
    ] {
        if let Some(bytes) = bytes {
            out.push_str(&format!("broca_memory_bytes{{kind=\"{kind}\"}} {bytes}\n"));
        }
    }
}

/// The storage's health: failed WAL writes by kind, a full file system.
fn storage(out: &mut String, ctx: &Host) {
    out.push_str("# HELP broca_wal_write_errors_total WAL writes (and opens for writing) that failed, by kind.\n# TYPE broca_wal_write_errors_total counter\n");
    for (kind, n) in ctx.storage.write_errors() {
        out.push_str(&format!(
            "broca_wal_write_errors_total{{kind=\"{kind}\"}} {n}\n"
        ));
    }
    out.push_str(&format!(
        "# HELP broca_storage_full_total Commands and runs that found the WALs' file system full (answered storage_full).\n# TYPE broca_storage_full_total counter\nbroca_storage_full_total {}\n# HELP broca_storage_degraded Whether writes last found the file system full (1) or not (0).\n# TYPE broca_storage_degraded gauge\nbroca_storage_degraded {}\n",
        ctx.storage.full_refusals(),
        u8::from(ctx.storage.full_since().is_some()),
    ));
}

/// Model errors by class, runs by finish reason and tool calls by outcome, per shard.
fn outcomes(out: &mut String, stats: &[ShardStats]) {
    out.push_str("# HELP broca_model_errors_total Failed model attempts by error class.\n# TYPE broca_model_errors_total counter\n");
    for s in stats {
        for (class, n) in &s.model_errors {
            out.push_str(&format!(
                "broca_model_errors_total{{shard=\"{}\",class=\"{}\"}} {n}\n",
                s.shard,
                class.as_str()
            ));
        }
    }
    labelled(
        out,
        stats,
        (
            "broca_runs_finished_total",
            "Runs ended, by finish reason (paused: waiting for the caller).",
            "reason",
        ),
        |s| &s.runs_finished,
    );
    labelled(
        out,
        stats,
        (
            "broca_tool_calls_total",
            "Tool calls answered, by outcome (as run.tool_calls names it).",
            "outcome",
        ),
        |s| &s.tool_calls,
    );
}

/// fdatasync's latency, a histogram per shard.
fn fsync_histogram(out: &mut String, stats: &[ShardStats]) {
    out.push_str("# HELP broca_wal_fsync_seconds fdatasync latency.\n# TYPE broca_wal_fsync_seconds histogram\n");
    for s in stats {
        let mut cumulative = 0u64;
        debug_assert_eq!(
            s.commit.fsync_latency_buckets.len(),
            broca_io::commit::FSYNC_LATENCY_BUCKETS_US.len() + 1,
            "one bucket per bound and one past the last"
        );
        for (i, count) in s.commit.fsync_latency_buckets.iter().enumerate() {
            cumulative += count;
            let le = match broca_io::commit::FSYNC_LATENCY_BUCKETS_US.get(i) {
                Some(us) => format!("{}", *us as f64 / 1e6),
                None => "+Inf".into(),
            };
            out.push_str(&format!(
                "broca_wal_fsync_seconds_bucket{{shard=\"{}\",le=\"{le}\"}} {cumulative}\n",
                s.shard
            ));
        }
        out.push_str(&format!(
            "broca_wal_fsync_seconds_sum{{shard=\"{}\"}} {}\nbroca_wal_fsync_seconds_count{{shard=\"{}\"}} {}\n",
            s.shard,
            s.commit.fsync_latency_sum_us as f64 / 1e6,
            s.shard,
            cumulative
        ));
    }
}

/// Where time and bytes go: the blocking pool's jobs by kind, the queues' depths, and each
/// shard's traffic by origin.
fn diagnostics(out: &mut String, ctx: &Host, stats: &[ShardStats]) {
    blocking_pool(out);
    queues(out, ctx, stats);
    egress(out, stats);
}

/// The `# HELP` and `# TYPE` lines of family `name`.
fn head(out: &mut String, name: &str, kind: &str, help: &str) {
    use std::fmt::Write as _;
    let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n");
}

/// The blocking pool's jobs, their time and those under way, by kind.
fn blocking_pool(out: &mut String) {
    use std::fmt::Write as _;
    let blocking = broca_io::blocking::stats();
    head(
        out,
        "broca_blocking_jobs_total",
        "counter",
        "Jobs the shards handed to their blocking pool, by kind.",
    );
    for b in &blocking {
        let _ = writeln!(
            out,
            "broca_blocking_jobs_total{{kind=\"{}\"}} {}",
            b.kind.as_str(),
            b.jobs
        );
    }
    head(
        out,
        "broca_blocking_seconds_total",
        "counter",
        "Time those jobs took, from hand-off to answer (waiting for a thread included), by kind.",
    );
    for b in &blocking {
        let _ = writeln!(
            out,
            "broca_blocking_seconds_total{{kind=\"{}\"}} {}",
            b.kind.as_str(),
            b.micros as f64 / 1e6
        );
    }
    head(
        out,
        "broca_blocking_jobs_under_way",
        "gauge",
        "Blocking jobs handed off and not yet answered, by kind.",
    );
    for b in &blocking {
        let _ = writeln!(
            out,
            "broca_blocking_jobs_under_way{{kind=\"{}\"}} {}",
            b.kind.as_str(),
            b.under_way
        );
    }
}

/// The depths of the mesh's queues, of the sessions' inboxes and of the store's hand-off.
fn queues(out: &mut String, ctx: &Host, stats: &[ShardStats]) {
    use std::fmt::Write as _;
    head(
        out,
        "broca_mesh_queue_depth",
        "gauge",
        "Messages waiting in each shard's queue from the others.",
    );
    for (shard, depth) in ctx.mesh.depths().iter().enumerate() {
        let _ = writeln!(out, "broca_mesh_queue_depth{{shard=\"{shard}\"}} {depth}");
    }
    head(
        out,
        "broca_session_commands_waiting",
        "gauge",
        "Commands waiting in the shard's session inboxes.",
    );
    for s in stats {
        let _ = writeln!(
            out,
            "broca_session_commands_waiting{{shard=\"{}\"}} {}",
            s.shard, s.commands_waiting
        );
    }
    head(
        out,
        "broca_store_queue_depth",
        "gauge",
        "Batches of WALs handed to the store's thread and not yet taken.",
    );
    let _ = writeln!(
        out,
        "broca_store_queue_depth {}",
        crate::start::STORE_QUEUE.load(std::sync::atomic::Ordering::Acquire)
    );
}

/// Each shard's HTTP traffic by origin: bytes, connections, reuses, idle connections.
fn egress(out: &mut String, stats: &[ShardStats]) {
    use std::fmt::Write as _;
    head(out, "broca_egress_bytes_total", "counter",
        "Bytes the shard's HTTP client sent (out) and received (in), by origin (`other`: origins past the first 64).");
    for s in stats {
        for (origin, c, _) in &s.egress {
            for (direction, n) in [("out", c.bytes_out), ("in", c.bytes_in)] {
                let _ = writeln!(out, "broca_egress_bytes_total{{shard=\"{}\",origin=\"{origin}\",direction=\"{direction}\"}} {n}", s.shard);
            }
        }
    }
    type Of = fn(&broca_io::net::ClientStats, usize) -> u64;
    let per_origin: [(&str, &str, &str, Of); 3] = [
        (
            "broca_egress_connects_total",
            "counter",
            "Connections the shard's HTTP client opened, by origin.",
            |c, _| c.connects,
        ),
        (
            "broca_egress_reuses_total",
            "counter",
            "Requests sent on a kept-alive connection, by origin.",
            |c, _| c.reuses,
        ),
        (
            "broca_egress_idle_connections",
            "gauge",
            "Connections the shard's HTTP client keeps idle for reuse, by origin.",
            |_, idle| idle as u64,
        ),
    ];
    for (name, kind, help, of) in per_origin {
        head(out, name, kind, help);
        for s in stats {
            for (origin, c, idle) in &s.egress {
                let _ = writeln!(
                    out,
                    "{name}{{shard=\"{}\",origin=\"{origin}\"}} {}",
                    s.shard,
                    of(c, *idle)
                );
            }
        }
    }
}

/// The same diagnostics as JSON, for `health.check`'s metrics: the blocking pool's jobs by
/// kind, the queues' depths, and the traffic by origin (summed over the shards).
pub fn diagnostics_json(ctx: &Host, stats: &[ShardStats]) -> serde_json::Value {
    let blocking: serde_json::Map<String, serde_json::Value> = broca_io::blocking::stats()
        .iter()
        .map(|b| {
            let v = serde_json::json!({"jobs": b.jobs, "seconds": b.micros as f64 / 1e6,
                "under_way": b.under_way});
            (b.kind.as_str().to_string(), v)
        })
        .collect();
    let mut egress: Vec<(String, broca_io::net::ClientStats)> = Vec::new();
    for (origin, c, _) in stats.iter().flat_map(|s| &s.egress) {
        match egress.iter_mut().find(|(o, _)| o == origin) {
            Some((_, sum)) => {
                sum.bytes_in += c.bytes_in;
                sum.bytes_out += c.bytes_out;
                sum.connects += c.connects;
                sum.reuses += c.reuses;
            }
            None => egress.push((origin.clone(), *c)),
        }
    }
    let egress: Vec<serde_json::Value> = egress
        .iter()
        .map(|(origin, c)| {
            serde_json::json!({"origin": origin, "bytes_in": c.bytes_in, "bytes_out": c.bytes_out,
                "connects": c.connects, "reuses": c.reuses})
        })
        .collect();
    serde_json::json!({
        "blocking": blocking,
        "queues": {
            "mesh": ctx.mesh.depths(),
            "session_commands": stats.iter().map(|s| s.commands_waiting).sum::<usize>(),
            "store": crate::start::STORE_QUEUE.load(std::sync::atomic::Ordering::Acquire),
        },
        "egress": egress,
        "user_commands": crate::commands::tally_json(),
        "session_refreshes": crate::change::tally_json(),
    })
}

/// A counter family with a label of its own besides the shard's.
fn labelled(
    out: &mut String,
    stats: &[ShardStats],
    (name, help, label): (&str, &str, &str),
    counts: fn(&ShardStats) -> &Vec<(&'static str, u64)>,
) {
    out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n"));
    for s in stats {
        for (value, n) in counts(s) {
            out.push_str(&format!(
                "{name}{{shard=\"{}\",{label}=\"{value}\"}} {n}\n",
                s.shard
            ));
        }
    }
}
