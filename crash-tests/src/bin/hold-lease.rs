//! Holds the writer lease of a session's WAL until stdin closes: the other process of the
//! cross-process lease tests. Usage: `hold-lease DIR SESSION`.

use std::path::PathBuf;

use broca::wal::{SessionTriple, WalWriter};
use broca_io::{Committer, LogConfig};

fn main() {
    let mut args = std::env::args_os().skip(1);
    let (Some(dir), Some(session)) = (args.next(), args.next()) else {
        eprintln!("usage: hold-lease DIR SESSION");
        std::process::exit(2);
    };
    let dir = PathBuf::from(dir);
    let triple = SessionTriple::new("/proj", "crash", session.to_string_lossy()).expect("triple");
    let result = broca_shards::run_local(async move {
        let (w, _) = WalWriter::open(&dir, &triple, LogConfig::default(), Committer::default())
            .await
            .map_err(|e| e.to_string())?;
        println!("holding epoch {}", w.epoch());
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        w.close().await.map_err(|e| e.to_string())
    });
    match result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            eprintln!("hold-lease: {e}");
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("hold-lease: executor: {e}");
            std::process::exit(1);
        }
    }
}
