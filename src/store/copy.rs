//! `hookledger migrate-to postgres://…`: copies a SQLite ledger into an empty PostgreSQL
//! database, for an app moving from one machine to several.
//!
//! Every table hookledger owns is copied, row for row, keys included: the ledger
//! (`webhook_events`, so events received before the move stay duplicates after it), the outbox
//! (pending and dead rows are delivered and retried from the new database) and the
//! stripe-billing tables. The app's own tables (`[schema] migrations`) are the app's to move.
//! Not copied: `hookledger_claims_filter`, the SQLite writer's filter of keys saved at a clean
//! stop (PostgreSQL claims without one).
//!
//! The source is read in one read transaction (a consistent snapshot, also next to a running
//! `serve`, which should be stopped first so that nothing arrives after the snapshot); the
//! target is written in one transaction, so a failed copy leaves it empty.

use std::path::Path;

use anyhow::{bail, Context};

use crate::config::Database;
use crate::sql::{Session, ToParam, Value};
use crate::store::postgres::PgStore;
use crate::store::sqlite::{self, SqliteStore};

/// The tables copied, their columns and their keys (the order the copy pages in).
const TABLES: &[(&str, &[&str], &[&str])] = &[
    (
        "webhook_events",
        &[
            "source",
            "event_id",
            "event_type",
            "created",
            "received_at",
            "payload",
            "payload_codec",
            "payload_dict",
        ],
        // SQLite's ledger has no index on (source, event_id) alone (its key is by block of ids first):
        // the copy pages in the order claims arrived.
        &["rowid"],
    ),
    (
        "hookledger_payload_dicts",
        &["id", "source", "dict", "created_at"],
        &["id"],
    ),
    (
        "outbox",
        &[
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
        &["id"],
    ),
    (
        "subscriptions",
        &[
            "id",
            "customer_id",
            "account_id",
            "status",
            "provider_updated_at",
            "event_rank",
            "event_id",
        ],
        &["id"],
    ),
    (
        "invoice_payments",
        &["stripe_invoice_id", "account_id", "amount_paid", "event_id"],
        &["stripe_invoice_id"],
    ),
    ("accounts", &["id", "credits", "plan_until"], &["id"]),
    ("counters", &["name", "value"], &["name"]),
];

/// Rows read and written per round trip of the copy.
const PAGE: i64 = 500;

/// Copies the SQLite database `from` into the PostgreSQL database `to`; the rows copied per
/// table.
pub(crate) fn copy(from: &Database, to: &Database) -> anyhow::Result<Vec<(String, u64)>> {
    let (Database::Sqlite(path), Database::Postgres(url)) = (from, to) else {
        bail!(
            "migrate-to copies a SQLite file (--db) into PostgreSQL (a postgres:// URL); got \
             --db {from} and target {to}"
        );
    };
    sqlite_to_postgres(path, url)
}

fn sqlite_to_postgres(from: &Path, to: &str) -> anyhow::Result<Vec<(String, u64)>> {
    // Brings an older file to the current schema first, so the columns match.
    drop(SqliteStore::open_existing(from)?);
    let source = sqlite::open_read(from)?;
    source.execute_batch("BEGIN")?;
    let mut target = PgStore::open(to, crate::config::DEFAULT_BUSY_TIMEOUT)?;
    for (table, _, _) in TABLES {
        let existing = count(target.session(), table)?;
        if existing > 0 {
            bail!(
                "the target database already has {existing} row(s) in {table}; migrate-to \
                 copies into an empty hookledger database (create a new one)"
            );
        }
    }
    target.begin()?;
    let copied = TABLES
        .iter()
        .map(|(table, columns, key)| {
            let n = copy_table(&source, target.session(), table, columns, key)
                .with_context(|| format!("copying {table}"))?;
            Ok((table.to_string(), n))
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

fn count(session: &dyn Session, table: &str) -> anyhow::Result<i64> {
    let rows = session.query(&format!("SELECT count(*) FROM {table}"), &[])?;
    Ok(rows.first().map(|r| r.get(0)).transpose()?.unwrap_or(0))
}

/// Copies `table` page by page in key order; the number of rows.
fn copy_table(
    from: &dyn Session,
    to: &dyn Session,
    table: &str,
    columns: &[&str],
    key: &[&str],
) -> anyhow::Result<u64> {
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
