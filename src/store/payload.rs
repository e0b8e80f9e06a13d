//! Stored payloads on every store: the one lookup of an event's payload by its key, reading
//! a stored payload back (`crate::payload` decompresses), and the dictionaries' table.

use std::sync::Arc;

use crate::payload::{self, Dictionary, Unreadable};
use crate::sql::{Dialect, Row, Session, StoreError};
use crate::store::ledger;

/// The stored payload of event `key` of `source`, as the body it was: `Ok(None)` when there
/// is no such event, or its payload was cleared. The one place an event's payload is found by
/// its key (the outbox worker's forward rows). On SQLite the newest block of the key index is
/// sought first ([`ledger::sqlite_newest_first`]): a forward row is mostly delivered soon
/// after its event was claimed.
pub(crate) fn event_payload(
    conn: &dyn Session,
    source: &str,
    key: &str,
) -> anyhow::Result<Option<Vec<u8>>> {
    const COLUMNS: &str = "payload, payload_codec, payload_dict";
    let rows = match conn.dialect() {
        Dialect::Sqlite => ledger::sqlite_newest_first(conn, COLUMNS, source, key)?,
        Dialect::Postgres => conn.query(
            &ledger::by_key(conn.dialect(), COLUMNS, "$1", "$2"),
            &[&source, &key],
        )?,
    };
    match rows.first() {
        Some(row) => read(conn, row, 0),
        None => Ok(None),
    }
}

/// An outbox row's payload as it stores it.
pub(crate) struct OutboxPayload {
    pub(crate) payload: Vec<u8>,
    /// The payload is its event's (`payload_ref = 1`).
    pub(crate) refers: bool,
    pub(crate) source: String,
    pub(crate) key: String,
}

impl OutboxPayload {
    /// The body to deliver; an error (the row cannot be delivered) when it refers to an event
    /// whose payload is gone or unreadable.
    pub(crate) fn payload(self, conn: &dyn Session) -> anyhow::Result<Vec<u8>> {
        if !self.refers {
            return Ok(self.payload);
        }
        event_payload(conn, &self.source, &self.key)?.ok_or_else(|| {
            Unreadable(format!(
                "event {} of source {} has no payload in the ledger",
                self.key, self.source
            ))
            .into()
        })
    }
}

/// The columns [`body_size`] reads: the stored length, the codec and the start of a frame.
pub(crate) const SIZE: &str = "length(payload), payload_codec, substr(payload, 1, 18)";

/// The size of the body stored in columns `at`.. of `row` (as selected by [`SIZE`]), without
/// decompressing it: a zstd frame says in its header; `None` when the payload was cleared.
pub(crate) fn body_size(row: &Row, at: usize) -> Result<Option<i64>, StoreError> {
    let Some(stored) = row.get::<Option<i64>>(at)? else {
        return Ok(None);
    };
    if row.get::<Option<i64>>(at + 1)? != Some(payload::ZSTD) {
        return Ok(Some(stored));
    }
    let head = row.get::<Option<Vec<u8>>>(at + 2)?.unwrap_or_default();
    Ok(Some(
        payload::content_size(&head).map_or(stored, |n| n as i64),
    ))
}

/// The payload in columns `at` (payload), `at + 1` (codec) and `at + 2` (dictionary) of
/// `row`, as the body it was; `None` when cleared.
pub(crate) fn read(conn: &dyn Session, row: &Row, at: usize) -> anyhow::Result<Option<Vec<u8>>> {
    let Some(bytes) = row.get::<Option<Vec<u8>>>(at)? else {
        return Ok(None);
    };
    let codec = row.get::<Option<i64>>(at + 1)?;
    let dict = row.get::<Option<i64>>(at + 2)?;
    Ok(Some(payload::decompress(bytes, codec, dict, |id| {
        dictionary(conn, id).map_err(|e| e.to_string())
    })?))
}

/// The bytes of dictionary `id`, if stored.
pub(crate) fn dictionary(conn: &dyn Session, id: i64) -> Result<Option<Vec<u8>>, StoreError> {
    conn.query(
        "SELECT dict FROM hookledger_payload_dicts WHERE id = $1",
        &[&id],
    )?
    .first()
    .map(|r| r.get::<Vec<u8>>(0))
    .transpose()
}

/// The dictionary `source` compresses with, if it has one.
pub(crate) fn dictionary_of(
    conn: &dyn Session,
    source: &str,
) -> anyhow::Result<Option<Arc<Dictionary>>> {
    let rows = conn.query(
        "SELECT dict FROM hookledger_payload_dicts WHERE source = $1",
        &[&source],
    )?;
    match rows.first() {
        Some(r) => Ok(Some(Arc::new(Dictionary::new(&r.get::<Vec<u8>>(0)?)?))),
        None => Ok(None),
    }
}

/// A body larger than this is no sample: a dictionary is for the many small bodies, and `n`
/// samples must fit in memory at once. Both its stored size and its size once decompressed
/// are bounded: a 10 MiB body of one repeated byte is stored in a few hundred bytes.
const MAX_SAMPLE: i64 = 64 * 1024;

/// Whether `source` has at least `n` stored payloads that may be samples, without reading
/// one: the trainer looks often, and its samples are read only once there may be enough.
pub(crate) fn has_samples(conn: &dyn Session, source: &str, n: i64) -> anyhow::Result<bool> {
    let rows = conn.query(
        "SELECT count(*) FROM (SELECT 1 FROM webhook_events
         WHERE source = $1 AND payload IS NOT NULL AND length(payload) <= $3 LIMIT $2) AS s",
        &[&source, &n, &MAX_SAMPLE],
    )?;
    let found = rows.first().map(|r| r.get::<i64>(0)).transpose()?;
    Ok(found.unwrap_or(0) >= n)
}

/// Up to `n` stored payloads of `source` (of at most [`MAX_SAMPLE`] bytes, stored and as the
/// body), as the bodies they were, to train on. A body over the bound is skipped by the size
/// its frame's header states, before it is decompressed.
pub(crate) fn samples(conn: &dyn Session, source: &str, n: i64) -> anyhow::Result<Vec<Vec<u8>>> {
    let rows = conn.query(
        &format!(
            "SELECT payload, payload_codec, payload_dict, {SIZE} FROM webhook_events
             WHERE source = $1 AND payload IS NOT NULL AND length(payload) <= $3
             ORDER BY received_at DESC LIMIT $2"
        ),
        &[&source, &n, &MAX_SAMPLE],
    )?;
    let mut samples = Vec::with_capacity(rows.len());
    for row in &rows {
        if body_size(row, 3)?.is_none_or(|size| size > MAX_SAMPLE) {
            continue;
        }
        // One unreadable payload is not a reason to have no dictionary.
        if let Ok(Some(body)) = read(conn, row, 0) {
            samples.push(body);
        }
    }
    Ok(samples)
}

/// Stores `dict` as the dictionary of `source`, unless it has one already (another instance
/// trained one first: its own is kept, and rows made with either can be read). Whether it
/// was stored.
pub(crate) fn store_dictionary(
    tx: &dyn Session,
    source: &str,
    dict: &[u8],
    now: i64,
) -> Result<u64, StoreError> {
    let id = Dictionary::new(dict)
        .map_err(|e: Unreadable| StoreError::Database(e.to_string()))?
        .id;
    // A source has one dictionary, never replaced: rows made with it must stay readable.
    tx.execute(
        "INSERT INTO hookledger_payload_dicts (id, source, dict, created_at)
         VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
        &[&id, &source, &dict, &now],
    )
}
