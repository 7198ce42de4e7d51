//! One writer per WAL across processes: a second process is refused while the first holds the
//! lease, and a kill -9 of the holder frees it (the next writer takes the next epoch).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use broca::wal::{SessionTriple, WalError, WalWriter};
use broca_io::{Committer, LogConfig};
use broca_shards::run_local;

#[test]
fn a_second_writer_in_another_process_is_refused_until_the_holder_dies() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_hold-lease"))
        .arg(dir.path())
        .arg("cross-process")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "holding epoch 1");

    let t = SessionTriple::new("/proj", "crash", "cross-process").unwrap();
    let open = || {
        run_local(async {
            match WalWriter::open(dir.path(), &t, LogConfig::default(), Committer::default()).await
            {
                Ok((w, _)) => {
                    let epoch = w.epoch();
                    w.close().await.unwrap();
                    Ok(epoch)
                }
                Err(e) => Err(e),
            }
        })
        .unwrap()
    };
    assert!(matches!(open(), Err(WalError::LeaseHeld { .. })));

    child.kill().unwrap(); // SIGKILL: no cleanup runs in the holder
    child.wait().unwrap();
    assert_eq!(open().unwrap(), 2);
}
