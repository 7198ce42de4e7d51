//! Projecting a session from where its last projection ended. Serve's store thread projects
//! a session again each time one of its runs ends; reading, decoding and replaying the whole
//! WAL for that grows with the session's age. A [`Follower`] keeps the replayed state of the
//! sessions it projected lately and reads only the records appended since, from the offset
//! where it stopped (a seek point the reader checks: a frame of that seq and lineage at that
//! offset, or the session is projected whole again).
//!
//! The state followed is the store's own (a replay of the WAL like any other), never the
//! actor's: what the store holds is a function of the WAL alone. Its messages are shared with
//! the actor's all the same: a session handed over with the actor's messages ([`Moved`])
//! keeps, of each message the replay made, the actor's copy when the two are equal, so a
//! session's conversation is held once in memory, not once by its actor and again here.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use broca_protocol::Message;

use broca_core::usage::{FactDeriver, SpendFact};
use broca_core::Session;
use broca_wal::reader::PagedReader;
use broca_wal::Record;

use super::{Checkpoint, Mark, Projection, RunRow, Store, StoreError};

/// Payload bytes decoded at once while following a WAL.
const PAGE_BYTES: usize = 256 * 1024;

/// A session's replayed state, as far as its WAL has been projected.
pub(crate) struct Followed {
    addr: [u8; 16],
    triple: broca_wal::SessionTriple,
    created_unix_ms: u64,
    lineage_id: String,
    session_hex: String,
    /// The seq of the next record.
    next_seq: u64,
    /// The last record applied (or skipped): its seq and offset.
    last: Option<(u64, u64)>,
    session: Session,
    deriver: FactDeriver,
    /// Each run's start, and its last terminal record's time.
    started: HashMap<String, u64>,
    ended: HashMap<String, u64>,
    /// When this session was last projected (the follower's clock), for eviction.
    used: u64,
}

impl Followed {
    pub(crate) fn new(header: &broca_wal::WalHeader) -> Followed {
        let session_hex = header.address.to_string();
        Followed {
            addr: header.address.0,
            triple: header.triple.clone(),
            created_unix_ms: header.created_unix_ms,
            lineage_id: header.lineage_hex(),
            deriver: FactDeriver::new(&session_hex),
            session_hex,
            next_seq: 1,
            last: None,
            session: Session::default(),
            started: HashMap::new(),
            ended: HashMap::new(),
            used: 0,
        }
    }

    /// Applies the record `seq`: its fact, if it yields one.
    pub(crate) fn apply(
        &mut self,
        seq: u64,
        record: Record,
    ) -> Result<Option<SpendFact>, StoreError> {
        assert!(seq >= self.next_seq, "records are followed in seq order");
        let fact = self.deriver.push(seq, &record);
        match &record {
            Record::RunStarted(s) => {
                self.started.insert(s.run_id.clone(), s.at_unix_ms);
            }
            // The last terminal record of each run (a resumed run's pause is followed by its
            // end).
            Record::RunFinished(f) => {
                if let Some(t) = f.at_unix_ms {
                    self.ended.insert(f.run_id.clone(), t);
                }
            }
            Record::RunPaused(p) => {
                if let Some(t) = p.at_unix_ms {
                    self.ended.insert(p.run_id.clone(), t);
                }
            }
            _ => {}
        }
        self.session
            .apply(seq, record)
            .map_err(|reason| StoreError::Project {
                path: None,
                reason: format!("record {seq}: {reason}"),
            })?;
        self.next_seq = seq + 1;
        Ok(fact)
    }

    /// Takes `theirs`' copy of each message from `from` on that is equal to the one replayed
    /// here (then the two share it); answers how many it took.
    fn share(&mut self, from: usize, theirs: &[Arc<Message>]) -> u64 {
        let mut taken = 0;
        let ours = self.session.transcript.iter_mut().zip(theirs).skip(from);
        for (mine, theirs) in ours {
            if !Arc::ptr_eq(mine, theirs) && **mine == **theirs {
                *mine = theirs.clone();
                taken += 1;
            }
        }
        taken
    }

    /// Passes over the record `seq` at `offset`, of a kind this build does not know.
    fn skip(&mut self, seq: u64, offset: u64) {
        assert!(seq >= self.next_seq, "records are followed in seq order");
        self.next_seq = seq + 1;
        self.last = Some((seq, offset));
    }

    /// The session's projections as far as it has been followed, with `facts` (those of the
    /// records since the store's mark at least).
    pub(crate) fn projection(&self, facts: Vec<SpendFact>) -> Projection {
        let session = &self.session;
        let runs = session
            .runs
            .iter()
            .map(|v| RunRow {
                run_id: v.run_id.clone(),
                session: self.session_hex.clone(),
                send_id: v.send_id.clone(),
                state: v.state.as_str().to_string(),
                detail: v.detail.clone(),
                provider: v.config.provider.clone(),
                model: v.config.model.clone(),
                credential_id: v.config.credential_id.clone(),
                steps: v.steps,
                usage: v.spend.usage(),
                unreported_steps: u64::from(v.spend.unreported_steps()),
                started_unix_ms: self.started_at(v),
                ended_unix_ms: self.ended_at(v),
                started_seq: v.started_seq,
            })
            .collect();
        let mut admission: Vec<(String, Checkpoint)> = session
            .runs
            .iter()
            .filter_map(|v| {
                v.send_id.clone().map(|s| {
                    (
                        s,
                        Checkpoint {
                            run_id: v.run_id.clone(),
                            inputs_digest: v.inputs_digest.clone(),
                        },
                    )
                })
            })
            .collect();
        admission.sort_by(|a, b| a.0.cmp(&b.0));
        Projection {
            addr: self.addr,
            mark: self.mark(),
            runs,
            admission,
            facts,
            transcript: session.transcript.clone(),
        }
    }

    fn mark(&self) -> Mark {
        Mark {
            lineage_id: self.lineage_id.clone(),
            last_seq: self.next_seq - 1,
            messages: self.session.transcript.len() as u64,
            queued: self.session.queued.len() as u64,
            project_root: self.triple.project_root.clone(),
            harness: self.triple.harness.clone(),
            session: self.triple.session.clone(),
            created_unix_ms: self.created_unix_ms,
            runs: self.session.runs.len() as u64,
            last_run: self.session.runs.last().map(|v| crate::LastRun {
                run_id: v.run_id.clone(),
                state: v.state.as_str().to_string(),
                model: v.config.model.clone(),
                started_unix_ms: self.started_at(v),
                ended_unix_ms: self.ended_at(v),
            }),
        }
    }

    /// When the run started (0 when its log did not say).
    fn started_at(&self, v: &broca_core::RunView) -> u64 {
        self.started.get(&v.run_id).copied().unwrap_or(0)
    }

    /// When the run ended or paused; `None` while it runs.
    fn ended_at(&self, v: &broca_core::RunView) -> Option<u64> {
        match v.state {
            broca_core::replay::RunState::Active => None,
            _ => self.ended.get(&v.run_id).copied(),
        }
    }
}

/// Computes a session's projections from its scanned WAL, and the state they came from.
pub(crate) fn follow_scan(
    scan: &broca_wal::Scan,
    bytes: &[u8],
) -> Result<(Projection, Followed), StoreError> {
    let decoded = scan
        .decode(bytes)
        .map_err(|(offset, why)| StoreError::Project {
            path: None,
            reason: format!("at offset {offset}: {why}"),
        })?;
    let mut f = Followed::new(&scan.header);
    f.session.transcript.reserve(decoded.records.len() / 2);
    let mut facts = Vec::new();
    for (seq, record) in decoded.records {
        facts.extend(f.apply(seq, record)?);
    }
    assert!(
        scan.next_seq() >= f.next_seq,
        "the scan ends after every record applied"
    );
    f.next_seq = scan.next_seq();
    f.last = scan.frames.last().map(|fr| (fr.seq, fr.offset));
    Ok((f.projection(facts), f))
}

/// What following a WAL from its seek point found.
enum Since {
    /// Nothing appended since the last projection.
    Current,
    Grew(Projection),
    /// The seek point, the lineage or the store's mark no longer agree: project it whole.
    Whole,
}

/// A session that moved on, as a shard hands it to the store's thread: its WAL, and the
/// messages its actor holds (empty when it has none to share).
#[derive(Debug, Clone)]
pub struct Moved {
    pub path: PathBuf,
    pub messages: Vec<Arc<Message>>,
}

impl Moved {
    pub fn path(path: PathBuf) -> Moved {
        Moved {
            path,
            messages: Vec::new(),
        }
    }
}

/// Projects sessions from where their last projections ended (serve's store thread owns
/// one); it keeps up to `followed_max` sessions' state, the least lately projected going
/// first.
pub struct Follower {
    followed: HashMap<PathBuf, Followed>,
    followed_max: usize,
    clock: u64,
    reads: Reads,
}

/// How a follower's projections read their WALs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reads {
    /// Read whole (first seen, dropped, or no longer what was followed).
    pub whole: u64,
    /// Read from the last record projected.
    pub since: u64,
    /// Messages replayed that were found equal to their actor's and are shared with it.
    pub shared: u64,
}

impl Follower {
    pub fn new(followed_max: usize) -> Follower {
        Follower {
            followed: HashMap::new(),
            followed_max,
            clock: 0,
            reads: Reads::default(),
        }
    }

    /// Sessions whose state is kept.
    pub fn followed(&self) -> usize {
        self.followed.len()
    }

    /// How its projections so far read their WALs.
    pub fn reads(&self) -> Reads {
        self.reads
    }

    /// [`Store::catch_up_batch`], reading each WAL from where its last projection ended when
    /// this follower has its state.
    pub fn catch_up_batch(
        &mut self,
        store: &Store,
        paths: &[PathBuf],
    ) -> Result<Vec<String>, StoreError> {
        let moved: Vec<Moved> = paths.iter().cloned().map(Moved::path).collect();
        self.catch_up_moved(store, &moved)
    }

    /// [`Follower::catch_up_batch`] for sessions handed over with their actors' messages,
    /// which the state kept shares where they are equal to its own.
    pub fn catch_up_moved(
        &mut self,
        store: &Store,
        moved: &[Moved],
    ) -> Result<Vec<String>, StoreError> {
        let mut projections = Vec::new();
        let mut failed = Vec::new();
        for Moved { path, messages } in moved {
            self.clock += 1;
            match self.behind(store, path, messages) {
                Ok(Some(p)) => projections.push(p),
                Ok(None) => {}
                Err(e) => {
                    self.followed.remove(path);
                    failed.push(e.to_string());
                }
            }
        }
        if !projections.is_empty() {
            if let Err(e) = store.write(&projections) {
                // What the store holds is not what is followed: start again from the WALs.
                self.followed.clear();
                return Err(e);
            }
        }
        self.evict();
        Ok(failed)
    }

    fn behind(
        &mut self,
        store: &Store,
        path: &Path,
        theirs: &[Arc<Message>],
    ) -> Result<Option<Projection>, StoreError> {
        if let Some(mut f) = self.followed.remove(path) {
            // The last message may have grown since (a steer joins it); those before it are
            // as they were, and were shared before if they could be.
            let from = f.session.transcript.len().saturating_sub(1);
            let found = since(store, path, &mut f)?;
            if !matches!(found, Since::Whole) {
                self.reads.shared += f.share(from, theirs);
            }
            if !matches!(found, Since::Whole) {
                self.reads.since += 1;
            }
            match found {
                Since::Current => {
                    f.used = self.clock;
                    self.followed.insert(path.to_path_buf(), f);
                    return Ok(None);
                }
                Since::Grew(p) => {
                    f.used = self.clock;
                    self.followed.insert(path.to_path_buf(), f);
                    return Ok(Some(p));
                }
                Since::Whole => {}
            }
        }
        self.reads.whole += 1;
        let Some((bytes, scan)) = broca_wal::verify::read_and_scan_if_any(path)? else {
            return Ok(None);
        };
        let last_seq = scan.frames.last().map_or(0, |f| f.seq);
        let current = store
            .mark(&scan.header.address.0)?
            .is_some_and(|m| m.lineage_id == scan.header.lineage_hex() && m.last_seq == last_seq);
        if current && self.followed_max == 0 {
            return Ok(None);
        }
        let (p, mut f) = follow_scan(&scan, &bytes).map_err(|e| crate::at_path(path, e))?;
        f.used = self.clock;
        if self.followed_max > 0 {
            self.reads.shared += f.share(0, theirs);
            self.followed.insert(path.to_path_buf(), f);
        }
        Ok((!current).then_some(p))
    }

    /// Drops the least lately projected sessions' state beyond `followed_max`.
    fn evict(&mut self) {
        let over = self.followed.len().saturating_sub(self.followed_max);
        if over == 0 {
            return;
        }
        let mut used: Vec<u64> = self.followed.values().map(|f| f.used).collect();
        used.sort_unstable();
        let keep_from = used[over - 1];
        self.followed.retain(|_, f| f.used > keep_from);
        assert!(
            self.followed.len() <= self.followed_max,
            "the followed state keeps its bound"
        );
    }
}

/// Reads the records `f`'s WAL gained since `f` ends, and applies them. The reader starts at
/// the last record applied, which it checks is there (its seq, lineage and checksum at its
/// offset), so that a WAL replaced or cut since is read whole instead.
fn since(store: &Store, path: &Path, f: &mut Followed) -> Result<Since, StoreError> {
    // The store must hold what `f` projected: otherwise the facts before it are missing.
    let held = store.mark(&f.addr)?;
    let Some((last_seq, last_offset)) = f.last else {
        return Ok(Since::Whole);
    };
    if held.as_ref() != Some(&f.mark()) {
        return Ok(Since::Whole);
    }
    let Ok(Some(mut r)) = PagedReader::open_from(path, last_seq, last_offset) else {
        return Ok(Since::Whole);
    };
    let at_last = r.last_seq() + 1 == last_seq && r.end() == last_offset;
    if !at_last || r.header().lineage_hex() != f.lineage_id {
        return Ok(Since::Whole);
    }
    let mut facts = Vec::new();
    loop {
        let Ok(frames) = r.next_frames(PAGE_BYTES, false) else {
            return Ok(Since::Whole);
        };
        if frames.is_empty() {
            break;
        }
        for frame in frames.into_iter().filter(|fr| fr.seq > last_seq) {
            let applied = match Record::decode(frame.kind, &frame.payload) {
                Ok(Record::Unknown { .. }) => {
                    f.skip(frame.seq, frame.offset);
                    continue;
                }
                Ok(record) => f.apply(frame.seq, record),
                Err(e) => Err(StoreError::Project {
                    path: None,
                    reason: e.to_string(),
                }),
            };
            match applied {
                Ok(fact) => {
                    facts.extend(fact);
                    assert!(f
                        .last
                        .is_none_or(|(s, o)| frame.seq > s && frame.offset > o));
                    f.last = Some((frame.seq, frame.offset));
                }
                // A record that does not fit or parse: the whole read names it.
                Err(_) => return Ok(Since::Whole),
            }
        }
    }
    if f.last == Some((last_seq, last_offset)) {
        return Ok(Since::Current);
    }
    Ok(Since::Grew(f.projection(facts)))
}
