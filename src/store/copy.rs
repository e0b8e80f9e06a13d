//! `hookledger migrate-to postgres://…`: copies a SQLite ledger into an empty PostgreSQL
//! database, for an app moving from one machine to several.
//!
//! Every table hookledger owns is copied, row for row, keys included: the ledger
//! (`webhook_events`, so events received before the move stay duplicates after it), the outbox
//! (pending and dead rows are delivered and retried from the new database), and the tables of
//! each built-in handler. The core names only its own tables ([`CORE`]); a handler's are the
//! handler's to name ([`Schema::tables`]): the caller passes every built-in handler's schema,
//! and the tables of each one the source has are copied, into tables made on the target by
//! that handler's own migrations. The app's own tables (`[schema] migrations`) are the app's to
//! move. Not copied: `hookledger_claims_filter`, the SQLite writer's filter of keys saved at a
//! clean stop (PostgreSQL claims without one).
//!
//! The source is read in one read transaction (a consistent snapshot, also next to a running
//! `serve`, which should be stopped first so that nothing arrives after the snapshot); the
//! target is written in one transaction, so a failed copy leaves it empty.

use std::path::Path;

use anyhow::{bail, Context};

use crate::config::Database;
use crate::handler::{Schema, Table};
use crate::sql::{Session, ToParam, Value};
use crate::store::postgres::PgStore;
use crate::store::sqlite::{self, SqliteStore};
use crate::store::Store;

/// The core's tables copied, their columns and their keys (the order the copy pages in).
const CORE: &[Table] = &[
    Table {
        name: "webhook_events",
        columns: &[
            "source",
            "event_id",
            "event_type",
            "created",
            "received_at",
            "payload",
            "payload_codec",
            "payload_dict",
        ],
        // SQLite's ledger has no index on (source, event_id) alone (its key is by block of ids
        // first): the copy pages in the order claims arrived.
        key: &["rowid"],
    },
    Table {
        name: "hookledger_payload_dicts",
        columns: &["id", "source", "dict", "created_at"],
        key: &["id"],
    },
    Table {
        name: "outbox",
        columns: &[
            "id",
            "kind",
            "source",
            "key",
            "event_type",
            "payload",
            "payload_ref",
            "status",
            "attempts",
            "next_attempt_at",
            "last_error",
            "created_at",
            "done_at",
            "queued",
            "output",
            "coalesce_key",
        ],
        key: &["id"],
    },
    Table {
        name: "counters",
        columns: &["name", "value"],
        key: &["name"],
    },
];

/// Rows read and written per round trip of the copy.
const PAGE: i64 = 500;

/// Copies the SQLite database `from` into the PostgreSQL database `to`, with the tables of
/// each of `handlers` (every built-in handler's schema) that `from` has; the rows copied per
/// table.
pub(crate) fn copy(
    from: &Database,
    to: &Database,
    handlers: &[&Schema],
) -> anyhow::Result<Vec<(String, u64)>> {
    let (Database::Sqlite(path), Database::Postgres(url)) = (from, to) else {
        bail!(
            "migrate-to copies a SQLite file (--db) into PostgreSQL (a postgres:// URL); got \
             --db {from} and target {to}"
        );
    };
    sqlite_to_postgres(path, url, handlers)
}

fn sqlite_to_postgres(
    from: &Path,
    to: &str,
    handlers: &[&Schema],
) -> anyhow::Result<Vec<(String, u64)>> {
    // Brings an older file to the current schema first, so the columns match: the core's, and
    // that of each handler whose tables it has (made by the handler's migrations, or by the
    // first migration of a release from before handlers owned their tables).
    let mut store = SqliteStore::open_existing(from)?;
    let source = sqlite::open_read(from)?;
    let mut owned = Vec::new();
    for schema in handlers {
        let mut has = false;
        for table in schema.tables {
            has |= exists(&source, SQLITE_HAS, table.name)?;
        }
        if has {
            store.migrate_handler(schema)?;
            owned.push(*schema);
        }
    }
    drop(store);
    source.execute_batch("BEGIN")?;
    let mut target = PgStore::open(to, crate::config::DEFAULT_BUSY_TIMEOUT)?;
    let tables: Vec<&Table> = CORE
        .iter()
        .chain(owned.iter().flat_map(|s| s.tables))
        .collect();
    for table in &tables {
        if !exists(target.session(), POSTGRES_HAS, table.name)? {
            continue; // a handler's, made below
        }
        let existing = count(target.session(), table.name)?;
        if existing > 0 {
            bail!(
                "the target database already has {existing} row(s) in {}; migrate-to \
                 copies into an empty hookledger database (create a new one)",
                table.name
            );
        }
    }
    for schema in &owned {
        target.migrate_handler(schema)?;
    }
    target.begin()?;
    let copied = tables
        .iter()
        .map(|table| {
            let n = copy_table(&source, target.session(), table)
                .with_context(|| format!("copying {}", table.name))?;
            Ok((table.name.to_string(), n))
        })
        .collect::<anyhow::Result<Vec<_>>>();
    let copied = match copied {
        Ok(copied) => copied,
        Err(e) => {
            target.rollback();
            return Err(e);
        }
    };
    // New outbox rows on PostgreSQL get ids after the copied ones.
    target.session().query(
        "SELECT setval(pg_get_serial_sequence('outbox', 'id'),
                       coalesce((SELECT max(id) FROM outbox), 0) + 1, false)",
        &[],
    )?;
    target.commit()?;
    Ok(copied)
}

/// Whether a table is named `$1`, on SQLite and on PostgreSQL (in the schema hookledger's
/// unqualified names reach).
const SQLITE_HAS: &str = "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = $1";
const POSTGRES_HAS: &str = "SELECT count(*) FROM pg_catalog.pg_tables
     WHERE schemaname = current_schema() AND tablename = $1::text";

fn exists(session: &dyn Session, query: &str, table: &str) -> anyhow::Result<bool> {
    let rows = session.query(query, &[&table])?;
    Ok(rows
        .first()
        .map(|r| r.get::<i64>(0))
        .transpose()?
        .unwrap_or(0)
        > 0)
}

fn count(session: &dyn Session, table: &str) -> anyhow::Result<i64> {
    let rows = session.query(&format!("SELECT count(*) FROM {table}"), &[])?;
    Ok(rows.first().map(|r| r.get(0)).transpose()?.unwrap_or(0))
}

/// Copies `table` page by page in key order; the number of rows.
fn copy_table(from: &dyn Session, to: &dyn Session, table: &Table) -> anyhow::Result<u64> {
    let Table {
        name: table,
        columns,
        key,
    } = *table;
    let list = columns.join(", ");
    let key_list = key.join(", ");
    // The key is read after the columns: a key that is not one of them (a rowid) is read, not
    // copied.
    let read: Vec<&str> = columns
        .iter()
        .chain(key.iter().filter(|k| !columns.contains(k)))
        .copied()
        .collect();
    let read_list = read.join(", ");
    let after: Vec<String> = (1..=key.len()).map(|i| format!("${i}")).collect();
    let first_page = format!("SELECT {read_list} FROM {table} ORDER BY {key_list} LIMIT {PAGE}");
    let next_page = format!(
        "SELECT {read_list} FROM {table} WHERE ({key_list}) > ({}) ORDER BY {key_list} LIMIT {PAGE}",
        after.join(", ")
    );
    let placeholders: Vec<String> = (1..=columns.len()).map(|i| format!("${i}")).collect();
    let insert = format!(
        "INSERT INTO {table} ({list}) VALUES ({})",
        placeholders.join(", ")
    );
    let key_at: Vec<usize> = key
        .iter()
        .map(|k| read.iter().position(|c| c == k).expect("a key is a column"))
        .collect();
    let mut copied = 0;
    let mut last: Option<Vec<Value>> = None;
    loop {
        let rows = match &last {
            None => from.query(&first_page, &[])?,
            Some(key) => {
                let params: Vec<&dyn ToParam> = key.iter().map(|v| v as &dyn ToParam).collect();
                from.query(&next_page, &params)?
            }
        };
        for row in &rows {
            let params: Vec<&dyn ToParam> = row.values()[..columns.len()]
                .iter()
                .map(|v| v as &dyn ToParam)
                .collect();
            to.execute(&insert, &params)?;
            copied += 1;
        }
        match rows.last() {
            Some(row) if rows.len() as i64 == PAGE => {
                last = Some(key_at.iter().map(|&i| row.values()[i].clone()).collect());
            }
            _ => return Ok(copied),
        }
    }
}
