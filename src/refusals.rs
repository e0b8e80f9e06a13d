//! Refused webhook requests, kept for `/status`: the request path counts each refusal in
//! memory ([`Refusals::record`]: one short lock, no I/O), and a thread of its own writes what
//! was counted through the writer once a [`FLUSH`], as one job.
//!
//! # Bounds
//! A flood of refusals must not slow the accepted events nor grow without bound. In memory:
//! one bucket per source and reason (both finite: configured sources, `'static` kinds), each
//! with a count and at most [`MESSAGES_PER_FLUSH`] distinct messages of at most
//! [`MESSAGE_CHARS`]. In the database: at most that many rows per source and reason per flush,
//! rows older than [`KEEP_SECS`] deleted and each source capped at [`ROWS_PER_SOURCE`] rows, in
//! the same job. The writer sees one job a second at most, however many requests are refused.
//!
//! # Failure modes
//! A flush the writer cannot commit (database down) is logged and dropped: the counts in
//! `/metrics` still have them. A kill loses at most the last second's; a stop flushes it.

use std::collections::HashMap;
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::store::refusals::RefusalRow;
use crate::store::Write;
use crate::writer::{Background, WriterHandle};

/// How often what was counted is written: often enough that the page is current, rarely
/// enough that a flood costs the writer one small job a second.
pub(crate) const FLUSH: Duration = Duration::from_secs(1);
/// Distinct messages kept per source and reason and flush: the page shows the last three.
pub(crate) const MESSAGES_PER_FLUSH: usize = 3;
/// A message is cut to this: hookledger's own sentences fit, nothing else can grow a row.
pub(crate) const MESSAGE_CHARS: usize = 300;
/// Refusals are kept a day: `/status` shows 15 minutes, a day is for looking back at a night.
pub(crate) const KEEP_SECS: i64 = 86_400;
/// Rows kept per source at most (a flood keeps its newest).
pub(crate) const ROWS_PER_SOURCE: i64 = 2_000;
/// The source refusals for a name no source has are kept under (as `/metrics` counts them):
/// one bucket, whatever names are asked for.
pub(crate) const UNKNOWN_SOURCE: &str = "-";

#[derive(Debug, Default)]
struct Bucket {
    count: i64,
    /// (when last seen, message, how many of `count` had it).
    messages: Vec<(i64, String, i64)>,
}

/// Refusals counted since the last flush.
#[derive(Debug, Default)]
pub(crate) struct Refusals {
    pending: Mutex<HashMap<(Arc<str>, &'static str), Bucket>>,
}

impl Refusals {
    /// Counts one refusal of `source` for `reason` at `at`; `message` is called only when the
    /// bucket keeps another message.
    pub(crate) fn record(
        &self,
        source: &Arc<str>,
        reason: &'static str,
        at: i64,
        message: impl FnOnce() -> String,
    ) {
        let Ok(mut pending) = self.pending.lock() else {
            return;
        };
        let bucket = pending.entry((source.clone(), reason)).or_default();
        bucket.count += 1;
        if bucket.messages.len() < MESSAGES_PER_FLUSH {
            let text = clean(&message());
            match bucket.messages.iter_mut().find(|(_, m, _)| *m == text) {
                Some(same) => {
                    same.0 = at;
                    same.2 += 1;
                }
                None => bucket.messages.push((at, text, 1)),
            }
        } else if let Some(last) = bucket.messages.last_mut() {
            // Counted with the last message kept: the total per reason stays exact.
            last.0 = at;
            last.2 += 1;
        }
    }

    /// Counts one request for `name`, which no source has.
    pub(crate) fn record_unknown(&self, name: &str, at: i64) {
        let unknown: Arc<str> = Arc::from(UNKNOWN_SOURCE);
        self.record(&unknown, "unknown_source", at, || {
            format!(
                "POST /webhooks/{name}: no source has that name; check the URL set at the provider"
            )
        });
    }

    /// What was counted since the last call, as rows, and an empty count.
    pub(crate) fn take(&self) -> Vec<RefusalRow> {
        let taken = match self.pending.lock() {
            Ok(mut pending) => std::mem::take(&mut *pending),
            Err(_) => return Vec::new(),
        };
        let mut rows = Vec::new();
        for ((source, reason), bucket) in taken {
            for (at, message, count) in bucket.messages {
                rows.push(RefusalRow {
                    source: source.to_string(),
                    reason: reason.to_string(),
                    at,
                    count,
                    message,
                });
            }
        }
        rows.sort_by(|a, b| (a.at, &a.source).cmp(&(b.at, &b.source)));
        rows
    }
}

/// `text` on one line, without control characters, at most [`MESSAGE_CHARS`] characters.
fn clean(text: &str) -> String {
    let mut out: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MESSAGE_CHARS)
        .collect();
    if text.chars().count() > MESSAGE_CHARS {
        out.push('…');
    }
    out
}

/// The thread that writes the counted refusals.
pub(crate) struct Flusher {
    /// Never sent on: dropping it (in `stop`) wakes the thread, which flushes and ends.
    stop: SyncSender<()>,
    thread: JoinHandle<()>,
}

impl Flusher {
    pub(crate) fn spawn(refusals: Arc<Refusals>, writer: WriterHandle) -> anyhow::Result<Flusher> {
        let (stop, stopped) = mpsc::sync_channel::<()>(0);
        let thread = std::thread::Builder::new()
            .name("hookledger-refusals".into())
            .spawn(move || loop {
                let last = !matches!(stopped.recv_timeout(FLUSH), Err(RecvTimeoutError::Timeout));
                flush(&refusals, &writer);
                if last {
                    break;
                }
            })?;
        Ok(Flusher { stop, thread })
    }
}

fn flush(refusals: &Refusals, writer: &WriterHandle) {
    let rows = refusals.take();
    if rows.is_empty() {
        return;
    }
    let now = crate::time::unix_now();
    let write = Write::Refusals {
        rows,
        before: now - KEEP_SECS,
        cap: ROWS_PER_SOURCE,
    };
    if let Err(e) = writer.run_blocking(write) {
        log::error!("refusals: not kept for /status: {e}");
    }
}

impl Background for Flusher {
    fn stop(self: Box<Self>) {
        drop(self.stop);
        if self.thread.join().is_err() {
            log::error!("refusals thread panicked");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_keeps_its_count_in_a_few_rows_with_short_clean_messages() {
        let refusals = Refusals::default();
        let stripe: Arc<str> = "stripe".into();
        for i in 0..10_000 {
            refusals.record(&stripe, "invalid_signature", 100 + i % 7, || {
                format!("message {}", i % 50)
            });
        }
        refusals.record(&stripe, "invalid_event", 200, || {
            format!("a\nb{}", "x".repeat(1000))
        });
        let rows = refusals.take();
        let signature: Vec<_> = rows
            .iter()
            .filter(|r| r.reason == "invalid_signature")
            .collect();
        assert_eq!(signature.len(), MESSAGES_PER_FLUSH);
        assert_eq!(signature.iter().map(|r| r.count).sum::<i64>(), 10_000);
        let event = rows.iter().find(|r| r.reason == "invalid_event").unwrap();
        assert_eq!(event.count, 1);
        assert!(event.message.starts_with("a b"), "{}", event.message);
        assert_eq!(event.message.chars().count(), MESSAGE_CHARS + 1);
        assert!(refusals.take().is_empty());
    }
}
