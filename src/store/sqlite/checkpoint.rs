//! The WAL checkpointer: copies the WAL back into the database file on its own connection and
//! thread, off the commit path, and keeps the WAL file within a bound.
//!
//! A PASSIVE checkpoint never blocks the writer or readers, but under a steady load (or a
//! prune) it never catches up: SQLite starts the WAL over only once every frame has been
//! copied back and no reader still uses it, so the file grew without end (4.5 GB while
//! pruning 1 M claims, left that size after `serve` stopped). So the file's size is watched:
//! past the bound, a TRUNCATE checkpoint waits (up to a second) for the writer's
//! transaction and the readers in flight, copies every frame back while new writes wait, and
//! truncates the file to zero bytes. The writer is held for that one checkpoint (a bound's
//! worth of pages: a fraction of a second), not for the prune or the burst that filled it.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, SyncSender};
use std::time::{Duration, Instant};

use rusqlite::Connection;

/// How often the checkpointer copies the WAL back into the database file (PASSIVE).
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(500);

/// How often the WAL file's size is looked at (a `stat`, nothing more).
const SIZE_INTERVAL: Duration = Duration::from_millis(100);

/// The longest a checkpoint waits for the writer and the readers.
const CHECKPOINT_WAIT: Duration = Duration::from_secs(1);

/// The WAL file past which a TRUNCATE checkpoint runs, by default (`storage.wal_limit_mb`).
pub(crate) const DEFAULT_WAL_LIMIT: u64 = crate::config::DEFAULT_WAL_LIMIT_MB as u64 * 1024 * 1024;

/// A PASSIVE checkpoint every [`CHECKPOINT_INTERVAL`], a TRUNCATE one whenever the WAL file
/// has grown past its bound. Dropping the value stops the thread after one last checkpoint.
pub(crate) struct Checkpointer {
    /// Never sent on: dropping it wakes the thread for its last round.
    _stop: SyncSender<()>,
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
        // A TRUNCATE checkpoint holds back new writes while it waits for the readers in
        // flight: it gives up well before the writer's own busy timeout would turn requests
        // into 503s, and tries again on the next round.
        conn.busy_timeout((busy_timeout / 4).min(CHECKPOINT_WAIT))?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        let wal = wal_path(Path::new(&path));
        let (stop, stopped) = mpsc::sync_channel::<()>(0);
        std::thread::Builder::new()
            .name("hookledger-checkpoint".into())
            .spawn(move || {
                let mut last_passive = Instant::now();
                loop {
                    let last = !matches!(
                        stopped.recv_timeout(SIZE_INTERVAL),
                        Err(mpsc::RecvTimeoutError::Timeout)
                    );
                    let size = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
                    let mode = if last || size > wal_limit {
                        "TRUNCATE"
                    } else if last_passive.elapsed() >= CHECKPOINT_INTERVAL {
                        "PASSIVE"
                    } else {
                        continue;
                    };
                    if let Err(e) = checkpoint(&conn, mode) {
                        log::warn!("WAL checkpoint ({mode}, WAL file {size} bytes) failed: {e}");
                    }
                    last_passive = Instant::now();
                    if last {
                        break;
                    }
                }
            })
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
        Ok(Checkpointer { _stop: stop })
    }
}

/// Runs one checkpoint in `mode`; a TRUNCATE one that could not finish (a reader or the
/// writer still busy past the busy timeout) is an error, and the next round tries again.
fn checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<()> {
    let busy: i64 = conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |row| {
        row.get(0)
    })?;
    if busy != 0 && mode != "PASSIVE" {
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
            Some("the writer or a reader stayed busy".into()),
        ));
    }
    Ok(())
}
