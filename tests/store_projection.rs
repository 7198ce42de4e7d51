//! The store's projection of one session's WAL (run index, admission checkpoints, usage facts,
//! transcript), written and read back, checked against the WAL.

use std::path::{Path, PathBuf};
use std::rc::Rc;

use broca::module::scripted::{CountingTools, Script, ScriptedModel};
use broca::module::session::SessionActor;
use broca::store::{project, Store};
use broca::wal::SessionTriple;
use broca_io::{Committer, LogConfig};

/// Two runs of a scripted session (the second one repeats the first's send_id).
fn session_wal(dir: &Path) -> PathBuf {
    let t = SessionTriple::new("/store", "unit", "s").unwrap();
    broca_shards::run_local(async {
        let mut a = SessionActor::open(
            dir,
            &t,
            Rc::new(ScriptedModel::new(Script::default())),
            Rc::new(CountingTools::default()),
            CountingTools::specs(&["echo"]),
            LogConfig::default(),
            Committer::default(),
        )
        .await
        .unwrap();
        for (prompt, send_id) in [("one", "k1"), ("two", "k2")] {
            let req = broca::core::SendRequest {
                prompt: prompt.into(),
                model: "scripted/unit".into(),
                send_id: Some(send_id.into()),
                max_steps: Some(6),
                ..Default::default()
            };
            a.send(&req).await.unwrap();
            a.run_admitted().await.unwrap();
        }
        a.close().await.unwrap();
    })
    .unwrap();
    broca::wal::writer::wal_path(dir, &t)
}

#[test]
fn a_session_projects_its_runs_checkpoints_facts_and_transcript() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("wal")).unwrap();
    let wal = session_wal(&dir.path().join("wal"));
    let (bytes, scan) = broca::wal::verify::read_and_scan(&wal).unwrap();
    let p = project(&scan, &bytes).unwrap();
    assert_eq!(p.runs.len(), 2);
    for r in &p.runs {
        assert_ne!(r.state, "active");
        assert!(r.ended_unix_ms.unwrap() >= r.started_unix_ms, "{r:?}");
        assert!(r.steps >= 1);
        assert_eq!(r.provider, "scripted");
    }
    let ids: Vec<&str> = p.admission.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(ids, ["k1", "k2"]);
    assert_eq!(p.admission[0].1.run_id, p.runs[0].run_id);
    let steps: u32 = p.runs.iter().map(|r| r.steps).sum();
    assert!(
        p.facts.len() as u32 >= steps,
        "a fact per step (and per failed attempt)"
    );
    assert_eq!(p.mark.messages as usize, p.transcript.len());
    assert_eq!(p.mark.last_seq, scan.frames.last().unwrap().seq);

    // Written and read back, the store agrees with the WAL; a second catch-up is a no-op.
    let (store, notes) = Store::open(dir.path()).unwrap();
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!(store.catch_up(&wal).unwrap().0, true);
    assert_eq!(store.catch_up(&wal).unwrap().0, false);
    assert_eq!(
        store.check(&dir.path().join("wal")).unwrap(),
        Vec::<String>::new()
    );
    let page = store.transcript_page(&p.addr, 1, 2).unwrap();
    assert_eq!(page.len(), 2);
    assert_eq!(page[0], *p.transcript[1]);
}
