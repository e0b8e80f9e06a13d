//! The WAL checkpointer: copies the WAL back into the database file on its own connection and
//! thread, off the commit path.

use std::sync::mpsc::{self, SyncSender};
use std::time::Duration;

use rusqlite::Connection;

/// How often the checkpointer copies the WAL back into the database file.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(500);

/// After a checkpoint resets the WAL, its file is shrunk back to this size.
const JOURNAL_SIZE_LIMIT: i64 = 64 * 1024 * 1024;

/// A PASSIVE checkpoint never blocks the writer or readers; it does what it can and the next
/// round does the rest. Dropping the value stops the thread after one last checkpoint.
pub(crate) struct Checkpointer {
    /// Never sent on: dropping it wakes the thread for its last round.
    _stop: SyncSender<()>,
}

impl Checkpointer {
    /// Turns off SQLite's automatic checkpoints on `writer` (they would run inside COMMIT)
    /// and starts the background thread on the same file.
    pub(crate) fn start(writer: &Connection, busy_timeout: Duration) -> rusqlite::Result<Self> {
        writer.pragma_update(None, "wal_autocheckpoint", 0)?;
        writer.pragma_update(None, "journal_size_limit", JOURNAL_SIZE_LIMIT)?;
        let conn = Connection::open(writer.path().unwrap_or_default())?;
        conn.busy_timeout(busy_timeout)?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        let (stop, stopped) = mpsc::sync_channel::<()>(0);
        std::thread::Builder::new()
            .name("hookledger-checkpoint".into())
            .spawn(move || loop {
                let last = !matches!(
                    stopped.recv_timeout(CHECKPOINT_INTERVAL),
                    Err(mpsc::RecvTimeoutError::Timeout)
                );
                if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                    log::warn!("WAL checkpoint failed: {e}");
                }
                if last {
                    break;
                }
            })
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
        Ok(Checkpointer { _stop: stop })
    }
}
