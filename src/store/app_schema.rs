//! The app's own schema, and the built-in handlers'.
//!
//! `[schema] migrations = "migrations/"` applies each `*.sql` file of the folder once, in name
//! order, each in its own transaction, and records it (with a hash of its text) in
//! `hookledger_app_migrations`, apart from hookledger's own `user_version`. A file that changed
//! after it was applied stops start-up: the database no longer matches it.
//!
//! A built-in handler's migrations ([`Schema`]: compiled in, in each store's SQL) run the same
//! way, recorded by handler and name in `hookledger_handler_migrations`; then each table the
//! handler owns must have its columns (a table of that name made by something else stops
//! start-up, named, instead of failing every event).

use std::path::Path;

use anyhow::{bail, Context};
use sha2::{Digest, Sha256};

use crate::handler::{Migration, Schema};
use crate::sql::Session;

/// How a store runs a migration: `batch` runs SQL text as it is (several statements, no
/// parameters), `begin` opens the transaction each migration runs in, and each one applied is
/// logged at `level` (info; debug on the in-memory database of a check, which nobody keeps).
pub(crate) struct Migrator<'a> {
    pub(crate) session: &'a dyn Session,
    pub(crate) batch: &'a dyn Fn(&str) -> anyhow::Result<()>,
    pub(crate) begin: &'a str,
    pub(crate) level: log::Level,
}

/// Whose migrations: the app's (a folder) or a built-in handler's (by its name).
#[derive(Clone, Copy)]
enum Owner<'a> {
    App,
    Handler(&'a str),
}

impl Owner<'_> {
    /// The table its migrations are recorded in, made if missing.
    fn record_table(self) -> &'static str {
        match self {
            Owner::App => {
                "CREATE TABLE IF NOT EXISTS hookledger_app_migrations (
                     name       TEXT PRIMARY KEY,
                     sha256     TEXT NOT NULL,
                     applied_at BIGINT NOT NULL
                 )"
            }
            Owner::Handler(_) => {
                "CREATE TABLE IF NOT EXISTS hookledger_handler_migrations (
                     handler    TEXT NOT NULL,
                     name       TEXT NOT NULL,
                     sha256     TEXT NOT NULL,
                     applied_at BIGINT NOT NULL,
                     PRIMARY KEY (handler, name)
                 )"
            }
        }
    }
}

/// Applies the migrations of `folder` not applied yet; returns how many it applied.
pub(crate) fn migrate(db: &Migrator<'_>, folder: &Path) -> anyhow::Result<usize> {
    let mut files: Vec<_> = std::fs::read_dir(folder)
        .with_context(|| {
            format!(
                "[schema] migrations: cannot read folder {}",
                folder.display()
            )
        })?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "sql"))
        .collect();
    files.sort();
    let mut migrations = Vec::new();
    for path in files {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .with_context(|| format!("migration file name {} is not UTF-8", path.display()))?
            .to_string();
        let sql = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read migration {}", path.display()))?;
        migrations.push((name, sql));
    }
    let migrations: Vec<(&str, &str)> = migrations
        .iter()
        .map(|(name, sql)| (name.as_str(), sql.as_str()))
        .collect();
    run(db, Owner::App, &migrations)
}

/// Applies the migrations of `schema`'s handler not applied yet, in the SQL `sql_of` picks
/// (the store's), and checks that each of its tables has its columns; returns how many it
/// applied.
pub(crate) fn migrate_handler(
    db: &Migrator<'_>,
    schema: &Schema,
    sql_of: fn(&Migration) -> &'static str,
) -> anyhow::Result<usize> {
    let migrations: Vec<(&str, &str)> = schema
        .migrations
        .iter()
        .map(|m| (m.name, sql_of(m)))
        .collect();
    let ran = run(db, Owner::Handler(schema.handler), &migrations)?;
    for table in schema.tables {
        let probe = format!(
            "SELECT {} FROM {} WHERE 1 = 0",
            table.columns.join(", "),
            table.name
        );
        db.session.query(&probe, &[]).with_context(|| {
            format!(
                "handler {}: table {} is not the one its migrations make (columns {}); was it \
                 made by something else?",
                schema.handler,
                table.name,
                table.columns.join(", ")
            )
        })?;
    }
    Ok(ran)
}

/// Applies `migrations` (name, SQL) of `owner` not applied yet, in order, each in a
/// transaction of its own; how many ran.
fn run(db: &Migrator<'_>, owner: Owner<'_>, migrations: &[(&str, &str)]) -> anyhow::Result<usize> {
    // In the migrations' transaction (and lock): two servers starting at once create it once.
    (db.batch)(db.begin)?;
    let created = (db.batch)(owner.record_table());
    (db.batch)(if created.is_ok() {
        "COMMIT"
    } else {
        "ROLLBACK"
    })?;
    created?;
    let mut applied = 0;
    for &(name, sql) in migrations {
        let hash = hex::encode(Sha256::digest(sql.as_bytes()));
        (db.batch)(db.begin)?;
        match apply(db, owner, name, sql, &hash) {
            Ok(true) => {
                (db.batch)("COMMIT")?;
                match owner {
                    Owner::App => log::log!(db.level, "applied migration {name}"),
                    Owner::Handler(handler) => {
                        log::log!(db.level, "applied migration {name} of handler {handler}")
                    }
                }
                applied += 1;
            }
            Ok(false) => (db.batch)("COMMIT")?,
            Err(e) => {
                let _ = (db.batch)("ROLLBACK");
                return Err(e);
            }
        }
    }
    Ok(applied)
}

/// Applies one migration in the open transaction unless it was applied already; whether it
/// ran. (Checked inside the transaction: several instances may start at once.)
fn apply(
    db: &Migrator<'_>,
    owner: Owner<'_>,
    name: &str,
    sql: &str,
    hash: &str,
) -> anyhow::Result<bool> {
    let recorded = match owner {
        Owner::App => db.session.query(
            "SELECT sha256 FROM hookledger_app_migrations WHERE name = $1",
            &[&name],
        )?,
        Owner::Handler(handler) => db.session.query(
            "SELECT sha256 FROM hookledger_handler_migrations WHERE handler = $1 AND name = $2",
            &[&handler, &name],
        )?,
    };
    match (
        recorded.first().map(|r| r.get::<String>(0)).transpose()?,
        owner,
    ) {
        (Some(old), _) if old == hash => return Ok(false),
        (Some(_), Owner::App) => bail!(
            "migration {name} changed after it was applied to this database; applied \
             migrations must not be edited: put the change in a new file (e.g. a higher \
             number) and restore {name}"
        ),
        (Some(_), Owner::Handler(handler)) => bail!(
            "migration {name} of handler {handler} is not the one applied to this database \
             (this hookledger edited a released migration, which it must never do); run the \
             hookledger that applied it, and report this"
        ),
        (None, _) => {}
    }
    let failed = || match owner {
        Owner::App => format!("migration {name} failed"),
        Owner::Handler(handler) => format!("migration {name} of handler {handler} failed"),
    };
    (db.batch)(sql).with_context(failed)?;
    let now = crate::time::unix_now();
    match owner {
        Owner::App => db.session.execute(
            "INSERT INTO hookledger_app_migrations (name, sha256, applied_at) VALUES ($1, $2, $3)",
            &[&name, &hash, &now],
        )?,
        Owner::Handler(handler) => db.session.execute(
            "INSERT INTO hookledger_handler_migrations (handler, name, sha256, applied_at)
             VALUES ($1, $2, $3, $4)",
            &[&handler, &name, &hash, &now],
        )?,
    };
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::Table;
    use rusqlite::Connection;

    fn migrate(conn: &mut Connection, folder: &Path) -> anyhow::Result<usize> {
        let batch = |sql: &str| Ok(conn.execute_batch(sql)?);
        super::migrate(
            &Migrator {
                session: &*conn,
                batch: &batch,
                begin: "BEGIN",
                level: log::Level::Info,
            },
            folder,
        )
    }

    fn migrate_handler(conn: &Connection, schema: &Schema) -> anyhow::Result<usize> {
        let batch = |sql: &str| Ok(conn.execute_batch(sql)?);
        super::migrate_handler(
            &Migrator {
                session: conn,
                batch: &batch,
                begin: "BEGIN",
                level: log::Level::Info,
            },
            schema,
            |m| m.sqlite,
        )
    }

    const TABLES: &[Table] = &[Table {
        name: "things",
        columns: &["id", "n"],
        key: &["id"],
    }];

    fn schema(migrations: &'static [Migration]) -> Schema {
        Schema {
            handler: "things-handler",
            migrations,
            tables: TABLES,
        }
    }

    const FIRST: Migration = Migration {
        name: "0001_things",
        sqlite: "CREATE TABLE IF NOT EXISTS things (id TEXT PRIMARY KEY, n INTEGER);",
        postgres: "not run here",
    };

    #[test]
    fn a_handlers_migrations_run_once_recorded_by_handler_and_its_tables_are_checked() {
        const BOTH: &[Migration] = &[
            FIRST,
            Migration {
                name: "0002_more",
                sqlite: "INSERT INTO things VALUES ('a', 1);",
                postgres: "not run here",
            },
        ];
        // Its text as applied, but one space: refused.
        const EDITED: &[Migration] = &[Migration {
            sqlite: "CREATE TABLE IF NOT EXISTS things (id TEXT PRIMARY KEY, n INTEGER); ",
            ..FIRST
        }];
        let conn = Connection::open_in_memory().unwrap();
        assert_eq!(migrate_handler(&conn, &schema(BOTH)).unwrap(), 2);
        assert_eq!(
            migrate_handler(&conn, &schema(BOTH)).unwrap(),
            0,
            "once each"
        );
        let recorded: Vec<String> = conn
            .prepare(
                "SELECT handler || '/' || name FROM hookledger_handler_migrations ORDER BY name",
            )
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(
            recorded,
            ["things-handler/0001_things", "things-handler/0002_more"]
        );
        let app_table: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE name = 'hookledger_app_migrations'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(app_table, 0, "apart from the app's");
        let err = migrate_handler(&conn, &schema(EDITED))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("migration 0001_things of handler things-handler is not the one applied"),
            "{err}"
        );
    }

    #[test]
    fn a_table_of_a_handlers_name_made_by_something_else_is_refused() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE things (id TEXT PRIMARY KEY, other INTEGER)")
            .unwrap();
        let err = format!(
            "{:#}",
            migrate_handler(&conn, &schema(&[FIRST])).unwrap_err()
        );
        assert!(
            err.contains("handler things-handler: table things is not the one its migrations make")
                && err.contains("no such column: n"),
            "{err}"
        );
    }

    #[test]
    fn migrations_run_once_in_name_order_and_a_changed_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("002_b.sql"), "INSERT INTO a VALUES (2);").unwrap();
        std::fs::write(dir.path().join("001_a.sql"), "CREATE TABLE a (x);").unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not a migration").unwrap();
        let mut conn = Connection::open_in_memory().unwrap();
        assert_eq!(migrate(&mut conn, dir.path()).unwrap(), 2);
        assert_eq!(migrate(&mut conn, dir.path()).unwrap(), 0, "once each");
        let rows: i64 = conn
            .query_row("SELECT count(*) FROM a", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 1);
        std::fs::write(dir.path().join("002_b.sql"), "INSERT INTO a VALUES (3);").unwrap();
        let err = migrate(&mut conn, dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("migration 002_b.sql changed after it was applied"),
            "{err}"
        );
        std::fs::write(dir.path().join("002_b.sql"), "INSERT INTO a VALUES (2);").unwrap();
        std::fs::write(
            dir.path().join("003_bad.sql"),
            "INSERT INTO nope VALUES (1);",
        )
        .unwrap();
        let err = format!("{:#}", migrate(&mut conn, dir.path()).unwrap_err());
        assert!(
            err.contains("migration 003_bad.sql failed") && err.contains("no such table"),
            "{err}"
        );
    }
}
