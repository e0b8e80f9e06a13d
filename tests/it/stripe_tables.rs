//! The stripe-billing handler owns its tables (`subscriptions`, `invoice_payments`,
//! `accounts`): a new database gets them from the handler's own migration
//! (`src/stripe/migrations/`), recorded in `hookledger_handler_migrations`, when a source names
//! the handler, and only then; a database made by the first migration as released (which made
//! them for everyone) keeps them with their rows; `migrate-to` copies them as the handler lists
//! them. On both stores, but for the SQLite files of older releases.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hookledger::internals::invoice_event;
use sha2::Digest;

use crate::util::*;

/// The handler's tables.
const TABLES: [&str; 3] = ["subscriptions", "invoice_payments", "accounts"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The handler's tables that `db` has.
fn stripe_tables(db: &Db) -> Vec<String> {
    let tables = db.tables();
    TABLES
        .iter()
        .filter(|t| tables.iter().any(|have| have == *t))
        .map(|t| t.to_string())
        .collect()
}

/// The handlers' migrations `db` records: `handler/name/sha256`; none without the table.
fn handler_migrations(db: &Db) -> Vec<String> {
    if !db
        .tables()
        .iter()
        .any(|t| t == "hookledger_handler_migrations")
    {
        return Vec::new();
    }
    db.strings(
        "SELECT handler || '/' || name || '/' || sha256 FROM hookledger_handler_migrations
         ORDER BY handler, name",
    )
}

/// The record of the handler's first migration in the dialect of `store`, as the database
/// keeps it: its text's SHA-256 is that of the file in `src/stripe/migrations/`.
fn billing_migration(store: Store) -> String {
    let dialect = match store {
        Store::Sqlite => "sqlite",
        Store::Postgres => "postgres",
    };
    let text =
        std::fs::read(root().join(format!("src/stripe/migrations/{dialect}/0001_billing.sql")))
            .unwrap();
    format!(
        "stripe-billing/0001_billing/{}",
        hex::encode(sha2::Sha256::digest(&text))
    )
}

/// A config file in `dir` with one `stripe` source, with `handlers`.
fn config(dir: &Path, handlers: &str) -> String {
    let path = dir.join(format!("hookledger-{}.toml", handlers.len()));
    std::fs::write(
        &path,
        format!(
            r#"
[[source]]
name = "stripe"
scheme = "stripe"
secrets = ["env:STRIPE_WEBHOOK_SECRET"]
handlers = [{handlers}]
"#
        ),
    )
    .unwrap();
    path.to_str().unwrap().to_string()
}

/// A signed-now `invoice.paid` of invoice `in_<id>` for `account`.
fn paid_for(id: &str, account: &str) -> Vec<u8> {
    invoice_event(
        id,
        "invoice.paid",
        now(),
        &format!("in_{id}"),
        "cus_1",
        account,
    )
    .into_bytes()
}

#[test]
fn a_new_database_gets_the_stripe_tables_from_the_handlers_migration() {
    // The quick start: the `stripe` source with stripe-billing.
    let server = Server::start(&[]);
    let db = server.db();
    assert_eq!(stripe_tables(&db), TABLES, "{:?}", db.tables());
    assert_eq!(handler_migrations(&db), [billing_migration(store())]);
    // The log is read from the server's stderr by a thread of the test's: it may come a
    // moment after the server answers (a loaded CI run read it too early once).
    let logged = wait_for(Duration::from_secs(10), || {
        server
            .log()
            .contains("applied migration 0001_billing of handler stripe-billing")
            .then_some(())
    });
    assert!(
        logged.is_some(),
        "made by the handler's migration, not found there: {}",
        server.log()
    );
    assert_outcome(&server.send(&paid("evt_new")), "evt_new", "processed");
    assert_eq!(credits(&db, "acct_1"), 100);
    drop(server);
}

#[test]
fn without_stripe_billing_no_stripe_tables_and_adding_it_later_makes_them_at_that_start() {
    let dir = test_dir();
    let without = config(dir.path(), "");
    let mut server = Server::start_in(dir.path(), &["--config", &without]);
    assert_outcome(&server.send(&paid("evt_before")), "evt_before", "processed");
    let db = server.db();
    assert_eq!(
        stripe_tables(&db),
        Vec::<String>::new(),
        "{:?}",
        db.tables()
    );
    assert_eq!(handler_migrations(&db), Vec::<String>::new());
    drop(db);
    assert_eq!(server.terminate(), Some(0));

    // The same database, the handler named: its tables are made at this start.
    let with = config(dir.path(), r#""stripe-billing""#);
    let server = Server::start_in(dir.path(), &["--config", &with]);
    let db = server.db();
    assert_eq!(stripe_tables(&db), TABLES);
    assert_eq!(handler_migrations(&db), [billing_migration(store())]);
    // An event claimed before is still a duplicate (the handler does not run for it); a new
    // one is billed.
    assert_outcome(&server.send(&paid("evt_before")), "evt_before", "duplicate");
    assert_outcome(&server.send(&paid("evt_after")), "evt_after", "processed");
    assert_eq!(credits(&db, "acct_1"), 100);
}

/// Every row of the handler's tables, each as one line of text, the same on both stores.
fn stripe_rows(db: &Db) -> Vec<(String, Vec<String>)> {
    const QUERIES: [&str; 3] = [
        "SELECT id || '|' || customer_id || '|' || coalesce(account_id, '-') || '|' || status
                || '|' || CAST(provider_updated_at AS TEXT) || '|' || CAST(event_rank AS TEXT)
                || '|' || event_id
         FROM subscriptions ORDER BY id",
        "SELECT stripe_invoice_id || '|' || account_id || '|' || CAST(amount_paid AS TEXT)
                || '|' || event_id
         FROM invoice_payments ORDER BY stripe_invoice_id",
        "SELECT id || '|' || CAST(credits AS TEXT) || '|' || coalesce(CAST(plan_until AS TEXT), '-')
         FROM accounts ORDER BY id",
    ];
    TABLES
        .iter()
        .zip(QUERIES)
        .map(|(table, sql)| (table.to_string(), db.strings(sql)))
        .collect()
}

/// A copy of `tests/fixtures/db/v2-stripe-only.db` at `dir/hookledger.db`.
fn released_file(dir: &Path) -> PathBuf {
    let path = dir.join("hookledger.db");
    std::fs::copy(root().join("tests/fixtures/db/v2-stripe-only.db"), &path).unwrap();
    path
}

const FIXTURE_ACCOUNT: &str = "test-account-001";

#[test]
fn a_sqlite_file_of_the_released_schema_keeps_its_stripe_tables_and_rows() {
    if skipped_on_postgres("a SQLite file made by an older release") {
        return;
    }
    let dir = test_dir();
    let path = released_file(dir.path());
    let before = stripe_rows(&Db::open(path.to_str().unwrap()));
    assert_eq!(
        before[2].1.len(),
        1,
        "the fixture has an account: {before:?}"
    );

    // Without stripe-billing: the tables stay as they are, untouched and unrecorded.
    let without = config(dir.path(), "");
    let mut server = Server::start_in(dir.path(), &["--config", &without]);
    let db = server.db();
    assert_eq!(stripe_rows(&db), before);
    assert_eq!(handler_migrations(&db), Vec::<String>::new());
    drop(db);
    assert_eq!(server.terminate(), Some(0));

    // With it: the handler's migration finds them, keeps every row, and is recorded.
    let server = Server::start_in(dir.path(), &[]);
    let db = server.db();
    assert_eq!(stripe_rows(&db), before);
    assert_eq!(handler_migrations(&db), [billing_migration(Store::Sqlite)]);
    let old = fixture("invoice.paid");
    assert_outcome(
        &server.send(&old),
        "evt_1Pgci1B7WZ01zgkWrMGF0FaA",
        "duplicate",
    );
    assert_eq!(credits(&db, FIXTURE_ACCOUNT), 100, "the fixture's credits");
    let new = paid_for("evt_released_next", FIXTURE_ACCOUNT);
    assert_outcome(&server.send(&new), "evt_released_next", "processed");
    assert_eq!(credits(&db, FIXTURE_ACCOUNT), 200, "added to the old row");
}

/// A database of its own on the test server, and the directory that drops it; `None` (the
/// test is skipped) where no server answers.
fn pg_database() -> Option<(TestDir, String)> {
    if !postgres_reachable() {
        return None;
    }
    let dir = test_dir();
    let url = postgres_db_in(dir.path());
    Some((dir, url))
}

#[test]
fn a_postgres_database_of_the_released_schema_keeps_its_stripe_tables_and_rows() {
    let Some((_dir, url)) = pg_database() else {
        return;
    };
    // What the released migrations left: migration 1 as released (with the three tables),
    // the later ones, and their record.
    let db = Db::open(&url);
    let mut migrations: Vec<PathBuf> =
        std::fs::read_dir(root().join("src/store/postgres/migrations"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| !p.ends_with("0001_schema.sql"))
            .collect();
    migrations.sort();
    let released = root().join("tests/fixtures/db/released-postgres-0001-schema.sql");
    db.batch("CREATE TABLE hookledger_migrations (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)");
    for (i, file) in std::iter::once(released).chain(migrations).enumerate() {
        db.batch(&std::fs::read_to_string(&file).unwrap());
        db.execute(
            "INSERT INTO hookledger_migrations (version, applied_at) VALUES ($1, 0)",
            &[&(i as i64 + 1)],
        );
    }
    db.batch(
        "INSERT INTO accounts (id, credits, plan_until) VALUES ('acct_1', 500, NULL);
         INSERT INTO invoice_payments VALUES ('in_old', 'acct_1', 2000, 'evt_old');
         INSERT INTO subscriptions VALUES ('sub_old', 'cus_1', 'acct_1', 'active', 5, 0, 'evt_sub');",
    );
    let before = stripe_rows(&db);

    let server = Server::start_on(&url, &[]);
    assert_eq!(stripe_rows(&db), before, "every row kept");
    assert_eq!(
        handler_migrations(&db),
        [billing_migration(Store::Postgres)]
    );
    assert_outcome(&server.send(&paid("evt_next")), "evt_next", "processed");
    assert_eq!(credits(&db, "acct_1"), 600, "added to the old row");
}

#[test]
fn migrate_to_copies_the_stripe_tables_the_handler_lists_into_tables_its_migration_makes() {
    if skipped_on_postgres("migrate-to copies a SQLite file") {
        return;
    }
    let Some((_pg_dir, pg)) = pg_database() else {
        return;
    };
    // A file of the released schema: its tables come along, made on PostgreSQL by the
    // handler's own migration.
    let dir = test_dir();
    let path = released_file(dir.path());
    let file = path.to_str().unwrap();
    let before = stripe_rows(&Db::open(file));
    let (code, out, err) = cli(&["migrate-to", &pg, "--db", file]);
    assert_eq!(code, 0, "{out}{err}");
    for (table, rows) in &before {
        assert!(
            out.contains(&format!("{table}: {} row(s)", rows.len())),
            "{table}: {out}"
        );
    }
    let target = Db::open(&pg);
    assert_eq!(stripe_rows(&target), before);
    assert_eq!(
        handler_migrations(&target),
        [billing_migration(Store::Postgres)]
    );
    assert_eq!(
        handler_migrations(&Db::open(file)),
        [billing_migration(Store::Sqlite)],
        "the source brought up to date first"
    );
}

#[test]
fn migrate_to_makes_no_stripe_tables_from_a_file_without_them() {
    if skipped_on_postgres("migrate-to copies a SQLite file") {
        return;
    }
    let Some((_pg_dir, pg)) = pg_database() else {
        return;
    };
    let dir = test_dir();
    let without = config(dir.path(), "");
    let mut server = Server::start_in(dir.path(), &["--config", &without]);
    assert_outcome(&server.send(&paid("evt_plain")), "evt_plain", "processed");
    let file = server.db_arg();
    assert_eq!(server.terminate(), Some(0));
    let (code, out, err) = cli(&["migrate-to", &pg, "--db", &file]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("webhook_events: 1 row(s)"), "{out}");
    for table in TABLES {
        assert!(!out.contains(&format!("{table}:")), "{out}");
    }
    let target = Db::open(&pg);
    assert_eq!(stripe_tables(&target), Vec::<String>::new());
    assert_eq!(handler_migrations(&target), Vec::<String>::new());
}
