//! Refused webhook requests, kept in `hookledger_refusals` (counts per source, reason and
//! minute) and `hookledger_refusal_messages` (the last few distinct messages per source and
//! reason) for `/status`: written in batches by the refusal recorder (`crate::refusals`,
//! through the writer), read by the console (`console.rs`). The same SQL on every store.

use crate::sql::{Session, StoreError};

/// Refusals of one source for one reason in one minute, between two flushes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RefusalCount {
    pub(crate) source: String,
    /// The error kind the request was answered with (`invalid_signature`, …).
    pub(crate) reason: String,
    /// Unix seconds / 60.
    pub(crate) minute: i64,
    /// How many requests.
    pub(crate) count: i64,
    /// Unix seconds of the last of them.
    pub(crate) last_at: i64,
}

/// A message a refusal of one source for one reason was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RefusalMessage {
    pub(crate) source: String,
    pub(crate) reason: String,
    /// Unix seconds of the last refusal with it.
    pub(crate) at: i64,
    /// hookledger's own text about the refusal (never the body, never a secret).
    pub(crate) message: String,
}

/// Adds `counts` to the kept counts, keeps `messages` (at most `messages_kept` per source and
/// reason, the newest), and deletes what was refused before `before`. Returns the counts and
/// messages written.
pub(crate) fn record(
    tx: &dyn Session,
    counts: &[RefusalCount],
    messages: &[RefusalMessage],
    before: i64,
    messages_kept: i64,
) -> Result<u64, StoreError> {
    let mut written = 0;
    for c in counts {
        // Added to, not inserted: a flood is one row a minute per source and reason, and its
        // count stays exact however long it lasts.
        written += tx.execute(
            "INSERT INTO hookledger_refusals (source, reason, minute, count, last_at)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (source, reason, minute) DO UPDATE
             SET count = hookledger_refusals.count + excluded.count,
                 last_at = CASE WHEN excluded.last_at > hookledger_refusals.last_at
                           THEN excluded.last_at ELSE hookledger_refusals.last_at END",
            &[&c.source, &c.reason, &c.minute, &c.count, &c.last_at],
        )?;
    }
    for m in messages {
        // A message seen again moves forward rather than taking a row of its own.
        written += tx.execute(
            "INSERT INTO hookledger_refusal_messages (source, reason, at, message)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (source, reason, message) DO UPDATE
             SET at = CASE WHEN excluded.at > hookledger_refusal_messages.at
                      THEN excluded.at ELSE hookledger_refusal_messages.at END",
            &[&m.source, &m.reason, &m.at, &m.message],
        )?;
    }
    let minute = before.div_euclid(60);
    tx.execute(
        "DELETE FROM hookledger_refusals WHERE minute < $1",
        &[&minute],
    )?;
    tx.execute(
        "DELETE FROM hookledger_refusal_messages WHERE at < $1",
        &[&before],
    )?;
    let mut kinds: Vec<(&str, &str)> = messages
        .iter()
        .map(|m| (m.source.as_str(), m.reason.as_str()))
        .collect();
    kinds.sort_unstable();
    kinds.dedup();
    for (source, reason) in kinds {
        // All but the newest `messages_kept` of this source and reason (a handful of rows).
        tx.execute(
            "DELETE FROM hookledger_refusal_messages WHERE source = $1 AND reason = $2
                 AND id NOT IN (SELECT id FROM hookledger_refusal_messages
                                WHERE source = $1 AND reason = $2
                                ORDER BY at DESC, id DESC LIMIT $3)",
            &[&source, &reason, &messages_kept],
        )?;
    }
    Ok(written)
}
