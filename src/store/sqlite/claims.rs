//! The claim on SQLite: whether an event is new, at a cost that does not depend on where its
//! id falls in the key order.
//!
//! `webhook_events_key` is unique on `(id >> 16, source, event_id)`: a block of 65,536
//! claims in arrival order, so a claim inserts into the newest block's part of the index, the
//! hot pages, whatever its event id and however the ledger was filled (by day, it was today's
//! part: a ledger filled by other code with one received time for all made that all of it).
//! An in-memory [`Bloom`] filter of every key in the ledger answers "certainly new" for
//! almost every new event: then the claim is one `INSERT … ON CONFLICT DO NOTHING`. Only on
//! "maybe" (a resend, or one false positive in ~10,000) does the claim seek the index once
//! for each block the ledger holds, newest first, before it inserts. It all runs in the
//! writer's `BEGIN IMMEDIATE` transaction, which no other connection can write in: the seek
//! and the insert see the same ledger.
//!
//! ## What keeps the filter whole
//! - Every claim this connection makes is added (a claim rolled back later stays in it: a
//!   false positive, never a false negative).
//! - Claims other connections add (the CLI, a `sqlite3` shell, another program filling the
//!   ledger) change `PRAGMA data_version`, read at the start of each of the writer's
//!   transactions: then the claims past the highest `id` the filter has seen are added (ids
//!   are AUTOINCREMENT: never reused), with their blocks (one a block of its own, say).
//! - A store without a filter (a CLI command's, or one that is still building) seeks every
//!   block on every claim: slower, as exact.
//! - A claim other code inserts with an id at or below the highest ever used (into a hole),
//!   or whose key or id it rewrites in place, is not past `seen`: migration 17's triggers,
//!   which fire for every writer, count it in `hookledger_ledger.rewrites`; read with
//!   `data_version`, a new count means reading the whole ledger again.
//! - A claim whose key is not UTF-8 text (a BLOB, invalid UTF-8: written by other code) is
//!   skipped and counted, never an error: no event hookledger receives has that key.
//!
//! ## Serving while the filter is built
//! Building the filter reads every key (about 20 s for 20 M claims). The writer's store does
//! not wait for it: it opens with the blocks alone and seeks every block on every claim (the
//! exact path a CLI command's store always takes), while a thread of its own reads the keys
//! on a read connection, in chunks of increasing `id` (each a short read transaction, so the
//! WAL is not held back), and hands the filter over ([`Building`]). At the start of its next
//! transaction the writer takes it and adds the claims past the highest id it read, as a
//! catch-up does. What the chunks could miss is what a catch-up misses (a claim written below
//! an id read, or a key rewritten): the triggers count it in `rewrites`, and a filter whose
//! build saw another count is dropped and built again. A claim deleted meanwhile stays in it:
//! a false positive.
//!
//! ## A restart without reading every claim
//! A clean restart need not read every key at all. So at a clean stop ([`Claims::save`]) the writer saves it, with `seen`, in
//! `hookledger_claims_filter`; the next start ([`Claims::open`]) loads it, deletes the row in
//! the same transaction, and adds the claims with `id > seen` (made after the save, by
//! anyone). Why that is the same filter a build would give: ids are AUTOINCREMENT, never
//! reused, so every claim with `id <= seen` existed at the save and is in the saved filter;
//! every later one has a higher id and is read; a claim deleted since is a false positive
//! (one seek), never a false negative.
//!
//! ## What a saved filter must match
//! A filter row is never trusted as it is read. It carries a SHA-256 checksum over its bits,
//! its parameters, the ledger's summary at the save (lowest and highest id, the highest id
//! ever used) and the ledger's identity (random bytes made with the ledger,
//! `hookledger_ledger`): a bit changed or a row copied from another database is refused. While
//! it is saved, the triggers mark it `stale` on any insert below an id used before, any key or
//! id rewritten, any delete, whoever writes. And what is cheap to check is checked: a lowest id
//! below the one saved, a highest id below `seen`, a sequence gone back, a schema migrated
//! since, the triggers gone, parameters or a size other than this release's filter has, and
//! more claims added since than it has room for (a bulk import while stopped: built once, at
//! the size the ledger now needs). Any of these: the row is deleted, the reason logged, and the
//! filter built from the ledger. `hookledger check` (`check.rs`) also verifies that a saved
//! filter it would load holds every key it covers.
//!
//! Deleting the row at the load means a filter is loaded once: after a crash (no clean stop,
//! no new row) the next start builds it from the ledger, as before there was a saved one.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;

use rusqlite::{Connection, OpenFlags, OptionalExtension};

use super::bloom::{key_hash, Bloom, FORMAT, HASHES};
use crate::event::Event;
use crate::payload::Stored;
use crate::sql::StoreError;
use crate::store::ledger::{block_of, SQLITE_BLOCKS, SQLITE_CLAIMED_IN};

/// Room for new claims in a filter built for a ledger of `n`: half again as many (at least a
/// million) before it fills up and is built again, larger.
fn capacity_for(n: u64) -> u64 {
    n + (n / 2).max(1 << 20)
}

/// A filter saved at a clean stop, as read back (`hookledger_claims_filter`).
struct Saved {
    seen: i64,
    min_id: i64,
    sequence: i64,
    schema_version: i64,
    format: i64,
    hashes: i64,
    size_bits: i64,
    capacity: i64,
    keys: i64,
    bits: Vec<u8>,
    checksum: Vec<u8>,
    stale: Option<String>,
}

impl Saved {
    /// The checksum a filter with these parameters and bits, saved of the ledger `identity`,
    /// carries: SHA-256 over all of them, so that a bit changed, a row of another ledger or a
    /// summary that is not the ledger's is refused.
    fn checksum(&self, identity: &[u8]) -> Vec<u8> {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update(b"hookledger claims filter\0");
        h.update((identity.len() as u64).to_le_bytes());
        h.update(identity);
        for n in [
            self.seen,
            self.min_id,
            self.sequence,
            self.schema_version,
            self.format,
            self.hashes,
            self.size_bits,
            self.capacity,
            self.keys,
        ] {
            h.update(n.to_le_bytes());
        }
        h.update(&self.bits);
        h.finalize().to_vec()
    }
}

/// The triggers (migration 17) that mark a saved filter stale and count the rewrites of the
/// ledger's keys: a saved filter is trusted only while all of them are there.
pub(crate) const TRIGGERS: [&str; 3] = [
    "hookledger_claim_below_sequence",
    "hookledger_claim_rewritten",
    "hookledger_claim_deleted",
];

/// What [`Claims::restore`] found.
enum Restored {
    /// No saved filter (a first start, or the last one did not stop cleanly).
    None,
    /// One that cannot be used, and why: deleted, and built again.
    Unfit(String),
    /// Loaded: the keys it held, and the claims added since its save.
    Loaded { saved: i64, added: u64 },
}

/// Whether and how a store's [`Claims`] gets a filter.
pub(crate) enum Filter {
    /// None: every claim seeks every block (a CLI command's store).
    Never,
    /// Built (or loaded) before the open returns (an in-memory database).
    Now,
    /// Loaded if one was saved, else built on a thread of its own from the database file at
    /// this path while the store serves without one (the writer's store).
    Behind(PathBuf),
}

/// What the writer knows of the ledger's keys, between its transactions.
pub(crate) struct Claims {
    /// Every key in the ledger (and a few no longer there); `None`: seek every block.
    filter: Option<Bloom>,
    /// The filter being built in the background, until the writer takes it.
    building: Option<Building>,
    /// The blocks the ledger holds claims of (and perhaps a few it no longer does).
    blocks: BTreeSet<i64>,
    /// The highest `id` the filter and the blocks cover.
    seen: i64,
    /// `PRAGMA data_version` when this connection last caught up: a new value means another
    /// connection committed.
    data_version: i64,
    /// The highest `id` of the open transaction, read before its COMMIT; `seen` once it
    /// commits.
    pending: Option<i64>,
    /// A claim was made in the open transaction.
    claimed: bool,
    /// `hookledger_ledger.rewrites` when this connection last read the ledger: another value
    /// means other code wrote a claim a catch-up past `seen` does not read.
    rewrites: i64,
    /// Claims whose key is not UTF-8 text (written by other code), skipped when last read.
    unreadable: u64,
    /// The filter was loaded from a save at the open, not built.
    #[cfg(test)]
    restored: bool,
}

impl Claims {
    /// Reads the blocks and, as `filter` says, a saved filter, every key of the ledger, or
    /// neither (then a build starts in the background, or none).
    pub(crate) fn open(conn: &Connection, filter: Filter) -> rusqlite::Result<Claims> {
        let mut claims = Claims {
            filter: None,
            building: None,
            blocks: BTreeSet::new(),
            seen: 0,
            data_version: 0,
            pending: None,
            claimed: false,
            rewrites: 0,
            unreadable: 0,
            #[cfg(test)]
            restored: false,
        };
        if !matches!(filter, Filter::Never) && claims.restore(conn) {
            #[cfg(test)]
            {
                claims.restored = true;
            }
            return Ok(claims);
        }
        match filter {
            Filter::Behind(path) => {
                claims.load(conn, false)?;
                claims.building = Some(Building::start(path, claims.seen)?);
            }
            filter => claims.load(conn, matches!(filter, Filter::Now))?,
        }
        Ok(claims)
    }

    /// Takes the filter built in the background if it is done (with `wait`, once it is):
    /// adds the claims made since its build read past them, or, when other code rewrote
    /// claims meanwhile (the build may have missed one), starts the build again.
    fn take_built(&mut self, conn: &Connection, wait: bool) -> rusqlite::Result<()> {
        let Some(building) = &self.building else {
            return Ok(());
        };
        let built = match wait {
            true => building.built.recv().ok(),
            false => match building.built.try_recv() {
                Ok(built) => Some(built),
                Err(mpsc::TryRecvError::Empty) => return Ok(()),
                Err(mpsc::TryRecvError::Disconnected) => None,
            },
        };
        self.building = None;
        match built {
            Some(Ok(built)) => self.install(conn, built),
            Some(Err(e)) => {
                log::warn!("ledger: building the filter failed ({e}); every claim seeks");
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Takes `built` as the filter, with the claims made since its build read past them; or,
    /// when other code rewrote claims meanwhile (the build may have missed one), builds again.
    fn install(&mut self, conn: &Connection, built: Built) -> rusqlite::Result<()> {
        if rewrites(conn)? != built.rewrites {
            log::warn!(
                "ledger: claims were rewritten while the filter was built; building it again"
            );
            self.building = Some(Building::start(built.path, self.seen)?);
            return Ok(());
        }
        let serving_since = self.seen;
        self.filter = Some(built.bloom);
        self.seen = built.seen;
        self.skipped(built.unreadable);
        // The blocks again: the build read claims other connections made meanwhile, in blocks
        // the writer had not caught up with; the catch-up below starts past them, so without
        // this their blocks would never be sought, and a resend of one would be claimed again.
        self.read_blocks(conn)?;
        let added = self.catch_up(conn)?;
        self.seen = self.seen.max(serving_since);
        log::info!(
            "ledger: filter of {} claim(s) built in the background in {:.1} s ({} MiB), {added} \
             added since",
            built.claims,
            built.took.as_secs_f64(),
            self.filter.as_ref().map_or(0, Bloom::bytes) >> 20
        );
        Ok(())
    }

    /// Loads the filter saved at the last clean stop (and deletes it, in the same
    /// transaction), then adds the claims made since: whether it did. A filter that does not
    /// fit is deleted, and the caller builds one.
    fn restore(&mut self, conn: &Connection) -> bool {
        let started = Instant::now();
        if !conn.is_autocommit() {
            return false;
        }
        let restored = conn.execute_batch("BEGIN IMMEDIATE").and_then(|()| {
            let restored = self.restore_in(conn);
            if restored.is_ok() {
                conn.execute_batch("COMMIT")?;
            }
            restored
        });
        let restored = match restored {
            Ok(restored) => restored,
            Err(e) => {
                if !conn.is_autocommit() {
                    let _ = conn.execute_batch("ROLLBACK");
                }
                self.filter = None;
                log::warn!("ledger: cannot load the saved filter ({e}); building it");
                return false;
            }
        };
        match restored {
            Restored::None => false,
            Restored::Unfit(why) => {
                log::warn!("ledger: the saved filter is refused ({why}); building it");
                false
            }
            Restored::Loaded { saved, added } => {
                log::info!(
                    "ledger: filter of {saved} claim(s) loaded, {added} added since its save, \
                     in {:.1} s ({} MiB)",
                    started.elapsed().as_secs_f64(),
                    self.filter.as_ref().map_or(0, Bloom::bytes) >> 20
                );
                true
            }
        }
    }

    /// [`Claims::restore`], in its write transaction.
    fn restore_in(&mut self, conn: &Connection) -> rusqlite::Result<Restored> {
        let row = conn
            .query_row(
                &format!("DELETE FROM hookledger_claims_filter RETURNING {SAVED_COLUMNS}"),
                [],
                saved_of,
            )
            .optional();
        let saved = match row {
            Ok(Some(saved)) => saved,
            Ok(None) => return Ok(Restored::None),
            // A column of the wrong type (a row written by other code): not a filter.
            Err(rusqlite::Error::FromSqlConversionFailure(..))
            | Err(rusqlite::Error::InvalidColumnType(..)) => {
                conn.execute("DELETE FROM hookledger_claims_filter", [])?;
                return Ok(Restored::Unfit("a column of the wrong type".into()));
            }
            Err(e) => return Err(e),
        };
        if let Some(refusal) = unfit(conn, &saved)? {
            return Ok(Restored::Unfit(refusal.why));
        }
        match Bloom::from_saved(&saved.bits, saved.keys as u64, saved.capacity as u64) {
            Ok(bloom) if bloom.bytes() as i64 * 8 == saved.size_bits => self.filter = Some(bloom),
            Ok(_) => {
                return Ok(Restored::Unfit(format!(
                    "a size of {} bits",
                    saved.size_bits
                )))
            }
            Err(why) => return Ok(Restored::Unfit(why)),
        }
        self.data_version = data_version(conn)?;
        self.rewrites = rewrites(conn)?;
        self.seen = saved.seen;
        self.read_blocks(conn)?;
        let added = self.catch_up(conn)?;
        Ok(Restored::Loaded {
            saved: saved.keys,
            added,
        })
    }

    /// At a clean stop, after the last transaction: saves the filter and `seen` (replacing
    /// any saved before), in one transaction, for the next start to load. Nothing without a
    /// filter, or with one that is full (the next start builds a larger one).
    pub(crate) fn save(&mut self, conn: &Connection, now: i64) -> rusqlite::Result<()> {
        if self.filter.as_ref().is_none_or(Bloom::is_full) || !conn.is_autocommit() {
            return Ok(());
        }
        let started = Instant::now();
        conn.execute_batch("BEGIN IMMEDIATE")?;
        let saved = self
            .save_in(conn, now)
            .and_then(|saved| conn.execute_batch("COMMIT").map(|()| saved));
        if saved.is_err() && !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        let (keys, bytes) = saved?;
        log::info!(
            "ledger: filter of {keys} claim(s) saved for the next start in {:.1} s ({} MiB)",
            started.elapsed().as_secs_f64(),
            bytes >> 20
        );
        Ok(())
    }

    /// [`Claims::save`], in its write transaction: the keys and bytes saved.
    fn save_in(&mut self, conn: &Connection, now: i64) -> rusqlite::Result<(u64, usize)> {
        // What other connections committed since the last batch would be read at the load
        // anyway (past `seen`); reading it now keeps the next start short. The filter is not
        // full (checked): this only catches up.
        self.begin(conn)?;
        let Some(filter) = &self.filter else {
            return Ok((0, 0));
        };
        let (keys, capacity) = filter.counts();
        let Some(identity) = identity(conn)? else {
            log::warn!("ledger: hookledger_ledger has no identity row; the filter is not saved");
            return Ok((0, 0));
        };
        let (min_id, _, sequence) = summary(conn)?;
        let mut saved = Saved {
            seen: self.seen,
            min_id,
            sequence,
            schema_version: conn.query_row("PRAGMA user_version", [], |r| r.get(0))?,
            format: FORMAT,
            hashes: HASHES as i64,
            size_bits: filter.bytes() as i64 * 8,
            capacity: capacity as i64,
            keys: keys as i64,
            bits: filter.to_bytes(),
            checksum: Vec::new(),
            stale: None,
        };
        saved.checksum = saved.checksum(&identity);
        conn.execute(
            "INSERT OR REPLACE INTO hookledger_claims_filter
                 (id, seen, min_id, sequence, schema_version, format, hashes, size_bits,
                  capacity, keys, bits, checksum, stale, saved_at)
             VALUES (1, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, NULL, ?12)",
            rusqlite::params![
                saved.seen,
                saved.min_id,
                saved.sequence,
                saved.schema_version,
                saved.format,
                saved.hashes,
                saved.size_bits,
                saved.capacity,
                saved.keys,
                &saved.bits,
                &saved.checksum,
                now
            ],
        )?;
        let bits = saved.bits;
        Ok((keys, bits.len()))
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
        self.rewrites = rewrites(conn)?;
        self.unreadable = 0;
        self.seen = max_id(conn)?;
        self.read_blocks(conn)?;
        if !filter {
            self.filter = None;
            return Ok(());
        }
        let mut bloom = Bloom::with_capacity(capacity_for(claims_at_most(conn)?));
        let mut keys = conn.prepare("SELECT source, event_id FROM webhook_events")?;
        let mut rows = keys.query([])?;
        let (mut claims, mut unreadable) = (0u64, 0u64);
        while let Some(row) = rows.next()? {
            match key_of(row.get_ref(0)?, row.get_ref(1)?) {
                Some(hash) => bloom.insert(hash),
                None => unreadable += 1,
            }
            claims += 1;
        }
        log::info!(
            "ledger: filter of {claims} claim(s) built in {:.1} s ({} MiB)",
            started.elapsed().as_secs_f64(),
            bloom.bytes() >> 20
        );
        self.skipped(unreadable);
        self.filter = Some(bloom);
        Ok(())
    }

    fn read_blocks(&mut self, conn: &Connection) -> rusqlite::Result<()> {
        let mut blocks = conn.prepare_cached(SQLITE_BLOCKS)?;
        self.blocks = blocks
            .query_map([], |r| r.get::<_, i64>(0))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(())
    }

    /// At the start of each of the writer's transactions (the write lock held): takes in what
    /// other connections committed since this one last looked.
    pub(crate) fn begin(&mut self, conn: &Connection) -> rusqlite::Result<()> {
        self.pending = None;
        self.claimed = false;
        self.take_built(conn, false)?;
        if self.filter.as_ref().is_some_and(Bloom::is_full) {
            return self.load(conn, true);
        }
        let version = data_version(conn)?;
        if version == self.data_version {
            return Ok(());
        }
        self.data_version = version;
        let rewrites = rewrites(conn)?;
        if rewrites != self.rewrites {
            log::warn!(
                "ledger: another connection inserted a claim below an id used before or \
                 rewrote a key ({} time(s)); reading the ledger again",
                rewrites - self.rewrites
            );
            let filter = self.filter.is_some();
            return self.load(conn, filter);
        }
        self.catch_up(conn)?;
        Ok(())
    }

    /// Adds the claims past `seen` (ids are never reused: the ones made since it was read),
    /// and their blocks: how many.
    fn catch_up(&mut self, conn: &Connection) -> rusqlite::Result<u64> {
        let mut added = conn.prepare_cached(
            "SELECT id, source, event_id FROM webhook_events WHERE id > ?1 ORDER BY id",
        )?;
        let mut rows = added.query([self.seen])?;
        let (mut n, mut unreadable) = (0, 0);
        while let Some(row) = rows.next()? {
            let id: i64 = row.get(0)?;
            self.seen = self.seen.max(id);
            self.blocks.insert(block_of(id));
            let key = key_of(row.get_ref(1)?, row.get_ref(2)?);
            match (&mut self.filter, key) {
                (Some(filter), Some(hash)) => filter.insert(hash),
                (_, None) => unreadable += 1,
                (None, Some(_)) => {}
            }
            n += 1;
        }
        self.skipped(unreadable);
        Ok(n)
    }

    /// Counts and tells `n` claims just read whose key is not UTF-8 text: skipped (no event
    /// hookledger receives has such a key), never an error.
    fn skipped(&mut self, n: u64) {
        if n == 0 {
            return;
        }
        self.unreadable += n;
        log::warn!(
            "ledger: {n} claim(s) with a source or event id that is not UTF-8 text (written by \
             other code) skipped, {} in all; `hookledger check` lists them",
            self.unreadable
        );
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
        // "Maybe": one seek a block, newest first (a resend comes soon after its first copy,
        // mostly). Seeking before inserting, not inserting then deleting: a
        // duplicate writes nothing (an ignored insert would still advance the AUTOINCREMENT
        // counter). No other connection can write between the seek and the insert: this is
        // the writer's `BEGIN IMMEDIATE` transaction.
        if self.filter.as_ref().is_none_or(|f| f.may_contain(hash)) {
            let mut seek = conn.prepare_cached(SQLITE_CLAIMED_IN)?;
            for &block in self.blocks.iter().rev() {
                if seek.exists(rusqlite::params![block, &*event.source, &event.id])? {
                    return Ok(false);
                }
            }
        }
        // Within a block the key decides, also if the filter and the blocks were ever wrong.
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
        self.blocks.insert(block_of(conn.last_insert_rowid()));
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

    /// After retention deleted claims: forgets the blocks below the oldest claim left.
    pub(crate) fn pruned(&mut self, conn: &Connection) -> rusqlite::Result<()> {
        let oldest: Option<i64> =
            conn.query_row("SELECT min(id) FROM webhook_events", [], |r| r.get(0))?;
        match oldest {
            Some(id) => self.blocks = self.blocks.split_off(&block_of(id)),
            None => self.blocks.clear(),
        }
        Ok(())
    }

    #[cfg(test)]
    pub(crate) fn has_filter(&self) -> bool {
        self.filter.is_some()
    }

    /// Waits for the filter being built in the background, and takes it.
    #[cfg(test)]
    pub(crate) fn wait_for_filter(&mut self, conn: &Connection) {
        while self.building.is_some() {
            self.take_built(conn, true).unwrap();
        }
    }
}

/// Claims read a chunk by the background build: each chunk its own short read transaction.
const CHUNK: i64 = 1 << 16;

/// A filter being built on a thread of its own; dropping it stops the build.
struct Building {
    built: mpsc::Receiver<rusqlite::Result<Built>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What a background build read.
struct Built {
    /// The database file it read.
    path: PathBuf,
    bloom: Bloom,
    /// The highest id it read.
    seen: i64,
    /// `hookledger_ledger.rewrites` before it read the first chunk.
    rewrites: i64,
    claims: u64,
    unreadable: u64,
    took: std::time::Duration,
}

impl Building {
    /// Starts building the filter of the ledger at `path`, which holds about the claims up to
    /// `seen` now.
    fn start(path: PathBuf, seen: i64) -> rusqlite::Result<Building> {
        let conn = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        let stop = Arc::new(AtomicBool::new(false));
        let (send, built) = mpsc::sync_channel(1);
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("hookledger-filter".into())
            .spawn(move || {
                if let Some(built) = build(&conn, path, &stopped).transpose() {
                    let _ = send.send(built);
                }
            })
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
        log::info!(
            "ledger: serving while the filter of up to {seen} claim(s) is built in the background \
             (until then each claim seeks every block)"
        );
        Ok(Building {
            built,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Building {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Reads every key of the ledger on `conn` (to the file at `path`), a chunk of ids at a time;
/// `None` when stopped.
fn build(conn: &Connection, path: PathBuf, stop: &AtomicBool) -> rusqlite::Result<Option<Built>> {
    let started = Instant::now();
    let rewrites = rewrites(conn)?;
    let mut bloom = Bloom::with_capacity(capacity_for(claims_at_most(conn)?));
    let mut chunk = conn.prepare(
        "SELECT id, source, event_id FROM webhook_events WHERE id > ?1 ORDER BY id LIMIT ?2",
    )?;
    let (mut seen, mut claims, mut unreadable) = (i64::MIN, 0u64, 0u64);
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let mut rows = chunk.query(rusqlite::params![seen, CHUNK])?;
        let mut read = 0;
        while let Some(row) = rows.next()? {
            seen = row.get(0)?;
            match key_of(row.get_ref(1)?, row.get_ref(2)?) {
                Some(hash) => bloom.insert(hash),
                None => unreadable += 1,
            }
            read += 1;
        }
        claims += read;
        if read < CHUNK as u64 {
            break;
        }
    }
    Ok(Some(Built {
        path,
        bloom,
        seen: seen.max(0),
        rewrites,
        claims,
        unreadable,
        took: started.elapsed(),
    }))
}

/// The columns of `hookledger_claims_filter` that [`saved_of`] reads.
const SAVED_COLUMNS: &str = "seen, min_id, sequence, schema_version, format, hashes, size_bits, \
                             capacity, keys, bits, checksum, stale";

fn saved_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<Saved> {
    Ok(Saved {
        seen: r.get(0)?,
        min_id: r.get(1)?,
        sequence: r.get(2)?,
        schema_version: r.get(3)?,
        format: r.get(4)?,
        hashes: r.get(5)?,
        size_bits: r.get(6)?,
        capacity: r.get(7)?,
        keys: r.get(8)?,
        bits: r.get(9)?,
        checksum: r.get(10)?,
        stale: r.get(11)?,
    })
}

/// The saved filter, if any, as a check reads it (not taken): why it cannot be used, or the
/// filter and the highest id it covers. An error: a row of the wrong types.
pub(crate) fn saved_filter(
    conn: &Connection,
) -> rusqlite::Result<Option<Result<(Bloom, i64), Refusal>>> {
    let saved = conn
        .query_row(
            &format!("SELECT {SAVED_COLUMNS} FROM hookledger_claims_filter"),
            [],
            saved_of,
        )
        .optional()?;
    let Some(saved) = saved else {
        return Ok(None);
    };
    if let Some(refusal) = unfit(conn, &saved)? {
        return Ok(Some(Err(refusal)));
    }
    Ok(Some(
        Bloom::from_saved(&saved.bits, saved.keys as u64, saved.capacity as u64)
            .map(|bloom| (bloom, saved.seen))
            .map_err(|why| Refusal { why, damaged: true }),
    ))
}

/// Why the saved filter `saved` cannot be used for the ledger on `conn` (in the load's
/// transaction), or `None`: it is whole, of this ledger, and nothing since its save wrote
/// what a catch-up past `seen` would miss. Also what `hookledger check` asks.
fn unfit(conn: &Connection, saved: &Saved) -> rusqlite::Result<Option<Refusal>> {
    let ordinary = |why: String| {
        Ok(Some(Refusal {
            why,
            damaged: false,
        }))
    };
    let damaged = |why: String| Ok(Some(Refusal { why, damaged: true }));
    if let Some(why) = &saved.stale {
        return ordinary(format!("stale: {why} since its save"));
    }
    if saved.format != FORMAT || saved.hashes != HASHES as i64 {
        return ordinary(format!(
            "saved with hash format {} and {} probe(s) a key, this release uses {FORMAT} and \
             {HASHES}",
            saved.format, saved.hashes
        ));
    }
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if saved.schema_version != version {
        return ordinary(format!(
            "saved at schema version {}, now {version}",
            saved.schema_version
        ));
    }
    let missing = missing_triggers(conn)?;
    if !missing.is_empty() {
        return damaged(format!(
            "the ledger's trigger(s) {} are gone: writes since may be unseen",
            missing.join(", ")
        ));
    }
    let Some(identity) = identity(conn)? else {
        return damaged("the ledger has no identity (hookledger_ledger)".into());
    };
    if saved.checksum != saved.checksum(&identity) {
        return damaged(
            "its checksum does not match (bits or counts changed since its save, or saved of \
             another ledger)"
                .into(),
        );
    }
    let (min_id, max_id, sequence) = summary(conn)?;
    let why = if max_id < saved.seen {
        format!(
            "it covers ids up to {}, the ledger's highest is {max_id}",
            saved.seen
        )
    } else if min_id != 0 && min_id < saved.min_id {
        format!(
            "a claim with id {min_id}, below the lowest at its save ({})",
            saved.min_id
        )
    } else if sequence < saved.sequence {
        format!(
            "the ledger's highest id used is {sequence}, {} at its save",
            saved.sequence
        )
    } else if saved.keys < 0 || saved.capacity < 0 {
        return damaged("negative counts".into());
    } else if max_id.saturating_sub(saved.seen) > saved.capacity - saved.keys {
        // Filled past its size by the catch-up (a bulk import while stopped), it would be
        // built again at the first batch anyway: once, now, at the size the ledger needs.
        format!(
            "up to {} claim(s) added since its save, room for {}",
            max_id.saturating_sub(saved.seen),
            saved.capacity - saved.keys
        )
    } else {
        return Ok(None);
    };
    ordinary(why)
}

/// Why a saved filter is not used: `damaged` when its row or the ledger's guards were
/// changed (a problem `hookledger check` reports), not when a write or an upgrade since
/// made it out of date (the next start builds it: nothing is wrong).
pub(crate) struct Refusal {
    pub(crate) why: String,
    pub(crate) damaged: bool,
}

/// The ledger's identity (migration 17), `None` if its row is gone.
fn identity(conn: &Connection) -> rusqlite::Result<Option<Vec<u8>>> {
    conn.query_row(
        "SELECT identity FROM hookledger_ledger WHERE id = 1",
        [],
        |r| r.get::<_, Vec<u8>>(0),
    )
    .optional()
    .or_else(|e| match e {
        rusqlite::Error::InvalidColumnType(..) => Ok(None),
        e => Err(e),
    })
}

/// How many times other code wrote a claim below an id used before, or rewrote a key
/// (migration 17's triggers count them).
fn rewrites(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row(
        "SELECT coalesce((SELECT rewrites FROM hookledger_ledger WHERE id = 1), 0)",
        [],
        |r| r.get(0),
    )
}

/// Which of [`TRIGGERS`] the database lacks.
pub(crate) fn missing_triggers(conn: &Connection) -> rusqlite::Result<Vec<&'static str>> {
    let mut present = conn.prepare_cached(
        "SELECT 1 FROM sqlite_master WHERE type = 'trigger' AND name = ?1 AND tbl_name = 'webhook_events'",
    )?;
    let mut missing = Vec::new();
    for name in TRIGGERS {
        if !present.exists([name])? {
            missing.push(name);
        }
    }
    Ok(missing)
}

/// The ledger's lowest and highest ids (0 when empty) and the highest id it ever used
/// (sqlite_sequence's).
fn summary(conn: &Connection) -> rusqlite::Result<(i64, i64, i64)> {
    // Each in a subquery of its own: SQLite reads one end of the table for a lone min() or
    // max(), and the whole table for both in one SELECT (1.5 s for 5 M claims, cold).
    conn.query_row(
        "SELECT coalesce((SELECT min(id) FROM webhook_events), 0),
                coalesce((SELECT max(id) FROM webhook_events), 0),
                coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'webhook_events'), 0)",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )
}

/// A claim's key as the claim path compares it, `None` when it is not UTF-8 text (a BLOB, a
/// number, invalid UTF-8, written by other code): no event hookledger receives has that key,
/// so the row is skipped, and counted.
pub(crate) fn key_of(
    source: rusqlite::types::ValueRef<'_>,
    event_id: rusqlite::types::ValueRef<'_>,
) -> Option<u64> {
    use rusqlite::types::ValueRef::Text;
    match (source, event_id) {
        (Text(s), Text(e)) => Some(key_hash(
            std::str::from_utf8(s).ok()?,
            std::str::from_utf8(e).ok()?,
        )),
        _ => None,
    }
}

/// Above this many ids between the lowest and the highest, [`claims_at_most`] counts.
const COUNT_ABOVE: u64 = 1 << 22;

/// At least the claims there are, to size a filter: the span of their ids (ids only grow,
/// and retention deletes the oldest), without a pass over them. A span over 4 M is counted
/// (one pass): a claim written by other code with an id far above the rest would otherwise
/// size a filter of gigabytes.
fn claims_at_most(conn: &Connection) -> rusqlite::Result<u64> {
    // Two subqueries: each reads one end of the table (both in one SELECT read all of it).
    let (low, high): (Option<i64>, Option<i64>) = conn.query_row(
        "SELECT (SELECT min(id) FROM webhook_events), (SELECT max(id) FROM webhook_events)",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let (Some(low), Some(high)) = (low, high) else {
        return Ok(0);
    };
    // In i128: ids may be negative when written by other code.
    let span = u64::try_from(i128::from(high) - i128::from(low) + 1).unwrap_or(u64::MAX);
    if span <= COUNT_ABOVE {
        return Ok(span);
    }
    let count: i64 = conn.query_row("SELECT count(*) FROM webhook_events", [], |r| r.get(0))?;
    Ok(span.min(count as u64))
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
    use crate::store::sqlite::bloom::key_hash;
    use crate::store::sqlite::SqliteStore;
    use crate::store::{Done, Outcome, Store, Work};

    fn claim(store: &mut SqliteStore, id: &str, now: i64) -> Outcome {
        // The contract's event, with no handler and an empty object as its body.
        let mut submission = crate::store::contract::submission(id, false);
        submission.handlers.clear();
        submission.event.body = bytes::Bytes::from_static(b"{}");
        let work = Work::Event(submission);
        match store.run_batch(vec![work], now).unwrap().pop() {
            Some(Done::Event(Ok(outcome))) => outcome,
            _ => panic!("one event in, its outcome out"),
        }
    }

    /// Claims written by other code before the store opened, one a block over 30 blocks (and
    /// one a day over 30 days).
    fn prefilled(path: &Path) {
        drop(SqliteStore::open(path, DEFAULT_BUSY_TIMEOUT).unwrap());
        let conn = rusqlite::Connection::open(path).unwrap();
        for day in 0..30 {
            conn.execute(
                "INSERT INTO webhook_events (id, source, event_id, event_type, created, received_at)
                 VALUES (?1, 'src', ?2, 't', 1, ?3)",
                rusqlite::params![
                    (day << 20) + 7,
                    format!("evt_{day}"),
                    20_000 * 86_400 + day * 86_400
                ],
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
        assert_eq!(store.claims.blocks.len(), 30);
        // Exact before the filter is there (each claim seeks every block), and after.
        assert_eq!(claim(&mut store, "evt_12", LATER), Outcome::Duplicate);
        built(&mut store);
        assert!(store.claims.has_filter());
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
        assert_eq!(store.claims.blocks.len(), 30, "in the newest block");
    }

    /// A CLI command's store has no filter: it seeks every block, and is as exact.
    #[test]
    fn a_store_without_a_filter_seeks_every_block() {
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

    /// Another connection's claims, and a claim it moved to another block, are seen at the
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
                 UPDATE webhook_events SET id = 40 << 20 WHERE event_id = 'evt_mine';",
                old = LATER - 5 * 86_400,
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

    /// Claims made and rewritten while the filter is built in the background: the filter
    /// the writer takes holds them all (a rewrite meanwhile makes it build again).
    #[test]
    fn claims_made_and_rewritten_during_the_background_build_are_in_the_filter_it_takes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.db");
        prefilled(&path);
        let mut store = SqliteStore::open(&path, DEFAULT_BUSY_TIMEOUT).unwrap();
        built(&mut store);
        let other = rusqlite::Connection::open(&path).unwrap();
        // A build that read the ledger before this writer's and another's claims.
        let read_then = |store: &mut SqliteStore| {
            store.claims.filter = None;
            let stop = std::sync::atomic::AtomicBool::new(false);
            super::build(&other, path.clone(), &stop).unwrap().unwrap()
        };
        let early = read_then(&mut store);
        assert_eq!(claim(&mut store, "evt_during", LATER), Outcome::Processed);
        other
            .execute(
                "INSERT INTO webhook_events (source, event_id, event_type, received_at)
                 VALUES ('src', 'evt_theirs', 't', ?1)",
                [LATER],
            )
            .unwrap();
        store.claims.install(&store.conn, early).unwrap();
        assert!(store.claims.building.is_none(), "taken as it is");
        for id in ["evt_during", "evt_theirs", "evt_0", "evt_29"] {
            assert!(in_filter(&mut store, id), "{id}");
        }
        assert!(!in_filter(&mut store, "evt_never"));

        // A key rewritten in place after the build read it: built again.
        let early = read_then(&mut store);
        other
            .execute(
                "UPDATE webhook_events SET event_id = 'evt_renamed' WHERE event_id = 'evt_5'",
                [],
            )
            .unwrap();
        store.claims.install(&store.conn, early).unwrap();
        assert!(store.claims.building.is_some(), "built again");
        assert!(in_filter(&mut store, "evt_renamed"));
        assert_eq!(claim(&mut store, "evt_renamed", LATER), Outcome::Duplicate);
        assert_eq!(claim(&mut store, "evt_after", LATER), Outcome::Processed);
        assert!(in_filter(&mut store, "evt_after"));
    }

    /// A claim another connection made in a block above the writer's, read by the build
    /// before the writer caught up with it: its block is sought once the filter is taken, so
    /// its resend is a duplicate (the model test found it: `processed` again).
    #[test]
    fn a_block_only_the_background_build_read_is_sought_after_the_filter_is_taken() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.db");
        prefilled(&path);
        let mut store = SqliteStore::open(&path, DEFAULT_BUSY_TIMEOUT).unwrap();
        built(&mut store);
        let other = rusqlite::Connection::open(&path).unwrap();
        let max: i64 = other
            .query_row("SELECT max(id) FROM webhook_events", [], |r| r.get(0))
            .unwrap();
        // Two blocks above the rest: the writer's next claim lands in the higher one, so the
        // unique index (which holds within a block) cannot catch a second `evt_above`.
        let (above, higher) = (((max >> 16) + 3) << 16, ((max >> 16) + 5) << 16);
        for (id, key) in [(above, "evt_above"), (higher, "evt_higher")] {
            other
                .execute(
                    "INSERT INTO webhook_events (id, source, event_id, event_type, received_at)
                     VALUES (?1, 'src', ?2, 't', ?3)",
                    rusqlite::params![id, key, LATER],
                )
                .unwrap();
        }
        store.claims.filter = None;
        let stop = std::sync::atomic::AtomicBool::new(false);
        let read = super::build(&other, path.clone(), &stop).unwrap().unwrap();
        assert_eq!(read.seen, higher, "the build read both");
        store.claims.install(&store.conn, read).unwrap();
        assert_eq!(claim(&mut store, "evt_above", LATER), Outcome::Duplicate);
        let db = rusqlite::Connection::open(&path).unwrap();
        let copies: i64 = db
            .query_row(
                "SELECT count(*) FROM webhook_events WHERE event_id = 'evt_above'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(copies, 1);
    }

    /// Whether the writer's store at `path` has a saved filter waiting.
    fn saved_rows(path: &Path) -> i64 {
        rusqlite::Connection::open(path)
            .unwrap()
            .query_row("SELECT count(*) FROM hookledger_claims_filter", [], |r| {
                r.get(0)
            })
            .unwrap()
    }

    /// The store once it took the filter built in the background.
    fn built(store: &mut SqliteStore) {
        store.claims.wait_for_filter(&store.conn);
    }

    /// Whether the store's own filter (not the seek behind it) holds `id`, once it has one.
    fn in_filter(store: &mut SqliteStore, id: &str) -> bool {
        built(store);
        let filter = store.claims.filter.as_ref().expect("the writer's filter");
        filter.may_contain(key_hash("src", id))
    }

    /// The writer's store on `path` after a clean stop with claims `evt_0` … `evt_29` from
    /// another program and `evt_mine` of its own: the filter saved.
    fn stopped_cleanly(path: &Path) {
        prefilled(path);
        let mut store = SqliteStore::open(path, DEFAULT_BUSY_TIMEOUT).unwrap();
        assert!(!store.claims.restored, "nothing saved yet: built");
        assert_eq!(claim(&mut store, "evt_mine", LATER), Outcome::Processed);
        built(&mut store);
        store.close();
        drop(store);
        assert_eq!(saved_rows(path), 1);
    }

    /// Saved at a clean stop, loaded at the next open (and deleted in the same transaction):
    /// every key in it, a claim another program made after the save added, `seen` where the
    /// ledger is; a second open without a clean stop builds the filter again.
    #[test]
    fn a_filter_saved_at_a_clean_stop_is_loaded_once_with_the_claims_made_since() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.db");
        stopped_cleanly(&path);
        let other = rusqlite::Connection::open(&path).unwrap();
        other
            .execute(
                "INSERT INTO webhook_events (source, event_id, event_type, received_at)
                 VALUES ('src', 'evt_after_save', 't', ?1)",
                [LATER - 2 * 86_400],
            )
            .unwrap();
        let max_id: i64 = other
            .query_row("SELECT max(id) FROM webhook_events", [], |r| r.get(0))
            .unwrap();

        let mut store = SqliteStore::open(&path, DEFAULT_BUSY_TIMEOUT).unwrap();
        assert!(store.claims.restored, "loaded, not built");
        assert_eq!(saved_rows(&path), 0, "deleted by the load");
        assert_eq!(store.claims.seen, max_id);
        assert_eq!(store.claims.blocks.len(), 30);
        for day in 0..30 {
            assert!(in_filter(&mut store, &format!("evt_{day}")));
        }
        assert!(in_filter(&mut store, "evt_mine"));
        assert!(in_filter(&mut store, "evt_after_save"));
        assert!(!in_filter(&mut store, "evt_never"));
        for id in ["evt_0", "evt_29", "evt_mine", "evt_after_save"] {
            assert_eq!(claim(&mut store, id, LATER), Outcome::Duplicate);
        }
        assert_eq!(claim(&mut store, "evt_new", LATER), Outcome::Processed);
        drop(store); // no clean stop: nothing saved

        let mut store = SqliteStore::open(&path, DEFAULT_BUSY_TIMEOUT).unwrap();
        assert!(!store.claims.restored, "built again");
        assert!(in_filter(&mut store, "evt_new"));
        assert!(in_filter(&mut store, "evt_after_save"));
    }

    /// A saved filter that does not fit is deleted and the filter built from the ledger: bits
    /// cut short, other parameters, a claim inserted below the lowest id saved, the top of the
    /// ledger gone, a schema migrated since, more claims added since than it has room for.
    #[test]
    fn a_saved_filter_that_does_not_fit_is_built_again() {
        let breaks = [
            "UPDATE hookledger_claims_filter SET bits = substr(bits, 1, 100)",
            "UPDATE hookledger_claims_filter SET bits = x''",
            "UPDATE hookledger_claims_filter SET hashes = hashes + 1",
            "UPDATE hookledger_claims_filter SET format = format + 1",
            "UPDATE hookledger_claims_filter SET size_bits = size_bits + 64",
            "UPDATE hookledger_claims_filter SET capacity = capacity * 2",
            "UPDATE hookledger_claims_filter SET capacity = -1",
            "UPDATE hookledger_claims_filter SET schema_version = schema_version - 1",
            "DELETE FROM webhook_events WHERE event_id = 'evt_mine'",
            "UPDATE webhook_events SET id = -5 WHERE event_id = 'evt_3'",
            "UPDATE webhook_events SET id = 4611686018427387904 WHERE event_id = 'evt_3'",
            "UPDATE hookledger_claims_filter SET keys = capacity;
             INSERT INTO webhook_events (source, event_id, event_type, received_at)
             VALUES ('src', 'evt_one_too_many', 't', 1)",
        ];
        for sql in breaks {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("h.db");
            stopped_cleanly(&path);
            rusqlite::Connection::open(&path)
                .unwrap()
                .execute_batch(sql)
                .unwrap();
            let mut store = SqliteStore::open(&path, DEFAULT_BUSY_TIMEOUT).unwrap();
            assert!(!store.claims.restored, "{sql}: built");
            assert_eq!(saved_rows(&path), 0, "{sql}: deleted");
            assert!(in_filter(&mut store, "evt_3"), "{sql}");
            assert_eq!(claim(&mut store, "evt_3", LATER), Outcome::Duplicate);
        }
    }

    /// Claims written by other code with ids far apart (2^62 and -2^62: a span past what an
    /// i64 holds) size the filter by their number, not by the span of their ids.
    #[test]
    fn ids_far_apart_size_the_filter_by_the_claims_there_are() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.db");
        prefilled(&path);
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch(
                "INSERT INTO webhook_events (id, source, event_id, event_type, received_at)
                 VALUES (4611686018427387904, 'src', 'evt_high', 't', 1728000000),
                        (-4611686018427387904, 'src', 'evt_low', 't', 1728000000)",
            )
            .unwrap();
        let mut store = SqliteStore::open(&path, DEFAULT_BUSY_TIMEOUT).unwrap();
        built(&mut store);
        let filter = store.claims.filter.as_ref().unwrap();
        assert_eq!(filter.counts(), (32, super::capacity_for(32)));
        assert!(filter.bytes() < 8 << 20, "{} bytes", filter.bytes());
        for id in ["evt_high", "evt_low", "evt_12"] {
            assert_eq!(claim(&mut store, id, LATER), Outcome::Duplicate, "{id}");
        }
        assert_eq!(claim(&mut store, "evt_new", LATER), Outcome::Processed);
    }

    /// A store without a filter (a CLI command's) saves nothing, and leaves a saved filter
    /// where it is for the server's next start.
    #[test]
    fn a_store_without_a_filter_neither_saves_nor_takes_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.db");
        prefilled(&path);
        let mut cli = SqliteStore::open_existing(&path).unwrap();
        cli.close();
        drop(cli);
        assert_eq!(saved_rows(&path), 0);
        let mut store = SqliteStore::open(&path, DEFAULT_BUSY_TIMEOUT).unwrap();
        built(&mut store);
        store.close();
        drop(store);
        let mut cli = SqliteStore::open_existing(&path).unwrap();
        assert_eq!(claim(&mut cli, "evt_4", LATER), Outcome::Duplicate);
        cli.close();
        drop(cli);
        assert_eq!(saved_rows(&path), 1);
    }
}
