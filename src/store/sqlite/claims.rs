//! The claim on SQLite: whether an event is new, at a cost that does not depend on where its
//! id falls in the key order.
//!
//! `webhook_events_key` is unique on `(received_at / 86400, source, event_id)`: a claim
//! inserts into today's part of the index, the hot pages, whatever its id. An in-memory
//! [`Bloom`] filter of every key in the ledger answers "certainly new" for almost every new
//! event: then the claim is one `INSERT … ON CONFLICT DO NOTHING`. Only on "maybe" (a resend,
//! or one false positive in ~10,000) does the claim seek the index once for each day the
//! ledger holds, today's first, then newest first, before it inserts. It all runs in the
//! writer's `BEGIN IMMEDIATE` transaction, which no other connection can write in: the seek
//! and the insert see the same ledger.
//!
//! ## What keeps the filter whole
//! - Every claim this connection makes is added (a claim rolled back later stays in it: a
//!   false positive, never a false negative).
//! - Claims other connections add (the CLI, a `sqlite3` shell, another program filling the
//!   ledger) change `PRAGMA data_version`, read at the start of each of the writer's
//!   transactions: then the claims past the highest `id` the filter has seen are added (ids
//!   are AUTOINCREMENT: never reused), and the days are read again (an `UPDATE` may have moved
//!   a claim to another day).
//! - A store without a filter (a CLI command's, or one that is still building) seeks every
//!   day on every claim: slower, as exact.
//!
//! A key rewritten in place by another program (`UPDATE … SET event_id`) is not seen; the
//! ledger is hookledger's, and handlers may not change it.

use std::collections::BTreeSet;
use std::time::Instant;

use rusqlite::Connection;

use super::bloom::{key_hash, Bloom};
use crate::event::Event;
use crate::payload::Stored;
use crate::sql::StoreError;
use crate::store::ledger::{day_of, SQLITE_CLAIMED_ON, SQLITE_DAYS};

/// Room for new claims in a filter built for a ledger of `n`: half again as many (at least a
/// million) before it fills up and is built again, larger.
fn capacity_for(n: u64) -> u64 {
    n + (n / 2).max(1 << 20)
}

/// What the writer knows of the ledger's keys, between its transactions.
pub(crate) struct Claims {
    /// Every key in the ledger (and a few no longer there); `None`: seek every day.
    filter: Option<Bloom>,
    /// The days the ledger holds claims of (and perhaps a few it no longer does).
    days: BTreeSet<i64>,
    /// The highest `id` the filter and the days cover.
    seen: i64,
    /// `PRAGMA data_version` when this connection last caught up: a new value means another
    /// connection committed.
    data_version: i64,
    /// The highest `id` of the open transaction, read before its COMMIT; `seen` once it
    /// commits.
    pending: Option<i64>,
    /// A claim was made in the open transaction.
    claimed: bool,
}

impl Claims {
    /// Reads the days, and with `filter`, every key of the ledger into a new filter (the
    /// writer's store; a CLI command's does without).
    pub(crate) fn open(conn: &Connection, filter: bool) -> rusqlite::Result<Claims> {
        let mut claims = Claims {
            filter: None,
            days: BTreeSet::new(),
            seen: 0,
            data_version: 0,
            pending: None,
            claimed: false,
        };
        claims.load(conn, filter)?;
        Ok(claims)
    }

    /// Reads the ledger again from the start, with a filter if it had one: after writes to it
    /// on this connection other than claims (an app's migration).
    pub(crate) fn reload(&mut self, conn: &Connection) -> rusqlite::Result<()> {
        let filter = self.filter.is_some();
        self.load(conn, filter)
    }

    /// Reads the ledger from the start, in one read transaction (unless one is open).
    fn load(&mut self, conn: &Connection, filter: bool) -> rusqlite::Result<()> {
        let own = conn.is_autocommit();
        if own {
            conn.execute_batch("BEGIN")?;
        }
        let loaded = self.load_in(conn, filter);
        if own {
            conn.execute_batch("COMMIT")?;
        }
        loaded
    }

    fn load_in(&mut self, conn: &Connection, filter: bool) -> rusqlite::Result<()> {
        let started = Instant::now();
        self.data_version = data_version(conn)?;
        self.seen = max_id(conn)?;
        self.read_days(conn)?;
        if !filter {
            self.filter = None;
            return Ok(());
        }
        // At least the claims there are (ids only grow), without a second pass over them.
        let n: i64 = conn.query_row(
            "SELECT coalesce(max(id) - min(id) + 1, 0) FROM webhook_events",
            [],
            |r| r.get(0),
        )?;
        let mut bloom = Bloom::with_capacity(capacity_for(n as u64));
        let mut keys = conn.prepare("SELECT source, event_id FROM webhook_events")?;
        let mut rows = keys.query([])?;
        let mut claims = 0u64;
        while let Some(row) = rows.next()? {
            bloom.insert(key_hash(
                row.get_ref(0)?.as_str()?,
                row.get_ref(1)?.as_str()?,
            ));
            claims += 1;
        }
        log::info!(
            "ledger: filter of {claims} claim(s) built in {:.1} s ({} MiB)",
            started.elapsed().as_secs_f64(),
            bloom.bytes() >> 20
        );
        self.filter = Some(bloom);
        Ok(())
    }

    fn read_days(&mut self, conn: &Connection) -> rusqlite::Result<()> {
        let mut days = conn.prepare_cached(SQLITE_DAYS)?;
        self.days = days
            .query_map([], |r| r.get::<_, i64>(0))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(())
    }

    /// At the start of each of the writer's transactions (the write lock held): takes in what
    /// other connections committed since this one last looked.
    pub(crate) fn begin(&mut self, conn: &Connection) -> rusqlite::Result<()> {
        self.pending = None;
        self.claimed = false;
        if self.filter.as_ref().is_some_and(Bloom::is_full) {
            return self.load(conn, true);
        }
        let version = data_version(conn)?;
        if version == self.data_version {
            return Ok(());
        }
        self.data_version = version;
        self.read_days(conn)?;
        let mut added = conn.prepare_cached(
            "SELECT id, source, event_id FROM webhook_events WHERE id > ?1 ORDER BY id",
        )?;
        let mut rows = added.query([self.seen])?;
        while let Some(row) = rows.next()? {
            self.seen = self.seen.max(row.get(0)?);
            if let Some(filter) = &mut self.filter {
                filter.insert(key_hash(
                    row.get_ref(1)?.as_str()?,
                    row.get_ref(2)?.as_str()?,
                ));
            }
        }
        Ok(())
    }

    /// Claims `event`, received at `now`, in the open transaction: true if it is new.
    pub(crate) fn claim(
        &mut self,
        conn: &Connection,
        event: &Event,
        stored: &Stored,
        now: i64,
    ) -> Result<bool, StoreError> {
        let hash = key_hash(&event.source, &event.id);
        let today = day_of(now);
        // "Maybe": one seek a day, today first, then newest first (a resend comes soon after
        // its first copy, mostly). Seeking before inserting, not inserting then deleting: a
        // duplicate writes nothing (an ignored insert would still advance the AUTOINCREMENT
        // counter). No other connection can write between the seek and the insert: this is
        // the writer's `BEGIN IMMEDIATE` transaction.
        if self.filter.as_ref().is_none_or(|f| f.may_contain(hash)) {
            let mut seek = conn.prepare_cached(SQLITE_CLAIMED_ON)?;
            let others = self.days.iter().rev().copied().filter(|&d| d != today);
            for day in std::iter::once(today).chain(others) {
                if seek.exists(rusqlite::params![day, &*event.source, &event.id])? {
                    return Ok(false);
                }
            }
        }
        // Within a day the key decides, also if the filter and the days were ever wrong.
        let inserted = conn
            .prepare_cached(
                "INSERT INTO webhook_events
                     (source, event_id, event_type, created, received_at, payload,
                      payload_codec, payload_dict)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                 ON CONFLICT DO NOTHING",
            )?
            .execute(rusqlite::params![
                &*event.source,
                &event.id,
                &event.kind,
                &event.created,
                now,
                &stored.bytes,
                &stored.codec,
                &stored.dict
            ])?;
        if inserted == 0 {
            return Ok(false);
        }
        self.claimed = true;
        if let Some(filter) = &mut self.filter {
            filter.insert(hash);
        }
        self.days.insert(today);
        Ok(true)
    }

    /// Before the COMMIT of a transaction that claimed: notes its highest id.
    pub(crate) fn before_commit(&mut self, conn: &Connection) -> rusqlite::Result<()> {
        if self.claimed {
            self.pending = Some(max_id(conn)?);
        }
        Ok(())
    }

    /// After the COMMIT: the filter has seen every id up to the transaction's highest.
    pub(crate) fn committed(&mut self) {
        if let Some(id) = self.pending.take() {
            self.seen = self.seen.max(id);
        }
    }

    /// After retention deleted claims: forgets the days older than the oldest claim left.
    pub(crate) fn pruned(&mut self, conn: &Connection) -> rusqlite::Result<()> {
        let oldest: Option<i64> =
            conn.query_row("SELECT min(received_at) FROM webhook_events", [], |r| {
                r.get(0)
            })?;
        match oldest {
            Some(at) => self.days = self.days.split_off(&day_of(at)),
            None => self.days.clear(),
        }
        Ok(())
    }

    #[cfg(test)]
    pub(crate) fn has_filter(&self) -> bool {
        self.filter.is_some()
    }
}

fn data_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("PRAGMA data_version", [], |r| r.get(0))
}

fn max_id(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("SELECT coalesce(max(id), 0) FROM webhook_events", [], |r| {
        r.get(0)
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::DEFAULT_BUSY_TIMEOUT;
    use crate::event::Event;
    use crate::handler::Submission;
    use crate::store::sqlite::SqliteStore;
    use crate::store::{Done, Outcome, Store, Work};

    fn claim(store: &mut SqliteStore, id: &str, now: i64) -> Outcome {
        let work = Work::Event(Submission {
            event: Event {
                source: "src".into(),
                id: id.into(),
                kind: "thing.happened".into(),
                created: Some(1),
                body: bytes::Bytes::from_static(b"{}"),
            },
            handlers: Vec::new(),
            forward: false,
            stored: None,
        });
        match store.run_batch(vec![work], now).unwrap().pop() {
            Some(Done::Event(Ok(outcome))) => outcome,
            _ => panic!("one event in, its outcome out"),
        }
    }

    /// Claims written by other code before the store opened, one a day over 30 days.
    fn prefilled(path: &Path) {
        drop(SqliteStore::open(path, DEFAULT_BUSY_TIMEOUT).unwrap());
        let conn = rusqlite::Connection::open(path).unwrap();
        for day in 0..30 {
            conn.execute(
                "INSERT INTO webhook_events (source, event_id, event_type, created, received_at)
                 VALUES ('src', ?1, 't', 1, ?2)",
                rusqlite::params![format!("evt_{day}"), 20_000 * 86_400 + day * 86_400],
            )
            .unwrap();
        }
    }

    const LATER: i64 = 20_100 * 86_400;

    #[test]
    fn the_writers_filter_holds_the_claims_in_the_ledger_when_it_opens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.db");
        prefilled(&path);
        let mut store = SqliteStore::open(&path, DEFAULT_BUSY_TIMEOUT).unwrap();
        assert!(store.claims.has_filter());
        assert_eq!(store.claims.days.len(), 30);
        for day in [0, 17, 29] {
            assert_eq!(
                claim(&mut store, &format!("evt_{day}"), LATER),
                Outcome::Duplicate
            );
        }
        assert_eq!(claim(&mut store, "evt_30", LATER), Outcome::Processed);
        assert_eq!(
            claim(&mut store, "evt_30", LATER + 86_400),
            Outcome::Duplicate
        );
        assert_eq!(store.claims.days.len(), 31);
    }

    /// A CLI command's store has no filter: it seeks every day, and is as exact.
    #[test]
    fn a_store_without_a_filter_seeks_every_day() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.db");
        prefilled(&path);
        let mut store = SqliteStore::open_existing(&path).unwrap();
        assert!(!store.claims.has_filter());
        assert_eq!(claim(&mut store, "evt_3", LATER), Outcome::Duplicate);
        assert_eq!(claim(&mut store, "evt_new", LATER), Outcome::Processed);
        assert_eq!(
            claim(&mut store, "evt_new", 20_000 * 86_400),
            Outcome::Duplicate
        );
    }

    /// Another connection's claims, and a claim it moved to another day, are seen at the
    /// writer's next transaction; a claim rolled back does not leave the filter behind on ids.
    #[test]
    fn the_filter_catches_up_on_what_other_connections_commit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.db");
        let mut store = SqliteStore::open(&path, DEFAULT_BUSY_TIMEOUT).unwrap();
        assert_eq!(claim(&mut store, "evt_mine", LATER), Outcome::Processed);
        let other = rusqlite::Connection::open(&path).unwrap();
        other
            .execute_batch(&format!(
                "INSERT INTO webhook_events (source, event_id, event_type, received_at)
                 VALUES ('src', 'evt_theirs', 't', {old});
                 UPDATE webhook_events SET received_at = {older} WHERE event_id = 'evt_mine';",
                old = LATER - 5 * 86_400,
                older = LATER - 9 * 86_400,
            ))
            .unwrap();
        assert_eq!(claim(&mut store, "evt_theirs", LATER), Outcome::Duplicate);
        assert_eq!(
            claim(&mut store, "evt_mine", LATER + 86_400),
            Outcome::Duplicate
        );
        let claims: i64 = other
            .query_row("SELECT count(*) FROM webhook_events", [], |r| r.get(0))
            .unwrap();
        assert_eq!(claims, 2);
    }
}
