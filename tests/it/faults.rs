//! Database faults: another process holding the write lock, and a full disk.

use std::time::{Duration, Instant};

use crate::util::*;

#[test]
fn write_lock_held_elsewhere_gives_503_within_busy_timeout_then_recovers() {
    if skipped_on_postgres(
        "SQLite's write lock, held by another connection, against --busy-timeout-ms",
    ) {
        return;
    }
    let (_, mut args) = down_app();
    args.extend(["--busy-timeout-ms".to_string(), "500".to_string()]);
    let server = Server::start(&strs(&args));
    wait_for_first_heartbeat(&server);
    let lock = server.db();
    lock.batch("BEGIN IMMEDIATE");
    for i in 0..3 {
        let started = Instant::now();
        let reply = server.send(&paid(&format!("evt_locked{i}")));
        assert_error(&reply, 503, "database_busy");
        assert_eq!(reply.retry_after.as_deref(), Some("1"));
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "answered within the busy timeout, not hung"
        );
    }
    lock.batch("ROLLBACK");
    assert_eq!(ledger_count(&server.db()), 0);
    for i in 0..3 {
        let id = format!("evt_locked{i}");
        assert_outcome(&server.send(&paid(&id)), &id, "processed");
    }
    let db = server.db();
    assert_eq!(ledger_count(&db), 3);
    assert_one_outbox_row_per_claim(&db);
}

/// Requests that arrive while the writer waits out the busy timeout for another batch are
/// answered with that batch, not after a busy timeout of their own: none waits about twice
/// `--busy-timeout-ms`.
#[test]
fn requests_queued_behind_a_busy_wait_get_their_503_within_one_busy_timeout() {
    if skipped_on_postgres(
        "SQLite's write lock, held by another connection, against --busy-timeout-ms",
    ) {
        return;
    }
    let server = Server::start(&["--busy-timeout-ms", "1000"]);
    wait_for_first_heartbeat(&server);
    let lock = server.db();
    lock.batch("BEGIN IMMEDIATE");
    let waits: Vec<(u16, Duration)> = std::thread::scope(|s| {
        let senders: Vec<_> = (0..8)
            .map(|i| {
                let server = &server;
                s.spawn(move || {
                    // Staggered, so most arrive while a batch is already waiting.
                    std::thread::sleep(Duration::from_millis(100 * i));
                    let started = Instant::now();
                    let reply = server.send(&paid(&format!("evt_queued{i}")));
                    (reply.status, started.elapsed())
                })
            })
            .collect();
        senders.into_iter().map(|h| h.join().unwrap()).collect()
    });
    lock.batch("ROLLBACK");
    for (status, waited) in &waits {
        assert_eq!(*status, 503);
        assert!(
            *waited < Duration::from_millis(1700),
            "a request waited {waited:?}, more than one busy timeout of 1 s: {waits:?}"
        );
    }
    assert_eq!(ledger_count(&server.db()), 0);
}

/// A real full disk: the database on a small tmpfs filled up by another file. Needs root
/// (mount); elsewhere the test says it was skipped, except under CI, which requires it.
#[test]
fn full_disk_gives_503_writes_nothing_half_and_recovers_when_space_returns() {
    if skipped_on_postgres("the SQLite file on a full tmpfs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
        .arg(dir.path())
        .status()
        .is_ok_and(|s| s.success());
    if !prerequisite(
        mounted,
        "HOOKLEDGER_REQUIRE_TMPFS",
        "cannot mount a tmpfs here (not root?)",
    ) {
        return;
    }
    struct Unmount<'a>(&'a std::path::Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(self.0)
                .status();
        }
    }
    let _unmount = Unmount(dir.path());

    let (_, args) = down_app();
    let server = Server::start_in(dir.path(), &strs(&args));
    assert_outcome(&server.send(&paid("evt_space0")), "evt_space0", "processed");
    // Fill the disk, leaving a little room.
    let filler = dir.path().join("filler");
    let free = free_bytes(dir.path());
    std::fs::write(&filler, vec![0u8; free.saturating_sub(48 * 1024) as usize]).unwrap();

    let mut acked = vec!["evt_space0".to_string()];
    let mut refused = Vec::new();
    for i in 1..400 {
        let id = format!("evt_space{i}");
        let reply = server.send(&paid(&id));
        match reply.status {
            200 => acked.push(id),
            503 => {
                assert_eq!(json(&reply)["error"], "disk_full", "{}", reply.body);
                assert!(reply.retry_after.is_some());
                refused.push(id);
            }
            other => panic!("unexpected {other}: {}", reply.body),
        }
        if refused.len() >= 5 {
            break;
        }
    }
    assert!(!refused.is_empty(), "the disk never filled up");
    // Not ready, and it says why.
    let (status, body) = server.admin_get("/readyz");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("\"reason\":\"disk_full\""), "{body}");

    // Space returns: the refused events now go through, and it is ready again.
    std::fs::remove_file(&filler).unwrap();
    assert_eq!(server.admin_get("/readyz"), (200, "ready\n".to_string()));
    for id in &refused {
        assert_outcome(&server.send(&paid(id)), id, "processed");
    }
    let db = server.db();
    let total = acked.len() + refused.len();
    assert_eq!(ledger_count(&db) as usize, total);
    // No half-written event: every claim has its outbox row.
    assert_one_outbox_row_per_claim(&db);
    assert_file_intact(&db);
}

fn free_bytes(path: &std::path::Path) -> u64 {
    let out = std::process::Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .unwrap()
}

/// The scenario as an operator meets it: the `sqlite3` shell holds the write lock for 10 s
/// with the default busy timeout (5 s). Requests get a 503 with `Retry-After` once the busy
/// timeout runs out (not a 500, not a hang), and succeed after the shell lets go.
#[test]
fn sqlite3_shell_holding_the_lock_for_10_s_gives_503_then_success() {
    use std::io::Write;
    if skipped_on_postgres("the sqlite3 shell holding SQLite's write lock") {
        return;
    }
    if !prerequisite(
        installed("sqlite3"),
        "HOOKLEDGER_REQUIRE_SQLITE3",
        "no sqlite3 shell (apt-get install sqlite3)",
    ) {
        return;
    }
    // No forwarding here: the server's own writes (delivery attempts) would share the wait.
    let server = Server::start(&[]);
    // The server's own start-up writes (the first retention pass, the first heartbeat; the
    // next one is 30 s away) are done before the shell takes the lock, so the request below
    // waits for the shell alone, and the probe below sees the shell's lock, not the server's.
    assert_outcome(&server.send(&paid("evt_warm")), "evt_warm", "processed");
    wait_for_first_heartbeat(&server);
    let mut shell = std::process::Command::new("sqlite3")
        .arg(server.db_path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("starting the sqlite3 shell");
    let mut stdin = shell.stdin.take().unwrap();
    stdin
        // The shell waits for the server's own short writes (delivery attempts) before it
        // takes the lock, as an operator's shell with a busy timeout would.
        .write_all(b".timeout 5000\nBEGIN IMMEDIATE;\nINSERT INTO counters VALUES ('shell', 1);\n")
        .unwrap();
    stdin.flush().unwrap();
    let locked_at = Instant::now();
    // Wait until the shell really holds the lock.
    let probe = rusqlite::Connection::open(server.db_path()).unwrap();
    probe.busy_timeout(Duration::ZERO).unwrap();
    wait_for(Duration::from_secs(5), || {
        probe
            .execute_batch("BEGIN IMMEDIATE; ROLLBACK;")
            .is_err()
            .then_some(())
    })
    .expect("the shell did not take the lock");
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(10).saturating_sub(locked_at.elapsed()));
        stdin.write_all(b"COMMIT;\n.quit\n").unwrap();
        drop(stdin);
        shell.wait().unwrap()
    });
    let started = Instant::now();
    let reply = server.send(&paid("evt_shell"));
    let waited = started.elapsed();
    assert_error(&reply, 503, "database_busy");
    assert_eq!(reply.retry_after.as_deref(), Some("1"));
    assert!(
        waited >= Duration::from_secs(4),
        "answered before the busy timeout: {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(9),
        "not answered within the busy timeout: {waited:?}"
    );
    assert_eq!(
        server.db().count("SELECT count(*) FROM webhook_events"),
        1,
        "only the warm-up event"
    );

    assert!(releaser.join().unwrap().success());
    assert_outcome(&server.send(&paid("evt_shell")), "evt_shell", "processed");
    let db = server.db();
    assert_eq!(
        db.count("SELECT value FROM counters WHERE name = 'shell'"),
        1
    );
    assert_eq!(
        db.strings("SELECT event_id FROM webhook_events ORDER BY event_id"),
        ["evt_shell", "evt_warm"]
    );
}
