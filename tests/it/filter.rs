//! The SQLite writer's saved filter of keys is checked, not trusted (DESIGN.md §21): a filter
//! row with its bits changed, or copied from another ledger, is refused and the filter built
//! from the ledger; writes by other code that a catch-up would miss (a claim into a hole, a key
//! rewritten in place) invalidate it, while stopped and while serving; claims hookledger cannot
//! read (a key that is not UTF-8 text) are skipped and counted, never an error; and
//! `hookledger check` finds each of these problems planted in a ledger.

use std::path::Path;

use crate::util::*;

/// Claims another program wrote, one in each of the blocks 1 to 5 of 2^16 ids (older blocks
/// than the server's next claims), with event ids `{prefix}_old_{b}`.
fn claims_in_older_blocks(db: &Db, prefix: &str) -> Vec<String> {
    (1..=5i64)
        .map(|b| {
            let id = format!("{prefix}_old_{b}");
            db.execute(
                "INSERT INTO webhook_events (id, source, event_id, event_type, created, received_at)
                 VALUES ($1, 'stripe', $2, 'invoice.paid', 1, $3)",
                &[&((b << 16) + 1), &id, &now()],
            );
            id
        })
        .collect()
}

/// A ledger in `dir` with claims in five older blocks (by another program) and three the
/// server processed, stopped cleanly: its filter saved. The event ids, oldest first.
fn stopped_with_a_saved_filter(dir: &Path, prefix: &str) -> Vec<String> {
    let mut server = Server::start_in(dir, &[]);
    let db = server.db();
    let mut ids = claims_in_older_blocks(&db, prefix);
    for i in 0..3 {
        let id = format!("{prefix}_new_{i}");
        assert_outcome(&server.send(&paid(&id)), &id, "processed");
        ids.push(id);
    }
    assert_eq!(server.terminate(), Some(0));
    assert_eq!(saved(&db), 1, "saved at the clean stop");
    ids
}

fn saved(db: &Db) -> i64 {
    db.one::<i64>("SELECT count(*) FROM hookledger_claims_filter", &[])
}

/// Each of `ids` resent is a duplicate, and the ledger holds one claim of each.
fn resends_are_duplicates(server: &Server, ids: &[String]) {
    for id in ids {
        assert_outcome(&server.send(&paid(id)), id, "duplicate");
    }
    let db = server.db();
    for id in ids {
        assert_eq!(
            db.one::<i64>(
                "SELECT count(*) FROM webhook_events WHERE source = 'stripe' AND event_id = $1",
                &[id],
            ),
            1,
            "{id}"
        );
    }
}

/// `hookledger check --json` on the database: its exit code and its report.
fn check(db_arg: &str) -> (i32, serde_json::Value) {
    let (code, out, err) = cli(&["check", "--json", "--db", db_arg]);
    let report = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out} {err}"));
    (code, report)
}

/// `hookledger check` finds nothing wrong with the database.
fn assert_checked_clean(db_arg: &str) {
    let (code, report) = check(db_arg);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["problems"], serde_json::json!([]), "{report:#}");
}

/// The count of problems of `kind` in a check's report.
fn problems(report: &serde_json::Value, kind: &str) -> u64 {
    report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["kind"] == kind)
        .map_or(0, |p| p["count"].as_u64().unwrap())
}

fn logged(server: &Server, text: &str) -> bool {
    let found = wait_for(std::time::Duration::from_secs(10), || {
        server.log().contains(text).then_some(())
    });
    if found.is_none() {
        eprintln!("not logged: {text}\n{}", server.log());
    }
    found.is_some()
}

/// A saved filter whose bits were zeroed (its row otherwise as saved) is refused, and the
/// filter built: the claims in older blocks, which the key index does not see from the newest,
/// stay duplicates when resent, one ledger row each.
#[test]
fn a_saved_filter_with_its_bits_zeroed_is_refused_and_older_claims_stay_duplicates() {
    if skipped_on_postgres("the saved filter of keys is the SQLite writer's") {
        return;
    }
    let dir = test_dir();
    let ids = stopped_with_a_saved_filter(dir.path(), "evt_zeroed");
    let db = Db::open(&db_arg_in(dir.path()));
    db.execute(
        "UPDATE hookledger_claims_filter SET bits = zeroblob(length(bits))",
        &[],
    );
    let (code, report) = check(&db_arg_in(dir.path()));
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(problems(&report, "filter"), 1, "{report:#}");

    let server = Server::start_in(dir.path(), &[]);
    assert!(logged(
        &server,
        "the saved filter is refused (its checksum does not match"
    ));
    assert_eq!(saved(&db), 0);
    resends_are_duplicates(&server, &ids);
    // The writer installs the filter built in the background at its next job: the resends'.
    // Then with the filter in.
    assert!(logged(&server, "claim(s) built in"));
    resends_are_duplicates(&server, &ids);
    assert_eq!(ledger_count(&db), 8);
    drop(server);
    assert_checked_clean(&db_arg_in(dir.path()));
}

/// A filter row copied from another ledger of the same size (the same ids, the same counts,
/// other keys) is refused: it was saved of another ledger's identity.
#[test]
fn a_filter_copied_from_another_ledger_of_the_same_size_is_refused() {
    if skipped_on_postgres("the saved filter of keys is the SQLite writer's") {
        return;
    }
    let (mine, theirs) = (test_dir(), test_dir());
    let ids = stopped_with_a_saved_filter(mine.path(), "evt_mine");
    stopped_with_a_saved_filter(theirs.path(), "evt_theirs");
    let db = Db::open(&db_arg_in(mine.path()));
    let other = db_arg_in(theirs.path());
    db.batch(&format!(
        "ATTACH DATABASE '{other}' AS theirs;
         DELETE FROM hookledger_claims_filter;
         INSERT INTO hookledger_claims_filter SELECT * FROM theirs.hookledger_claims_filter;
         DETACH DATABASE theirs;"
    ));
    let same = |column: &str| {
        let of = |db: &Db| {
            db.one::<i64>(
                &format!("SELECT {column} FROM hookledger_claims_filter"),
                &[],
            )
        };
        assert_eq!(of(&db), of(&Db::open(&other)), "{column}");
    };
    for column in ["seen", "min_id", "sequence", "keys", "capacity"] {
        same(column);
    }

    let server = Server::start_in(mine.path(), &[]);
    assert!(logged(
        &server,
        "the saved filter is refused (its checksum does not match"
    ));
    resends_are_duplicates(&server, &ids);
    assert_eq!(ledger_count(&db), 8);
    drop(server);
    assert_checked_clean(&db_arg_in(mine.path()));
}

/// Writes by other code that a catch-up past the highest id seen would miss invalidate the
/// saved filter: a claim inserted with an explicit id into a hole of an older block, and a
/// key rewritten in place. After the restart both are duplicates when resent.
#[test]
fn a_claim_into_a_hole_and_a_key_rewritten_while_stopped_make_the_saved_filter_stale() {
    if skipped_on_postgres("the saved filter of keys is the SQLite writer's") {
        return;
    }
    for (write, id, why) in [
        (
            "INSERT INTO webhook_events (id, source, event_id, event_type, created, received_at)
             VALUES ((2 << 16) + 9, 'stripe', 'evt_hole', 'invoice.paid', 1, unixepoch())",
            "evt_hole",
            "stale: claim 131081 inserted below an id used before",
        ),
        (
            "UPDATE webhook_events SET event_id = 'evt_rewritten' WHERE event_id = 'evt_st_old_3'",
            "evt_rewritten",
            "stale: the key of claim 196609 rewritten",
        ),
    ] {
        let dir = test_dir();
        let mut ids = stopped_with_a_saved_filter(dir.path(), "evt_st");
        let db = Db::open(&db_arg_in(dir.path()));
        db.batch(write);
        assert!(db
            .opt::<String>("SELECT stale FROM hookledger_claims_filter", &[])
            .is_some());
        let server = Server::start_in(dir.path(), &[]);
        assert!(logged(&server, why), "{write}");
        ids.retain(|i| i != "evt_st_old_3");
        ids.push(id.to_string());
        resends_are_duplicates(&server, &ids);
        drop(server);
        assert_checked_clean(&db_arg_in(dir.path()));
    }
}

/// The same writes while the server runs: the triggers count them, and the writer reads the
/// ledger again at its next transaction.
#[test]
fn a_claim_into_a_hole_and_a_key_rewritten_while_serving_are_duplicates() {
    if skipped_on_postgres("the filter of keys is the SQLite writer's") {
        return;
    }
    let dir = test_dir();
    let server = Server::start_in(dir.path(), &[]);
    let db = server.db();
    let mut ids = claims_in_older_blocks(&db, "evt_live");
    assert_outcome(
        &server.send(&paid("evt_live_new")),
        "evt_live_new",
        "processed",
    );
    db.batch(
        "INSERT INTO webhook_events (id, source, event_id, event_type, created, received_at)
         VALUES ((2 << 16) + 9, 'stripe', 'evt_live_hole', 'invoice.paid', 1, unixepoch())",
    );
    assert_outcome(
        &server.send(&paid("evt_live_hole")),
        "evt_live_hole",
        "duplicate",
    );
    db.batch(
        "UPDATE webhook_events SET event_id = 'evt_live_rewritten'
         WHERE event_id = 'evt_live_old_4'",
    );
    ids.retain(|i| i != "evt_live_old_4");
    ids.extend(["evt_live_new", "evt_live_hole", "evt_live_rewritten"].map(String::from));
    resends_are_duplicates(&server, &ids);
    assert!(logged(&server, "reading the ledger again"));
    assert_eq!(ledger_count(&db), 7);
    drop(server);
    assert_checked_clean(&db_arg_in(dir.path()));
}

/// Claims written by other code with a key that is not UTF-8 text (a BLOB event id, invalid
/// UTF-8 in a TEXT one, a BLOB source) neither stop the start nor fail a webhook: skipped,
/// counted in a warning, and listed by `check`.
#[test]
fn claims_with_keys_that_are_not_utf8_text_are_skipped_at_the_start_and_while_serving() {
    if skipped_on_postgres("PostgreSQL refuses text that is not UTF-8") {
        return;
    }
    const UNREADABLE: &str =
        "INSERT INTO webhook_events (source, event_id, event_type, received_at)
         VALUES ('stripe', x'ff00fe', 'invoice.paid', unixepoch()),
                ('stripe', CAST(x'c328' AS TEXT), 'invoice.paid', unixepoch()),
                (x'737472697065', 'evt_blob_source', 'invoice.paid', unixepoch())";
    for saved_filter in [false, true] {
        let dir = test_dir();
        let mut server = Server::start_in(dir.path(), &[]);
        assert_outcome(&server.send(&paid("evt_before")), "evt_before", "processed");
        match saved_filter {
            true => assert_eq!(server.terminate(), Some(0)),
            false => server.kill(),
        }
        let db = Db::open(&db_arg_in(dir.path()));
        db.batch(UNREADABLE);

        let server = Server::start_in(dir.path(), &[]);
        // The writer takes the filter built in the background (and tells what it skipped) at
        // its next job: this event's.
        assert_outcome(&server.send(&paid("evt_after")), "evt_after", "processed");
        assert!(logged(
            &server,
            "ledger: 3 claim(s) with a source or event id that is not UTF-8 text"
        ));
        assert_outcome(&server.send(&paid("evt_before")), "evt_before", "duplicate");
        // And one written while it serves.
        db.batch(
            "INSERT INTO webhook_events (source, event_id, event_type, received_at)
             VALUES ('stripe', x'0102', 'invoice.paid', unixepoch())",
        );
        let reply = server.send(&paid("evt_while"));
        assert_eq!(reply.status, 200);
        assert_outcome(&reply, "evt_while", "processed");
        assert!(logged(&server, "4 in all"));
        assert_eq!(ledger_count(&db), 7);
        assert_eq!(credits(&db, "acct_1"), 300);
        drop(server);
        let (code, report) = check(&db_arg_in(dir.path()));
        assert_eq!(code, 1);
        assert_eq!(problems(&report, "unreadable_key"), 4, "{report:#}");
        assert_eq!(
            report["problems"].as_array().unwrap().len(),
            1,
            "{report:#}"
        );
    }
}

/// `hookledger check` finds each problem planted in a ledger, names it, and exits 1: a key
/// twice (in two blocks), a payload that does not decode, an outbox row whose event is
/// missing, a key that is not UTF-8 text, a saved filter lacking keys, a guard trigger gone;
/// on the ledger as the server left it, it exits 0.
#[test]
fn check_finds_each_planted_problem() {
    if skipped_on_postgres("check is for SQLite") {
        return;
    }
    let dir = test_dir();
    let ids = stopped_with_a_saved_filter(dir.path(), "evt_chk");
    let db_arg = db_arg_in(dir.path());
    let (code, out, _) = cli(&["check", "--db", &db_arg]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("8 claim(s), 3 payload(s) decoded"), "{out}");
    assert!(
        out.contains("saved filter whole: 8 key(s) found in it; no problem found"),
        "{out}"
    );

    let db = Db::open(&db_arg);
    let plants = [
        (
            "duplicate_key",
            format!(
                "INSERT INTO webhook_events (id, source, event_id, event_type, received_at)
                 VALUES (40 << 16, 'stripe', '{}', 'invoice.paid', 1)",
                ids[1]
            ),
        ),
        (
            "payload",
            "UPDATE webhook_events SET payload = x'28b52ffd00', payload_codec = 1
             WHERE event_id = 'evt_chk_new_0'"
                .to_string(),
        ),
        (
            "outbox_ref",
            "INSERT INTO outbox (kind, source, key, payload, payload_ref)
             VALUES ('forward', 'stripe', 'evt_gone', x'', 1)"
                .to_string(),
        ),
        (
            "unreadable_key",
            "INSERT INTO webhook_events (source, event_id, event_type, received_at)
             VALUES ('stripe', x'ff', 'invoice.paid', 1)"
                .to_string(),
        ),
        (
            "filter",
            "UPDATE hookledger_claims_filter SET bits = zeroblob(length(bits))".to_string(),
        ),
        (
            "trigger",
            "DROP TRIGGER hookledger_claim_deleted".to_string(),
        ),
    ];
    for (i, (kind, sql)) in plants.iter().enumerate() {
        db.batch(sql);
        let (code, report) = check(&db_arg);
        assert_eq!(code, 1, "{kind}: {report:#}");
        for (planted, _) in &plants[..=i] {
            assert!(
                problems(&report, planted) >= 1,
                "{planted} after {kind}: {report:#}"
            );
        }
        assert_eq!(
            report["problems"].as_array().unwrap().len(),
            i + 1,
            "{report:#}"
        );
    }
    let (code, out, _) = cli(&["check", "--db", &db_arg]);
    assert_eq!(code, 1);
    assert!(out.contains("problem: duplicate_key (1)"), "{out}");
    assert!(out.contains("6 problem(s) found"), "{out}");
}
