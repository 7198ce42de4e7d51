//! The store (the brief's store role): projections of the WALs in LMDB (heed), kept in
//! `<state-dir>/store/`. The WAL is authoritative; every projection here can be rebuilt from
//! the WALs, and is whenever it cannot be trusted.
//!
//! Projections, per session (keys start with the session address, so a session's entries are
//! one key range):
//! - `runs`: run index (run id -> state, times, steps, usage totals, provider, model);
//! - `admission`: checkpoints (send_id -> run id and the digest of the send's inputs);
//! - `facts`: usage facts (`core::usage`), one per model attempt and step;
//! - `transcript`: the materialized transcript (ordinal -> message);
//! - `marks`: what the session's projection is bound to: the WAL's lineage_id and the last
//!   seq applied.
//!
//! A session whose mark matches its WAL is current; one that is behind is projected again;
//! one of another lineage is replaced. The store records which state dir it belongs to: a
//! store copied from elsewhere is cleared and rebuilt, and one that cannot be opened (deleted,
//! truncated, damaged) is moved aside and rebuilt. Updates run off the hot path (serve's
//! blocking pool, or after `broca run`'s run).

use std::ops::Bound;
use std::path::{Path, PathBuf};

use heed::types::Bytes;
use heed::{Database, Env, EnvOpenOptions};
use serde::Serialize;

use broca_core::usage::SpendFact;
use broca_protocol::Message;

mod follow;
mod rows;
pub use follow::{Follower, Moved, Reads};
pub use rows::{Checkpoint, LastRun, Mark, Pass, Projection, RunRow, StoreError};

/// The store's format; another one is rebuilt.
const FORMAT: &str = "broca-store-2";
/// The largest the store's memory map may grow (address space, not memory).
const MAP_BYTES: usize = 64 << 30;

/// The store of one state dir.
pub struct Store {
    env: Env,
    dir: PathBuf,
    meta: Database<Bytes, Bytes>,
    marks: Database<Bytes, Bytes>,
    runs: Database<Bytes, Bytes>,
    admission: Database<Bytes, Bytes>,
    facts: Database<Bytes, Bytes>,
    transcript: Database<Bytes, Bytes>,
}

fn err(what: &'static str) -> impl Fn(heed::Error) -> StoreError {
    move |e| StoreError::Lmdb {
        op: what,
        message: e.to_string(),
    }
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> StoreError + '_ {
    move |e| StoreError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

fn decode(what: &'static str) -> impl Fn(serde_json::Error) -> StoreError {
    move |e| StoreError::Decode {
        what,
        message: e.to_string(),
    }
}

impl Store {
    /// Opens (or creates) the store of `state_dir`. A store that cannot be opened or checked
    /// is moved aside and a new one created; a store of another state dir, or of another
    /// format, is cleared. Each such event is one line in the returned notes: the caller
    /// says so, and catches up from the WALs.
    pub fn open(state_dir: &Path) -> Result<(Store, Vec<String>), StoreError> {
        let id = state_id(state_dir)?;
        let dir = state_dir.join("store");
        let mut notes = Vec::new();
        let store = match Store::open_dir(&dir) {
            Ok(s) => s,
            Err(why) => {
                let aside = state_dir.join(format!("store.unusable-{}", now_unix_ms()));
                broca_io::fs::rename(&dir, &aside)
                    .and_then(|()| broca_io::fs::sync_dir(state_dir))
                    .map_err(|e| StoreError::Stuck {
                        dir: dir.clone(),
                        why: why.to_string(),
                        message: e.to_string(),
                    })?;
                notes.push(format!(
                    "the store {} could not be used ({why}); moved to {} and rebuilt from the WALs",
                    dir.display(),
                    aside.display()
                ));
                Store::open_dir(&dir)?
            }
        };
        let rtxn = store.env.read_txn().map_err(err("read"))?;
        let owner = store
            .meta
            .get(&rtxn, b"state_id")
            .map_err(err("read"))?
            .map(<[u8]>::to_vec);
        let format = store
            .meta
            .get(&rtxn, b"format")
            .map_err(err("read"))?
            .map(<[u8]>::to_vec);
        drop(rtxn);
        let fresh = owner.is_none() && format.is_none();
        if owner.as_deref() != Some(id.as_bytes()) || format.as_deref() != Some(FORMAT.as_bytes()) {
            if !fresh {
                notes.push(if owner.as_deref() != Some(id.as_bytes()) {
                    format!(
                        "the store {} belongs to another state dir; cleared and rebuilt from the WALs",
                        dir.display()
                    )
                } else {
                    format!("the store {} has another format; cleared and rebuilt", dir.display())
                });
            }
            store.clear()?;
            let mut w = store.env.write_txn().map_err(err("write"))?;
            store
                .meta
                .put(&mut w, b"state_id", id.as_bytes())
                .map_err(err("write"))?;
            store
                .meta
                .put(&mut w, b"format", FORMAT.as_bytes())
                .map_err(err("write"))?;
            w.commit().map_err(err("commit"))?;
        }
        Ok((store, notes))
    }

    /// Opens the store of `state_dir` to read it only: nothing is created, moved aside or
    /// cleared, so a read-only state dir works. A store that is missing, damaged, of another
    /// state dir (its `state.id`) or of another format is [`StoreError::Incomparable`].
    pub fn open_read_only(state_dir: &Path) -> Result<Store, StoreError> {
        let dir = state_dir.join("store");
        let incomparable = |why: String| StoreError::Incomparable {
            dir: dir.clone(),
            why,
        };
        let data = dir.join("data.mdb");
        let len = match std::fs::metadata(&data) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(incomparable("there is none".into()))
            }
            Err(e) => return Err(io(&data)(e)),
        };
        // SAFETY: as in `open_dir`; read-only, and LMDB's lock file (or, on a read-only
        // file system, none) coordinates with a writer.
        let env = unsafe {
            let mut o = EnvOpenOptions::new();
            o.map_size(MAP_BYTES)
                .max_dbs(8)
                .flags(heed::EnvFlags::READ_ONLY);
            o.open(&dir)
        }
        .map_err(|e| incomparable(format!("it does not open: {e}")))?;
        let need = (env.info().last_page_number as u64 + 1) * u64::from(env.stat().page_size);
        if len < need {
            return Err(incomparable(format!(
                "{} has {len} bytes, shorter than its {need} bytes of pages",
                data.display()
            )));
        }
        let r = env.read_txn().map_err(err("read"))?;
        let db = |name: &str| match env.open_database::<Bytes, Bytes>(&r, Some(name)) {
            Ok(Some(db)) => Ok(db),
            Ok(None) => Err(incomparable(format!("it has no {name} table"))),
            Err(e) => Err(incomparable(format!("its {name} table: {e}"))),
        };
        let (meta, marks, runs, admission, facts, transcript) = (
            db("meta")?,
            db("marks")?,
            db("runs")?,
            db("admission")?,
            db("facts")?,
            db("transcript")?,
        );
        let owner = meta
            .get(&r, b"state_id")
            .map_err(err("read"))?
            .map(<[u8]>::to_vec);
        let format = meta
            .get(&r, b"format")
            .map_err(err("read"))?
            .map(<[u8]>::to_vec);
        // The transaction that opened the tables is committed, not dropped: LMDB keeps the
        // handles it opened only then, and a later read on them would fail EINVAL.
        r.commit().map_err(err("read"))?;
        let id = std::fs::read_to_string(state_dir.join("state.id")).unwrap_or_default();
        if owner.as_deref() != Some(id.trim().as_bytes()) {
            return Err(incomparable(
                "it belongs to another state dir (its state.id is not this one's)".into(),
            ));
        }
        if format.as_deref() != Some(FORMAT.as_bytes()) {
            return Err(incomparable("it has another format".into()));
        }
        Ok(Store {
            env,
            dir,
            meta,
            marks,
            runs,
            admission,
            facts,
            transcript,
        })
    }

    fn open_dir(dir: &Path) -> Result<Store, StoreError> {
        broca_owner_only::create_dir(dir).map_err(io(dir))?;
        let data = dir.join("data.mdb");
        let existed = data.exists();
        // SAFETY: the store's files are used by broca alone; LMDB's own lock file coordinates
        // the processes that open them (serve, and `broca store`/`export` beside it).
        let env = unsafe {
            EnvOpenOptions::new()
                .map_size(MAP_BYTES)
                .max_dbs(8)
                .open(dir)
        }
        .map_err(err("open"))?;
        // A file cut shorter than its last page would fault when read: check before use.
        if existed {
            let need = (env.info().last_page_number as u64 + 1) * u64::from(env.stat().page_size);
            let len = std::fs::metadata(&data).map(|m| m.len()).unwrap_or(0);
            if len < need {
                return Err(StoreError::Io {
                    path: data,
                    message: format!("{len} bytes, shorter than its {need} bytes of pages"),
                });
            }
        }
        let mut w = env.write_txn().map_err(err("write"))?;
        let mut db = |name: &str| {
            env.create_database::<Bytes, Bytes>(&mut w, Some(name))
                .map_err(err("create a table"))
        };
        let (meta, marks, runs, admission, facts, transcript) = (
            db("meta")?,
            db("marks")?,
            db("runs")?,
            db("admission")?,
            db("facts")?,
            db("transcript")?,
        );
        w.commit().map_err(err("commit"))?;
        for f in ["data.mdb", "lock.mdb"] {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(dir.join(f), std::fs::Permissions::from_mode(0o600));
        }
        Ok(Store {
            env,
            dir: dir.to_path_buf(),
            meta,
            marks,
            runs,
            admission,
            facts,
            transcript,
        })
    }

    /// The store's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn clear(&self) -> Result<(), StoreError> {
        self.clear_projections(true)
    }

    /// Clears every projection (and the store's own records with `meta`), in one transaction.
    fn clear_projections(&self, meta: bool) -> Result<(), StoreError> {
        let mut w = self.env.write_txn().map_err(err("write"))?;
        if meta {
            self.meta.clear(&mut w).map_err(err("clear"))?;
        }
        for db in [
            &self.marks,
            &self.runs,
            &self.admission,
            &self.facts,
            &self.transcript,
        ] {
            db.clear(&mut w).map_err(err("clear"))?;
        }
        w.commit().map_err(err("commit"))
    }

    /// The mark of session `addr`, if the store has projected it.
    pub fn mark(&self, addr: &[u8; 16]) -> Result<Option<Mark>, StoreError> {
        let r = self.env.read_txn().map_err(err("read"))?;
        let found = self.marks.get(&r, addr).map_err(err("read"))?;
        found
            .map(|b| serde_json::from_slice(b).map_err(decode("a mark")))
            .transpose()
    }

    /// Brings the session of the WAL at `path` up to date. `Ok(true)` when it was projected
    /// again, `Ok(false)` when it was current.
    pub fn catch_up(&self, path: &Path) -> Result<(bool, u64), StoreError> {
        let (projection, read) = self.behind(path)?;
        if let Some(p) = &projection {
            self.write(std::slice::from_ref(p))?;
        }
        Ok((projection.is_some(), read))
    }

    /// Brings the sessions of the WALs at `paths` up to date in one transaction (one sync);
    /// each WAL that cannot be projected is one line of the answer.
    pub fn catch_up_batch(&self, paths: &[PathBuf]) -> Result<Vec<String>, StoreError> {
        let mut projections = Vec::new();
        let mut failed = Vec::new();
        for path in paths {
            match self.behind(path) {
                Ok((Some(p), _)) => projections.push((path, p)),
                Ok((None, _)) => {}
                Err(e) => failed.push(e.to_string()),
            }
        }
        if !projections.is_empty() {
            // Checked under the write lock: a session deleted since it was read (past its
            // retention, `forget`) is not written back.
            let mut w = self.env.write_txn().map_err(err("write"))?;
            for (path, p) in &projections {
                if broca_wal::archive::exists(path) {
                    self.write_one(&mut w, p)?;
                }
            }
            w.commit().map_err(err("commit"))?;
        }
        Ok(failed)
    }

    /// The session's fresh projection when the store is behind its WAL, and the bytes read.
    fn behind(&self, path: &Path) -> Result<(Option<Projection>, u64), StoreError> {
        let Some((bytes, scan)) = broca_wal::verify::read_and_scan_if_any(path)? else {
            return Ok((None, 0));
        };
        let read = bytes.len() as u64;
        let addr = scan.header.address.0;
        let last_seq = scan.frames.last().map_or(0, |f| f.seq);
        if let Some(m) = self.mark(&addr)? {
            if m.lineage_id == scan.header.lineage_hex() && m.last_seq == last_seq {
                return Ok((None, read));
            }
        }
        let p = project(&scan, &bytes).map_err(|e| at_path(path, e))?;
        Ok((Some(p), read))
    }

    /// Catches up every WAL in `wal_dir`, a batch of sessions per transaction.
    pub fn catch_up_all(&self, wal_dir: &Path) -> Result<Pass, StoreError> {
        self.catch_up_all_with(wal_dir, &mut |_, _| {})
    }

    /// [`Store::catch_up_all`], telling `progress` (WALs done, of how many) as it goes.
    pub fn catch_up_all_with(
        &self,
        wal_dir: &Path,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Pass, StoreError> {
        const BATCH: usize = 256;
        let mut pass = Pass::default();
        let files = wal_files(wal_dir)?;
        let total = files.len() as u64;
        for chunk in files.chunks(BATCH) {
            let mut projections = Vec::new();
            for path in chunk {
                pass.sessions += 1;
                match self.behind(path) {
                    Ok((p, bytes)) => {
                        pass.wal_bytes += bytes;
                        projections.extend(p);
                    }
                    Err(e) => pass.failed.push(e.to_string()),
                }
                progress(pass.sessions, total);
            }
            pass.projected += projections.len() as u64;
            if !projections.is_empty() {
                self.write(&projections)?;
            }
        }
        pass.facts = self.count_facts()?;
        Ok(pass)
    }

    /// Clears every projection and rebuilds it from the WALs.
    pub fn rebuild(&self, wal_dir: &Path) -> Result<Pass, StoreError> {
        self.rebuild_with(wal_dir, &mut |_, _| {})
    }

    /// [`Store::rebuild`], telling `progress` (WALs done, of how many) as it goes.
    pub fn rebuild_with(
        &self,
        wal_dir: &Path,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Pass, StoreError> {
        self.clear_projections(false)?;
        self.catch_up_all_with(wal_dir, progress)
    }

    /// Replaces each session's projections with the given ones, in one transaction.
    pub fn write(&self, projections: &[Projection]) -> Result<(), StoreError> {
        let mut w = self.env.write_txn().map_err(err("write"))?;
        for p in projections {
            self.write_one(&mut w, p)?;
        }
        w.commit().map_err(err("commit"))
    }

    /// Writes one session's projection. A session the store holds of the same lineage and
    /// not ahead of `p` only grew (its WAL is append-only): what it already holds is kept,
    /// and only what changed is written (each run row and checkpoint that differs, the facts
    /// of the records since its mark, the transcript from its last message on). Anything
    /// else (new, another lineage) replaces the session's projections whole.
    fn write_one(&self, w: &mut heed::RwTxn, p: &Projection) -> Result<(), StoreError> {
        let held: Option<Mark> = self
            .marks
            .get(w, &p.addr)
            .map_err(err("read"))?
            .and_then(|b| serde_json::from_slice(b).ok());
        let grew = held.filter(|m| {
            m.lineage_id == p.mark.lineage_id
                && m.last_seq <= p.mark.last_seq
                && m.messages <= p.mark.messages
        });
        let (facts_after, messages_from) = match &grew {
            Some(m) => (m.last_seq, m.messages.saturating_sub(1)),
            None => {
                let (lo, hi) = session_range(&p.addr);
                let range = (Bound::Included(&lo[..]), Bound::Excluded(&hi[..]));
                for db in [&self.runs, &self.admission, &self.facts, &self.transcript] {
                    db.delete_range(w, &range).map_err(err("delete"))?;
                }
                (0, 0)
            }
        };
        // Only a value that differs is put: an unchanged one dirties no page.
        let put = |db: &Database<Bytes, Bytes>, w: &mut heed::RwTxn, k: &[u8], v: Vec<u8>| {
            if grew.is_some() && db.get(w, k).map_err(err("read"))? == Some(&v[..]) {
                return Ok::<(), StoreError>(());
            }
            db.put(w, k, &v).map_err(err("write"))
        };
        for r in &p.runs {
            put(&self.runs, w, &key(&p.addr, r.run_id.as_bytes()), json(r))?;
        }
        for (send_id, c) in &p.admission {
            put(
                &self.admission,
                w,
                &key(&p.addr, send_id.as_bytes()),
                json(c),
            )?;
        }
        for f in p.facts.iter().filter(|f| f.wal_seq > facts_after) {
            self.facts
                .put(w, &key(&p.addr, &f.wal_seq.to_be_bytes()), &json(f))
                .map_err(err("write"))?;
        }
        for (i, m) in p.transcript.iter().enumerate().skip(messages_from as usize) {
            let m: &Message = m;
            put(
                &self.transcript,
                w,
                &key(&p.addr, &(i as u64).to_be_bytes()),
                json(m),
            )?;
        }
        self.marks
            .put(w, &p.addr, &json(&p.mark))
            .map_err(err("write"))?;
        Ok(())
    }

    /// Takes every projection of the session `addr` out of the store (its mark, runs,
    /// admissions, facts, transcript), in one transaction: a session past its retention.
    pub fn forget(&self, addr: &[u8; 16]) -> Result<(), StoreError> {
        let mut w = self.env.write_txn().map_err(err("write"))?;
        let (lo, hi) = session_range(addr);
        let range = (Bound::Included(&lo[..]), Bound::Excluded(&hi[..]));
        for db in [&self.runs, &self.admission, &self.facts, &self.transcript] {
            db.delete_range(&mut w, &range).map_err(err("delete"))?;
        }
        self.marks
            .delete(&mut w, &addr[..])
            .map_err(err("delete"))?;
        w.commit().map_err(err("commit"))
    }

    /// Every session the store holds: its address and its mark (what `sessions.list` pages).
    pub fn sessions(&self) -> Result<Vec<([u8; 16], Mark)>, StoreError> {
        let r = self.env.read_txn().map_err(err("read"))?;
        let mut out = Vec::new();
        for item in self.marks.iter(&r).map_err(err("read"))? {
            let (k, v) = item.map_err(err("read"))?;
            let Ok(addr) = <[u8; 16]>::try_from(k) else {
                continue;
            };
            out.push((addr, serde_json::from_slice(v).map_err(decode("a mark"))?));
        }
        Ok(out)
    }

    /// The sessions (by address) whose index holds a run without a terminal record, or a
    /// queued send not yet started: what a crash left open, for serve to resume at start. Each is checked against its WAL when its
    /// actor opens; a session the store has not caught up with is not here.
    pub fn sessions_with_open_runs(&self) -> Result<Vec<[u8; 16]>, String> {
        let r = self.env.read_txn().map_err(err("read"))?;
        let mut out: Vec<[u8; 16]> = Vec::new();
        for item in self.runs.iter(&r).map_err(err("read"))? {
            let (k, v) = item.map_err(err("read"))?;
            let row: RunRow = serde_json::from_slice(v).map_err(decode("a run"))?;
            let Some(addr) = k.get(..16).and_then(|a| <[u8; 16]>::try_from(a).ok()) else {
                continue;
            };
            if row.state == "active" && out.last() != Some(&addr) {
                out.push(addr);
            }
        }
        // Sessions whose queued sends wait for a run that already ended.
        for item in self.marks.iter(&r).map_err(err("read"))? {
            let (k, v) = item.map_err(err("read"))?;
            let mark: Mark = serde_json::from_slice(v).map_err(decode("a mark"))?;
            let Ok(addr) = <[u8; 16]>::try_from(k) else {
                continue;
            };
            if mark.queued > 0 && !out.contains(&addr) {
                out.push(addr);
            }
        }
        Ok(out)
    }

    /// Every usage fact at or after `since_unix_ms`, by session and log order.
    pub fn facts(&self, since_unix_ms: Option<u64>) -> Result<Vec<SpendFact>, StoreError> {
        let r = self.env.read_txn().map_err(err("read"))?;
        let mut out = Vec::new();
        for item in self.facts.iter(&r).map_err(err("read"))? {
            let (_, v) = item.map_err(err("read"))?;
            let f: SpendFact = serde_json::from_slice(v).map_err(decode("a fact"))?;
            if since_unix_ms.is_none_or(|s| f.at_unix_ms >= s) {
                out.push(f);
            }
        }
        Ok(out)
    }

    fn count_facts(&self) -> Result<u64, StoreError> {
        let r = self.env.read_txn().map_err(err("read"))?;
        self.facts.len(&r).map_err(err("read"))
    }

    /// Messages `from..from+limit` of session `addr`'s materialized transcript.
    pub fn transcript_page(
        &self,
        addr: &[u8; 16],
        from: u64,
        limit: usize,
    ) -> Result<Vec<Message>, StoreError> {
        let r = self.env.read_txn().map_err(err("read"))?;
        let lo = key(addr, &from.to_be_bytes());
        let (_, hi) = session_range(addr);
        let range = (Bound::Included(&lo[..]), Bound::Excluded(&hi[..]));
        let mut out = Vec::with_capacity(limit);
        for item in self
            .transcript
            .range(&r, &range)
            .map_err(err("read"))?
            .take(limit)
        {
            let (_, v) = item.map_err(err("read"))?;
            out.push(serde_json::from_slice(v).map_err(decode("a message"))?);
        }
        Ok(out)
    }

    /// Compares every projection with what the WALs say. Each difference is one line; none
    /// means the store agrees with the WALs.
    pub fn check(&self, wal_dir: &Path) -> Result<Vec<String>, StoreError> {
        let mut diffs = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for path in wal_files(wal_dir)? {
            let Some((bytes, scan)) = broca_wal::verify::read_and_scan_if_any(&path)? else {
                continue;
            };
            let want = match project(&scan, &bytes) {
                Ok(p) => p,
                Err(e) => {
                    diffs.push(format!("{}: cannot be projected: {e}", path.display()));
                    continue;
                }
            };
            seen.insert(want.addr);
            let have = self.read_projection(&want.addr)?;
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            match have {
                None => diffs.push(format!("{name}: not in the store")),
                Some(have) => {
                    let differ = |what: &str, same: bool, diffs: &mut Vec<String>| {
                        if !same {
                            diffs.push(format!("{name}: {what} differ from the WAL"));
                        }
                    };
                    differ(
                        "mark (lineage, last seq)",
                        have.mark == want.mark,
                        &mut diffs,
                    );
                    differ("runs", have.runs == want.runs, &mut diffs);
                    differ(
                        "admission checkpoints",
                        have.admission == want.admission,
                        &mut diffs,
                    );
                    differ("usage facts", have.facts == want.facts, &mut diffs);
                    differ("transcript", have.transcript == want.transcript, &mut diffs);
                }
            }
        }
        let r = self.env.read_txn().map_err(err("read"))?;
        for item in self.marks.iter(&r).map_err(err("read"))? {
            let (k, _) = item.map_err(err("read"))?;
            let addr: [u8; 16] = k.try_into().map_err(|_| StoreError::Decode {
                what: "a mark key",
                message: "not an address".into(),
            })?;
            if !seen.contains(&addr) {
                diffs.push(format!("{}: in the store, but its WAL is gone", hex(&addr)));
            }
        }
        Ok(diffs)
    }

    /// The run rows the store holds for the session `addr`, in the order the runs started
    /// (none for a session it does not hold).
    pub fn runs(&self, addr: &[u8; 16]) -> Result<Vec<RunRow>, StoreError> {
        Ok(self
            .read_projection(addr)?
            .map(|p| p.runs)
            .unwrap_or_default())
    }

    fn read_projection(&self, addr: &[u8; 16]) -> Result<Option<Projection>, StoreError> {
        let Some(mark) = self.mark(addr)? else {
            return Ok(None);
        };
        let r = self.env.read_txn().map_err(err("read"))?;
        let (lo, hi) = session_range(addr);
        let range = (Bound::Included(&lo[..]), Bound::Excluded(&hi[..]));
        fn all<T: serde::de::DeserializeOwned>(
            db: &Database<Bytes, Bytes>,
            r: &heed::RoTxn,
            range: &(Bound<&[u8]>, Bound<&[u8]>),
        ) -> Result<Vec<(Vec<u8>, T)>, StoreError> {
            let mut out = Vec::new();
            for item in db.range(r, range).map_err(err("read"))? {
                let (k, v) = item.map_err(err("read"))?;
                out.push((
                    k[16..].to_vec(),
                    serde_json::from_slice(v).map_err(decode("a row"))?,
                ));
            }
            Ok(out)
        }
        let mut runs: Vec<RunRow> = all(&self.runs, &r, &range)?
            .into_iter()
            .map(|(_, v)| v)
            .collect();
        runs.sort_by_key(|x: &RunRow| x.started_seq);
        let admission = all::<Checkpoint>(&self.admission, &r, &range)?
            .into_iter()
            .map(|(k, v)| (String::from_utf8_lossy(&k).into_owned(), v))
            .collect();
        let facts = all(&self.facts, &r, &range)?
            .into_iter()
            .map(|(_, v)| v)
            .collect();
        let transcript = all::<Message>(&self.transcript, &r, &range)?
            .into_iter()
            .map(|(_, v)| std::sync::Arc::new(v))
            .collect();
        Ok(Some(Projection {
            addr: *addr,
            mark,
            runs,
            admission,
            facts,
            transcript,
        }))
    }
}

/// Computes a session's projections from its scanned WAL.
pub fn project(scan: &broca_wal::Scan, bytes: &[u8]) -> Result<Projection, StoreError> {
    follow::follow_scan(scan, bytes).map(|(p, _)| p)
}

/// A projection's failure, naming the WAL.
fn at_path(path: &Path, e: StoreError) -> StoreError {
    match e {
        StoreError::Project { reason, .. } => StoreError::Project {
            path: Some(path.to_path_buf()),
            reason,
        },
        other => other,
    }
}

/// The WALs of `wal_dir`, sorted: its `.wal` files, and the sessions only the archive holds
/// (as the path their live WAL would have; reads resolve it in the archive).
pub fn wal_files(wal_dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    let mut out = broca_wal::listing::wal_dir_files(wal_dir).map_err(io(wal_dir))?;
    let archive = broca_wal::archive::dir_of(wal_dir);
    let archived = broca_wal::archive::archived_files(&archive).map_err(io(&archive))?;
    out.extend(archived.into_iter().map(|f| wal_dir.join(f)));
    out.sort();
    out.dedup();
    Ok(out)
}

/// This state dir's id (`<state-dir>/state.id`, made once, owner-only).
fn state_id(state_dir: &Path) -> Result<String, StoreError> {
    let path = state_dir.join("state.id");
    if let Ok(text) = std::fs::read_to_string(&path) {
        let t = text.trim();
        if t.len() == 32 && t.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(t.to_string());
        }
    }
    let mut raw = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut raw))
        .map_err(io(Path::new("/dev/urandom")))?;
    let id = hex(&raw);
    broca_owner_only::create_dir(state_dir).map_err(io(state_dir))?;
    broca_io::fs::replace_file(&path, id.as_bytes(), 0o600).map_err(io(&path))?;
    Ok(id)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn key(addr: &[u8; 16], rest: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(16 + rest.len());
    k.extend_from_slice(addr);
    k.extend_from_slice(rest);
    k
}

/// The key range of one session: from its address to its address followed by 0xff (no key's
/// remainder starts with 0xff: UTF-8 ids never hold that byte, big-endian seqs and ordinals
/// stay far below 2^56).
fn session_range(addr: &[u8; 16]) -> ([u8; 16], [u8; 17]) {
    let mut hi = [0xffu8; 17];
    hi[..16].copy_from_slice(addr);
    (*addr, hi)
}

fn json<T: Serialize + ?Sized>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("store values serialize")
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
