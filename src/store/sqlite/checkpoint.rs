//! The WAL checkpointer: copies the WAL back into the database file on its own connection and
//! thread, off the commit path, and keeps the WAL file within a bound.
//!
//! A PASSIVE checkpoint never blocks the writer or readers, but under a steady load (or a
//! prune) it never catches up: SQLite starts the WAL over only once every frame has been
//! copied back and no reader still uses it, so the file grew without end (4.5 GB while
//! pruning 1 M claims, left that size after `serve` stopped). A checkpoint on this thread
//! that waits for the writer does not help either: the writer takes the lock again right
//! after each COMMIT and the checkpoint starves. So this thread watches the file's size and,
//! past the bound, tries a TRUNCATE checkpoint briefly (enough when the writer is idle) and
//! raises a flag; the writer, between two batches, then runs a TRUNCATE
//! checkpoint itself ([`Checkpointer::truncate_if_over`]): it waits (up to a second) for the
//! readers in flight, copies every frame back and cuts the file to zero bytes. The writer is
//! held for that one checkpoint (a bound's worth of pages), not for the prune or the burst
//! that filled it.
//!
//! # Starting the WAL over
//! Under a steady load even that is too much: at 500 events/s the WAL reached a 64 MiB bound
//! every 4 s, and each TRUNCATE (this thread's, which got the lock between two commits) held
//! the writer 35–50 ms: p99 22 ms for requests whose median was 1 ms. SQLite writes the WAL
//! from its start again once a checkpoint has copied every frame back, but this thread's
//! PASSIVE checkpoints never quite do: the writer commits new frames while one runs. So after
//! each, the writer copies the few frames left behind itself between two batches
//! ([`Checkpointer::between_batches`]), with nothing written meanwhile, and its next
//! transaction starts the WAL over: the file stays at about what is written between two
//! checkpoints, and no checkpoint holds the writer for more than a few frames.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use crate::store::WalWatch;

/// How often the checkpointer copies the WAL back into the database file (PASSIVE).
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(500);

/// How often the WAL file's size is looked at (a `stat`, nothing more).
const SIZE_INTERVAL: Duration = Duration::from_millis(100);

/// The longest the writer's TRUNCATE checkpoint waits for the readers in flight: well before
/// a request queued behind it would time out; the next batch tries again.
const CHECKPOINT_WAIT: Duration = Duration::from_secs(1);

/// After the writer's TRUNCATE checkpoint failed (a reader stayed past [`CHECKPOINT_WAIT`]),
/// how long batches run before it waits on one again: a long reader (a backup, a copy) must
/// not cost every batch a second.
const TRUNCATE_RETRY: Duration = Duration::from_secs(5);

/// The longest this thread's checkpoints wait for the writer and the readers.
const IDLE_WAIT: Duration = Duration::from_millis(100);

/// How long the WAL file stays past its bound before that is told (logged, counted, shown):
/// the writer's TRUNCATE between two batches, or this thread's, cuts it well within it,
/// unless a reader's snapshot holds the frames.
const OVER_GRACE: Duration = Duration::from_secs(2);

/// The WAL file past which a TRUNCATE checkpoint runs, by default (`storage.wal_limit_mb`).
pub(crate) const DEFAULT_WAL_LIMIT: u64 = crate::config::DEFAULT_WAL_LIMIT_MB as u64 * 1024 * 1024;

/// A PASSIVE checkpoint every [`CHECKPOINT_INTERVAL`], a TRUNCATE one by the writer whenever
/// the WAL file has grown past its bound, and a last TRUNCATE one at the end. Dropping the value stops the thread after one last checkpoint.
pub(crate) struct Checkpointer {
    /// Never sent on: dropping it wakes the thread for its last round.
    _stop: SyncSender<()>,
    /// Set by the thread when the WAL file is past its bound; taken by the writer.
    over: Arc<AtomicBool>,
    /// Set by the thread while the WAL holds over a quarter of its bound: the writes since it
    /// last started over are more than the checkpoints keep up with.
    behind: Arc<AtomicBool>,
    /// Set by the thread after a PASSIVE checkpoint of a WAL that was not empty: the writer
    /// may have committed frames while it ran, which the writer then copies back itself.
    finish: Arc<AtomicBool>,
    /// The writer's busy timeout, put back after its checkpoint.
    busy_timeout: Duration,
    /// The writer's next TRUNCATE attempt is not before this (set when one failed).
    next_try: std::sync::Mutex<Instant>,
    /// The file's size and the times it stayed past its bound, for `/metrics` and `/status`.
    watch: Arc<WalWatch>,
    /// Joined on drop, so the last TRUNCATE checkpoint runs before the process ends.
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        // Dropping `_stop` (after this) is what wakes the thread: wake it first.
        let (stop, _) = mpsc::sync_channel(0);
        drop(std::mem::replace(&mut self._stop, stop));
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                log::error!("checkpoint thread panicked");
            }
        }
    }
}

/// The WAL file of the database at `path`.
pub(crate) fn wal_path(path: &Path) -> PathBuf {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    PathBuf::from(wal)
}

impl Checkpointer {
    /// Turns off SQLite's automatic checkpoints on `writer` (they would run inside COMMIT)
    /// and starts the background thread on the same file; `wal_limit` is the WAL file's bound
    /// in bytes.
    pub(crate) fn start(
        writer: &Connection,
        busy_timeout: Duration,
        wal_limit: u64,
    ) -> rusqlite::Result<Self> {
        writer.pragma_update(None, "wal_autocheckpoint", 0)?;
        // When a writer starts the WAL over, the file is cut back to the bound.
        writer.pragma_update(None, "journal_size_limit", wal_limit as i64)?;
        let path = writer.path().unwrap_or_default().to_string();
        let conn = Connection::open(&path)?;
        // Short: the writer's own checkpoint takes over when this one cannot finish.
        conn.busy_timeout(IDLE_WAIT)?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        let wal = wal_path(Path::new(&path));
        let (stop, stopped) = mpsc::sync_channel::<()>(0);
        let over = Arc::new(AtomicBool::new(false));
        let raise = over.clone();
        let behind = Arc::new(AtomicBool::new(false));
        let backlog = behind.clone();
        let finish = Arc::new(AtomicBool::new(false));
        let left_behind = finish.clone();
        // A quarter of the bound, in frames (the headers are small beside a page).
        let page_size: i64 = writer.query_row("PRAGMA page_size", [], |r| r.get(0))?;
        let quarter = wal_limit / 4 / page_size.max(512) as u64;
        let watch = Arc::new(WalWatch::default());
        watch.limit.store(wal_limit, Ordering::Relaxed);
        let watched = watch.clone();
        let thread = std::thread::Builder::new()
            .name("hookledger-checkpoint".into())
            .spawn(move || {
                let mut last_passive = Instant::now();
                let mut over_since: Option<Over> = None;
                loop {
                    let last = !matches!(
                        stopped.recv_timeout(SIZE_INTERVAL),
                        Err(mpsc::RecvTimeoutError::Timeout)
                    );
                    let size = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
                    if size > wal_limit {
                        raise.store(true, Ordering::Relaxed);
                    }
                    look(&watched, &mut over_since, size, &conn);
                    // Past the bound while the writer is idle (no batch to run the writer's
                    // checkpoint after), this thread's own TRUNCATE does it; under load it may
                    // take the lock between two commits and hold the writer while it copies
                    // the rest (rare since the WAL starts over), or give up to the writer's.
                    let mode = if last || size > wal_limit {
                        "TRUNCATE"
                    } else if last_passive.elapsed() >= CHECKPOINT_INTERVAL {
                        "PASSIVE"
                    } else {
                        continue;
                    };
                    let done = match mode {
                        "PASSIVE" => passive(&conn),
                        _ => checkpoint(&conn, mode),
                    };
                    if let Ok(Some(frames)) = &done {
                        backlog.store(*frames > quarter, Ordering::Relaxed);
                        if mode == "PASSIVE" && *frames > 0 {
                            left_behind.store(true, Ordering::Relaxed);
                        }
                    }
                    if !last && mode == "TRUNCATE" {
                        if let Err(e) = done {
                            log::debug!("WAL checkpoint (TRUNCATE) left to the writer: {e}");
                        }
                    } else if let Err(e) = done {
                        log::warn!("WAL checkpoint ({mode}, WAL file {size} bytes) failed: {e}");
                    }
                    last_passive = Instant::now();
                    if last {
                        break;
                    }
                }
            })
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
        Ok(Checkpointer {
            _stop: stop,
            over,
            behind,
            finish,
            busy_timeout,
            next_try: std::sync::Mutex::new(Instant::now()),
            watch,
            thread: Some(thread),
        })
    }

    /// Set while the WAL holds over a quarter of its bound (read at each of the thread's
    /// checkpoints, every 500 ms): a prune waits on it, so that it writes no faster than the
    /// checkpoints copy back and the WAL starts over, and requests do not wait behind the
    /// writer's own checkpoint of a full WAL.
    pub(crate) fn behind(&self) -> crate::store::WalBehind {
        self.behind.clone()
    }

    /// The WAL file's size and the times it stayed past its bound.
    pub(crate) fn watch(&self) -> Arc<WalWatch> {
        self.watch.clone()
    }

    /// On the writer's connection, between two batches: truncates the WAL when it has grown
    /// past its bound ([`Checkpointer::truncate_if_over`]), or else, after each of the
    /// thread's checkpoints of a WAL that was not empty, copies back the frames it may have
    /// left behind (PASSIVE: it waits for nobody; nothing to copy costs nothing), so that the
    /// next transaction starts the WAL over. A failure (another checkpoint running,
    /// often) is logged at debug level: the thread's next round raises the flag again.
    pub(crate) fn between_batches(&self, writer: &Connection) {
        if self.truncate_if_over(writer) || !self.finish.swap(false, Ordering::Relaxed) {
            return;
        }
        if let Err(e) = checkpoint(writer, "PASSIVE") {
            log::debug!("WAL checkpoint (PASSIVE, by the writer) failed: {e}");
        }
    }

    /// When the WAL file has grown past its bound, copies it back and truncates it
    /// (TRUNCATE), waiting at most [`CHECKPOINT_WAIT`] for the readers in flight; whether it
    /// tried. A failure is logged, and batches run without waiting on it for
    /// [`TRUNCATE_RETRY`] (the thread raises the flag again while the WAL stays past its
    /// bound).
    fn truncate_if_over(&self, writer: &Connection) -> bool {
        if !self.over.swap(false, Ordering::Relaxed) {
            return false;
        }
        let now = Instant::now();
        let mut next_try = self.next_try.lock().unwrap_or_else(|e| e.into_inner());
        if now < *next_try {
            return false;
        }
        let done = writer
            .busy_timeout(CHECKPOINT_WAIT)
            .and_then(|()| checkpoint(writer, "TRUNCATE"));
        if let Err(e) = done {
            *next_try = now + TRUNCATE_RETRY;
            // Often a reader in flight (tried again later): not worth a line each.
            log::debug!("WAL checkpoint (TRUNCATE, WAL past its bound) failed: {e}");
        }
        if let Err(e) = writer.busy_timeout(self.busy_timeout) {
            log::warn!("cannot restore the busy timeout: {e}");
        }
        true
    }
}

/// A stay of the WAL file past its bound.
struct Over {
    since: Instant,
    peak: u64,
    /// Whether it was told (it lasted [`OVER_GRACE`]).
    told: bool,
}

/// Records the WAL file's `size` in `watch`, and tells a stay past its bound once it has lasted
/// [`OVER_GRACE`]: a warning naming what holds it (a reader's snapshot, when a checkpoint
/// cannot copy every frame back; else writes faster than the checkpoints), counted, and shown
/// until it ends; then a line saying how long it lasted and how far it grew. (A reader that
/// held a snapshot for 31 s let the file grow to 166 MiB past an 8 MiB bound, and nothing
/// said so.)
fn look(watch: &WalWatch, over: &mut Option<Over>, size: u64, conn: &Connection) {
    let limit = watch.limit.load(Ordering::Relaxed);
    watch.bytes.store(size, Ordering::Relaxed);
    if size <= limit {
        if let Some(stay) = over.take().filter(|stay| stay.told) {
            watch.over_since.store(0, Ordering::Relaxed);
            watch.pinned.store(false, Ordering::Relaxed);
            log::info!(
                "the WAL file is back within storage.wal_limit_mb = {} after {} s past it \
                 (it reached {} MiB)",
                limit >> 20,
                stay.since.elapsed().as_secs(),
                stay.peak >> 20
            );
        }
        return;
    }
    let stay = over.get_or_insert_with(|| Over {
        since: Instant::now(),
        peak: size,
        told: false,
    });
    stay.peak = stay.peak.max(size);
    if stay.told || stay.since.elapsed() < OVER_GRACE {
        return;
    }
    stay.told = true;
    // A PASSIVE checkpoint copies back every frame no reader still needs: what it leaves is a
    // reader's.
    let pinned = conn
        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
            Ok(row.get::<_, i64>(2)? < row.get::<_, i64>(1)?)
        })
        .unwrap_or(false);
    watch.pinned.store(pinned, Ordering::Relaxed);
    watch.over_total.fetch_add(1, Ordering::Relaxed);
    let began = crate::time::unix_now() - stay.since.elapsed().as_secs() as i64;
    watch.over_since.store(began.max(1), Ordering::Relaxed);
    let cause = if pinned {
        "a reader holds an old snapshot of the database (a long read transaction: a backup, \
         an open sqlite3 shell, a slow query on another connection), so no checkpoint can \
         copy the WAL back; it grows until that reader ends"
    } else {
        "the checkpoints do not keep up with the writes"
    };
    log::warn!(
        "the WAL file is {} MiB, past storage.wal_limit_mb = {} for {} s: {cause}",
        size >> 20,
        limit >> 20,
        stay.since.elapsed().as_secs()
    );
}

/// The most PASSIVE checkpoints one round of the thread runs back to back ([`passive`]).
const PASSES: usize = 3;

/// A PASSIVE checkpoint, run again (up to [`PASSES`] in all) while the writer committed
/// frames during the one before; the frames the WAL held as the first began. SQLite syncs the
/// database file only at the end of a checkpoint that reached the WAL's end; under load the
/// first rarely does (the writer commits while it copies), and the sync of all it copied
/// would fall to the next one that does: the writer's ([`Checkpointer::between_batches`]),
/// while requests wait (under a prune, 7.7 ms at the median with one pass, 1.2 with three).
/// Each pass copies what was committed during the one before, a few frames, so one soon runs
/// while nothing is committed, and it syncs the file here; the writer's then copies and syncs
/// a few pages.
fn passive(conn: &Connection) -> rusqlite::Result<Option<u64>> {
    let first = checkpoint(conn, "PASSIVE")?;
    let mut last = first;
    for _ in 1..PASSES {
        let again = checkpoint(conn, "PASSIVE")?;
        // Nothing was committed since the pass before began: it reached the WAL's end.
        if again == last {
            break;
        }
        last = again;
    }
    Ok(first)
}

/// Runs one checkpoint in `mode`: the frames the WAL held as it began (`None` when SQLite
/// does not say). A TRUNCATE one that could not finish (a reader or the writer still busy
/// past the busy timeout) is an error, and the next round tries again.
fn checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<Option<u64>> {
    let (busy, log): (i64, i64) =
        conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })?;
    if busy != 0 && mode != "PASSIVE" {
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
            Some("the writer or a reader stayed busy".into()),
        ));
    }
    Ok((log >= 0).then_some(log as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes that never pause, one small transaction after the other as the writer runs them
    /// under load, each followed by [`Checkpointer::between_batches`]: the WAL starts over at
    /// each of the thread's checkpoints, so its file stays at what is written between two
    /// (about a sixth of all that went through it, measured), not all of it, with a bound too high for a TRUNCATE to cut it.
    /// (Without the writer's part of the checkpoint the file held every frame written: the
    /// thread's checkpoints never reached the WAL's end.)
    #[test]
    fn under_writes_that_never_pause_the_wal_starts_over_at_each_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal.db");
        let writer = Connection::open(&path).unwrap();
        writer
            .execute_batch(
                "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;
                 CREATE TABLE t (x BLOB);",
            )
            .unwrap();
        let checkpoints = Checkpointer::start(&writer, Duration::from_secs(1), 1 << 40).unwrap();
        let page_size: i64 = writer
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .unwrap();
        let wal = wal_path(&path);
        // Each commit writes a page at least (the table's last leaf) to the WAL.
        let (started, mut through, mut peak) = (Instant::now(), 0, 0);
        while started.elapsed() < CHECKPOINT_INTERVAL * 8 {
            writer
                .execute("INSERT INTO t VALUES (randomblob(100))", [])
                .unwrap();
            through += page_size as u64;
            checkpoints.between_batches(&writer);
            peak = peak.max(std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0));
        }
        assert!(
            peak * 2 < through,
            "the WAL file reached {peak} bytes, with {through} bytes of pages written through it"
        );
    }
}
