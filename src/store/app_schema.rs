//! The app's own schema: `[schema] migrations = "migrations/"` applies each `*.sql` file of the
//! folder once, in name order, each in its own transaction, and records it (with a hash of its
//! text) in `hookledger_app_migrations`, apart from hookledger's own `user_version`. A file
//! that changed after it was applied stops start-up: the database no longer matches it.

use std::path::Path;

use anyhow::{bail, Context};
use sha2::{Digest, Sha256};

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
    // In the migrations' transaction (and lock): two servers starting at once create it once.
    (db.batch)(db.begin)?;
    let created = (db.batch)(
        "CREATE TABLE IF NOT EXISTS hookledger_app_migrations (
             name       TEXT PRIMARY KEY,
             sha256     TEXT NOT NULL,
             applied_at BIGINT NOT NULL
         )",
    );
    (db.batch)(if created.is_ok() {
        "COMMIT"
    } else {
        "ROLLBACK"
    })?;
    created?;
    let mut applied = 0;
    for path in files {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .with_context(|| format!("migration file name {} is not UTF-8", path.display()))?
            .to_string();
        let sql = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read migration {}", path.display()))?;
        let hash = hex::encode(Sha256::digest(sql.as_bytes()));
        (db.batch)(db.begin)?;
        match apply(db, &name, &sql, &hash) {
            Ok(true) => {
                (db.batch)("COMMIT")?;
                log::log!(db.level, "applied migration {name}");
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
fn apply(db: &Migrator<'_>, name: &str, sql: &str, hash: &str) -> anyhow::Result<bool> {
    let recorded = db.session.query(
        "SELECT sha256 FROM hookledger_app_migrations WHERE name = $1",
        &[&name],
    )?;
    match recorded.first().map(|r| r.get::<String>(0)).transpose()? {
        Some(old) if old == hash => return Ok(false),
        Some(_) => bail!(
            "migration {name} changed after it was applied to this database; applied \
             migrations must not be edited: put the change in a new file (e.g. a higher \
             number) and restore {name}"
        ),
        None => {}
    }
    (db.batch)(sql).with_context(|| format!("migration {name} failed"))?;
    db.session.execute(
        "INSERT INTO hookledger_app_migrations (name, sha256, applied_at) VALUES ($1, $2, $3)",
        &[&name, &hash, &crate::time::unix_now()],
    )?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
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
