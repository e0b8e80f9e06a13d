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

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::Connection;

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
    /// The writer's busy timeout, put back after its checkpoint.
    busy_timeout: Duration,
    /// The writer's next TRUNCATE attempt is not before this (set when one failed).
    next_try: std::sync::Mutex<Instant>,
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
        // A quarter of the bound, in frames (the headers are small beside a page).
        let page_size: i64 = writer.query_row("PRAGMA page_size", [], |r| r.get(0))?;
        let quarter = wal_limit / 4 / page_size.max(512) as u64;
        let thread = std::thread::Builder::new()
            .name("hookledger-checkpoint".into())
            .spawn(move || {
                let mut last_passive = Instant::now();
                loop {
                    let last = !matches!(
                        stopped.recv_timeout(SIZE_INTERVAL),
                        Err(mpsc::RecvTimeoutError::Timeout)
                    );
                    let size = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
                    if size > wal_limit {
                        raise.store(true, Ordering::Relaxed);
                    }
                    // Past the bound while the writer is idle (no batch to run the writer's
                    // checkpoint after), this thread's own TRUNCATE does it; under load it
                    // gives up at once and the writer's does.
                    let mode = if last || size > wal_limit {
                        "TRUNCATE"
                    } else if last_passive.elapsed() >= CHECKPOINT_INTERVAL {
                        "PASSIVE"
                    } else {
                        continue;
                    };
                    let done = checkpoint(&conn, mode);
                    if let Ok(Some(frames)) = &done {
                        backlog.store(*frames > quarter, Ordering::Relaxed);
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
            busy_timeout,
            next_try: std::sync::Mutex::new(Instant::now()),
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

    /// On the writer's connection, between two batches: when the WAL file has grown past its
    /// bound, copies it back and truncates it (TRUNCATE), waiting at most [`CHECKPOINT_WAIT`]
    /// for the readers in flight. A failure is logged, and batches run without waiting on it
    /// for [`TRUNCATE_RETRY`] (the thread raises the flag again while the WAL stays past its
    /// bound).
    pub(crate) fn truncate_if_over(&self, writer: &Connection) {
        if !self.over.swap(false, Ordering::Relaxed) {
            return;
        }
        let now = Instant::now();
        let mut next_try = self.next_try.lock().unwrap_or_else(|e| e.into_inner());
        if now < *next_try {
            return;
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
    }
}

/// Runs one checkpoint in `mode`: the frames the WAL held (`None` when SQLite does not say).
/// A TRUNCATE one that could not finish (a reader or the writer still busy past the busy
/// timeout) is an error, and the next round tries again.
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
