//! Opening the SQLite file: pragmas, migrations and the read-only pool.
//!
//! The write connection is opened here but owned by the writer thread (`writer.rs`); every
//! other reader (outbox polling, CLI listings) takes a read-only connection from the pool.
//!
//! Migrations are an append-only list keyed by `PRAGMA user_version`: entry `i` moves the
//! schema from version `i` to `i + 1`. `schema.sql` is migration 1 and never changes.

pub mod ledger;

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::{Connection, OpenFlags};

/// Append-only. Never edit a released entry; add a new one.
const MIGRATIONS: &[&str] = &[include_str!("../../../schema.sql")];

/// How long a writer waits for another process's write lock (an `sqlite3` shell, a CLI
/// command) before it gives up with `SQLITE_BUSY`. Long enough to ride out a CLI command,
/// short enough that the provider gets a 503 long before its own timeout (Stripe: ~10 s).
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

pub type ReadPool = r2d2::Pool<SqliteConnectionManager>;

/// Opens (creating if needed) the database for writing and brings its schema up to date.
pub fn open_writer(path: &Path, busy_timeout: Duration) -> anyhow::Result<Connection> {
    let mut conn = Connection::open(path)
        .with_context(|| format!("cannot open database file {}", path.display()))?;
    conn.busy_timeout(busy_timeout)?;
    configure_writer(&conn)
        .with_context(|| format!("cannot configure database file {}", path.display()))?;
    migrate(&mut conn).with_context(|| format!("cannot migrate {}", path.display()))?;
    Ok(conn)
}

fn configure_writer(conn: &Connection) -> rusqlite::Result<()> {
    // WAL lets readers (outbox worker, CLI) run while the writer commits.
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        log::warn!("journal_mode is {mode}, not wal (is the file on a network filesystem?)");
    }
    // Durability first: a 200 is only sent after COMMIT, and COMMIT must mean on disk,
    // also on power loss. NORMAL would lose the last commits in WAL mode.
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(())
}

/// Brings the schema to the newest version, one transaction per migration.
pub fn migrate(conn: &mut Connection) -> anyhow::Result<()> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let version = usize::try_from(version).unwrap_or(usize::MAX);
    if version > MIGRATIONS.len() {
        bail!(
            "database schema version {version} is newer than this hookledger knows ({}); \
             upgrade hookledger",
            MIGRATIONS.len()
        );
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version) {
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        tx.execute_batch(sql)
            .with_context(|| format!("migration {} failed", i + 1))?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
        log::info!("database migrated to schema version {}", i + 1);
    }
    Ok(())
}

/// A pool of read-only connections. The database must already exist (open the writer first).
pub fn read_pool(path: &Path, size: u32) -> anyhow::Result<ReadPool> {
    let manager = SqliteConnectionManager::file(path)
        .with_flags(OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .with_init(|c| c.busy_timeout(DEFAULT_BUSY_TIMEOUT));
    r2d2::Pool::builder()
        .max_size(size)
        .build(manager)
        .with_context(|| format!("cannot open read connections to {}", path.display()))
}

/// Opens an existing database for a CLI command, refusing to create a new empty one (a typo
/// in `--db` should be an error, not a fresh database that shows nothing).
pub fn open_existing(path: &Path) -> anyhow::Result<Connection> {
    if !path.exists() {
        bail!(
            "database file {} does not exist (start `hookledger serve --db {}` first, or pass the right --db)",
            path.display(),
            path.display()
        );
    }
    open_writer(path, DEFAULT_BUSY_TIMEOUT)
}
