//! Disk as the ledger grows (SQLite): the write-ahead log stays within `storage.wal_limit_mb`
//! under a burst and a prune and is cut back after, and the space pruning frees goes back to
//! the file system, so the file shrinks to what it holds; `hookledger vacuum` converts a
//! database made without that.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::util::*;

const MB: u64 = 1024 * 1024;

/// A signed-now Stripe event `id` with about `pad` bytes of payload.
/// An event of about `pad` bytes that the ledger cannot compress (random letters and digits:
/// ~6 bits a byte), so it stores about `pad * 3 / 4` bytes.
fn event(id: &str, pad: usize) -> Vec<u8> {
    const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let note: String = (0..pad)
        .map(|_| ALNUM[fastrand::usize(..ALNUM.len())] as char)
        .collect();
    format!(
        r#"{{"id":"{id}","object":"event","type":"customer.updated","created":{},"data":{{"object":{{"id":"cus_1","object":"customer","note":"{note}"}}}}}}"#,
        now(),
    )
    .into_bytes()
}

fn size(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

fn wal(db: &Path) -> PathBuf {
    PathBuf::from(format!("{}-wal", db.display()))
}

/// A server whose WAL bound is 1 MiB and whose own retention keeps everything (the test
/// prunes with the CLI, next to it).
fn start(dir: &Path) -> Server {
    let path = dir.join("hookledger.toml");
    std::fs::write(
        &path,
        r#"
[storage]
wal_limit_mb = 1

[retention]
claim_days = "never"
payload_days = "never"

[[source]]
name = "stripe"
scheme = "stripe"
secrets = ["env:STRIPE_WEBHOOK_SECRET"]
"#,
    )
    .unwrap();
    Server::start_in(dir, &["--config", path.to_str().unwrap()])
}

/// Waits until the WAL file is at most `bound` bytes; its size then.
fn wal_within(db: &Path, bound: u64) -> u64 {
    wait_for(Duration::from_secs(20), || {
        let n = size(&wal(db));
        (n <= bound).then_some(n)
    })
    .unwrap_or_else(|| panic!("the WAL stayed at {} bytes", size(&wal(db))))
}

#[test]
fn pruning_half_the_payloads_shrinks_the_file_and_the_wal_stays_within_its_bound() {
    if skipped_on_postgres("the SQLite file and its write-ahead log") {
        return;
    }
    let dir = test_dir();
    let server = start(dir.path());
    let db_path = server.db_path();
    let db = server.db();
    assert_eq!(
        db.count("SELECT auto_vacuum FROM pragma_auto_vacuum"),
        2,
        "a new database gives freed pages back (INCREMENTAL)"
    );

    // A burst: 1,200 events of ~8 KB stored, ~10 MB through a WAL bounded at 1 MiB.
    let mut peak = 0;
    for i in 0..1200 {
        let id = format!("evt_{i:05}");
        assert_outcome(&server.send(&event(&id, 11_500)), &id, "processed");
        peak = peak.max(size(&wal(&db_path)));
    }
    assert_eq!(ledger_count(&db), 1200);
    let after_burst = wal_within(&db_path, MB);
    assert!(
        peak < 8 * MB,
        "the WAL peaked at {peak} bytes during the burst"
    );

    // Half the payloads are older than the payload age.
    db.batch(
        "UPDATE webhook_events SET received_at = received_at - 40 * 86400
         WHERE CAST(substr(event_id, 5) AS INTEGER) % 2 = 0",
    );
    wal_within(&db_path, MB);
    let before = size(&db_path);
    assert!(before > 9 * MB, "the ledger holds ~10 MB: {before} bytes");

    // The CLI prunes next to the server, which keeps answering meanwhile.
    let db_arg = server.db_arg();
    let prune = std::thread::spawn(move || cli(&["prune", "--db", &db_arg]));
    let mut during: i64 = 0;
    while !prune.is_finished() || during < 20 {
        let id = format!("evt_during_{during}");
        assert_outcome(&server.send(&event(&id, 100)), &id, "processed");
        during += 1;
    }
    let (code, out, err) = prune.join().unwrap();
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("cleared 600 payloads"), "{out}");
    assert_eq!(
        db.count("SELECT count(*) FROM webhook_events WHERE event_id LIKE 'evt_during_%'"),
        during,
        "every request sent during the prune was committed"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM webhook_events WHERE payload IS NULL"),
        600
    );
    assert_eq!(ledger_count(&db), 1200 + during, "the claims stay");

    let wal_after = wal_within(&db_path, MB);
    // The file is cut when the checkpointer copies the last frames back (within a second).
    let after = wait_for(Duration::from_secs(20), || {
        let after = size(&db_path);
        (after * 100 <= before * 60).then_some(after)
    })
    .unwrap_or_else(|| size(&db_path));
    assert!(
        after * 100 <= before * 60,
        "the file went from {before} to {after} bytes (WAL {after_burst} after the burst, \
         {wal_after} after the prune)"
    );
    assert_eq!(
        db.count("SELECT freelist_count FROM pragma_freelist_count"),
        0,
        "no free page left in the file"
    );
}

#[test]
fn vacuum_converts_an_old_database_and_is_refused_while_serve_runs() {
    if skipped_on_postgres("a command for SQLite files") {
        return;
    }
    let dir = test_dir();
    let db_path = PathBuf::from(db_arg_in(dir.path()));
    // A database made as before: no auto_vacuum, 2,000 rows of 4 KB, half deleted.
    {
        let conn = rusqlite::Connection::open(&db_path).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             CREATE TABLE filler (x BLOB);
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000)
             INSERT INTO filler SELECT randomblob(4000) FROM n;
             DELETE FROM filler WHERE rowid % 2 = 0;
             PRAGMA wal_checkpoint(TRUNCATE);",
        )
        .unwrap();
    }
    let before = size(&db_path);
    let db_arg = db_path.to_str().unwrap();
    let server = Server::start_in(dir.path(), &[]);
    let (code, _, err) = cli(&["vacuum", "--db", db_arg]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("stop serve"), "{err}");
    assert_eq!(size(&db_path), before, "a refused vacuum changes nothing");
    drop(server);

    let (code, out, err) = cli(&["vacuum", "--db", db_arg]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&format!("{before} bytes before")), "{out}");
    let after = size(&db_path);
    assert!(after * 100 <= before * 60, "{before} -> {after}");
    let conn = rusqlite::Connection::open(&db_path).unwrap();
    let mode: i64 = conn
        .query_row("PRAGMA auto_vacuum", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, 2, "INCREMENTAL from now on");
    let rows: i64 = conn
        .query_row("SELECT count(*) FROM filler", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 1000, "the rows stay");

    let (code, _, err) = cli(&[
        "vacuum",
        "--db",
        &format!("{}/none.db", dir.path().display()),
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("does not exist"), "{err}");
}

/// A reader that holds an old snapshot keeps the WAL past its bound (no checkpoint can copy
/// its frames back): that is logged once with its cause, counted on `/metrics` and shown on
/// `/status` while it lasts, and the end is logged too. (The WAL once grew to 166 MiB past an
/// 8 MiB bound while a reader held a snapshot for 31 s, and nothing said so.)
#[test]
fn a_wal_held_past_its_bound_by_a_reader_is_logged_counted_and_shown() {
    if skipped_on_postgres("the SQLite write-ahead log") {
        return;
    }
    let dir = test_dir();
    let server = start(dir.path());
    let db_path = server.db_path();
    assert_outcome(
        &server.send(&event("evt_first", 100)),
        "evt_first",
        "processed",
    );
    let (_, metrics) = server.admin_get("/metrics");
    assert!(
        metrics.contains("hookledger_wal_over_limit_total 0"),
        "{metrics}"
    );

    // Another connection's read transaction: its snapshot pins the WAL.
    let reader = rusqlite::Connection::open(&db_path).unwrap();
    reader.execute_batch("BEGIN").unwrap();
    let held: i64 = reader
        .query_row("SELECT count(*) FROM webhook_events", [], |r| r.get(0))
        .unwrap();
    assert_eq!(held, 1);
    // ~3 MB through a WAL bounded at 1 MiB.
    for i in 0..400 {
        let id = format!("evt_{i:04}");
        assert_outcome(&server.send(&event(&id, 11_500)), &id, "processed");
    }
    let told = wait_for(Duration::from_secs(10), || {
        let log = server.log();
        log.lines()
            .find(|l| l.contains("past storage.wal_limit_mb = 1"))
            .map(str::to_string)
    })
    .unwrap_or_else(|| panic!("nothing said the WAL is past its bound:\n{}", server.log()));
    assert!(told.contains("WARN"), "{told}");
    assert!(told.contains("a reader holds an old snapshot"), "{told}");
    assert!(size(&wal(&db_path)) > 2 * MB, "the reader kept the frames");
    let (_, metrics) = server.admin_get("/metrics");
    assert!(
        metrics.contains("hookledger_wal_over_limit_total 1"),
        "{metrics}"
    );
    let bytes: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("hookledger_wal_bytes "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no hookledger_wal_bytes in {metrics}"));
    assert!(bytes > 2 * MB, "{bytes}");
    let (status, page) = server.admin_get("/status");
    assert_eq!(status, 200);
    assert!(page.contains("id=wal-over"), "{page}");
    assert!(page.contains("a reader holds an old snapshot"), "{page}");

    // The reader ends: the WAL is cut back, and that is said once.
    reader.execute_batch("COMMIT").unwrap();
    drop(reader);
    wal_within(&db_path, MB);
    wait_for(Duration::from_secs(10), || {
        server
            .log()
            .contains("back within storage.wal_limit_mb = 1")
            .then_some(())
    })
    .unwrap_or_else(|| panic!("the end was not told:\n{}", server.log()));
    let log = server.log();
    assert_eq!(
        log.matches("past storage.wal_limit_mb").count(),
        1,
        "told once per stay:\n{log}"
    );
    let (_, page) = server.admin_get("/status");
    assert!(!page.contains("id=wal-over"), "{page}");
    assert!(
        page.contains("past it for over 2 s 1 time since the start"),
        "{page}"
    );
}
