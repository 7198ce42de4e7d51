//! Module mode's services from other modules: `broca module` against the daemon stand-in
//! (tests/support/daemon.rs) reading credentials from the claustrum vault (under its own
//! identity, off the shards' threads) and its model catalog from fusiform (with the last good
//! answer kept through an outage), with aimock as the provider.

#[path = "support/daemon.rs"]
#[allow(dead_code)]
mod daemon;
#[path = "support/module.rs"]
mod module_support;
mod support;

use std::time::{Duration, Instant};

use daemon::{Answer, CatalogModule, Daemon, Services};
use module_support::*;
use serde_json::{json, Value};
use subc_protocol::FrameType;
use support::{broca, fixture, Aimock};

#[test]
fn vault_credentials_resolve_through_claustrum_under_the_modules_identity() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let peer = Aimock::start(&fixture("aimock.json"));
    let mut d = Daemon::start(dir.path());
    let secret = "sk-ant-from-the-vault-0123456789abcdef";
    // The nonce as the daemon hands it: a pipe at descriptor 3, named by SUBC_LAUNCH_NONCE_FD
    // (subc-os's own handoff); the environment copy must lose to it.
    let handoff = subc_os::launch_nonce::LaunchNonceHandoff::new("nonce-v").unwrap();
    let mut cmd = module(
        &state,
        &d,
        &peer,
        &[
            ("SUBC_LAUNCH_NONCE", "not-this-one"),
            ("ANTHROPIC_API_KEY", ""),
            ("BROCA_BASE_URL_BEDROCK", &peer.url()),
            ("AWS_ACCESS_KEY_ID", ""),
        ],
    );
    cmd.env(
        subc_os::launch_nonce::LAUNCH_NONCE_FD_ENV,
        handoff.fd_env_value(),
    );
    handoff.install_last(&mut cmd);
    let mut child = cmd.spawn_quiet();
    d.accept(Answer::Accept).unwrap();
    let handle = "ckh_dev_handle_0123456789";
    let handle_secret = "sk-ant-behind-a-handle-0123456789";
    // An AWS key pair, as a typed secret (a JSON object).
    let aws = json!({"access_key_id": "AKIDFROMTHEVAULT", "secret_access_key": "aws-vault-secret-0123456789",
        "session_token": "aws-vault-session-0123", "region": "us-east-1"});
    let vault = d.serve_vault(vec![
        ("anthropic-team".into(), secret.into()),
        (handle.into(), handle_secret.into()),
        ("aws-team".into(), aws.to_string()),
    ]);
    assert_eq!(d.bind(1, 1, "/vault", "h", "s").0, FrameType::Response);
    let (_, status) = run_with(
        &mut d,
        1,
        json!({"prompt": "hello", "model": "anthropic/m", "credential_id": "vault:anthropic-team"}),
    );
    assert_eq!(
        status["state"], "completed",
        "the run used the vault's key: {status}"
    );
    // One route to the vault, opened with broca's module id and launch nonce.
    let opens = vault.opens.lock().unwrap().clone();
    assert_eq!(opens.len(), 1, "{opens:?}");
    assert_eq!(
        opens[0]["target"],
        json!({"kind": "management_surface", "module_id": "claustrum"})
    );
    assert_eq!(
        opens[0]["consumer_identity"],
        json!({"module_id": "ck-broca", "launch_nonce": "nonce-v"})
    );
    let asked = vault.calls.load(std::sync::atomic::Ordering::SeqCst);
    assert!(asked >= 1, "the vault was asked");
    // A second send reuses the secret kept in memory.
    let (_, status) = run_with(
        &mut d,
        1,
        json!({"prompt": "hello", "model": "anthropic/m", "credential_id": "vault:anthropic-team", "send_id": "second"}),
    );
    assert_eq!(status["state"], "completed");
    // The provider refuses the vault's key (aimock answers `err-401` with a 401): the run
    // pauses auth_required and the vault hears of it, with the record version it gave.
    let (_, status) = run_with(
        &mut d,
        1,
        json!({"prompt": "err-401", "model": "anthropic/m", "credential_id": "vault:anthropic-team", "send_id": "third"}),
    );
    assert_eq!(status["state"], "paused", "{status}");
    // The report goes off the shard's thread: it may land just after the run paused.
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while vault.reports.lock().unwrap().is_empty() && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let reports = vault.reports.lock().unwrap().clone();
    assert_eq!(
        reports,
        [json!({"credential_id": "anthropic-team", "provider_status": 401, "record_version": 3})],
        "the vault is told of the refused key"
    );
    // The vault rotates the key (a new record version): the refused key is not kept, so the
    // next use reads the rotated one, and a refusal of it is reported with its own version.
    vault.version.store(4, std::sync::atomic::Ordering::SeqCst);
    let (_, status) = run_with(
        &mut d,
        1,
        json!({"prompt": "err-401", "model": "anthropic/m", "credential_id": "vault:anthropic-team", "send_id": "rotated"}),
    );
    assert_eq!(status["state"], "paused", "{status}");
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while vault.reports.lock().unwrap().len() < 2 && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        vault.reports.lock().unwrap().get(1).cloned(),
        Some(
            json!({"credential_id": "anthropic-team", "provider_status": 401, "record_version": 4})
        ),
        "the rotated key was read and used"
    );
    // A typed secret: the vault's AWS key pair signs a Bedrock request (an API key would be
    // refused by the family before anything is sent).
    let (_, status) = run_with(
        &mut d,
        1,
        json!({"prompt": "hello", "model": "bedrock/anthropic.claude", "credential_id": "vault:aws-team", "send_id": "aws"}),
    );
    assert_eq!(
        status["state"], "completed",
        "the vault's key pair: {status}"
    );
    // A credential the vault does not hold is refused before anything is written.
    let (ty, e) = d.request(
        1,
        1,
        "session.send",
        json!({"prompt": "x", "model": "anthropic/m", "credential_id": "vault:nope"}),
    );
    assert_eq!(ty, FrameType::Error, "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("not_found")
            || e["message"].as_str().unwrap().contains("nope"),
        "{e}"
    );
    assert_eq!(
        e["detail"]["class"], "auth_required",
        "a verdict on the credential: {e}"
    );
    // A developer's bearer handle, kept in the owner-only credentials file: the vault is asked
    // with the handle (possession authorizes); the run freezes the id, never the handle.
    give_vault_handle(&state, "dev", handle);
    let (_, status) = run_with(
        &mut d,
        1,
        json!({"prompt": "hello", "model": "anthropic/m", "credential_id": "vault:dev", "send_id": "fourth"}),
    );
    assert_eq!(status["state"], "completed");
    assert_eq!(vault.handles.lock().unwrap().clone(), [handle.to_string()]);
    // The vault out (its route relayed away, no new route to it): an outage, not a verdict:
    // the send is refused for now, transiently, and nothing is written.
    vault.down.store(true, std::sync::atomic::Ordering::SeqCst);
    let (ty, e) = d.request(
        1,
        1,
        "session.send",
        json!({"prompt": "x", "model": "anthropic/m", "credential_id": "vault:other"}),
    );
    assert_eq!(ty, FrameType::Error, "{e}");
    assert_eq!(e["code"], "credential_unavailable", "{e}");
    assert_eq!(e["detail"]["class"], "transient", "{e}");
    vault.down.store(false, std::sync::atomic::Ordering::SeqCst);
    drain(&mut d, &mut child);
    // The secret is nowhere broca writes: not in the WAL, the store, or its logs.
    let err = stderr_of(&mut child);
    assert!(
        !err.contains(secret) && !err.contains(handle_secret) && !err.contains(handle),
        "{err}"
    );
    support::assert_no_file_holds(&state, secret);
    support::assert_no_file_holds(&state, handle_secret);
    support::assert_no_file_holds(&state, "aws-vault-secret-0123456789");
    support::assert_no_file_holds(&state.join("wal"), handle);
    support::assert_no_file_holds(&state.join("store"), handle);
}

#[test]
fn the_catalog_comes_from_fusiform_and_its_last_good_answer_outlives_an_outage() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let peer = Aimock::start(&fixture("aimock.json"));
    let catalog = CatalogModule::default();
    *catalog.answer.lock().unwrap() = Some(json!({
        "source": "models.dev", "resolved_at_ms": 1_786_488_349_024i64, "catalog_version": 7,
        "models": {"anthropic/claude-sonnet-4-5": {
            "limit.context": 123456, "limit.output": null,
            "rate.input": {"state": "priced", "units": 2_500_000_000i64, "exponent": 9, "currency": "USD"},
            "rate.output": {"state": "priced", "units": 12, "exponent": 0, "currency": "USD"}
        }}
    }));
    let frozen_entry = |send_id: &str, d: &mut Daemon| {
        let send =
            json!({"prompt": "hello", "model": "anthropic/claude-sonnet-4-5", "send_id": send_id});
        let (ty, sent) = d.request(1, 1, "session.send", send);
        assert_eq!(ty, FrameType::Response, "{sent}");
        let run_id = sent["result"]["run_id"].as_str().unwrap().to_string();
        assert_eq!(wait_ended(d, 1, 1, &run_id)["state"], "completed");
        run_started(&state, &run_id).to_string()
    };
    // The catalog is asked again every second while broca serves.
    let config = dir.path().join("serve.json");
    std::fs::write(&config, r#"{"catalog_refresh_secs": 1}"#).unwrap();
    for round in ["up", "down"] {
        let mut d = Daemon::start(&dir.path().join(round));
        let mut child = module(&state, &d, &peer, &[("BROCA_CATALOG_MODULE", "fusiform")])
            .args(["--config", config.to_str().unwrap()])
            .spawn_quiet();
        d.accept(Answer::Accept).unwrap();
        d.serve(Services {
            vault: None,
            tools: None,
            catalog: Some(catalog.clone()),
            bus: None,
        });
        assert_eq!(d.bind(1, 1, "/cat", "h", "s").0, FrameType::Response);
        let entry = frozen_entry(round, &mut d);
        // fusiform's facts, frozen with the run; its null output limit stays unknown (the
        // built-in catalog's 64000 is not put in its place).
        assert!(
            entry.contains("\"context_window\":123456"),
            "{round}: {entry}"
        );
        assert!(
            entry.contains("\"input\":2.5") && entry.contains("\"output\":12.0"),
            "{round}: {entry}"
        );
        assert!(!entry.contains("\"max_output\""), "{round}: {entry}");
        if round == "up" {
            // Only the facts broca reads are asked for.
            let asked = catalog.arguments.lock().unwrap().clone();
            assert!(
                asked.iter().all(|a| a["fact_prefixes"]
                    .as_array()
                    .is_some_and(|p| p.contains(&json!("rate.")) && p.contains(&json!("limit.")))),
                "{asked:?}"
            );
            // A new catalog_version while serving: the next admission resolves in it.
            let mut next = catalog.answer.lock().unwrap().clone().unwrap();
            next["catalog_version"] = json!(8);
            next["models"]["anthropic/claude-sonnet-4-5"]["limit.context"] = json!(222_222);
            *catalog.answer.lock().unwrap() = Some(next);
            let mut n = 0;
            let mut until_frozen = |context: &str, d: &mut Daemon| {
                let until = Instant::now() + Duration::from_secs(20);
                loop {
                    n += 1;
                    let entry = frozen_entry(&format!("refreshed-{n}"), d);
                    if entry.contains(&format!("\"context_window\":{context}")) {
                        return;
                    }
                    assert!(
                        Instant::now() < until,
                        "the new catalog was never taken: {entry}"
                    );
                    std::thread::sleep(Duration::from_millis(200));
                }
            };
            until_frozen("222222", &mut d);
            // Back as it was, as version 9: the last good copy the next round starts from.
            if let Some(a) = catalog.answer.lock().unwrap().as_mut() {
                a["catalog_version"] = json!(9);
                a["models"]["anthropic/claude-sonnet-4-5"]["limit.context"] = json!(123_456);
            }
            until_frozen("123456", &mut d);
        }
        drain(&mut d, &mut child);
        let err = stderr_of(&mut child);
        if round == "down" {
            assert!(
                err.contains("unavailable") && err.contains("last good"),
                "{err}"
            );
        }
        // Down from here on: the next start uses the last good answer.
        *catalog.answer.lock().unwrap() = None;
    }
    assert!(catalog.asked.load(std::sync::atomic::Ordering::SeqCst) >= 2);
}

#[test]
fn a_vault_read_never_holds_up_the_shard_it_was_asked_on() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let peer = Aimock::start(&fixture("aimock.json"));
    let mut d = Daemon::start(dir.path());
    // One shard: the daemon's connection, both sessions and the vault's caller share it.
    let mut child = broca(&state)
        .env("ANTHROPIC_API_KEY", KEY)
        .env("BROCA_BASE_URL_ANTHROPIC", peer.url())
        .env("SUBC_LAUNCH_NONCE", "nonce-shard")
        .args(["module", "--subc"])
        .arg(&d.file)
        .args(["--shards", "1", "--grace-secs", "2"])
        .spawn_quiet();
    d.accept(Answer::Accept).unwrap();
    let vault = d.serve_vault(vec![(
        "team-key".into(),
        "sk-ant-from-the-vault-0123456789abcdef".into(),
    )]);
    d.bind(1, 1, "/vault-slow", "h", "a");
    d.bind(2, 1, "/vault-slow", "h", "b");
    // The vault takes its time with session a's credential...
    vault.hold.store(true, std::sync::atomic::Ordering::SeqCst);
    let held = d.send(
        FrameType::Request,
        1,
        1,
        &json!({"method": "session.send", "params": {"prompt": "hello", "model": "anthropic/m",
            "credential_id": "vault:team-key", "send_id": "a-1"}}),
    );
    let until = Instant::now() + Duration::from_secs(10);
    while vault.calls.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(Instant::now() < until, "the vault was never asked");
        std::thread::sleep(Duration::from_millis(10));
    }
    // ...while session b's whole run goes through on the same shard.
    let (_, sent) = d.request(
        2,
        1,
        "session.send",
        json!({"prompt": "hello", "model": "anthropic/m", "send_id": "b-1"}),
    );
    let b_run = result_of(&mut d, &sent)["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(wait_ended(&mut d, 2, 1, &b_run)["state"], "completed");
    if let Some(early) = d
        .seen
        .iter()
        .find(|f| f.header.channel == 1 && f.header.corr == held)
    {
        panic!(
            "session a's send was answered before its credential came from the vault: {}",
            String::from_utf8_lossy(&early.body)
        );
    }
    // Once the vault answers, session a's send is admitted and its run completes.
    vault.hold.store(false, std::sync::atomic::Ordering::SeqCst);
    let answer = d.answer(1, held);
    let answer: Value = serde_json::from_slice(&answer.body).unwrap();
    let a_run = result_of(&mut d, &answer)["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(wait_ended(&mut d, 1, 1, &a_run)["state"], "completed");
    drain(&mut d, &mut child);
}

#[test]
fn without_a_launch_nonce_the_vault_is_read_by_bearer_handle_only_in_module_mode_and_serve() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let peer = Aimock::start(&fixture("aimock.json"));
    let mut d = Daemon::start(&dir.path().join("d"));
    let handle = "ckh_dev_handle_nonce_less_0123";
    let mut child = module(&state, &d, &peer, &[("ANTHROPIC_API_KEY", "")]).spawn_quiet();
    d.accept(Answer::Accept).unwrap();
    let vault = d.serve_vault(vec![
        ("anthropic-team".into(), "sk-ant-granted-0123456789".into()),
        (handle.into(), "sk-ant-by-handle-0123456789".into()),
    ]);
    assert_eq!(d.bind(1, 1, "/nonce", "h", "s").0, FrameType::Response);
    // Under the module's grant: refused before any route to the vault opens, as claustrum's
    // own client refuses (the route would open unscoped).
    let (ty, e) = d.request(
        1,
        1,
        "session.send",
        json!({"prompt": "x", "model": "anthropic/m", "credential_id": "vault:anthropic-team"}),
    );
    assert_eq!(ty, FrameType::Error, "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("launch nonce"),
        "{e}"
    );
    assert!(vault.opens.lock().unwrap().is_empty(), "no route opened");
    // A bearer handle needs no grant.
    give_vault_handle(&state, "dev", handle);
    let (_, status) = run_with(
        &mut d,
        1,
        json!({"prompt": "hello", "model": "anthropic/m", "credential_id": "vault:dev", "send_id": "h1"}),
    );
    assert_eq!(status["state"], "completed", "{status}");
    let opens = vault.opens.lock().unwrap().clone();
    assert!(
        opens.iter().all(|o| o.get("consumer_identity").is_none()),
        "{opens:?}"
    );
    drain(&mut d, &mut child);

    // `broca serve` (no daemon module, no nonce) finds the daemon by its connection file and
    // reads the handle through it; a name without a handle is refused naming what to do.
    let serve_state = dir.path().join("serve-state");
    give_vault_handle(&serve_state, "dev", handle);
    let before = vault.handles.lock().unwrap().len();
    let file = d.file.to_str().unwrap().to_string();
    let s = support::serve::start_env(
        &serve_state,
        &peer,
        &[],
        &[("SUBC_CONNECTION_FILE", &file), ("ANTHROPIC_API_KEY", "")],
    );
    let run = support::serve::send_until_completed(
        &s,
        json!({"prompt": "hello", "model": "anthropic/m", "credential_id": "vault:dev"}),
    );
    assert!(!run.is_empty());
    assert_eq!(
        vault.handles.lock().unwrap().len(),
        before + 1,
        "read by its handle"
    );
    let (_, e) = support::serve::rpc(
        &s,
        "session.send",
        json!({"session": "s2", "prompt": "x", "model": "anthropic/m",
               "credential_id": "vault:team"}),
    );
    assert!(e.to_string().contains("vault_handle"), "{e}");
    drop(s);

    // `broca run --credential vault:dev` the same way.
    let before = vault.handles.lock().unwrap().len();
    let o = broca(&serve_state)
        .env("SUBC_CONNECTION_FILE", &file)
        .env("ANTHROPIC_API_KEY", "")
        .env("BROCA_BASE_URL_ANTHROPIC", peer.url())
        .args([
            "run",
            "--model",
            "anthropic/m",
            "--credential",
            "vault:dev",
            "--json",
            "hello",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        vault.handles.lock().unwrap().len(),
        before + 1,
        "read by its handle"
    );
}
