//! serve's web view (`/ui`) in a real headless Chromium (Debian's `chromium`, driven by
//! playwright-core from tests/peers/ui_browser.mjs): signed in through `broca ui`'s one-time
//! link, it lists the sessions with their runs' states, shows a transcript's tool calls and
//! results, marks the calls a crash left of unknown outcome, follows a run live, catches up
//! from its cursor after serve restarts, and cannot send. Screenshots are kept under
//! target/test-artifacts/ui.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;
use support::serve::Serve;
use support::{broca, dump_all, ensure_peers, peers_dir, repo_root};

const PROJECT: &str = "/demo";

/// serve with no provider key (the demo model needs none) on `listen`.
fn serve(state: &Path, listen: &str) -> Serve {
    let mut cmd = broca(state);
    cmd.env_remove("ANTHROPIC_API_KEY")
        .args(["serve", "--listen", listen, "--shards", "2"])
        .stderr(Stdio::null());
    support::serve::spawn(&mut cmd, state)
}

/// `broca send` to a session of `/demo` with the demo model, to its end.
fn send(state: &Path, session: &str, prompt: &str) {
    let o = broca(state)
        .args(["send", "--project-root", PROJECT, "--session", session])
        .args(["--model", "demo/tour", prompt])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Stops serve with SIGTERM and waits for it.
fn stop(s: &mut Serve) {
    // SAFETY: a signal to the serve this test started and has not reaped.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
    let _ = s.child.wait();
}

#[test]
fn the_web_view_in_a_real_browser() {
    ensure_peers();
    let chromium = std::env::var("BROCA_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        Path::new(&chromium).exists(),
        "{chromium} is missing: the web view's test needs Debian's chromium (`apt-get install \
         chromium`; .ci/run installs it) or BROCA_CHROMIUM naming one"
    );
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut s = serve(&state, "127.0.0.1:0");
    let listen = s.addr.clone();
    send(&state, "done", "alpha beta gamma");
    support::serve::kill_mid_demo_tool(
        &state,
        &mut s,
        &["--project-root", PROJECT, "--session", "crashed"],
        "what happened here",
    );
    drop(s);
    let mut s = serve(&state, &listen);

    let o = broca(&state).args(["ui", "--json"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let link: Value = serde_json::from_slice(&o.stdout).unwrap();
    let url = link["url"].as_str().unwrap().to_string();
    assert!(
        url.starts_with(&format!("http://{listen}/ui/login?token=")),
        "{url}"
    );
    assert!(!url.contains(s.handle.trim()), "the link is not the handle");

    let shots = repo_root().join("target/test-artifacts/ui");
    let _ = std::fs::remove_dir_all(&shots);
    let mut browser = Command::new("node")
        .arg(peers_dir().join("ui_browser.mjs"))
        .env("BROCA_UI_BASE", format!("http://{listen}"))
        .env("BROCA_UI_LINK", &url)
        .env("BROCA_UI_SHOTS", &shots)
        .env("BROCA_CHROMIUM", &chromium)
        .current_dir(peers_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("node runs");
    let mut to_browser = browser.stdin.take().unwrap();
    let mut said = Vec::new();
    let mut ended = None;
    for line in BufReader::new(browser.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        eprintln!("browser: {line}");
        said.push(line.clone());
        match line.as_str() {
            // The view is open on session `done`: a run sent now streams into it.
            "STEP live" => send(&state, "done", "one two three four"),
            // serve restarts (the view's subscription drops), and a run happens meanwhile.
            "STEP restart" => {
                stop(&mut s);
                drop(s);
                s = serve(&state, &listen);
                send(&state, "done", "five six");
            }
            l if l == "DONE" || l.starts_with("FAIL") => {
                ended = Some(line.clone());
                break;
            }
            _ => continue,
        }
        writeln!(to_browser, "go").unwrap();
    }
    let status = browser.wait().unwrap();
    assert_eq!(ended.as_deref(), Some("DONE"), "{}", said.join("\n"));
    assert!(status.success());
    // Every check ran (a skipped one would not print its OK).
    let oks = said.iter().filter(|l| l.starts_with("OK ")).count();
    assert_eq!(oks, 18, "{}", said.join("\n"));
    for shot in [
        "1-sessions",
        "2-interrupted",
        "3-transcript",
        "4-live",
        "5-reconnected",
    ] {
        let png = std::fs::read(shots.join(format!("{shot}.png"))).unwrap();
        assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "{shot}");
    }
    // The view's refused send wrote nothing: the runs are the test's four.
    let started = dump_all(&state)
        .into_iter()
        .filter(|r| r["kind"] == "run_started")
        .count();
    assert_eq!(started, 4);
    drop(s);
}
