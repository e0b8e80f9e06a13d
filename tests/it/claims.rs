//! The claim as the ledger grows: a claim other code wrote is a duplicate when resent, a
//! restart (after a clean stop, which saves the SQLite writer's filter of keys, or after a
//! kill, which does not) keeps every claim a duplicate, and a ledger made by the release
//! before claims by block is converted in place, also when the conversion is killed midway.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::util::*;

/// A claim written into the ledger by another program while the server runs (a `sqlite3`
/// shell, the CLI, a tool that fills the ledger), received on another day than today's, is a
/// duplicate when the provider sends it, and so is one it moved to a block of ids of its own:
/// the server's in-memory filter of keys and its list of blocks catch up on what other
/// connections commit.
#[test]
fn a_claim_another_connection_wrote_while_serving_is_a_duplicate() {
    let server = Server::start(&[]);
    assert_outcome(&server.send(&paid("evt_served")), "evt_served", "processed");
    let db = server.db();
    let days_ago = now() - 3 * 86_400;
    db.execute(
        "INSERT INTO webhook_events (source, event_id, event_type, created, received_at)
         VALUES ('stripe', $1, 'invoice.paid', $2, $2)",
        &[&"evt_outside", &days_ago],
    );
    // And a claim moved to another day by hand (as tests of retention do), and on SQLite to
    // a block of the key index that held no claim (ids go by blocks of 2^16).
    db.execute(
        "UPDATE webhook_events SET received_at = received_at - 40 * 86400 WHERE event_id = $1",
        &[&"evt_served"],
    );
    if store() == Store::Sqlite {
        db.execute(
            "UPDATE webhook_events SET id = (SELECT max(id) FROM webhook_events) + (5 << 20)
             WHERE event_id = $1",
            &[&"evt_served"],
        );
    }
    for id in ["evt_outside", "evt_served"] {
        assert_outcome(&server.send(&paid(id)), id, "duplicate");
    }
    assert_outcome(&server.send(&paid("evt_new")), "evt_new", "processed");
    assert_eq!(ledger_count(&db), 3);
    // Only the two invoices the server processed were credited.
    assert_eq!(credits(&db, "acct_1"), 200);
    assert_ledger_checks(&server.db_arg());
}

/// A clean stop (SIGTERM) saves the SQLite writer's filter of keys, the next start loads it
/// and deletes the row while it serves; a `kill -9` saves nothing and the next start builds
/// the filter from the ledger. Either way every claim made before is a duplicate when resent
/// (on PostgreSQL, which has no filter, the same restarts keep the same answers).
#[test]
fn claims_stay_duplicates_after_a_clean_stop_and_after_a_kill() {
    let sqlite = store() == Store::Sqlite;
    let saved = |db: &Db| db.one::<i64>("SELECT count(*) FROM hookledger_claims_filter", &[]);
    let dir = test_dir();
    let ids: Vec<String> = (0..20).map(|i| format!("evt_restart_{i}")).collect();
    let mut server = Server::start_in(dir.path(), &[]);
    for id in &ids {
        assert_outcome(&server.send(&paid(id)), id, "processed");
    }
    let db = server.db();
    if sqlite {
        assert_eq!(saved(&db), 0, "nothing saved while serving");
    }
    assert_eq!(server.terminate(), Some(0));
    if sqlite {
        assert_eq!(saved(&db), 1, "saved at the clean stop");
        assert!(logged(&server, "ledger: filter of 20 claim(s) saved"));
        // A claim another program makes while the server is stopped: past the saved `seen`.
        db.execute(
            "INSERT INTO webhook_events (source, event_id, event_type, created, received_at)
             VALUES ('stripe', 'evt_while_stopped', 'invoice.paid', 1, $1)",
            &[&(now() - 86_400)],
        );
    }
    drop(db);

    let mut server = Server::start_in(dir.path(), &[]);
    let db = server.db();
    if sqlite {
        assert_eq!(saved(&db), 0, "taken by the start that loaded it");
        assert!(logged(
            &server,
            "ledger: filter of 20 claim(s) loaded, 1 added since its save"
        ));
    }
    for id in &ids {
        assert_outcome(&server.send(&paid(id)), id, "duplicate");
    }
    if sqlite {
        assert_outcome(
            &server.send(&paid("evt_while_stopped")),
            "evt_while_stopped",
            "duplicate",
        );
    }
    assert_outcome(&server.send(&paid("evt_second")), "evt_second", "processed");
    server.kill();
    if sqlite {
        assert_eq!(saved(&db), 0, "a kill saves nothing");
    }
    drop(db);

    let server = Server::start_in(dir.path(), &[]);
    // Duplicates while the filter is rebuilt (each claim seeks every block), and then with
    // it: the writer installs the built filter at its next job, and these resends are jobs
    // (waiting for the log line before sending any failed on a busy machine, where the build
    // ended after the start-up's own writes and nothing else came to the writer).
    for id in ids.iter().map(String::as_str).chain(["evt_second"]) {
        assert_outcome(&server.send(&paid(id)), id, "duplicate");
    }
    if sqlite {
        assert!(logged(&server, "claim(s) built in"));
        assert!(!server.log().contains("claim(s) loaded"));
        for id in ids.iter().map(String::as_str).chain(["evt_second"]) {
            assert_outcome(&server.send(&paid(id)), id, "duplicate");
        }
    }
    let db = server.db();
    assert_eq!(ledger_count(&db), 21 + i64::from(sqlite));
    // Only the 21 events the servers processed were credited.
    assert_eq!(credits(&db, "acct_1"), 2100);
    assert_ledger_checks(&server.db_arg());
}

/// Whether the server logs `text` within a few seconds (its log is read on another thread).
fn logged(server: &Server, text: &str) -> bool {
    let found = wait_for(Duration::from_secs(10), || {
        server.log().contains(text).then_some(())
    });
    if found.is_none() {
        eprintln!("not logged: {text}\n{}", server.log());
    }
    found.is_some()
}

/// The schema of the release before claims by block (version 10): the first migration as
/// released (with the stripe-billing tables) and the migrations up to 0010, as that release
/// applied them.
fn release_10_schema() -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut sql =
        std::fs::read_to_string(root.join("tests/fixtures/db/released-sqlite-0001-schema.sql"))
            .unwrap();
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("src/store/sqlite/migrations"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_str().unwrap();
            name[..4] <= *"0010"
        })
        .collect();
    files.sort();
    assert_eq!(files.len(), 9, "migrations 0002 to 0010");
    for file in files {
        sql.push_str(&std::fs::read_to_string(file).unwrap());
    }
    sql
}

/// Claims in the ledger made by [`release_10_ledger`]: enough that its conversion takes a
/// while (a second or so), for a kill to land in the middle of it.
const CLAIMS: i64 = 300_000;

/// A ledger as the release before claims by block left it: [`CLAIMS`] claims of two sources
/// with random-looking ids, received over 400 days, every tenth with its payload.
fn release_10_ledger(path: &Path) {
    let mut conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch("PRAGMA journal_mode = WAL").unwrap();
    let tx = conn.transaction().unwrap();
    tx.execute_batch(&release_10_schema()).unwrap();
    tx.pragma_update(None, "user_version", 10).unwrap();
    let start = now() - 400 * 86_400;
    {
        let mut insert = tx
            .prepare(
                "INSERT INTO webhook_events (source, event_id, event_type, created, received_at, payload)
                 VALUES (?1, ?2, 'invoice.paid', ?3, ?4, ?5)",
            )
            .unwrap();
        for i in 0..CLAIMS {
            let source = if i % 7 == 0 { "github" } else { "stripe" };
            let payload = (i % 10 == 0).then(|| format!(r#"{{"n":{i}}}"#).into_bytes());
            insert
                .execute(rusqlite::params![
                    source,
                    old_id(i),
                    i,
                    start + i * 399 * 86_400 / CLAIMS,
                    payload
                ])
                .unwrap();
        }
    }
    tx.commit().unwrap();
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
}

/// The `i`-th old claim's id: scattered over the key order, as GitHub's and Svix's are.
fn old_id(i: i64) -> String {
    format!(
        "evt_{:016x}",
        (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    )
}

/// Every claim, as text, in the order claims arrived.
fn ledger_rows(path: &Path) -> Vec<String> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT rowid, source, event_id, event_type, created, received_at, hex(payload)
             FROM webhook_events ORDER BY rowid",
        )
        .unwrap();
    stmt.query_map([], |r| {
        Ok(format!(
            "{}|{}|{}|{}|{:?}|{}|{:?}",
            r.get::<_, i64>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, String>(3)?,
            r.get::<_, Option<i64>>(4)?,
            r.get::<_, i64>(5)?,
            r.get::<_, Option<String>>(6)?,
        ))
    })
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

fn schema_version(path: &Path) -> i64 {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap()
}

/// A ledger made by the release before claims by block is converted in place by `serve`; a
/// `kill -9` in the middle of the conversion leaves it as it was (the migration is one
/// transaction), and the next start converts it: every claim kept with its columns and its
/// place in the order, old ids duplicates when resent (on another day than the one they were
/// received), new ids processed.
#[test]
fn a_release_10_ledger_is_converted_in_place_also_when_killed_midway() {
    if skipped_on_postgres("a SQLite file made by the release before claims by block") {
        return;
    }
    let dir = test_dir();
    let path = dir.path().join("hookledger.db");
    release_10_ledger(&path);
    let before = ledger_rows(&path);
    assert_eq!(before.len() as i64, CLAIMS);

    // Killed while migrating: as soon as the conversion has written into the WAL.
    let wal = dir.path().join("hookledger.db-wal");
    let mut child = serve_command(&path)
        .env("STRIPE_WEBHOOK_SECRET", SECRET)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = wait_for(Duration::from_secs(60), || {
        let len = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
        (len > 1 << 20).then_some(len)
    });
    let exited = child.try_wait().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(started.is_some(), "the migration never wrote 1 MiB of WAL");
    assert!(
        exited.is_none(),
        "the server finished before the kill: make the ledger larger"
    );
    assert_eq!(
        schema_version(&path),
        10,
        "the kill rolled the conversion back"
    );
    assert_eq!(ledger_rows(&path), before, "untouched after the kill");

    // Started again: converted, each claim as it was. Without retention, which would clear
    // the payloads of the claims over 30 days old while the test reads them.
    let keep_all = ["--retention-days", "never", "--payload-days", "never"];
    let server = Server::start_in(dir.path(), &keep_all);
    assert!(schema_version(&path) >= 11);
    assert_eq!(
        ledger_rows(&path),
        before,
        "every claim, its columns and order"
    );
    let db = server.db();
    let index: String = db.one(
        "SELECT sql FROM sqlite_master WHERE name = 'webhook_events_key'",
        &[],
    );
    assert!(index.contains("(id >> 16, source, event_id)"), "{index}");
    for i in [0, 1, CLAIMS / 2, CLAIMS - 1] {
        if i % 7 == 0 {
            continue; // github's: the test server has only the stripe source
        }
        let id = old_id(i);
        assert_outcome(&server.send(&paid(&id)), &id, "duplicate");
    }
    assert_outcome(&server.send(&paid("evt_after")), "evt_after", "processed");
    assert_eq!(ledger_count(&db), CLAIMS + 1);
    assert_eq!(
        credits(&db, "acct_1"),
        100,
        "only the new event was credited"
    );
    assert_ledger_checks(&server.db_arg());
}
