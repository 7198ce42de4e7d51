//! The `broca` command line (pico-args). Exit codes: 0 success, 1 a failure the command found
//! (corruption, refused input), 2 bad usage. Errors go to stderr as one line.

use std::cell::Cell;
use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::rc::Rc;

use broca_core::admission::SendRequest;
use broca_run::{Failure, Standalone};
use broca_serve::ServeOptions;
use broca_transport::Endpoints;
use broca_wal::SessionTriple;

use broca_wal::verify::{dump, verify_file, wal_files, FileReport};

mod archive;
mod client;
mod import;
mod log;
mod progress;
mod serve;
use serve::parse_serve;
mod remote;
mod store;
mod ui;
mod uploads;
mod verify_media;

pub use log::init_process;

/// Exit code: success.
pub const EXIT_OK: u8 = 0;
/// Exit code: the command found a failure.
pub const EXIT_FAILURE: u8 = 1;
/// Exit code: bad usage.
pub const EXIT_USAGE: u8 = 2;

const HELP: &str = "\
broca: a durable runner for LLM agent loops

Usage: broca [--state-dir DIR] <command> [args]

Commands:
  serve [--listen ADDR] [--socket PATH] [--shards N] [--grace-secs N] [--config FILE]
        [--tools-config FILE] [--plain-http] [--import-root DIR]...
                         the daemon: the management surface over HTTP (see `broca serve --help`)
  module --subc FILE     broca as a module of the subconscious daemon (see `broca module --help`)
  run --model PROVIDER/MODEL PROMPT
                         one run, in process: streams the answer to stdout (see `broca run --help`)
  wal verify [PATH...]   check WAL files (files, folders or a state dir; default: the state dir)
  wal dump FILE          print every record of a WAL as one JSON object per line
  store check|rebuild    compare the store with the WALs, or rebuild it from them
  archive pack|list|verify|restore
                         pack idle WALs into sealed containers, and back (see `broca archive --help`)
  import claude-code|codex PATH...
                         take Claude Code or Codex session logs in as sessions that go on
                         (see `broca import --help`)
  export usage [--since TIME] [--format jsonl|csv]
                         print the usage facts (one per model step and failed attempt)

Try it with no key and no network: `broca run --model demo/tour \"hello\"` (or `broca send
--session s1 --model demo/tour \"hello\"` against a running serve). demo/tour is a demo, not a
model: broca's own deterministic script, which streams a greeting, calls a built-in tool that
counts the words of the prompt (1.5 s: time to try kill -9), and answers; priced at zero.

Commands for a running serve (found through <state-dir>/serve.json, or --connect URL|SOCKET):
  send --session S [--model M] PROMPT
                         send a prompt and stream the answer; the outcome and usage at the end
  attach --session S [--from start|live|CURSOR]
                         follow a session's events (Ctrl-C leaves its run going)
  status --session S [RUN]
                         a run's state and usage (default: the session's latest)
  cancel --session S RUN cancel a run
  ls [--state S] [--since TIME]
                         the sessions, most recently active first, with their latest run
  read --session S [--from N]
                         a session's transcript
  ui                     print a one-time sign-in link to serve's read-only web view (/ui)
  (each takes --project-root P, default the current directory, --harness H, default cli,
  and --json; see `broca COMMAND --help`)

Global options:
  --state-dir DIR   state directory (default: $BROCA_STATE_DIR, else $XDG_DATA_HOME/broca,
                    else ~/.local/share/broca)
  -h, --help        this help (also after any command)
  -V, --version     the version

  --log-level FILTER
                    log filter for stderr (default: $BROCA_LOG, else $RUST_LOG, else warn),
                    e.g. info or broca=debug,warn; a filter that does not parse is an error
  --log-format text|json
                    log lines as text (default) or as one JSON object per line

Environment:
  BROCA_LOG         log filter for stderr (else RUST_LOG), e.g. BROCA_LOG=broca=debug
";

const SERVE_HELP: &str = "\
Usage: broca serve [options]

Runs the daemon: one shard per core, each owning its sessions, their WALs and their provider
connections. Once ready it writes <state-dir>/serve.json = {pid, listen, socket, handle_file}
and prints `broca listening on http://ADDR`. TCP requests carry `Authorization: Bearer
<handle>` (the handle is in handle_file, owner-only); the Unix socket needs none.
SIGTERM, SIGINT or SIGHUP stops admission, gives active runs the grace period, seals the
rest interrupted, and re-raises the signal; a second one exits at once (the next start
resumes the runs left open).

Options:
  --listen ADDR        TCP address (default 127.0.0.1:7411; 127.0.0.1:0 picks a free port)
  --socket PATH        Unix socket (default <state-dir>/broca.sock)
  --shards N           executors, one per core (default: the cores available)
  --grace-secs N       how long active runs may finish at shutdown (default 5)
  --config FILE        JSON: {\"listen\", \"socket\", \"shards\", \"grace_secs\",
                       \"idle_secs\", \"open_sessions_max\" (per shard; default
                       a third of the open-files limit at two
                       descriptors a session; a session past it waits),
                       \"wait_for_room_secs\" (how long a send waits for an open
                       session to close before 503 session_limit; default 60),
                       \"body_limit_bytes\" (default 8 MiB),
                       \"catalog_file\", \"catalog_url\" (else BROCA_CATALOG_FILE and
                       BROCA_CATALOG_URL), \"catalog_module\" (module mode: the fusiform
                       module asked with catalog.get; else BROCA_CATALOG_MODULE),
                       \"catalog_refresh_secs\" (how often the
                       catalog is read again; default 300, 0 never),
                       \"archive_after_days\" (pack sessions idle this long in
                       the background; default off), \"archive_every_secs\"
                       (how often; default 3600),
                       \"request_timeout_ms\" (default 15000),
                       \"base_urls\": {PROVIDER: URL},
                       \"import_roots\": [DIR...]};
                       flags win over the file
  --tools-config FILE  MCP tool servers, JSON or TOML (see `broca run --help`)
  --plain-http         allow a --listen address other hosts can reach (refused without it:
                       the handle and the prompts would cross the network in clear; put a
                       TLS-terminating proxy in front); also \"plain_http\": true
  --import-root DIR    a folder session.import may read logs from (repeatable; default
                       ~/.claude/projects and ~/.codex/sessions, after CLAUDE_CONFIG_DIR
                       and CODEX_HOME): a path outside them, or a link out of them, is
                       refused import_forbidden

Routes (README.md's management surface and the llm-runner/v1 role give each method's
params and answer):
  POST /v1/rpc {\"method\", \"params\"}   session.send, run.status, run.result, run.cancel,
                    run.tool_calls, session.read, session.head, session.history,
                    session.retract, session.send_status (also send.status), session.import,
                    role.describe, session.baseline, sessions.list, runs.list,
                    session.upload_begin, session.upload_append, session.upload_status,
                    session.upload_commit, session.media_read (docs/attachments.md),
                    session.release (docs/retention.md), session.user_command,
                    session.user_command_status, session.refresh, session.refresh_policy,
                    session.flush_prefix, session.adopt, session.host_start (with
                    `plans` on; docs/plans.md)
  GET /v1/subscribe?project_root=P&harness=H&session=S&from=start|live|CURSOR
                    the session's events as server-sent events, or a WebSocket on upgrade;
                    Last-Event-ID resumes after a cursor
  GET /healthz      ok, or degraded with its reasons
  GET /metrics      Prometheus text (docs/metrics.md)
  GET /ui           a read-only web view in a browser, signed in through the one-time link
                    `broca ui` prints (POST /ui/link); the sign-in reads, never sends
";

const RUN_HELP: &str = "\
Usage: broca run --model PROVIDER/MODEL [options] PROMPT

Runs one send in this process, with the same WAL and durability as serve, and streams the
answer's text to stdout. PROMPT `-` reads the prompt from stdin. A run an earlier crash left
open in the session is resumed first (reported on stderr). Exit 0 when the run completed, 1
for any other end (the reason on stderr, and in the JSON with --json), 2 for bad usage.

Options:
  --model PROVIDER/MODEL  e.g. anthropic/claude-sonnet-4-5, openai/gpt-4o,
                          openai-responses/gpt-4o; demo/tour for a keyless, offline demo
  --base-url URL          the provider's base URL (scheme://host[:port][/prefix]); plain http
                          only for loopback hosts; ws:// or wss:// selects the WebSocket mode
                          of openai-responses
  --project-root P        session identity (default: the current directory)
  --harness H             session identity (default: broca-run)
  --session S             session identity (default: default)
  --send-id ID            idempotency key: the same ID again answers the same run, runs nothing
  --credential ID         the credential: env:NAME, file:NAME (<state-dir>/credentials.json)
                          or vault:NAME (a vault_handle there); default: the provider's
                          environment variable
  --system TEXT           system text
  --max-steps N           model steps at most (default 32)
  --context-limit N       the context limit in tokens (default: the model's window)
  --compact               summarize older turns as the context limit comes near, instead of
                          ending the run there (docs/compaction.md); stays on for the session
  --tools-config FILE     MCP tool servers, JSON or TOML (.toml):
                          {\"mcp\": [{\"name\", \"command\": [...], \"env\"?, \"cwd\"?} |
                                   {\"name\", \"url\", \"headers\"?}],
                           \"result_bytes_max\"?}; a server also takes
                          \"startup_timeout_ms\", \"call_timeout_ms\", \"max_concurrency\"
  --json                  end stdout with the run.result reply as one JSON line

Environment:
  ANTHROPIC_API_KEY, OPENAI_API_KEY     credentials (never written anywhere)
  GEMINI_API_KEY                        gemini/MODEL
  GOOGLE_CLOUD_ACCESS_TOKEN, GOOGLE_CLOUD_PROJECT
                                        code-assist/MODEL (an OAuth access token)
  AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION
                                        bedrock/MODEL (signed with SigV4)
  CHATGPT_ACCESS_TOKEN, CHATGPT_ACCOUNT_ID
                                        chatgpt/MODEL (the ChatGPT backend)
  BROCA_BASE_URL_<PROVIDER>             base URL per provider (e.g. BROCA_BASE_URL_OPENAI_RESPONSES)
  HTTPS_PROXY, NO_PROXY                 an http:// proxy for TLS connections (CONNECT)
  SSL_CERT_FILE                         extra trusted certificates (PEM)
";

const WAL_HELP: &str = "\
Usage: broca wal <verify|dump> ...

  verify [PATH...]  check WAL files; exit 0 when each is intact or ends in a torn tail that
                    recovery may cut (said as such), 1 naming file, offset and reason for any
                    corruption or any file that is not a WAL
  dump FILE         one JSON object per record, in order: seq, offset, len (the whole frame:
                    offset + len is where the next record starts), kind, epoch, record
";

const VERIFY_HELP: &str = "\
Usage: broca wal verify [PATH...]

Checks each WAL file named, each *.wal file in a folder named, or each WAL of a state dir
(<dir>/wal/*.wal). Without PATH, checks the state dir. Reads only: never truncates or repairs.
Exit 0 when every WAL is intact or ends in a torn tail that recovery may cut; exit 1 naming
file, offset and reason for any corruption and for any file that is not a WAL. An empty file
(a crash while it was being created) is reported by name and does not fail the check.
";

const DUMP_HELP: &str = "\
Usage: broca wal dump FILE

Prints one JSON object per record, in order: {\"seq\", \"offset\", \"len\", \"kind\", \"epoch\",
\"record\"}. `offset + len` is where the next record starts. Stops at corruption with exit 1
after printing the records before it.
";

/// Runs the command line `args` (without the program name) and returns the exit code.
/// Called as `ck-broca` (the daemon's name for the module), the command is `module`.
pub fn run_as(program: Option<OsString>, args: Vec<OsString>) -> u8 {
    let name = program
        .as_deref()
        .map(std::path::Path::new)
        .and_then(|p| p.file_name())
        .and_then(|n| n.to_str());
    if name == Some("ck-broca") {
        let mut args = args;
        if args.first().is_some_and(|a| a == "module") {
            args.remove(0);
        }
        let mut pargs = pico_args::Arguments::from_vec(args);
        if pargs.contains(["-h", "--help"]) {
            return print_help(MODULE_HELP);
        }
        let state_dir: Option<PathBuf> = match pargs.opt_value_from_str("--state-dir") {
            Ok(dir) => dir,
            Err(e) => return usage(&format!("--state-dir: {e}")),
        };
        return module_command(pargs, state_dir);
    }
    run(args)
}

/// Runs the command line `args` (without the program name) and returns the exit code.
pub fn run(args: Vec<OsString>) -> u8 {
    let mut pargs = pico_args::Arguments::from_vec(args);
    let help = pargs.contains(["-h", "--help"]);
    if pargs.contains(["-V", "--version"]) {
        broca_io::outln!("broca {}", env!("CARGO_PKG_VERSION"));
        return EXIT_OK;
    }
    let state_dir: Option<PathBuf> = match pargs.opt_value_from_str("--state-dir") {
        Ok(dir) => dir,
        Err(e) => return usage(&format!("--state-dir: {e}")),
    };
    let command = pargs.subcommand().ok().flatten();
    match command.as_deref() {
        None if help => print_help(HELP),
        None => usage("no command given; see `broca --help`"),
        Some("wal") => wal(pargs, help, state_dir),
        Some("serve") if help => print_help(SERVE_HELP),
        Some("serve") => serve_command(pargs, state_dir),
        Some("module") if help => print_help(MODULE_HELP),
        Some("module") => module_command(pargs, state_dir),
        Some("run") if help => print_help(RUN_HELP),
        Some("run") => run_command(pargs, state_dir),
        Some("store") => store::store(pargs, help, state_dir),
        Some("export") => store::export(pargs, help, state_dir),
        Some("archive") => archive::archive(pargs, help, state_dir),
        Some(c @ ("send" | "attach" | "status" | "cancel" | "ls" | "read" | "ui")) => {
            remote::command(c, pargs, help, state_dir)
        }
        Some("import") => import::import(pargs, help, state_dir),
        Some(other) => usage(&format!("unknown command `{other}`; see `broca --help`")),
    }
}

fn print_help(text: &str) -> u8 {
    broca_io::out!("{text}");
    EXIT_OK
}

fn usage(message: &str) -> u8 {
    broca_io::errln!("broca: {message}");
    EXIT_USAGE
}

fn rest(pargs: pico_args::Arguments) -> Result<Vec<OsString>, String> {
    let rest = pargs.finish();
    if let Some(flag) = rest.iter().find(|a| a.to_string_lossy().starts_with('-')) {
        return Err(format!("unknown option `{}`", flag.to_string_lossy()));
    }
    Ok(rest)
}

/// The state dir: `--state-dir`, else `$BROCA_STATE_DIR`, else `$XDG_DATA_HOME/broca`, else
/// `~/.local/share/broca`; made absolute (serve.json and every message then name it
/// unambiguously).
pub fn resolve_state_dir(flag: Option<PathBuf>) -> Option<PathBuf> {
    let env = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    flag.or_else(|| env("BROCA_STATE_DIR"))
        .or_else(|| env("XDG_DATA_HOME").map(|d| d.join("broca")))
        .or_else(|| env("HOME").map(|h| h.join(".local/share/broca")))
        .map(|d| std::path::absolute(&d).unwrap_or(d))
}

fn wal(mut pargs: pico_args::Arguments, help: bool, state_dir: Option<PathBuf>) -> u8 {
    let sub = pargs.subcommand().ok().flatten();
    match sub.as_deref() {
        None if help => print_help(WAL_HELP),
        None => usage("`broca wal` needs `verify` or `dump`; see `broca wal --help`"),
        Some("verify") if help => print_help(VERIFY_HELP),
        Some("dump") if help => print_help(DUMP_HELP),
        Some("verify") => match rest(pargs) {
            Ok(paths) => wal_verify(paths, state_dir),
            Err(e) => usage(&e),
        },
        Some("dump") => match rest(pargs) {
            Ok(paths) if paths.len() == 1 => wal_dump(PathBuf::from(&paths[0])),
            Ok(_) => usage("`broca wal dump` takes exactly one FILE"),
            Err(e) => usage(&e),
        },
        Some(other) => usage(&format!(
            "unknown command `wal {other}`; see `broca wal --help`"
        )),
    }
}

fn wal_verify(paths: Vec<OsString>, state_dir: Option<PathBuf>) -> u8 {
    let args: Vec<PathBuf> = if paths.is_empty() {
        match resolve_state_dir(state_dir) {
            Some(dir) if dir.exists() => vec![dir],
            Some(dir) => {
                broca_io::outln!("no state dir at {}: no WALs to verify", dir.display());
                return EXIT_OK;
            }
            None => return usage("no PATH and no state dir (set --state-dir or HOME)"),
        }
    } else {
        paths.into_iter().map(PathBuf::from).collect()
    };
    let is_container = |a: &PathBuf| {
        a.extension()
            .is_some_and(|x| x == broca_wal::archive::EXTENSION)
    };
    let mut failed = 0usize;
    let mut listed = Vec::new();
    for arg in args.iter().filter(|a| !is_container(a)) {
        match wal_files(arg) {
            Ok(files) => listed.push(files),
            Err(e) => {
                broca_io::errln!("FAIL {e}");
                failed += 1;
            }
        }
    }
    let files: Vec<PathBuf> = listed.into_iter().flatten().collect();
    failed += verify_wals(&files);
    // The sealed containers of a state dir named (or the default one), and containers named.
    let containers: Vec<PathBuf> = args
        .iter()
        .flat_map(|a| {
            if is_container(a) {
                vec![a.clone()]
            } else {
                broca_wal::archive::container_paths(&a.join(broca_wal::archive::DIR_NAME))
                    .unwrap_or_default()
            }
        })
        .collect();
    failed += archive::verify_containers(&containers);
    broca_io::outln!(
        "{} WAL files and {} containers checked, {failed} failed",
        files.len(),
        containers.len()
    );
    if failed > 0 {
        EXIT_FAILURE
    } else {
        EXIT_OK
    }
}

/// Verifies each WAL of `files` and the media its content store holds, one line each, with
/// a progress bar; how many failed.
fn verify_wals(files: &[PathBuf]) -> usize {
    let mut failed = 0;
    let mut bar = progress::Count::new("WALs verified", files.len() as u64);
    for file in files {
        let shown = file.display();
        let report = verify_file(file);
        bar.clear();
        // The content store of a WAL that reads: each medium it references.
        if !report.is_failure() && !matches!(report, FileReport::Empty { .. }) {
            match verify_media::check(file) {
                Ok(0) => {}
                Ok(n) => broca_io::outln!(
                    "ok    {shown}: {n} media in its content store, each as its records state"
                ),
                Err(e) => {
                    failed += 1;
                    broca_io::errln!("FAIL  {e}");
                }
            }
        }
        match report {
            FileReport::Intact { records, end } => {
                broca_io::outln!("ok    {shown}: {records} records, intact (ends at offset {end})")
            }
            FileReport::Torn {
                records,
                at,
                bytes,
                reason,
            } => broca_io::outln!(
                "torn  {shown}: {records} records, then a torn tail at offset {at} ({bytes} \
                 bytes; {reason}) that recovery cuts when a writer opens the log"
            ),
            FileReport::Empty { reason } => broca_io::outln!(
                "empty {shown}: {reason} (a crash while it was being created; a writer \
                 initializes it)"
            ),
            FileReport::Failed(e) => {
                failed += 1;
                broca_io::errln!("FAIL  {e}");
            }
        }
        bar.tick();
    }
    failed
}

fn wal_dump(path: PathBuf) -> u8 {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let result = dump(&path, &mut out);
    let flushed = out.flush();
    match (result, flushed) {
        (Ok(_), Ok(())) => EXIT_OK,
        (Err(e), _) => {
            broca_io::errln!("broca: {e}");
            EXIT_FAILURE
        }
        (Ok(_), Err(e)) => {
            broca_io::errln!("broca: writing to stdout failed: {e}");
            EXIT_FAILURE
        }
    }
}

fn run_command(mut pargs: pico_args::Arguments, state_dir: Option<PathBuf>) -> u8 {
    match parse_run(&mut pargs, state_dir) {
        Ok((standalone, json)) => run_standalone(standalone, json),
        Err(e) => usage(&e),
    }
}

/// `broca run`'s prompt: its one argument, or stdin's text for `-`.
fn run_prompt(rest: &[OsString]) -> Result<String, String> {
    match rest {
        [p] if p == "-" => {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                .map_err(|e| format!("reading the prompt from stdin: {e}"))?;
            Ok(text)
        }
        [p] => Ok(p.to_str().ok_or("the prompt is not UTF-8")?.to_string()),
        [] => Err("`broca run` needs a PROMPT (or - to read it from stdin)".into()),
        _ => Err("`broca run` takes one PROMPT; quote it".into()),
    }
}

/// `broca run`'s session: its project root (else the current directory) made absolute.
fn run_triple(
    project_root: Option<String>,
    harness: &str,
    session: &str,
) -> Result<SessionTriple, String> {
    let root = match project_root {
        Some(p) => PathBuf::from(p),
        None => std::env::current_dir().map_err(|e| format!("the current directory: {e}"))?,
    };
    let root = std::path::absolute(&root).map_err(|e| format!("--project-root: {e}"))?;
    let root = root.to_str().ok_or("--project-root is not UTF-8")?;
    SessionTriple::new(root, harness, session).map_err(|e| e.to_string())
}

/// The catalog sources of `state_dir`, the local ones installed so `model` is checked
/// against them (the run loads them all, the catalog service too, before it starts), and the
/// endpoints with `--base-url` set for the model's provider.
fn run_catalog(
    state_dir: &std::path::Path,
    model: &str,
    base_url: Option<String>,
) -> Result<(broca_catalog::load::Sources, Endpoints), String> {
    let catalog = broca_catalog::load::Sources::from_env(state_dir);
    broca_catalog::install(broca_catalog::load::load_local(&catalog).0);
    let entry = broca_catalog::resolve(model)?;
    let mut endpoints = Endpoints::from_env()?;
    if let Some(url) = base_url {
        endpoints
            .set(&entry.provider.id, &url)
            .map_err(|e| format!("--base-url: {e}"))?;
    }
    Ok((catalog, endpoints))
}

fn parse_run(
    pargs: &mut pico_args::Arguments,
    state_dir: Option<PathBuf>,
) -> Result<(Standalone, bool), String> {
    let opt = |pargs: &mut pico_args::Arguments, name: &'static str| {
        pargs
            .opt_value_from_str::<_, String>(name)
            .map_err(|e| format!("{name}: {e}"))
    };
    let model = opt(pargs, "--model")?.ok_or("`broca run` needs --model PROVIDER/MODEL")?;
    let base_url = opt(pargs, "--base-url")?;
    let project_root = opt(pargs, "--project-root")?;
    let harness = opt(pargs, "--harness")?.unwrap_or_else(|| "broca-run".into());
    let session = opt(pargs, "--session")?.unwrap_or_else(|| "default".into());
    let send_id = opt(pargs, "--send-id")?;
    let system = opt(pargs, "--system")?;
    let credential_id = opt(pargs, "--credential")?;
    let tools_config = opt(pargs, "--tools-config")?;
    let max_steps = pargs
        .opt_value_from_str::<_, u32>("--max-steps")
        .map_err(|e| format!("--max-steps: {e}"))?;
    let context_limit = pargs
        .opt_value_from_str::<_, u64>("--context-limit")
        .map_err(|e| format!("--context-limit: {e}"))?;
    let compact = pargs.contains("--compact");
    let json = pargs.contains("--json");
    let rest = rest(std::mem::replace(
        pargs,
        pico_args::Arguments::from_vec(Vec::new()),
    ))?;
    let prompt = run_prompt(&rest)?;
    let tools = match tools_config {
        Some(path) => Some(broca_tools::config::ToolsConfig::load(
            std::path::Path::new(&path),
        )?),
        None => None,
    };
    let state_dir = resolve_state_dir(state_dir)
        .ok_or("no state dir: set --state-dir, BROCA_STATE_DIR or HOME")?;
    let (catalog, endpoints) = run_catalog(&state_dir, &model, base_url)?;
    let triple = run_triple(project_root, &harness, &session)?;
    let send = SendRequest {
        prompt,
        model,
        send_id,
        system,
        credential_id,
        max_steps,
        context_limit,
        compaction: compact.then(broca_protocol::compaction::Compaction::summarize),
        ..SendRequest::default()
    };
    Ok((
        Standalone {
            state_dir,
            triple,
            send,
            endpoints,
            tools,
            catalog,
        },
        json,
    ))
}

fn run_standalone(standalone: Standalone, json: bool) -> u8 {
    let ended_in_newline = Rc::new(Cell::new(true));
    let seen = ended_in_newline.clone();
    let display = Box::new(move |text: &str| {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
        if let Some(last) = text.chars().last() {
            seen.set(last == '\n');
        }
    });
    let report = match standalone.run(display) {
        Ok(r) => r,
        Err(e) => {
            broca_io::errln!("broca: {e}");
            // A refusal is an answer too: with --json it is the last stdout line, in the shape
            // of the management surface's error replies.
            if let (true, Failure::Refused(r)) = (json, &e) {
                let body = broca_wire::RpcError::refusal(r).body();
                broca_io::outln!("{}", String::from_utf8_lossy(&body));
            }
            return EXIT_FAILURE;
        }
    };
    if let Some(r) = &report.resumed {
        broca_io::errln!(
            "broca: resumed a run an earlier stop left open: {}",
            r.summary()
        );
    }
    let result = &report.result;
    if report.existing {
        broca_io::errln!(
            "broca: this send_id already started run {}; nothing was run again",
            result.run_id
        );
        if let Some(m) = &result.final_message {
            broca_io::out!("{}", m.text);
            ended_in_newline.set(m.text.ends_with('\n'));
        }
    }
    if !ended_in_newline.get() {
        broca_io::outln!();
    }
    if json {
        broca_io::outln!(
            "{}",
            serde_json::to_string(result).expect("a run result serializes")
        );
    }
    if result.completed() {
        EXIT_OK
    } else {
        broca_io::errln!("broca: {}", result.summary());
        EXIT_FAILURE
    }
}

const MODULE_HELP: &str = "\
Usage: broca module --subc CONNECTION_FILE [options]   (also: ck-broca --subc CONNECTION_FILE)

Runs broca as a module of the subconscious daemon: reads the daemon's owner-only connection
file, connects to it over loopback TCP, authenticates (the daemon proves it holds the file's
key first) and registers (HELLO) as SUBC_MODULE_ID (default ck-broca), with the launch nonce
when the daemon handed one (a pipe named by SUBC_LAUNCH_NONCE_FD, else SUBC_LAUNCH_NONCE). Clients then reach broca over the daemon's
management routes: each route is bound to a session (its identity's harness and session, its
scope's folder as the project root), and its requests {method, params} are the methods of
`broca serve` (docs/module.md). broca does not listen itself in this mode.

A daemon that cannot be reached, or refuses the handshake or the HELLO, exits 1 at once with
one line; broca never falls back to running standalone. `module.draining`, a GOODBYE from the
daemon or SIGTERM stop admission, give active runs the grace period and seal the rest
interrupted; then broca says GOODBYE and exits (0 when the daemon asked; SIGTERM is
re-raised; a connection lost unannounced exits 1).

Options: --subc FILE (required), and those of `broca serve` except --listen and --socket:
--shards N, --grace-secs N, --config FILE, --tools-config FILE.
";

/// `broca module` (and `ck-broca`).
pub fn module_command(mut pargs: pico_args::Arguments, state_dir: Option<PathBuf>) -> u8 {
    let file: Option<PathBuf> = match pargs.opt_value_from_str("--subc") {
        Ok(f) => f,
        Err(e) => return usage(&format!("--subc: {e}")),
    };
    let Some(connection_file) = file else {
        return usage("`broca module` needs --subc CONNECTION_FILE (the daemon's)");
    };
    for flag in ["--listen", "--socket"] {
        if pargs.contains(flag) {
            return usage(&format!("{flag}: broca does not listen in module mode"));
        }
    }
    let opts = match parse_serve(&mut pargs, state_dir) {
        Ok(o) => o,
        Err(e) => return usage(&e),
    };
    let module_id = match std::env::var(broca_subc::protocol::SUBC_MODULE_ID_ENV) {
        Ok(id) if id.is_empty() => return usage("SUBC_MODULE_ID is set but empty"),
        Ok(id) => id,
        Err(_) => "ck-broca".to_string(),
    };
    // The nonce is this process's alone: read once (from the descriptor the daemon names, else
    // the environment), before anything is spawned, and kept from the tool servers it starts.
    let launch_nonce = match broca_subc::connect::launch_nonce() {
        Ok(n) => n,
        Err(e) => {
            broca_io::errln!("broca: {e}");
            return EXIT_FAILURE;
        }
    };
    let opts = broca_daemon::DaemonOptions {
        host: opts.host,
        connection_file,
        module_id,
        launch_nonce,
    };
    daemon_exit(broca_daemon::run(opts))
}

/// The exit of the daemon (serve or module mode) once it ended: 0, the stopping signal
/// re-raised, or 1 with the reason.
fn daemon_exit(ended: Result<i32, broca_host::StartError>) -> u8 {
    match ended {
        Ok(0) => EXIT_OK,
        Ok(sig) => broca_host::reraise(sig),
        Err(e) => {
            broca_io::errln!("broca: {e}");
            EXIT_FAILURE
        }
    }
}

fn serve_command(mut pargs: pico_args::Arguments, state_dir: Option<PathBuf>) -> u8 {
    let opts = match parse_serve(&mut pargs, state_dir) {
        Ok(o) => o,
        Err(e) => return usage(&e),
    };
    daemon_exit(broca_serve::serve(opts))
}

#[cfg(test)]
mod tests {
    #[test]
    fn serve_help_names_every_method_and_route() {
        for m in broca_wire::request::Method::ALL {
            assert!(
                super::SERVE_HELP.contains(m.as_str()),
                "`broca serve --help` leaves out {}",
                m.as_str()
            );
        }
        for route in [
            "POST /v1/rpc",
            "GET /v1/subscribe",
            "GET /healthz",
            "GET /ui",
            "GET /metrics",
        ] {
            assert!(super::SERVE_HELP.contains(route), "{route}");
        }
    }
}
