//! `broca wal verify|dump` and `--help`, run as a user would: the real binary on real files.

use std::path::Path;
use std::process::{Command, Output};

use broca::wal::writer::wal_path;
use broca::wal::{Record, SessionTriple, WalWriter};
use broca_io::{Committer, LogConfig};
use broca_shards::run_local;

fn broca(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_broca"))
        .args(args)
        .env_remove("BROCA_STATE_DIR")
        .output()
        .expect("run broca")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn write_wal(dir: &Path, session: &str, notes: usize) -> std::path::PathBuf {
    let t = SessionTriple::new("/proj", "cli", session).unwrap();
    run_local(async {
        let (mut w, _) = WalWriter::open(dir, &t, LogConfig::default(), Committer::default())
            .await
            .unwrap();
        for i in 0..notes {
            let payload = format!("{{\"i\":{i}}}").into_bytes();
            w.append(&Record::Unknown { kind: 900, payload })
                .await
                .unwrap();
        }
        w.close().await.unwrap();
    })
    .unwrap();
    wal_path(dir, &t)
}

#[test]
fn verify_passes_intact_and_torn_logs_and_fails_corrupt_ones_naming_file_and_offset() {
    let state = tempfile::tempdir().unwrap();
    let wal_dir = state.path().join("wal");
    std::fs::create_dir(&wal_dir).unwrap();
    let good = write_wal(&wal_dir, "good", 5);
    let torn = write_wal(&wal_dir, "torn", 5);
    let mut bytes = std::fs::read(&torn).unwrap();
    let end = broca::wal::scan(&bytes).unwrap().end as usize;
    bytes[end..end + 20].copy_from_slice(&[0xAB; 20]);
    std::fs::write(&torn, &bytes).unwrap();

    let out = broca(&[
        "--state-dir",
        state.path().to_str().unwrap(),
        "wal",
        "verify",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(&format!("ok    {}", good.display())),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("torn  {}", torn.display())),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("torn tail at offset {end}")),
        "{stdout}"
    );

    let corrupt = write_wal(&wal_dir, "corrupt", 5);
    let mut bytes = std::fs::read(&corrupt).unwrap();
    // The lease record: the batch after it proves it was durable (a flip inside the last
    // batch could be a torn write, and would be cut).
    let frame = broca::wal::scan(&bytes).unwrap().frames[0].clone();
    bytes[frame.offset as usize + 41] ^= 1;
    std::fs::write(&corrupt, &bytes).unwrap();
    let out = broca(&["wal", "verify", state.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains(&corrupt.display().to_string()), "{stderr}");
    assert!(
        stderr.contains(&format!("corrupt at offset {}", frame.offset)),
        "{stderr}"
    );
}

#[test]
fn verify_names_empty_files_and_fails_files_that_are_not_wals() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.wal");
    std::fs::write(&empty, b"").unwrap();
    let out = broca(&["wal", "verify", empty.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains(&format!("empty {}", empty.display())));

    let other = dir.path().join("notes.txt");
    std::fs::write(&other, b"hello, world\n").unwrap();
    let out = broca(&["wal", "verify", other.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("notes.txt") && stderr.contains("not a broca WAL"),
        "{stderr}"
    );

    let out = broca(&[
        "wal",
        "verify",
        dir.path().join("missing.wal").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("missing.wal"));
}

#[test]
fn verify_fails_a_misplaced_wal_whose_header_names_another_session() {
    let dir = tempfile::tempdir().unwrap();
    let wal = write_wal(dir.path(), "one", 1);
    let elsewhere = dir.path().join("00000000000000000000000000000000.wal");
    std::fs::rename(&wal, &elsewhere).unwrap();
    let out = broca(&["wal", "verify", elsewhere.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("misdirected"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_wal_the_user_cannot_read_is_a_clear_error() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let wal = write_wal(dir.path(), "private", 1);
    // As root the permission bits do not apply: check as an unprivileged user when root.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_broca"));
    cmd.args(["wal", "verify", wal.to_str().unwrap()]);
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } == 0 {
        cmd.uid(65534).gid(65534);
    }
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("private") || stderr.contains(&wal.display().to_string()),
        "{stderr}"
    );
    assert!(
        stderr.to_lowercase().contains("permission denied"),
        "{stderr}"
    );
}

#[test]
fn dump_prints_each_record_with_offsets_that_chain() {
    let dir = tempfile::tempdir().unwrap();
    let wal = write_wal(dir.path(), "dump", 3);
    let out = broca(&["wal", "dump", wal.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let lines: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4);
    assert_eq!(lines[0]["kind"], "lease_acquired");
    assert_eq!(lines[0]["record"]["epoch"], 1);
    assert_eq!(lines[0]["offset"], 4096);
    assert_eq!(lines[2]["kind"], "unknown(900)");
    assert_eq!(lines[2]["record"]["i"], 1);
    for pair in lines.windows(2) {
        let next = pair[0]["offset"].as_u64().unwrap() + pair[0]["len"].as_u64().unwrap();
        assert_eq!(pair[1]["offset"].as_u64().unwrap(), next);
        assert_eq!(
            pair[1]["seq"].as_u64().unwrap(),
            pair[0]["seq"].as_u64().unwrap() + 1
        );
    }
}

#[test]
fn every_command_has_help_and_bad_usage_exits_2() {
    for args in [
        &["--help"][..],
        &["wal", "--help"],
        &["wal", "verify", "--help"],
        &["wal", "dump", "--help"],
    ] {
        let out = broca(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(text(&out.stdout).contains("Usage: broca"), "{args:?}");
    }
    for args in [
        &[][..],
        &["frobnicate"],
        &["wal"],
        &["wal", "dump"],
        &["wal", "verify", "--bogus"],
    ] {
        let out = broca(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert_eq!(
            text(&out.stderr).lines().count(),
            1,
            "{args:?}: one line on stderr"
        );
    }
}

/// A WAL verified with a FIFO beside it: the listing's warning is a log line to look at.
fn log_lines(env: &[(&str, &str)], args: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join(format!("{}.wal", "f".repeat(32)));
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_broca"));
    cmd.env_remove("BROCA_STATE_DIR")
        .env_remove("BROCA_LOG")
        .env_remove("RUST_LOG");
    cmd.envs(env.iter().copied())
        .args(args)
        .args(["wal", "verify"])
        .arg(dir.path())
        .output()
        .unwrap()
}

#[test]
fn logs_take_a_level_and_a_format_and_refuse_a_filter_that_does_not_parse() {
    // Default: warnings, as text.
    let o = log_lines(&[], &[]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let e = text(&o.stderr);
    assert!(e.contains("WARN") && e.contains("a FIFO"), "{e}");
    // As JSON lines: each one an object with its level and fields.
    let o = log_lines(&[], &["--log-format", "json"]);
    let line = text(&o.stderr)
        .lines()
        .find(|l| l.contains("a FIFO"))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("{}", text(&o.stderr)));
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["level"], "WARN", "{v}");
    assert!(v["path"].as_str().unwrap().ends_with(".wal"), "{v}");
    // A level that leaves warnings out, from the flag, from BROCA_LOG, from RUST_LOG.
    for (env, args) in [
        (&[][..], &["--log-level", "error"][..]),
        (&[("BROCA_LOG", "error")][..], &[][..]),
        (&[("RUST_LOG", "error")][..], &[][..]),
        (&[("BROCA_LOG", "error"), ("RUST_LOG", "warn")][..], &[][..]),
    ] {
        let o = log_lines(env, args);
        assert!(o.status.success());
        assert!(!text(&o.stderr).contains("a FIFO"), "{env:?} {args:?}");
    }
    // A filter that does not parse, or a format broca does not write: exit 2, named.
    for (env, args, named) in [
        (&[][..], &["--log-level", "broca=loud"][..], "--log-level"),
        (&[("BROCA_LOG", "broca=loud")][..], &[][..], "BROCA_LOG"),
        (&[("RUST_LOG", "[{")][..], &[][..], "RUST_LOG"),
        (&[][..], &["--log-format", "xml"][..], "--log-format"),
    ] {
        let o = log_lines(env, args);
        assert_eq!(o.status.code(), Some(2), "{env:?} {args:?}");
        assert!(text(&o.stderr).contains(named), "{}", text(&o.stderr));
    }
}

/// Runs `broca args...` on a pseudo-terminal (stdout and stderr both): everything it wrote.
fn on_a_terminal(state: &Path, args: &[&str]) -> String {
    const PTY: &str = r#"
import os, pty, sys
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
out = b""
while True:
    try:
        chunk = os.read(fd, 65536)
    except OSError:
        break
    if not chunk:
        break
    out += chunk
os.waitpid(pid, 0)
sys.stdout.buffer.write(out)
"#;
    let mut cmd = std::process::Command::new("python3");
    cmd.args(["-c", PTY])
        .arg(env!("CARGO_BIN_EXE_broca"))
        .arg("--state-dir")
        .arg(state)
        .args(args);
    String::from_utf8_lossy(&cmd.output().expect("python3 runs").stdout).into_owned()
}

#[test]
fn long_commands_draw_a_bar_on_a_terminal_and_stay_quiet_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    // Two sessions, from logs (no provider needed).
    let logs = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/import");
    let state_arg = state.display().to_string();
    for (format, log) in [
        ("claude-code", "claude_tool.jsonl"),
        ("codex", "codex_tool.jsonl"),
    ] {
        let log = logs.join(log).display().to_string();
        let o = broca(&["--state-dir", &state_arg, "import", format, &log]);
        assert!(o.status.success(), "{}", text(&o.stderr));
    }
    for (args, what) in [
        (&["wal", "verify"][..], "2/2 WALs verified"),
        (&["store", "rebuild"][..], "2/2 WALs projected"),
    ] {
        let shown = on_a_terminal(&state, args);
        assert!(shown.contains(what), "{args:?}: {shown:?}");
        // Cleared before the command's own lines and at the end.
        assert!(shown.contains("\r\u{1b}[2K"), "{args:?}: {shown:?}");
        let piped = broca(&[&["--state-dir", state_arg.as_str()][..], args].concat());
        assert!(piped.status.success(), "{args:?}");
        let err = text(&piped.stderr);
        assert!(
            !err.contains("WALs"),
            "{args:?}: quiet when not a terminal: {err:?}"
        );
    }
}
