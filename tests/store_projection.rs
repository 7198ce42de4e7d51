//! The store's projection of one session's WAL (run index, admission checkpoints, usage facts,
//! transcript), written and read back, checked against the WAL.

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::{Arc, Weak};

use broca::protocol::{Block, Message};

use broca::session::SessionActor;
use broca::store::{project, Store};
use broca::wal::SessionTriple;
use broca_io::{Committer, LogConfig};
use broca_testkit::{CountingTools, Script, ScriptedModel};

/// Two runs of a scripted session (the second one repeats the first's send_id).
fn session_wal(dir: &Path) -> PathBuf {
    session_wal_with(dir, &["k1", "k2"], |_| {})
}

/// Runs of a scripted session, one per send_id, calling `after_run` with the WAL's path after
/// each one.
fn session_wal_with(dir: &Path, send_ids: &[&str], after_run: impl FnMut(&Path)) -> PathBuf {
    session_wal_named(dir, "s", send_ids, after_run)
}

/// [`session_wal_with`] for the session named `session`.
fn session_wal_named(
    dir: &Path,
    session: &str,
    send_ids: &[&str],
    mut after_run: impl FnMut(&Path),
) -> PathBuf {
    session_wal_handing(dir, session, send_ids, |wal, _| after_run(wal))
}

/// [`session_wal_named`], handing `after_run` the messages the actor holds too.
fn session_wal_handing(
    dir: &Path,
    session: &str,
    send_ids: &[&str],
    mut after_run: impl FnMut(&Path, Vec<Arc<Message>>),
) -> PathBuf {
    let t = SessionTriple::new("/store", "unit", session).unwrap();
    broca_shards::run_local(async {
        let mut a = SessionActor::opener(
            dir,
            &t,
            Rc::new(ScriptedModel::new(Script::default())),
            Rc::new(CountingTools::default()),
        )
        .tool_specs(CountingTools::specs(&["echo"]))
        .log(LogConfig::default())
        .committer(Committer::default())
        .open()
        .await
        .unwrap();
        for send_id in send_ids {
            let req = broca::core::SendRequest {
                prompt: format!("prompt of {send_id}"),
                model: "scripted/unit".into(),
                send_id: Some(send_id.to_string()),
                max_steps: Some(6),
                ..Default::default()
            };
            a.send(&req).await.unwrap();
            a.run_admitted().await.unwrap();
            let held = a.state().transcript.clone();
            after_run(&broca::wal::writer::wal_path(dir, &t), held);
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

#[test]
fn a_session_projected_after_each_run_agrees_with_its_wal_as_a_whole_projection_does() {
    let dir = tempfile::tempdir().unwrap();
    let wal_dir = dir.path().join("wal");
    std::fs::create_dir_all(&wal_dir).unwrap();
    let (store, _) = Store::open(dir.path()).unwrap();
    let mut marks = Vec::new();
    // Each catch-up finds the session it holds grown by one run: it writes what changed.
    let wal = session_wal_with(&wal_dir, &["k1", "k2", "k3", "k4"], |wal| {
        assert_eq!(store.catch_up(wal).unwrap().0, true);
        assert_eq!(store.check(&wal_dir).unwrap(), Vec::<String>::new());
        let (bytes, scan) = broca::wal::verify::read_and_scan(wal).unwrap();
        marks.push(store.mark(&scan.header.address.0).unwrap().unwrap());
        let p = project(&scan, &bytes).unwrap();
        let last = p.transcript.len() as u64 - 1;
        // The last message (where a run's tool results gather) is the projection's, too.
        assert_eq!(
            store.transcript_page(&p.addr, last, 1).unwrap(),
            [(*p.transcript[last as usize]).clone()]
        );
    });
    assert_eq!(marks.len(), 4);
    assert!(
        marks
            .windows(2)
            .all(|w| w[0].last_seq < w[1].last_seq && w[0].messages < w[1].messages),
        "{marks:?}"
    );
    // What the store holds is what a store built from the WAL at once holds.
    let fresh_dir = tempfile::tempdir().unwrap();
    let (fresh, _) = Store::open(fresh_dir.path()).unwrap();
    assert_eq!(fresh.catch_up(&wal).unwrap().0, true);
    let (bytes, scan) = broca::wal::verify::read_and_scan(&wal).unwrap();
    let addr = scan.header.address.0;
    let whole = project(&scan, &bytes).unwrap();
    assert_eq!(store.facts(None).unwrap(), fresh.facts(None).unwrap());
    assert_eq!(store.facts(None).unwrap().len(), whole.facts.len());
    assert_eq!(
        store.transcript_page(&addr, 0, 1000).unwrap(),
        fresh.transcript_page(&addr, 0, 1000).unwrap()
    );
}

/// The store's thread in serve projects a session after each run from where the last
/// projection ended: what it writes is what a projection of the whole WAL writes.
#[test]
fn a_followed_session_reads_only_its_new_records_and_agrees_with_a_whole_projection() {
    let dir = tempfile::tempdir().unwrap();
    let wal_dir = dir.path().join("wal");
    std::fs::create_dir_all(&wal_dir).unwrap();
    let (store, _) = Store::open(dir.path()).unwrap();
    let mut follower = broca::store::Follower::new(16);
    let mut marks = Vec::new();
    let wal = session_wal_with(&wal_dir, &["k1", "k2", "k3", "k4", "k5"], |wal| {
        let failed = follower
            .catch_up_batch(&store, &[wal.to_path_buf()])
            .unwrap();
        assert!(failed.is_empty(), "{failed:?}");
        assert_eq!(store.check(&wal_dir).unwrap(), Vec::<String>::new());
        // Nothing new: nothing written, and the WAL is not read whole again.
        assert!(follower
            .catch_up_batch(&store, &[wal.to_path_buf()])
            .unwrap()
            .is_empty());
        let (_, scan) = broca::wal::verify::read_and_scan(wal).unwrap();
        marks.push(store.mark(&scan.header.address.0).unwrap().unwrap());
    });
    assert_eq!(
        follower.reads(),
        broca::store::Reads {
            whole: 1,
            since: 9,
            shared: 0
        },
        "the first projection reads the WAL whole, each after it from its last record"
    );
    assert!(
        marks.windows(2).all(|w| w[0].last_seq < w[1].last_seq),
        "{marks:?}"
    );
    let fresh_dir = tempfile::tempdir().unwrap();
    let (fresh, _) = Store::open(fresh_dir.path()).unwrap();
    assert!(fresh.catch_up(&wal).unwrap().0);
    let (_, scan) = broca::wal::verify::read_and_scan(&wal).unwrap();
    let addr = scan.header.address.0;
    assert_eq!(store.mark(&addr).unwrap(), fresh.mark(&addr).unwrap());
    assert_eq!(store.facts(None).unwrap(), fresh.facts(None).unwrap());
    assert_eq!(store.check(&wal_dir).unwrap(), Vec::<String>::new());
    assert_eq!(
        store.transcript_page(&addr, 0, 1000).unwrap(),
        fresh.transcript_page(&addr, 0, 1000).unwrap()
    );
}

/// Serve's shards hand each session's messages to the store's thread with the session: the
/// follower keeps the actor's copy of each message it replayed equal to it, so a
/// conversation is held once. A handed message that differs from the WAL's is not taken, and
/// the store holds the WAL's.
#[test]
fn a_followed_session_shares_its_actors_messages_and_takes_none_that_differ() {
    let dir = tempfile::tempdir().unwrap();
    let wal_dir = dir.path().join("wal");
    std::fs::create_dir_all(&wal_dir).unwrap();
    let (store, _) = Store::open(dir.path()).unwrap();
    let mut follower = broca::store::Follower::new(16);
    let mut last: Vec<Weak<Message>> = Vec::new();
    let mut altered: Option<Weak<Message>> = None;
    let wal = session_wal_handing(&wal_dir, "s", &["k1", "k2", "k3"], |wal, mut held| {
        assert!(held.len() > 2, "a run adds messages");
        // The hand-off's first message is not the one in the WAL.
        let mut changed = (*held[0]).clone();
        changed.content = vec![Block::Text {
            text: "not what the WAL says".into(),
        }];
        held[0] = Arc::new(changed);
        altered = Some(Arc::downgrade(&held[0]));
        let moved = broca::store::Moved {
            path: wal.to_path_buf(),
            messages: held.clone(),
        };
        let failed = follower.catch_up_moved(&store, &[moved]).unwrap();
        assert!(failed.is_empty(), "{failed:?}");
        last = held.iter().map(Arc::downgrade).collect();
    });
    // The actor has closed and the hand-offs are gone: what still lives is what the follower
    // holds.
    let (held, gone) = last
        .iter()
        .partition::<Vec<_>, _>(|w| w.upgrade().is_some());
    assert_eq!(gone.len(), 1, "the altered message is not kept");
    assert!(altered.unwrap().upgrade().is_none());
    assert_eq!(held.len(), last.len() - 1, "every equal message is shared");
    let reads = follower.reads();
    assert!(reads.shared as usize >= held.len(), "{reads:?}");
    assert_eq!((reads.whole, reads.since), (1, 2));
    // What the store holds is the WAL's, the first message included.
    let fresh_dir = tempfile::tempdir().unwrap();
    let (fresh, _) = Store::open(fresh_dir.path()).unwrap();
    assert!(fresh.catch_up(&wal).unwrap().0);
    let (_, scan) = broca::wal::verify::read_and_scan(&wal).unwrap();
    let addr = scan.header.address.0;
    let page = store.transcript_page(&addr, 0, 1000).unwrap();
    assert_eq!(page, fresh.transcript_page(&addr, 0, 1000).unwrap());
    assert_eq!(store.check(&wal_dir).unwrap(), Vec::<String>::new());
}

/// A followed WAL replaced by another lineage (the session removed and run again), or a
/// session dropped from a follower full of others, is projected whole: never from a seek
/// point that is not this WAL's.
#[test]
fn a_replaced_or_dropped_session_is_projected_whole_again() {
    let dir = tempfile::tempdir().unwrap();
    let wal_dir = dir.path().join("wal");
    std::fs::create_dir_all(&wal_dir).unwrap();
    let (store, _) = Store::open(dir.path()).unwrap();
    let mut follower = broca::store::Follower::new(1);
    let wal = session_wal_with(&wal_dir, &["k1", "k2", "k3"], |wal| {
        follower
            .catch_up_batch(&store, &[wal.to_path_buf()])
            .unwrap();
    });
    assert_eq!(
        follower.reads(),
        broca::store::Reads {
            whole: 1,
            since: 2,
            shared: 0
        }
    );
    let (_, before) = broca::wal::verify::read_and_scan(&wal).unwrap();
    std::fs::remove_file(&wal).unwrap();
    let wal = session_wal_with(&wal_dir, &["k9"], |_| {});
    let (_, after) = broca::wal::verify::read_and_scan(&wal).unwrap();
    assert_ne!(before.header.lineage_hex(), after.header.lineage_hex());
    assert!(follower
        .catch_up_batch(&store, &[wal.clone()])
        .unwrap()
        .is_empty());
    assert_eq!(
        follower.reads(),
        broca::store::Reads {
            whole: 2,
            since: 2,
            shared: 0
        }
    );
    assert_eq!(store.check(&wal_dir).unwrap(), Vec::<String>::new());
    let (bytes, scan) = broca::wal::verify::read_and_scan(&wal).unwrap();
    assert_eq!(
        store.mark(&scan.header.address.0).unwrap(),
        Some(project(&scan, &bytes).unwrap().mark)
    );

    // Another session pushes this one out of a follower that keeps one: it is read whole
    // (and found current).
    let other = session_wal_named(&wal_dir, "other", &["o1"], |_| {});
    assert!(follower
        .catch_up_batch(&store, &[other])
        .unwrap()
        .is_empty());
    assert_eq!(follower.followed(), 1);
    assert!(follower.catch_up_batch(&store, &[wal]).unwrap().is_empty());
    assert_eq!(
        follower.reads(),
        broca::store::Reads {
            whole: 4,
            since: 2,
            shared: 0
        }
    );
    assert_eq!(store.check(&wal_dir).unwrap(), Vec::<String>::new());
}
