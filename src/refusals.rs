//! Refused webhook requests, kept for `/status`: the request path counts each refusal in
//! memory ([`Refusals::record`]: short locks, no I/O, no formatting under a lock), and a
//! thread of its own writes what was counted through the writer once a [`FLUSH`], as one job.
//!
//! # Bounds
//! A flood of refusals must not slow the accepted events nor grow without bound. In memory:
//! one count per source, reason and minute (configured sources, `'static` kinds), and at most
//! [`MESSAGES_PER_FLUSH`] distinct messages of at most [`MESSAGE_CHARS`] per source and
//! reason. In the database: a count per source, reason and minute, added to (so the counts of
//! the last 15 minutes stay exact under any flood), and at most [`MESSAGES_KEPT`] messages per
//! source and reason; both pruned after [`KEEP_SECS`] in the same job. The writer sees one
//! job a second at most, however many requests are refused.
//!
//! # What a message may say
//! Only hookledger's own text about a client's fault (a wrong signature, a body it cannot
//! read). A server error's text can carry a value of the payload (a database's `DETAIL: Key
//! (email)=(…)`): for those only the kind is kept, and the text goes to the log.
//!
//! # Failure modes
//! A flush the writer cannot commit (database down) is logged and dropped: the counts in
//! `/metrics` still have them. A kill loses at most the last second's; a stop flushes it.

use std::collections::HashMap;
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::store::refusals::{RefusalCount, RefusalMessage};
use crate::store::Write;
use crate::writer::{Background, WriterHandle};

/// How often what was counted is written: often enough that the page is current, rarely
/// enough that a flood costs the writer one small job a second.
pub(crate) const FLUSH: Duration = Duration::from_secs(1);
/// Distinct messages kept per source and reason and flush: the page shows the last three.
pub(crate) const MESSAGES_PER_FLUSH: usize = 3;
/// Distinct messages kept in the database per source and reason (the newest): the page shows
/// three, a few more for a look back.
pub(crate) const MESSAGES_KEPT: i64 = 5;
/// A message is cut to this: hookledger's own sentences fit, nothing else can grow a row.
pub(crate) const MESSAGE_CHARS: usize = 300;
/// Refusals are kept a day: `/status` shows 15 minutes, a day is for looking back at a night.
/// At most a row per source, reason and minute: 1440 per source and reason.
pub(crate) const KEEP_SECS: i64 = 86_400;
/// The source refusals for a name no source has are kept under: `*` cannot be a source's
/// name (letters, digits, `-`, `_`), so it never mixes with one.
pub(crate) const UNKNOWN_SOURCE: &str = "*";
/// The longest name no source has that is shown in a message: a valid name is 64 at most.
const UNKNOWN_NAME_CHARS: usize = 64;

/// A source and a reason refusals are counted under.
type Key = (Arc<str>, &'static str);

/// Counted since the last flush.
#[derive(Debug, Default)]
struct Pending {
    /// (source, reason, minute) → (count, last at).
    counts: HashMap<(Arc<str>, &'static str, i64), (i64, i64)>,
    /// (source, reason) → (when last seen, message), at most [`MESSAGES_PER_FLUSH`].
    messages: HashMap<Key, Vec<(i64, String)>>,
}

/// Refusals counted since the last flush.
#[derive(Debug, Default)]
pub(crate) struct Refusals {
    pending: Mutex<Pending>,
}

impl Refusals {
    /// Counts one refusal of `source` for `reason` at `at`; `message` is called, outside the
    /// lock, only when this source and reason keep another message.
    pub(crate) fn record(
        &self,
        source: &Arc<str>,
        reason: &'static str,
        at: i64,
        message: impl FnOnce() -> String,
    ) {
        let wanted = {
            let Ok(mut pending) = self.pending.lock() else {
                return;
            };
            let counted = pending
                .counts
                .entry((source.clone(), reason, at.div_euclid(60)))
                .or_insert((0, at));
            counted.0 += 1;
            counted.1 = counted.1.max(at);
            pending
                .messages
                .get(&(source.clone(), reason))
                .is_none_or(|kept| kept.len() < MESSAGES_PER_FLUSH)
        };
        if !wanted {
            return;
        }
        let text = clean(&message());
        let Ok(mut pending) = self.pending.lock() else {
            return;
        };
        let kept = pending
            .messages
            .entry((source.clone(), reason))
            .or_default();
        if let Some(same) = kept.iter_mut().find(|(_, m)| *m == text) {
            same.0 = same.0.max(at);
        } else if kept.len() < MESSAGES_PER_FLUSH {
            kept.push((at, text));
        }
    }

    /// Counts one request for `name`, which no source has. The name is shown only when it
    /// could be a source's (a typo in the URL); anything else is not repeated.
    pub(crate) fn record_unknown(&self, name: &str, at: i64) {
        let unknown: Arc<str> = Arc::from(UNKNOWN_SOURCE);
        // Bounded before anything else looks at it: a name can be as long as a URL.
        let name: String = name.chars().take(UNKNOWN_NAME_CHARS + 1).collect();
        self.record(&unknown, "unknown_source", at, move || {
            if crate::config::is_valid_source_name(&name) {
                format!(
                    "POST /webhooks/{name}: no source has that name; check the URL set at the \
                     provider"
                )
            } else {
                "POST /webhooks/(not a valid source name): no source has that name; check the \
                 URL set at the provider"
                    .to_string()
            }
        });
    }

    /// What was counted since the last call, and an empty count.
    pub(crate) fn take(&self) -> (Vec<RefusalCount>, Vec<RefusalMessage>) {
        let taken = match self.pending.lock() {
            Ok(mut pending) => std::mem::take(&mut *pending),
            Err(_) => return (Vec::new(), Vec::new()),
        };
        let mut counts: Vec<RefusalCount> = taken
            .counts
            .into_iter()
            .map(
                |((source, reason, minute), (count, last_at))| RefusalCount {
                    source: source.to_string(),
                    reason: reason.to_string(),
                    minute,
                    count,
                    last_at,
                },
            )
            .collect();
        counts.sort_by(|a, b| {
            (&a.source, &a.reason, a.minute).cmp(&(&b.source, &b.reason, b.minute))
        });
        let mut messages = Vec::new();
        for ((source, reason), kept) in taken.messages {
            for (at, message) in kept {
                messages.push(RefusalMessage {
                    source: source.to_string(),
                    reason: reason.to_string(),
                    at,
                    message,
                });
            }
        }
        messages.sort_by(|a, b| (a.at, &a.source).cmp(&(b.at, &b.source)));
        (counts, messages)
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
    let (counts, messages) = refusals.take();
    if counts.is_empty() {
        return;
    }
    let now = crate::time::unix_now();
    let write = Write::Refusals {
        counts,
        messages,
        before: now - KEEP_SECS,
        messages_kept: MESSAGES_KEPT,
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
    fn a_flood_keeps_its_exact_count_by_minute_and_a_few_short_clean_messages() {
        let refusals = Refusals::default();
        let stripe: Arc<str> = "stripe".into();
        for i in 0..10_000 {
            // Minutes 1 and 2: 120 + i % 7 spans 120..=126, 60 + i % 3 spans 60..=62.
            let at = if i % 2 == 0 { 120 + i % 7 } else { 60 + i % 3 };
            refusals.record(&stripe, "invalid_signature", at, || {
                format!("message {}", i % 50)
            });
        }
        refusals.record(&stripe, "invalid_event", 200, || {
            format!("a\nb{}", "x".repeat(1000))
        });
        let (counts, messages) = refusals.take();
        let signature: Vec<(i64, i64, i64)> = counts
            .iter()
            .filter(|r| r.reason == "invalid_signature")
            .map(|r| (r.minute, r.count, r.last_at))
            .collect();
        assert_eq!(signature, [(1, 5_000, 62), (2, 5_000, 126)]);
        let kept: Vec<&str> = messages
            .iter()
            .filter(|m| m.reason == "invalid_signature")
            .map(|m| m.message.as_str())
            .collect();
        assert_eq!(kept.len(), MESSAGES_PER_FLUSH, "{kept:?}");
        let event = messages
            .iter()
            .find(|r| r.reason == "invalid_event")
            .unwrap();
        assert!(event.message.starts_with("a b"), "{}", event.message);
        assert_eq!(event.message.chars().count(), MESSAGE_CHARS + 1);
        let (counts, messages) = refusals.take();
        assert!(counts.is_empty() && messages.is_empty());
    }

    #[test]
    fn an_unknown_name_is_shown_only_when_it_could_be_a_source_name() {
        let refusals = Refusals::default();
        refusals.record_unknown("strpie", 10);
        refusals.record_unknown(&format!("<script>{}", "x".repeat(10_000)), 11);
        refusals.record_unknown(&"a".repeat(65), 12);
        let (counts, messages) = refusals.take();
        assert_eq!(counts.len(), 1);
        assert_eq!(
            (counts[0].source.as_str(), counts[0].count),
            (UNKNOWN_SOURCE, 3)
        );
        assert!(!crate::config::is_valid_source_name(UNKNOWN_SOURCE));
        let texts: Vec<&str> = messages.iter().map(|m| m.message.as_str()).collect();
        assert_eq!(texts.len(), 2, "{texts:?}");
        assert!(texts[0].starts_with("POST /webhooks/strpie: "), "{texts:?}");
        assert!(
            texts[1].starts_with("POST /webhooks/(not a valid source name): "),
            "{texts:?}"
        );
    }
}
