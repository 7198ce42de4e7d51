//! The commands that talk to a running `broca serve` (`client.rs` finds and asks it): `send`
//! streams a run's answer and ends with its outcome, `attach` follows a session's events,
//! `status`, `cancel`, `ls` and `read`. Text for a person by default; `--json` prints the
//! daemon's answers as JSON, one per line, for scripts. Exit 0 on success (for `send`: the
//! run completed), 1 for a refusal or any other end, 2 for bad usage.

use std::ffi::OsString;
use std::path::PathBuf;

use broca_wire::request::Method;
use serde_json::{json, Value};

use super::client::{ClientError, Daemon, Event};
use super::{print_help, usage, EXIT_FAILURE, EXIT_OK};

mod reads;
use reads::{ls, read};

pub(super) const SEND_HELP: &str = "\
Usage: broca send --session S [options] PROMPT

Sends PROMPT to a session of the running broca serve (found through <state-dir>/serve.json,
or --connect) and streams the answer's text to stdout as it comes; then the run's outcome and
usage on stderr. Exit 0 when the run completed, 1 otherwise. Ctrl-C stops following the run,
not the run: `broca attach` or `broca status` find it again.

Options:
  --session S            the session (required)
  --project-root P       the session's project (default: the current directory)
  --harness H            the session's harness (default: cli)
  --model PROVIDER/MODEL the model (default: the one of the session's latest run)
  --send-id ID           idempotency key (default: a new one); the same again answers the
                         same run
  --system TEXT          system text
  --max-steps N          model steps at most
  --context-limit N      the context limit in tokens (default: the model's window)
  --compact              summarize older turns as the context limit comes near, instead of
                         ending the run there (docs/compaction.md); stays on for the session
                         until a send says --no-compact
  --no-compact           turn that off for this send and the session's later ones
  --delivery MODE        queue (the default: after the session's running run), steer (joins
                         the running run at its next step boundary; this then follows that
                         run) or interrupt (cancels the running run, then starts); a steer or
                         an interrupt takes the running run's model and settings
  --attach FILE          attach an image (.png, .jpg, .gif, .webp) or a PDF, uploaded into the
                         session first (repeatable, in order; not on a session's first send)
  --json                 print run.result's answer as the last stdout line, no text
  --connect URL|SOCKET   the daemon: http://HOST:PORT (handle from BROCA_HANDLE or the state
                         dir) or a Unix socket's path
";

pub(super) const ATTACH_HELP: &str = "\
Usage: broca attach --session S [--project-root P] [--harness H] [--from start|live|CURSOR]

Follows a session's events until the daemon ends the subscription or Ctrl-C (which leaves any
run going): the answer's text as it streams, one line per run, message and tool call. --from
start replays the session from its beginning; CURSOR (an event's id, printed with --json)
resumes right after that event, with no gap and no duplicate. --json prints each event as a
JSON line ({\"id\", \"unit\"}, {\"display\"}, {\"gap\"}, {\"end\"}).
";

pub(super) const STATUS_HELP: &str = "\
Usage: broca status --session S [--project-root P] [--harness H] [RUN] [--json]

The state of run RUN of the session (default: its latest run), with its usage.
";

pub(super) const CANCEL_HELP: &str = "\
Usage: broca cancel --session S [--project-root P] [--harness H] RUN [--at now|step_boundary]

Cancels run RUN: at once (the default), or once its current step and tool calls are
recorded. Says `ack`, or `not_active` when the run had already ended.
";

pub(super) const LS_HELP: &str = "\
Usage: broca ls [--project-root P] [--harness H] [--state S] [--since TIME] [--limit N] [--all]

Lists the daemon's sessions, most recently active first, with their latest run. --state is a
run state (active, paused, completed, max_steps, cancelled, interrupted, error) or none;
--since TIME (2026-11-30, 2026-11-30T12:00:00Z or Unix ms) keeps the sessions active since.
One page (--limit, default 50) unless --all; --cursor C goes on from a page's end.
";

pub(super) const READ_HELP: &str = "\
Usage: broca read --session S [--project-root P] [--harness H] [--from N] [--limit N] [--json]

Prints the session's transcript from ordinal N (default: the first), a page at a time (--limit,
default 200, at most 500), each message with its ordinal and role; tool calls and results by
name.
";

/// Marks an error finding the daemon (exit 1, not 2).
const NOT_FOUND: &str = "\u{0}not found: ";

/// The options every remote command shares.
struct Common {
    daemon: Daemon,
    json: bool,
    project_root: String,
    /// Whether --project-root was given (else the current directory is the project root).
    project_root_given: bool,
    harness: String,
    /// Whether --harness was given (else `cli`).
    harness_given: bool,
    session: Option<String>,
}

impl Common {
    fn params(&self) -> Result<Value, String> {
        let session = self
            .session
            .clone()
            .ok_or("this command needs --session S")?;
        Ok(json!({"project_root": self.project_root, "harness": self.harness, "session": session}))
    }
}

fn opt(pargs: &mut pico_args::Arguments, name: &'static str) -> Result<Option<String>, String> {
    pargs
        .opt_value_from_str::<_, String>(name)
        .map_err(|e| format!("{name}: {e}"))
}

fn common(pargs: &mut pico_args::Arguments, state_dir: Option<PathBuf>) -> Result<Common, String> {
    let connect = opt(pargs, "--connect")?;
    let json = pargs.contains("--json");
    let given_root = opt(pargs, "--project-root")?;
    let project_root_given = given_root.is_some();
    let project_root = match given_root {
        Some(p) => std::path::absolute(&p).map_err(|e| format!("--project-root: {e}"))?,
        None => std::env::current_dir().map_err(|e| format!("the current directory: {e}"))?,
    };
    let given_harness = opt(pargs, "--harness")?;
    let harness_given = given_harness.is_some();
    let harness = given_harness.unwrap_or_else(|| "cli".into());
    let session = opt(pargs, "--session")?;
    let state_dir = super::resolve_state_dir(state_dir)
        .ok_or("no state dir: give --state-dir, or set BROCA_STATE_DIR or HOME")?;
    let daemon =
        Daemon::find(&state_dir, connect.as_deref()).map_err(|e| format!("{NOT_FOUND}{e}"))?;
    Ok(Common {
        daemon,
        json,
        project_root: project_root.display().to_string(),
        project_root_given,
        harness,
        harness_given,
        session,
    })
}

/// The positional arguments left, none of them an option.
fn positional(pargs: pico_args::Arguments) -> Result<Vec<String>, String> {
    super::rest(pargs).map(|r| {
        r.into_iter()
            .map(|a: OsString| a.to_string_lossy().into_owned())
            .collect()
    })
}

/// A refusal or an unreachable daemon, said on stderr: exit 1.
fn failed(e: ClientError) -> u8 {
    broca_io::errln!("broca: {e}");
    EXIT_FAILURE
}

/// Runs a remote command (`name`) with its arguments.
pub(super) fn command(
    name: &str,
    mut pargs: pico_args::Arguments,
    help: bool,
    state_dir: Option<PathBuf>,
) -> u8 {
    let text = match name {
        "send" => SEND_HELP,
        "attach" => ATTACH_HELP,
        "status" => STATUS_HELP,
        "cancel" => CANCEL_HELP,
        "ls" => LS_HELP,
        "ui" => super::ui::UI_HELP,
        _ => READ_HELP,
    };
    if help {
        return print_help(text);
    }
    let outcome = common(&mut pargs, state_dir).and_then(|c| match name {
        "send" => send(c, pargs),
        "attach" => attach(c, pargs),
        "status" => status(c, pargs),
        "cancel" => cancel(c, pargs),
        "ls" => ls(c, pargs),
        "ui" => super::ui::ui(&c.daemon, c.json, pargs),
        _ => read(c, pargs),
    });
    match outcome {
        Ok(code) => code,
        // No daemon to ask is a failure, not a usage error.
        Err(e) if e.starts_with(NOT_FOUND) => {
            broca_io::errln!("broca: {}", &e[NOT_FOUND.len()..]);
            EXIT_FAILURE
        }
        Err(e) => usage(&e),
    }
}

/// What `broca send` was asked, its flags read.
struct SendArgs {
    model: Option<String>,
    send_id: String,
    system: Option<String>,
    max_steps: Option<u32>,
    context_limit: Option<u64>,
    compaction: Option<&'static str>,
    attach: Vec<std::path::PathBuf>,
    delivery: Option<String>,
    prompt: String,
}

/// Reads `broca send`'s flags and its prompt (`-`: from stdin).
fn send_args(mut pargs: pico_args::Arguments) -> Result<SendArgs, String> {
    let model = opt(&mut pargs, "--model")?;
    let send_id = opt(&mut pargs, "--send-id")?.unwrap_or_else(new_send_id);
    let system = opt(&mut pargs, "--system")?;
    let max_steps = pargs
        .opt_value_from_str::<_, u32>("--max-steps")
        .map_err(|e| format!("--max-steps: {e}"))?;
    let context_limit = pargs
        .opt_value_from_str::<_, u64>("--context-limit")
        .map_err(|e| format!("--context-limit: {e}"))?;
    let compaction = match (pargs.contains("--compact"), pargs.contains("--no-compact")) {
        (true, true) => return Err("--compact and --no-compact: choose one".into()),
        (true, false) => Some("summarize"),
        (false, true) => Some("off"),
        (false, false) => None,
    };
    let attach = pargs
        .values_from_str("--attach")
        .map_err(|e| format!("--attach: {e}"))?;
    let delivery = match opt(&mut pargs, "--delivery")?.as_deref() {
        None | Some("queue") => None,
        Some(mode @ ("steer" | "interrupt")) => Some(mode.to_string()),
        Some(other) => {
            return Err(format!(
                "--delivery: `{other}` is not one of queue, steer, interrupt"
            ))
        }
    };
    let prompt = match positional(pargs)?.as_slice() {
        [p] if p == "-" => {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
                .map_err(|e| format!("reading the prompt from stdin: {e}"))?;
            s
        }
        [p] => p.clone(),
        [] => return Err("`broca send` needs a PROMPT (or - for stdin)".into()),
        _ => return Err("`broca send` takes one PROMPT; quote it".into()),
    };
    Ok(SendArgs {
        model,
        send_id,
        system,
        max_steps,
        context_limit,
        compaction,
        attach,
        delivery,
        prompt,
    })
}

/// `session.send`'s params for `a` (its model `model`, empty for a steer's), its files
/// uploaded first; `Err(code)` when an upload failed (said on stderr).
fn send_params(c: &Common, a: &SendArgs, model: String) -> Result<Result<Value, u8>, String> {
    let mut params = c.params()?;
    params["prompt"] = a.prompt.clone().into();
    if !model.is_empty() {
        params["model"] = model.into();
    }
    if let Some(mode) = &a.delivery {
        params["delivery"] = mode.clone().into();
    }
    params["send_id"] = a.send_id.clone().into();
    if let Some(s) = &a.system {
        params["system"] = s.clone().into();
    }
    if let Some(n) = a.max_steps {
        params["max_steps"] = n.into();
    }
    if let Some(n) = a.context_limit {
        params["context_limit"] = n.into();
    }
    if let Some(mode) = a.compaction {
        params["compaction"] = json!({ "mode": mode });
    }
    if !a.attach.is_empty() {
        let ids = match super::uploads::upload_files(&c.daemon, &c.params()?, &a.attach) {
            Ok(ids) => ids,
            Err(e) => {
                broca_io::errln!("broca: {e}");
                return Ok(Err(EXIT_FAILURE));
            }
        };
        params["content"] = ids
            .iter()
            .map(|id| json!({"type": "upload", "upload_id": id}))
            .collect();
    }
    Ok(Ok(params))
}

fn send(c: Common, pargs: pico_args::Arguments) -> Result<u8, String> {
    let a = send_args(pargs)?;
    let model = match a.model.clone() {
        Some(m) => m,
        // A steer or an interrupt takes the running run's model (and settings).
        None if a.delivery.is_some() => String::new(),
        None => match latest_model(&c) {
            Ok(Some(m)) => m,
            Ok(None) => {
                return Err(
                    "`broca send` needs --model PROVIDER/MODEL for a session's first run".into(),
                )
            }
            Err(e) => return Ok(failed(e)),
        },
    };
    let params = match send_params(&c, &a, model)? {
        Ok(params) => params,
        Err(code) => return Ok(code),
    };
    // Subscribed first: the answer's text is live only, so the stream must be open before
    // the run can say anything.
    let mut events = match c.daemon.subscribe(&query(&c, "live")?) {
        Ok(e) => Some(e),
        Err(e) => {
            broca_io::errln!("broca: the answer will not stream ({e}); waiting for the outcome");
            None
        }
    };
    let sent = match c.daemon.rpc(Method::SessionSend.as_str(), params) {
        Ok(v) => v,
        Err(e) => return Ok(failed(e)),
    };
    let mut run_id = sent["run_id"].as_str().map(str::to_string);
    if sent["state"] == "pending" && !c.json {
        broca_io::errln!("broca: queued behind the session's active run");
    }
    // A steer joined a run already under way: that run is followed from here.
    let joined = a.delivery.as_deref() == Some("steer") && sent.get("delivered").is_none();
    if joined && !c.json {
        broca_io::errln!("broca: steered into the running run; following it");
    }
    if sent["state"] != "finished" {
        if let Some(events) = events.as_mut() {
            follow(events, &a.send_id, &mut run_id, joined, c.json);
        }
    }
    let Some(run_id) = run_id else {
        broca_io::errln!("broca: the subscription ended before the run started");
        return Ok(EXIT_FAILURE);
    };
    outcome(&c, &run_id)
}

/// Waits for run `run_id`'s result and says it: exit 0 when it completed.
fn outcome(c: &Common, run_id: &str) -> Result<u8, String> {
    let params = with(c, json!({"run_id": run_id, "wait_ms": 60000}))?;
    let result = loop {
        match c.daemon.rpc(Method::RunResult.as_str(), params.clone()) {
            Ok(r) if r["state"] == "active" => continue,
            Ok(r) => break r,
            Err(e) => return Ok(failed(e)),
        }
    };
    if c.json {
        broca_io::outln!("{result}");
    } else {
        broca_io::outln!("");
        broca_io::errln!("{}", outcome_line(&result));
    }
    Ok(if result["state"] == "completed" {
        EXIT_OK
    } else {
        EXIT_FAILURE
    })
}

/// Prints the run's text as it streams, until the run (ours: `run_id`, or the one started
/// for `send_id`) ends or the stream does.
/// Follows the run the send started (its `run_started` names the send) or, when `joined`, the
/// run `run_id` already under way, until it ends.
fn follow(
    events: &mut super::client::Events,
    send_id: &str,
    run_id: &mut Option<String>,
    joined: bool,
    json: bool,
) {
    let mut ours = joined;
    while let Some(event) = events.next_event() {
        match event {
            Event::Control { unit, .. } => {
                let of_run = unit["run_id"].as_str();
                if unit["type"] == "run_started"
                    && (unit["send_id"] == send_id || of_run == run_id.as_deref())
                {
                    *run_id = of_run.map(str::to_string);
                    ours = true;
                }
                if ours
                    && matches!(unit["type"].as_str(), Some("run_finished" | "run_paused"))
                    && of_run == run_id.as_deref()
                {
                    return;
                }
            }
            Event::Display(text) if !json => broca_io::out!("{text}"),
            Event::Gap(n) if !json => broca_io::errln!("\n[{n} display deltas dropped]"),
            Event::End(why) => {
                if !json {
                    broca_io::errln!("\nbroca: the daemon ended the subscription: {why}");
                }
                return;
            }
            _ => {}
        }
    }
}

/// One line for a person: the run, how it ended and what it used.
fn outcome_line(result: &Value) -> String {
    let mut line = format!(
        "run {}: {}",
        result["run_id"].as_str().unwrap_or("?"),
        result["state"].as_str().unwrap_or("?")
    );
    if let Some(reason) = result["reason"].as_str().filter(|r| *r != result["state"]) {
        line.push_str(&format!(" ({reason})"));
    }
    if let Some(detail) = result["stop_detail"].as_str() {
        line.push_str(&format!(": {detail}"));
    }
    if let Some(e) = result["error"]["message"].as_str() {
        line.push_str(&format!(": {e}"));
    }
    line.push_str(&usage_text(&result["usage"]));
    if let Some(calls) = result["indeterminate_tool_calls"]
        .as_array()
        .filter(|c| !c.is_empty())
    {
        line.push_str(&format!(
            "; {} tool call(s) with an unknown outcome, never sent again",
            calls.len()
        ));
    }
    line
}

/// ` · N steps · X in, Y out tokens`, as far as the usage says.
fn usage_text(usage: &Value) -> String {
    let mut out = String::new();
    if let Some(n) = usage["steps"].as_u64() {
        out.push_str(&format!(" · {n} step{}", if n == 1 { "" } else { "s" }));
    }
    let field = |k: &str| usage[k].as_u64();
    let input = [
        field("input_tokens"),
        field("cached_input_tokens"),
        field("cache_write_tokens"),
    ];
    if input.iter().any(Option::is_some) || field("output_tokens").is_some() {
        let total_in: u64 = input.iter().flatten().sum();
        out.push_str(&format!(
            " · {total_in} in, {} out tokens",
            field("output_tokens").map_or("?".into(), |n| n.to_string())
        ));
    }
    out
}

fn new_send_id() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("cli-{ms}-{}", std::process::id())
}

/// The model of the session's latest run, if it has one.
fn latest_model(c: &Common) -> Result<Option<String>, ClientError> {
    let params = with(c, json!({"limit": 1})).map_err(ClientError::Unreachable)?;
    let page = c.daemon.rpc(Method::RunsList.as_str(), params)?;
    Ok(page["runs"][0]["provider"].as_str().and_then(|p| {
        page["runs"][0]["model"]
            .as_str()
            .map(|m| format!("{p}/{m}"))
    }))
}

/// The session's params with `extra`'s members.
fn with(c: &Common, extra: Value) -> Result<Value, String> {
    let mut p = c.params()?;
    for (k, v) in extra.as_object().into_iter().flatten() {
        p[k.as_str()] = v.clone();
    }
    Ok(p)
}

/// The subscribe route's query for the session, from `from`.
fn query(c: &Common, from: &str) -> Result<String, String> {
    let session = c
        .session
        .as_deref()
        .ok_or("this command needs --session S")?;
    Ok(format!(
        "project_root={}&harness={}&session={}&from={}",
        encode(&c.project_root),
        encode(&c.harness),
        encode(session),
        encode(from)
    ))
}

/// Percent-encodes a query value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn attach(c: Common, mut pargs: pico_args::Arguments) -> Result<u8, String> {
    let from = opt(&mut pargs, "--from")?.unwrap_or_else(|| "live".into());
    positional(pargs)?
        .is_empty()
        .then_some(())
        .ok_or("`broca attach` takes no positional argument")?;
    let mut events = match c.daemon.subscribe(&query(&c, &from)?) {
        Ok(e) => e,
        Err(e) => return Ok(failed(e)),
    };
    if !c.json {
        broca_io::errln!("broca: attached (Ctrl-C to leave; any run goes on)");
    }
    while let Some(event) = events.next_event() {
        if c.json {
            let line = match &event {
                Event::Control { id, unit } => json!({"id": id, "unit": unit}),
                Event::Display(t) => json!({"display": t}),
                Event::Gap(n) => json!({"gap": n}),
                Event::End(why) => json!({"end": why}),
            };
            broca_io::outln!("{line}");
            continue;
        }
        match event {
            Event::Display(t) => broca_io::out!("{t}"),
            Event::Gap(n) => broca_io::errln!("\n[{n} display deltas dropped]"),
            Event::End(why) => broca_io::errln!("\nbroca: the subscription ended: {why}"),
            Event::Control { unit, .. } => {
                if let Some(line) = unit_line(&unit) {
                    broca_io::outln!("{line}");
                }
            }
        }
    }
    Ok(EXIT_OK)
}

/// A control unit as a person reads it, when it says something a person follows.
fn unit_line(unit: &Value) -> Option<String> {
    let run = unit["run_id"].as_str().unwrap_or("");
    Some(match unit["type"].as_str()? {
        "run_started" => format!(
            "\n== run {run} started ({}): {}",
            unit["model"].as_str().unwrap_or("?"),
            unit["prompt"].as_str().unwrap_or("")
        ),
        "run_finished" => format!(
            "\n== run {run} ended: {}",
            unit["finish"]["kind"]
                .as_str()
                .or(unit["reason"].as_str())
                .unwrap_or("finished")
        ),
        "run_paused" => format!("\n== run {run} paused"),
        "send_steered" => format!(
            "\n>> steered into run {run} (at its next step): {}",
            unit["prompt"].as_str().unwrap_or("")
        ),
        "tool_call" => format!("\n-> tool {}", unit["call"]["name"].as_str().unwrap_or("?")),
        "tool_result" => format!(
            "<- tool result{}",
            if unit["result"]["is_error"] == true {
                " (error)"
            } else {
                ""
            }
        ),
        _ => return None,
    })
}

fn status(c: Common, pargs: pico_args::Arguments) -> Result<u8, String> {
    let mut params = c.params()?;
    match positional(pargs)?.as_slice() {
        [] => {}
        [run] => params["run_id"] = run.clone().into(),
        _ => return Err("`broca status` takes at most one RUN".into()),
    }
    let st = match c.daemon.rpc(Method::RunStatus.as_str(), params) {
        Ok(v) => v,
        Err(e) => return Ok(failed(e)),
    };
    if c.json {
        broca_io::outln!("{st}");
    } else {
        broca_io::outln!("{}", outcome_line(&st));
    }
    Ok(EXIT_OK)
}

fn cancel(c: Common, mut pargs: pico_args::Arguments) -> Result<u8, String> {
    let at = opt(&mut pargs, "--at")?;
    let [run] = positional(pargs)?
        .try_into()
        .map_err(|_| "`broca cancel` needs one RUN")?;
    let mut params = with(&c, json!({ "run_id": run }))?;
    if let Some(at) = at {
        params["at"] = at.into();
    }
    match c.daemon.rpc(Method::RunCancel.as_str(), params) {
        Ok(v) => {
            broca_io::outln!(
                "{}",
                if c.json {
                    v.to_string()
                } else {
                    v.as_str().unwrap_or("").to_string()
                }
            );
            Ok(EXIT_OK)
        }
        Err(e) => Ok(failed(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::reads::when;
    use super::*;

    #[test]
    fn times_and_outcomes_read_as_a_person_reads_them() {
        assert_eq!(when(0), "1970-01-01 00:00:00");
        assert_eq!(when(1_764_547_200_000 + 3_723_000), "2025-12-01 01:02:03");
        let line = outcome_line(&json!({
            "run_id": "r1", "state": "interrupted",
            "usage": {"steps": 2, "input_tokens": 10, "cached_input_tokens": 5, "output_tokens": 7},
            "indeterminate_tool_calls": ["c1"],
        }));
        assert_eq!(
            line,
            "run r1: interrupted · 2 steps · 15 in, 7 out tokens; 1 tool call(s) with an \
             unknown outcome, never sent again"
        );
        assert_eq!(encode("/a b&c"), "/a%20b%26c");
    }
}
