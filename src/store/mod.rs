//! Storage: what the writer, the outbox worker, retention, the admin pages and the CLI need
//! from a database, opened once ([`open`], [`open_reader`]: the only place a [`Database`] is
//! matched) and handed out.
//!
//! - `seam.rs`: the [`Store`] trait (a store owns its transaction: [`Store::run_batch`]), the
//!   [`OutboxReader`], the jobs ([`Work`], [`Write`]) and their results;
//! - `pipeline.rs`: claim → handlers → outbox row, written once for every store, job by job or
//!   batched;
//! - the SQL both stores run, on [`Session`](crate::sql::Session): the claim (`ledger.rs`), the
//!   outbox's writes (`outbox.rs`), `[[alert]]` incidents (`alerts.rs`), retention
//!   (`retention.rs`), stored payloads and their dictionaries (`payload.rs`), the listings (`listings.rs`), the operator's console (`console.rs`),
//!   refused requests kept for it (`refusals.rs`), the app's migrations (`app_schema.rs`), the
//!   copy from one store to the
//!   other (`copy.rs`);
//! - `owned.rs`: hookledger's own tables, which a handler may read but not change (it may add
//!   outbox rows);
//! - `sqlite/` and `postgres/`: each store's transactions, migrations, due outbox rows,
//!   read connections and errors, alike in shape;
//! - `contract.rs` (tests): one suite every store passes.

pub(crate) mod alerts;
mod app_schema;
pub(crate) mod console;
#[cfg(test)]
pub(crate) mod contract;
#[cfg(feature = "postgres")]
pub(crate) mod copy;
pub(crate) mod ledger;
pub(crate) mod listings;
pub(crate) mod outbox;
mod owned;
pub(crate) mod payload;
pub(crate) mod pipeline;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod refusals;
pub(crate) mod retention;
pub(crate) mod seam;
pub(crate) mod sqlite;

use std::path::{Path, PathBuf};

pub use seam::Outcome;
pub(crate) use seam::{
    Done, OutboxReader, Poll, ServeGuard, Store, WalBehind, WalWatch, Work, Write,
};

use crate::config::{Database, StorageConfig};
use crate::sql::Session;

/// Read connections to the ledger, pooled: the admin pages, reconcile's lookups, the CLI's
/// listings. Cheap to clone.
#[derive(Clone)]
pub(crate) enum Reader {
    Sqlite {
        pool: sqlite::ReadPool,
        file: PathBuf,
    },
    #[cfg(feature = "postgres")]
    Postgres(postgres::ReadPool),
}

impl Reader {
    /// Runs `read` on a connection of the pool.
    pub(crate) fn read<T>(
        &self,
        read: impl FnOnce(&dyn Session) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        match self {
            Reader::Sqlite { pool, .. } => read(&*pool.get()?),
            #[cfg(feature = "postgres")]
            Reader::Postgres(pool) => read(&*pool.get()?),
        }
    }

    /// The database file, for a store that is one (free space is then the server's concern).
    pub(crate) fn file(&self) -> Option<&Path> {
        match self {
            Reader::Sqlite { file, .. } => Some(file),
            #[cfg(feature = "postgres")]
            Reader::Postgres(_) => None,
        }
    }
}

/// A database opened: the writer's store, the pooled readers and the outbox worker's reads.
pub(crate) struct Stores {
    pub(crate) writer: Box<dyn Store>,
    pub(crate) reader: Reader,
    pub(crate) outbox: Box<dyn OutboxReader>,
    /// No second server on this SQLite file while it lives.
    pub(crate) guard: ServeGuard,
}

/// For a SQLite database whose file does not exist yet: an empty one in memory, with
/// hookledger's schema, to apply the app's migrations and check its effects on before the file
/// is created, so that a bad one creates nothing. `None` for an existing file, and on
/// PostgreSQL (whose database the operator made; a bad effect stops start-up after
/// hookledger's tables are in it).
pub(crate) fn scratch(database: &Database) -> anyhow::Result<Option<Box<dyn Store>>> {
    match database {
        Database::Sqlite(path) if !path.exists() => {
            Ok(Some(Box::new(sqlite::SqliteStore::open_in_memory()?)))
        }
        _ => Ok(None),
    }
}

/// How a database is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// For `serve`: created and migrated if needed; on SQLite, a second server on the same
    /// file is refused.
    Serve,
    /// For one command's writes next to a running `serve`: a SQLite file must exist already (a
    /// typo in `--db` should be an error, not a fresh database that shows nothing); a
    /// PostgreSQL database must exist, and gets hookledger's tables if it has none.
    Command,
}

/// Opens `database` once: its writer (migrated), its readers and its outbox reads.
pub(crate) fn open(
    database: &Database,
    storage: &StorageConfig,
    access: Access,
) -> anyhow::Result<Stores> {
    match database {
        Database::Sqlite(path) => {
            let (writer, guard): (_, ServeGuard) = match access {
                Access::Serve => {
                    let lock = sqlite::lock_for_serve(path)?;
                    (
                        sqlite::SqliteStore::open_bounded(
                            path,
                            storage.busy_timeout,
                            (storage.wal_limit_mb as u64).saturating_mul(1024 * 1024),
                        )?,
                        Box::new(lock),
                    )
                }
                Access::Command => (sqlite::SqliteStore::open_existing(path)?, Box::new(())),
            };
            let pool = sqlite::read_pool(path, READERS)?;
            Ok(Stores {
                writer: Box::new(writer),
                outbox: Box::new(pool.clone()),
                reader: Reader::Sqlite {
                    pool,
                    file: path.clone(),
                },
                guard,
            })
        }
        // Several servers may share it: that is what it is for.
        #[cfg(feature = "postgres")]
        Database::Postgres(url) => Ok(Stores {
            writer: Box::new(postgres::PgStore::open(url, storage.busy_timeout)?),
            reader: Reader::Postgres(postgres::read_pool(url, storage.busy_timeout, READERS)?),
            outbox: Box::new(postgres::PgOutbox::open(
                url,
                storage.outbox_lease,
                storage.busy_timeout,
            )?),
            guard: Box::new(()),
        }),
        #[cfg(not(feature = "postgres"))]
        Database::Postgres(_) => Err(without_postgres()),
    }
}

/// A PostgreSQL database asked of a build without the `postgres` feature (validation refuses
/// it first, naming `database`; a library user may call here directly).
#[cfg(not(feature = "postgres"))]
fn without_postgres() -> anyhow::Error {
    anyhow::anyhow!(crate::config::WITHOUT_POSTGRES)
}

/// Opens `database` for reads only (the CLI's listings): read-only where the store has such a
/// thing, and a SQLite file must exist.
pub(crate) fn open_reader(database: &Database, storage: &StorageConfig) -> anyhow::Result<Reader> {
    match database {
        Database::Sqlite(path) => {
            sqlite::check_exists(path)?;
            Ok(Reader::Sqlite {
                pool: sqlite::read_pool(path, 1)?,
                file: path.clone(),
            })
        }
        #[cfg(feature = "postgres")]
        Database::Postgres(url) => Ok(Reader::Postgres(postgres::read_pool(
            url,
            storage.busy_timeout,
            1,
        )?)),
        #[cfg(not(feature = "postgres"))]
        Database::Postgres(_) => {
            let _ = storage;
            Err(without_postgres())
        }
    }
}

/// Read connections per database: the admin pages, reconcile and the outbox worker (SQLite)
/// each hold one at a time.
const READERS: u32 = 4;
