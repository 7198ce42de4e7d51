//! The store, usage export, catalog and credentials through the real binary: facts from real
//! runs (aimock, and a provider that never reports usage), `broca store check|rebuild` against
//! deleted, truncated, foreign and stale stores, catalog overrides and a catalog service with
//! their last good copies, and credentials from the owner-only file never written anywhere.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};
use support::serve::{rpc, start, wait_for};
use support::{broca, dump_all, fixture, last_json, peers_dir, Aimock, Peer};

fn run(state: &Path, base: &str, model: &str, prompt: &str, env: &[(&str, &str)]) -> Output {
    run_in(state, base, model, "a", prompt, env)
}

/// `broca run` of `prompt` in `session`.
fn run_in(
    state: &Path,
    base: &str,
    model: &str,
    session: &str,
    prompt: &str,
    env: &[(&str, &str)],
) -> Output {
    broca(state)
        .env("ANTHROPIC_API_KEY", "sk-store-test-0123456789")
        .env("OPENAI_API_KEY", "sk-store-test-0123456789")
        .envs(env.iter().copied())
        .args([
            "run",
            "--model",
            model,
            "--base-url",
            base,
            "--session",
            session,
            "--json",
            prompt,
        ])
        .output()
        .expect("broca runs")
}

fn ok(o: &Output) -> Value {
    let r = last_json(o);
    assert!(
        o.status.success(),
        "{r} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    r
}

fn cmd(state: &Path, args: &[&str]) -> Output {
    broca(state).args(args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn facts(state: &Path) -> Vec<Value> {
    let o = cmd(state, &["export", "usage"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    text(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A loopback process that prints its port on its first stdout line; killed on drop.
#[test]
fn absent_usage_stays_absent_from_the_stream_to_the_exported_fact() {
    let peer = Peer::start(Command::new("python3").arg(peers_dir().join("no_usage_provider.py")));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path();
    let r = ok(&run(state, &peer.url(), "openai/gpt-5", "hi", &[]));
    assert_eq!(r["usage"], json!({}), "no measure reported, none invented");
    let f = facts(state);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0]["usage"], json!({}));
    assert_eq!(f[0]["kind"], "step");
    assert_eq!(f[0]["credential_id"], "env:OPENAI_API_KEY");
    // The charge basis is the catalog's prices for the model, frozen at admission.
    assert_eq!(f[0]["charge_basis"]["output"], 10.0);
    let csv = text(&cmd(state, &["export", "usage", "--format", "csv"]).stdout);
    let row: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let cell = |name: &str| row[header.iter().position(|h| *h == name).unwrap()];
    // Every measure of the CSV header: none was reported, so every cell is empty.
    let measures: Vec<&str> = header
        .iter()
        .copied()
        .filter(|h| h.ends_with("_tokens"))
        .collect();
    assert_eq!(
        measures,
        [
            "input_tokens",
            "output_tokens",
            "cache_read_tokens",
            "cache_write_tokens",
            "reasoning_tokens"
        ]
    );
    for measure in measures {
        assert_eq!(cell(measure), "", "{measure} is absent, not 0");
    }
    // And in the JSON lines: no measure key at all.
    for key in ["input", "output", "cache_read", "cache_write", "reasoning"] {
        assert!(
            f[0]["usage"].get(key).is_none(),
            "{key} is absent: {}",
            f[0]
        );
    }
    assert_eq!(cell("output_price"), "10");
}

#[test]
fn facts_are_exported_with_stable_ids_and_the_store_rebuilds_to_the_same_bytes() {
    let peer = Aimock::start(&fixture("store.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path();
    for (session, prompt) in [("a", "counted"), ("b", "counted"), ("a", "no usage")] {
        let o = run_in(
            state,
            &peer.url(),
            "anthropic/claude-sonnet-4-5",
            session,
            prompt,
            &[],
        );
        ok(&o);
    }
    let before = facts(state);
    assert_eq!(before.len(), 3);
    assert!(before
        .iter()
        .any(|f| f["usage"] == json!({"input": 1000, "output": 200})));
    let ids: std::collections::HashSet<&str> = before
        .iter()
        .map(|f| f["fact_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 3, "one id per fact");
    // --since filters on the fact's time.
    assert_eq!(
        text(&cmd(state, &["export", "usage", "--since", "2999-01-01"]).stdout),
        ""
    );
    assert_eq!(
        text(&cmd(state, &["export", "usage", "--since", "1970-01-01"]).stdout)
            .lines()
            .count(),
        3
    );

    let o = cmd(state, &["store", "check"]);
    assert!(o.status.success(), "{}", text(&o.stdout));
    let o = cmd(state, &["store", "rebuild"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("rebuilt 2 sessions: 3 facts"),
        "{}",
        text(&o.stdout)
    );
    assert_eq!(
        facts(state),
        before,
        "a rebuild gives the same facts, the same ids"
    );

    // Bad usage of the commands: exit 2 naming the problem.
    for (args, says) in [
        (vec!["export", "usage", "--format", "xml"], "jsonl or csv"),
        (vec!["export", "usage", "--since", "yesterday"], "--since"),
        (vec!["export", "spend"], "exports `usage`"),
        (vec!["store", "fix"], "unknown command `store fix`"),
    ] {
        let o = cmd(state, &args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(
            text(&o.stderr).contains(says),
            "{args:?}: {}",
            text(&o.stderr)
        );
    }
}

fn two_runs(state: &Path, peer: &Aimock) {
    for session in ["a", "b"] {
        let o = run_in(
            state,
            &peer.url(),
            "anthropic/claude-sonnet-4-5",
            session,
            "counted",
            &[],
        );
        ok(&o);
    }
}

#[test]
fn a_deleted_truncated_or_garbled_store_is_noticed_and_rebuilt_from_the_wals() {
    let peer = Aimock::start(&fixture("store.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path();
    two_runs(state, &peer);
    let want = facts(state);
    let data = state.join("store/data.mdb");
    for damage in ["delete", "truncate", "garble"] {
        match damage {
            "delete" => std::fs::remove_dir_all(state.join("store")).unwrap(),
            "truncate" => {
                let f = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
                f.set_len(std::fs::metadata(&data).unwrap().len() / 3)
                    .unwrap();
            }
            _ => std::fs::write(&data, vec![0x5a; 64 * 1024]).unwrap(),
        }
        // check says the store is not the WALs' (and exits 1) rather than trusting it, and
        // leaves it as it is: only a rebuild (or a writer's catch-up) changes it.
        let listing = || {
            let mut l: Vec<_> = std::fs::read_dir(state)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            l.sort();
            l
        };
        let (files, data_len) = (listing(), std::fs::metadata(&data).map(|m| m.len()).ok());
        let o = cmd(state, &["store", "check"]);
        assert_eq!(o.status.code(), Some(1), "{damage}: {}", text(&o.stdout));
        assert!(
            text(&o.stderr).contains("cannot be compared with the WALs")
                && text(&o.stderr).contains("`broca store rebuild`"),
            "{damage}: {}",
            text(&o.stderr)
        );
        assert_eq!(listing(), files, "{damage}: check moved nothing");
        assert_eq!(
            std::fs::metadata(&data).map(|m| m.len()).ok(),
            data_len,
            "{damage}: check wrote nothing"
        );
        // Export catches up from the WALs: the same facts as before.
        assert_eq!(facts(state), want, "{damage}");
        assert!(cmd(state, &["store", "check"]).status.success(), "{damage}");
    }
}

#[test]
fn a_store_from_another_state_dir_or_one_left_behind_is_never_taken_as_truth() {
    let peer = Aimock::start(&fixture("store.json"));
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    two_runs(a.path(), &peer);
    two_runs(b.path(), &peer);
    // A's store copied into B: B's WALs are not what it holds.
    std::fs::remove_dir_all(b.path().join("store")).unwrap();
    copy_dir(&a.path().join("store"), &b.path().join("store"));
    let o = cmd(b.path(), &["store", "check"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("belongs to another state dir"),
        "{}",
        text(&o.stderr)
    );
    assert!(cmd(b.path(), &["store", "rebuild"]).status.success());
    assert!(cmd(b.path(), &["store", "check"]).status.success());

    // A store that fell behind its WALs (restored from before the last run).
    let state = a.path();
    let old = state.join("store.old");
    copy_dir(&state.join("store"), &old);
    ok(&run(
        state,
        &peer.url(),
        "anthropic/claude-sonnet-4-5",
        "counted",
        &[],
    ));
    std::fs::remove_dir_all(state.join("store")).unwrap();
    std::fs::rename(&old, state.join("store")).unwrap();
    let o = cmd(state, &["store", "check"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stdout).contains("differ from the WAL"),
        "{}",
        text(&o.stdout)
    );
    assert_eq!(facts(state).len(), 3, "export catches the store up first");
    assert!(cmd(state, &["store", "check"]).status.success());
}

#[test]
fn store_check_only_reads_and_works_on_a_read_only_state_dir() {
    let peer = Aimock::start(&fixture("store.json"));
    let dir = tempfile::tempdir().unwrap();
    two_runs(dir.path(), &peer);
    // The state dir copied onto its own file system, made read-only.
    let mount = support::Mount::tmpfs(64 << 20);
    let state = mount.dir.join("state");
    let copied = Command::new("cp")
        .arg("-a")
        .arg(dir.path())
        .arg(&state)
        .status()
        .unwrap();
    assert!(copied.success());
    mount.read_only();
    let o = cmd(&state, &["store", "check"]);
    assert!(
        o.status.success(),
        "{} {}",
        text(&o.stdout),
        text(&o.stderr)
    );
    assert!(text(&o.stdout).contains("the store agrees with the WALs"));
    // A store of another state dir on it: named, and nothing cleared (nothing could be).
    drop(mount);
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    two_runs(a.path(), &peer);
    two_runs(b.path(), &peer);
    std::fs::copy(a.path().join("state.id"), b.path().join("state.id")).unwrap();
    let before = std::fs::read(b.path().join("store/data.mdb")).unwrap();
    let o = cmd(b.path(), &["store", "check"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("belongs to another state dir"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(
        std::fs::read(b.path().join("store/data.mdb")).unwrap(),
        before,
        "check cleared nothing"
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[test]
fn catalog_overrides_and_the_service_keep_their_last_good_copy() {
    let peer = Aimock::start(&fixture("store.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let file = dir.path().join("catalog.json");
    let priced = |price: f64| {
        json!({"models": [{"provider": "anthropic", "model": "house-model", "context_window": 1234,
            "prices": {"currency": "EUR", "unit": "per_million_tokens", "input": price}}]})
    };
    std::fs::write(&file, priced(2.5).to_string()).unwrap();
    let house = |env: &[(&str, &str)]| {
        let o = run(&state, &peer.url(), "anthropic/house-model", "counted", env);
        ok(&o);
        o
    };
    let env = [("BROCA_CATALOG_FILE", file.to_str().unwrap())];
    house(&env);
    let frozen = |n: usize| {
        dump_all(&state)
            .into_iter()
            .filter(|r| r["kind"] == "run_started")
            .nth(n)
            .unwrap()["record"]["config"]["catalog"]
            .clone()
    };
    assert_eq!(frozen(0)["prices"]["input"], 2.5);
    assert_eq!(frozen(0)["context_window"], 1234);

    // The file stops parsing: said clearly, the last good contents kept.
    std::fs::write(&file, "{\"models\": [oops").unwrap();
    let o = house(&env);
    assert!(
        text(&o.stderr).contains("catalog file")
            && text(&o.stderr).contains("keeping its last good contents"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(frozen(1)["prices"]["input"], 2.5);

    // A catalog service: its answer is used and kept; when it is down, the kept copy is.
    let served = dir.path().join("served");
    std::fs::create_dir_all(&served).unwrap();
    std::fs::write(served.join("catalog.json"), priced(7.0).to_string()).unwrap();
    let http = Peer::start(
        Command::new("python3")
            .args(["-u", "-c", "import http.server,functools,sys\nh=functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[1])\ns=http.server.HTTPServer(('127.0.0.1',0),h)\nprint(s.server_address[1])\ns.serve_forever()"])
            .arg(&served),
    );
    let url = format!("{}/catalog.json", http.url());
    let env = [("BROCA_CATALOG_URL", url.as_str())];
    house(&env);
    assert_eq!(frozen(2)["prices"]["input"], 7.0);
    let kept = state.join("catalog/service-last-good.json");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&kept).unwrap().permissions().mode() & 0o777,
        0o600
    );
    drop(http);
    let o = house(&env);
    assert!(
        text(&o.stderr).contains("using its last good answer"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(frozen(3)["prices"]["input"], 7.0);
}

#[test]
fn a_credential_from_the_owner_only_file_pays_and_its_secret_is_written_nowhere() {
    const SECRET: &str = "sk-file-credential-0123456789abcdef";
    let peer = Aimock::start(&fixture("store.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    let creds = state.join("credentials.json");
    std::fs::write(&creds, json!({"work": {"api_key": SECRET}}).to_string()).unwrap();
    std::fs::set_permissions(&creds, std::fs::Permissions::from_mode(0o600)).unwrap();
    let s = start(&state, &peer, &[]);
    let send = |session: &str, credential: &str| {
        let (status, r) = rpc(
            &s,
            "session.send",
            json!({"session": session, "prompt": "counted", "model": "anthropic/m", "credential_id": credential}),
        );
        assert_eq!(status, 200, "{r}");
        let run_id = r["result"]["run_id"].as_str().unwrap().to_string();
        let mut last = Value::Null;
        wait_for("the run to end", || {
            last = rpc(
                &s,
                "run.status",
                json!({"session": session, "run_id": run_id}),
            )
            .1["result"]
                .clone();
            last["state"] != "active"
        });
        last
    };
    assert_eq!(send("a", "file:work")["state"], "completed");
    // A file others can read is refused at admission, naming the file; session b gets no WAL.
    std::fs::set_permissions(&creds, std::fs::Permissions::from_mode(0o644)).unwrap();
    let wals_before = wal_names(&state);
    let (status, r) = rpc(
        &s,
        "session.send",
        json!({"session": "b", "prompt": "counted", "model": "anthropic/m", "credential_id": "file:work"}),
    );
    assert_eq!(status, 400, "{r}");
    assert_eq!(r["error"]["code"], "auth_required", "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("chmod 600"),
        "{r}"
    );
    assert_eq!(wal_names(&state), wals_before);
    std::fs::set_permissions(&creds, std::fs::Permissions::from_mode(0o600)).unwrap();
    // A secret given where an id belongs is refused without being echoed.
    let (status, r) = rpc(
        &s,
        "session.send",
        json!({"session": "c", "prompt": "counted", "model": "anthropic/m", "credential_id": SECRET}),
    );
    assert_eq!(status, 400, "{r}");
    assert!(!r.to_string().contains(SECRET));
    wait_for("the store to catch up", || {
        cmd(&state, &["store", "check"]).status.success()
    });
    drop(s);
    // The id is in the run and its facts; the secret in no file but credentials.json.
    let f = facts(&state);
    assert!(f.iter().any(|f| f["credential_id"] == "file:work"));
    let mut stack = vec![PathBuf::from(&state)];
    while let Some(p) = stack.pop() {
        for e in std::fs::read_dir(&p).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path != creds {
                let bytes = std::fs::read(&path).unwrap_or_default();
                assert!(
                    !bytes.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()),
                    "the secret is in {}",
                    path.display()
                );
            }
        }
    }
}

/// The file names under the state dir's wal/.
fn wal_names(state: &Path) -> Vec<std::ffi::OsString> {
    let mut names: Vec<_> = std::fs::read_dir(state.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    names
}

/// A measure some steps reported and others did not: summed over the steps that reported it,
/// never 0 for the rest, everywhere usage is shown (run.result, run.status, the session's
/// spend on session.head, the store's run rows, the usage export), with the steps that
/// reported nothing counted.
#[test]
fn a_measure_reported_by_some_steps_is_summed_over_them_everywhere_usage_is_shown() {
    let peer =
        Peer::start(Command::new("python3").arg(peers_dir().join("partial_usage_provider.py")));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path();
    let aimock = Aimock::start(&fixture("aimock.json"));
    let s = support::serve::start_env(
        state,
        &aimock,
        &[],
        &[
            ("OPENAI_API_KEY", "sk-usage-test-0123456789"),
            ("BROCA_BASE_URL_OPENAI", &peer.url()),
        ],
    );
    let send = |prompt: &str| {
        let (status, r) = rpc(
            &s,
            "session.send",
            json!({"session": "u", "prompt": prompt, "model": "openai/m"}),
        );
        assert_eq!(status, 200, "{r}");
        let run_id = r["result"]["run_id"].as_str().unwrap().to_string();
        let result = support::serve::result_when_ended(&s, "u", &run_id);
        assert_eq!(result["state"], "completed", "{result}");
        let (_, status) = rpc(&s, "run.status", json!({"session": "u", "run_id": run_id}));
        assert_eq!(
            status["result"]["usage"], result["usage"],
            "run.status and run.result say the same usage"
        );
        (run_id, result)
    };
    let (first, full) = send("usage:full");
    let (_, plain) = send("usage:plain");
    let (_, none) = send("usage:none");
    // Each run as its one step reported it: the role's input is the uncached part.
    let u = &full["usage"];
    assert_eq!(
        (
            u["input_tokens"].as_u64(),
            u["cached_input_tokens"].as_u64()
        ),
        (Some(30), Some(60))
    );
    assert_eq!(
        (
            u["cache_write_tokens"].as_u64(),
            u["reasoning_tokens"].as_u64()
        ),
        (Some(10), Some(5)),
        "OpenAI-compatible chat's cache writes and reasoning both kept: {u}"
    );
    let u = &plain["usage"];
    assert_eq!(
        (u["input_tokens"].as_u64(), u["output_tokens"].as_u64()),
        (Some(50), Some(10))
    );
    for absent in [
        "cached_input_tokens",
        "cache_write_tokens",
        "reasoning_tokens",
    ] {
        assert!(
            u.get(absent).is_none(),
            "{absent} was not reported, so it is absent: {u}"
        );
    }
    assert_eq!(plain["metered_usage"], json!({"input": 50, "output": 10}));
    let u = &none["usage"];
    assert_eq!(
        (u["steps"].as_u64(), u["unreported_steps"].as_u64()),
        (Some(1), Some(1))
    );
    assert!(
        u.get("input_tokens").is_none() && u.get("output_tokens").is_none(),
        "{u}"
    );
    assert!(none.get("metered_usage").is_none(), "{none}");
    assert_eq!(none["metered_unreported_steps"], 1);

    // The session's spend: every step of every run since the first, each measure summed over
    // the steps that reported it (a lower bound where some did not), never 0 for the rest.
    let (_, head) = rpc(&s, "session.head", json!({"session": "u"}));
    let spend = &head["result"]["usage"];
    assert_eq!(spend["since"], first.as_str(), "{spend}");
    assert_eq!(
        (spend["steps"].as_u64(), spend["unreported_steps"].as_u64()),
        (Some(3), Some(1))
    );
    assert_eq!(
        (
            spend["input_tokens"].as_u64(),
            spend["cached_input_tokens"].as_u64(),
            spend["cache_write_tokens"].as_u64(),
            spend["output_tokens"].as_u64(),
            spend["reasoning_tokens"].as_u64()
        ),
        (Some(80), Some(60), Some(10), Some(30), Some(5)),
        "{spend}"
    );
    let by_model = spend["by_model"].as_array().unwrap();
    assert_eq!(by_model.len(), 1);
    assert_eq!(by_model[0]["steps"], 3);

    // The usage export: a fact per step, each with exactly what its step reported.
    let facts = facts(state);
    let usages: Vec<&Value> = facts.iter().map(|f| &f["usage"]).collect();
    assert_eq!(
        usages,
        [
            &json!({"input": 100, "output": 20, "cache_read": 60, "cache_write": 10, "reasoning": 5}),
            &json!({"input": 50, "output": 10}),
            &json!({}),
        ]
    );

    // The store's run rows, once serve has projected them: the same sums, the unreported
    // step counted.
    let triple = broca::wal::SessionTriple::new("/proj", "h", "u").unwrap();
    let addr = triple.address().0;
    drop(s);
    let (store, _) = broca::store::Store::open(state).unwrap();
    store.catch_up_all(&state.join("wal")).unwrap();
    let rows = store.runs(&addr).unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0].usage.reasoning, Some(5));
    assert_eq!(
        rows[1].usage.reasoning, None,
        "never 0 for a measure not reported"
    );
    assert_eq!(rows[1].usage.input, Some(50));
    assert_eq!(rows[2].usage, broca::protocol::Usage::default());
    assert_eq!(rows[2].unreported_steps, 1);
}
