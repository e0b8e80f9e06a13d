//! `serve`'s heartbeat: every [`EVERY`] the time is written to `hookledger_heartbeat` through
//! the writer (as `/readyz` writes it), so the row says when an instance was last up. At
//! start-up, before the first beat, [`downtime`] reads it: a gap of more than [`DOWN_AFTER`]
//! before this start is a time no instance was up (with several instances on PostgreSQL the
//! row is theirs together), shown on the console beside what the recoveries found since.
//!
//! Failure modes: a beat that fails (the database down, busy, full) is logged (one line a beat
//! at most) and tried again at the next; it never stops `serve`, nor does a row that cannot be
//! read at the start (then no downtime is shown). A database that never had a beat shows no
//! downtime; the first start after an upgrade from a hookledger without the heartbeat shows
//! the time since `/readyz` last wrote the row, if it ever did.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::metrics::Downtime;
use crate::store::{Reader, Write};
use crate::writer::{Background, WriterHandle};

/// How often the heartbeat is written.
pub(crate) const EVERY: Duration = Duration::from_secs(30);

/// A gap between the last beat and a start longer than this (seconds) was downtime: three
/// beats missed, more than a restart in place takes.
pub(crate) const DOWN_AFTER: i64 = 90;

/// The last time no instance was up before `now`, from the heartbeat row.
pub(crate) fn downtime(reader: &Reader, now: i64) -> anyhow::Result<Option<Downtime>> {
    let last = reader.read(|conn| {
        let rows = conn.query("SELECT at FROM hookledger_heartbeat WHERE id = 1", &[])?;
        Ok(match rows.first() {
            Some(row) => Some(row.get::<i64>(0)?),
            None => None,
        })
    })?;
    let Some(last) = last else { return Ok(None) };
    Ok((now - last > DOWN_AFTER).then_some(Downtime {
        from: last,
        to: now,
    }))
}

/// The thread that writes the heartbeat.
pub(crate) struct Heartbeat {
    stop: mpsc::SyncSender<()>,
    thread: JoinHandle<()>,
}

impl Heartbeat {
    /// Starts beating at once, then every [`EVERY`].
    pub(crate) fn spawn(writer: WriterHandle) -> anyhow::Result<Heartbeat> {
        let (stop, stopped) = mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("hookledger-heartbeat".into())
            .spawn(move || loop {
                let at = crate::time::unix_now();
                if let Err(e) = writer.run_blocking(Write::Heartbeat { at }) {
                    log::warn!("heartbeat: not written: {e}");
                }
                match stopped.recv_timeout(EVERY) {
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
                }
            })
            .map_err(|e| anyhow::anyhow!("cannot start the heartbeat thread: {e}"))?;
        Ok(Heartbeat { stop, thread })
    }
}

impl Background for Heartbeat {
    fn stop(self: Box<Self>) {
        let _ = self.stop.try_send(());
        if self.thread.join().is_err() {
            log::error!("heartbeat thread panicked");
        }
    }
}
