//! The store contract: one generic set of tests that every store passes (SQLite here, and
//! PostgreSQL on the test server), so that a second store cannot drift from the first. Each
//! test opens the database as `serve` does ([`super::open`]) and goes through the seam only:
//! [`Store::run_batch`], the [`OutboxReader`], the [`Reader`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::{Database, StorageConfig};
use crate::event::Event;
use crate::handler::{Handler, Prepared, Submission};
use crate::outbox::Attempt;
use crate::sql::{StoreError, Tx};
use crate::store::{open, Access, Done, Outcome, Poll, Stores, Work, Write};

/// Records each new event in the app's table `seen`, whose CHECK refuses `evt_bad`.
pub(crate) struct Record;

impl Handler for Record {
    fn name(&self) -> &str {
        "record"
    }

    fn handle(&self, tx: &Tx<'_>, event: &Event, _: Prepared) -> Result<(), StoreError> {
        tx.execute("INSERT INTO seen (event_id) VALUES ($1)", &[&event.id])?;
        Ok(())
    }
}

/// Spins without end on `evt_slow`, in a write (a recursive query, as an effect driven by a
/// body value can); records every other event in `seen`.
struct Slow;

impl Handler for Slow {
    fn name(&self) -> &str {
        "slow"
    }

    fn handle(&self, tx: &Tx<'_>, event: &Event, _: Prepared) -> Result<(), StoreError> {
        if event.id == "evt_slow" {
            tx.execute(
                "WITH RECURSIVE spin(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM spin) \
                 INSERT INTO seen (event_id) SELECT CAST(max(n) AS TEXT) FROM spin",
                &[],
            )?;
        }
        Record.handle(tx, event, Prepared::none())
    }
}

fn event(id: &str, forward: bool) -> Work<'static> {
    Work::Event(submission(id, forward))
}

/// Event `id` of source `src` with the [`Record`] handler, forwarded or not.
pub(crate) fn submission(id: &str, forward: bool) -> Submission {
    Submission {
        token: None,
        event: Event {
            source: "src".into(),
            id: id.into(),
            kind: "thing.happened".into(),
            created: Some(1),
            body: bytes::Bytes::from(format!(r#"{{"id":"{id}"}}"#)),
        },
        handlers: vec![(Arc::new(Record) as Arc<dyn Handler>, Prepared::none())],
        forward,
        routed: Vec::new(),
        stored: None,
    }
}

fn outcomes(done: Vec<Done>) -> Vec<Result<Outcome, StoreError>> {
    done.into_iter()
        .map(|d| match d {
            Done::Event(r) => r,
            Done::Write(_) => panic!("an event's result"),
        })
        .collect()
}

fn written(done: Vec<Done>) -> u64 {
    match done.as_slice() {
        [Done::Write(Ok(n))] => *n,
        _ => panic!("one write that succeeded"),
    }
}

/// Runs `work` as one batch at `now`, which must commit.
fn batch(stores: &mut Stores, work: Vec<Work<'_>>, now: i64) -> Vec<Done> {
    stores.writer.run_batch(work, now).unwrap()
}

/// Runs the events of `work` as one batch at `now`, which must commit: their outcomes.
fn events(stores: &mut Stores, work: Vec<Work<'_>>, now: i64) -> Vec<Result<Outcome, StoreError>> {
    outcomes(batch(stores, work, now))
}

/// Runs `write` alone in a batch at `now`: the rows it changed.
fn write(stores: &mut Stores, write: &Write, now: i64) -> u64 {
    written(batch(stores, vec![Work::Write(write)], now))
}

fn count(stores: &Stores, sql: &'static str) -> i64 {
    stores
        .reader
        .read(|ledger| Ok(ledger.query(sql, &[])?[0].get::<i64>(0)?))
        .unwrap()
}

/// Opens `database` as `serve` does, with the app's migration that makes `seen`.
fn opened(database: Database, dir: &std::path::Path) -> Stores {
    let mut stores = open(&database, &StorageConfig::default(), Access::Serve).unwrap();
    let migrations = dir.join("migrations");
    std::fs::create_dir_all(&migrations).unwrap();
    std::fs::write(
        migrations.join("001_seen.sql"),
        "CREATE TABLE seen (event_id TEXT NOT NULL CHECK (event_id <> 'evt_bad'));",
    )
    .unwrap();
    assert_eq!(stores.writer.migrate_app(&migrations).unwrap(), 1);
    assert_eq!(
        stores.writer.migrate_app(&migrations).unwrap(),
        0,
        "an app migration runs once"
    );
    stores
}

/// A claim is processed once; the same event again, in another batch or later in the same
/// one, is a duplicate and runs nothing.
fn claims_once(stores: &mut Stores) {
    assert_eq!(
        events(
            stores,
            vec![event("evt_1", false), event("evt_1", false)],
            10,
        ),
        [Ok(Outcome::Processed), Ok(Outcome::Duplicate)]
    );
    assert_eq!(
        events(stores, vec![event("evt_1", false)], 11),
        [Ok(Outcome::Duplicate)]
    );
    assert_eq!(count(stores, "SELECT count(*) FROM webhook_events"), 1);
    assert_eq!(count(stores, "SELECT count(*) FROM seen"), 1);
}

/// A resend on a later day, and one after the clock went back a few days, is a duplicate: the
/// key is one claim whatever day it was received.
fn a_resend_on_another_day_is_a_duplicate(stores: &mut Stores) {
    let last_second = 20_000 * 86_400 + 86_399;
    let claim = |stores: &mut Stores, id: &str, now: i64| {
        outcomes(batch(stores, vec![event(id, false)], now))
    };
    assert_eq!(
        claim(stores, "evt_day", last_second),
        [Ok(Outcome::Processed)]
    );
    for (what, now) in [
        ("past midnight", last_second + 2),
        ("a month later", last_second + 30 * 86_400),
        ("the clock back three days", last_second - 3 * 86_400),
        ("the same second", last_second),
    ] {
        assert_eq!(
            claim(stores, "evt_day", now),
            [Ok(Outcome::Duplicate)],
            "{what}"
        );
    }
    // Other ids on those days are new, and the ledger reads each claim back by its key.
    assert_eq!(
        claim(stores, "evt_other", last_second + 2),
        [Ok(Outcome::Processed)]
    );
    assert_eq!(count(stores, "SELECT count(*) FROM webhook_events"), 2);
    assert_eq!(count(stores, "SELECT count(*) FROM seen"), 2);
    let shown = stores
        .reader
        .read(|ledger| crate::store::listings::event_show(ledger, "src", "evt_day"))
        .unwrap();
    assert_eq!(shown["received_at"], last_second);
    let source = stores
        .reader
        .read(|ledger| crate::store::listings::source_of(ledger, "evt_other"))
        .unwrap();
    assert_eq!(source, "src");
}

/// One event whose handler fails is undone alone: its claim too; the others commit.
fn a_failing_event_rolls_back_alone(stores: &mut Stores) {
    let done = batch(
        stores,
        vec![
            event("evt_a", false),
            event("evt_bad", false),
            event("evt_b", false),
        ],
        10,
    );
    let results = outcomes(done);
    assert_eq!(results[0], Ok(Outcome::Processed));
    assert!(
        matches!(results[1], Err(StoreError::Database(_))),
        "{:?}",
        results[1]
    );
    assert_eq!(results[2], Ok(Outcome::Processed));
    assert_eq!(count(stores, "SELECT count(*) FROM webhook_events"), 2);
    assert_eq!(count(stores, "SELECT count(*) FROM seen"), 2);
    // Its retry starts clean.
    let ledger = "SELECT count(*) FROM webhook_events WHERE event_id = 'evt_bad'";
    assert_eq!(count(stores, ledger), 0);
}

/// A handler that runs past its time limit fails its event alone, after about the limit: the
/// events before and after it in the batch commit, and the next batch runs as usual.
fn a_handler_over_its_time_limit_fails_its_event_alone(stores: &mut Stores) {
    stores.writer.limit_handlers(Duration::from_millis(300));
    let slow = |id: &str| match event(id, true) {
        Work::Event(mut s) => {
            s.handlers = vec![(Arc::new(Slow) as Arc<dyn Handler>, Prepared::none())];
            Work::Event(s)
        }
        Work::Write(_) => unreachable!(),
    };
    let started = Instant::now();
    let done = batch(
        stores,
        vec![slow("evt_a"), slow("evt_slow"), slow("evt_b")],
        10,
    );
    let took = started.elapsed();
    let results = outcomes(done);
    assert_eq!(results[0], Ok(Outcome::Processed));
    assert!(
        matches!(&results[1], Err(StoreError::Database(m)) if m.contains("time limit")),
        "{:?}",
        results[1]
    );
    assert_eq!(results[2], Ok(Outcome::Processed));
    // Once or twice the limit (PostgreSQL tries the batch together first); never the spin.
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_eq!(count(stores, "SELECT count(*) FROM webhook_events"), 2);
    assert_eq!(count(stores, "SELECT count(*) FROM seen"), 2);
    assert_eq!(count(stores, "SELECT count(*) FROM outbox"), 2);
    let slow_claims = "SELECT count(*) FROM webhook_events WHERE event_id = 'evt_slow'";
    assert_eq!(count(stores, slow_claims), 0);
    assert_eq!(
        events(stores, vec![slow("evt_c")], 11),
        [Ok(Outcome::Processed)]
    );
    assert_eq!(count(stores, "SELECT count(*) FROM seen"), 3);
}

/// A forwarded event's outbox row is due, leased to the worker, and done once its attempt is
/// recorded; then nothing is due.
fn outbox_rows_are_leased_and_completed(stores: &mut Stores) {
    assert_eq!(
        events(
            stores,
            vec![event("evt_f", true), event("evt_g", false)],
            10
        ),
        [Ok(Outcome::Processed), Ok(Outcome::Processed)]
    );
    let due = stores
        .outbox
        .due(&Poll::new(r#"["forward"]"#, 10, 10))
        .unwrap();
    assert_eq!(due.len(), 1);
    let row = &due[0];
    assert_eq!((row.key.as_str(), row.source.as_str()), ("evt_f", "src"));
    assert_eq!(
        stores.outbox.payload(row, 10).unwrap().unwrap(),
        br#"{"id":"evt_f"}"#
    );
    let record = Write::Record {
        id: row.id,
        queued: row.queued,
        attempt: Attempt::Delivered { follow_up: None },
    };
    assert_eq!(write(stores, &record, 11), 1);
    let status = "SELECT count(*) FROM outbox WHERE status = 'done' AND key = 'evt_f'";
    assert_eq!(count(stores, status), 1);
    assert!(stores
        .outbox
        .due(&Poll::new(r#"["forward"]"#, 100, 10))
        .unwrap()
        .is_empty());
    assert_eq!(stores.outbox.next_due_at(r#"["forward"]"#).unwrap(), None);
}

/// A poll carries no payload (a [`crate::outbox::PendingRow`] has none): the payload of the
/// row attempted is read by id, byte for byte, while the row is pending as polled, and leaves
/// its lease alone.
fn payloads_are_read_by_id_when_attempted(stores: &mut Stores) {
    // 4 MiB of every byte value: not UTF-8, not JSON.
    let body: Vec<u8> = (0..4 << 20).map(|i| (i % 251) as u8).collect();
    let Work::Event(mut big) = event("evt_big", true) else {
        unreachable!()
    };
    big.event.body = bytes::Bytes::from(body.clone());
    assert_eq!(
        events(stores, vec![Work::Event(big), event("evt_small", true)], 10),
        [Ok(Outcome::Processed), Ok(Outcome::Processed)]
    );
    let due = stores
        .outbox
        .due(&Poll::new(r#"["forward"]"#, 10, 10))
        .unwrap();
    let keys: Vec<&str> = due.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["evt_big", "evt_small"]);
    let row = &due[0];
    // Every field of a polled row, by name: a payload field added back fails to compile here.
    let crate::outbox::PendingRow {
        id: _,
        kind: _,
        source: _,
        key: _,
        event_type: _,
        attempts: _,
        queued: _,
        lease: _,
    } = row;
    // Leased by the poll on PostgreSQL (SQLite has no leases): reading the payload as the
    // attempt starts, at 20, renews the lease from then (the default lease: 300 s).
    let leased = "SELECT count(*) FROM outbox WHERE leased_until IS NOT NULL";
    let leases = count(stores, leased);
    let payload = stores.outbox.payload(row, 20).unwrap();
    assert!(payload.as_deref() == Some(&body[..]), "the payload intact");
    assert_eq!(count(stores, leased), leases);
    let renewed = "SELECT count(*) FROM outbox WHERE key = 'evt_big' AND leased_until = 320";
    assert_eq!(count(stores, renewed), i64::from(row.lease.is_some()));
    let requeued = crate::outbox::PendingRow {
        queued: row.queued + 1,
        ..row.clone()
    };
    assert_eq!(
        stores.outbox.payload(&requeued, 20).unwrap(),
        None,
        "queued again since the poll: not this attempt's"
    );
    let record = Write::Record {
        id: row.id,
        queued: row.queued,
        attempt: Attempt::Delivered { follow_up: None },
    };
    let recorded = stores.writer.run_batch(vec![Work::Write(&record)], 11);
    assert_eq!(written(recorded.unwrap()), 1);
    assert_eq!(
        stores.outbox.payload(row, 21).unwrap(),
        None,
        "done: nothing to attempt"
    );
}

/// Recovery makes the pending rows of a kind that wait on a retry delay due at once; a row
/// never attempted, a dead row and another kind's rows keep their times.
fn recovery_makes_rows_waiting_on_backoff_due(stores: &mut Stores) {
    let done = batch(
        stores,
        vec![event("evt_r1", true), event("evt_r2", true)],
        10,
    );
    assert_eq!(outcomes(done).len(), 2);
    let due = stores
        .outbox
        .due(&Poll::new(r#"["forward"]"#, 10, 10))
        .unwrap();
    assert_eq!(due.len(), 2);
    let retry = Write::Record {
        id: due[0].id,
        queued: due[0].queued,
        attempt: Attempt::Retry {
            at: 1000,
            error: "HTTP 503".into(),
            output: None,
        },
    };
    let recorded = stores.writer.run_batch(vec![Work::Write(&retry)], 11);
    assert_eq!(written(recorded.unwrap()), 1);
    let other = Write::Recover {
        kind: "send_receipt".into(),
    };
    let recorded = stores.writer.run_batch(vec![Work::Write(&other)], 12);
    assert_eq!(written(recorded.unwrap()), 0, "another kind's rows");
    let recover = Write::Recover {
        kind: "forward".into(),
    };
    let recorded = stores.writer.run_batch(vec![Work::Write(&recover)], 12);
    assert_eq!(
        written(recorded.unwrap()),
        1,
        "only the row waiting on backoff"
    );
    let at = "SELECT count(*) FROM outbox WHERE key = 'evt_r1' AND next_attempt_at = 12 \
              AND attempts = 1 AND status = 'pending'";
    assert_eq!(count(stores, at), 1);
    let untouched = "SELECT count(*) FROM outbox WHERE key = 'evt_r2' AND next_attempt_at = 10";
    assert_eq!(count(stores, untouched), 1);
}

/// Coalescing keeps the newest queued row of a kind and source: the older queued ones are
/// superseded, the one being attempted (running here, leased on PostgreSQL) is left alone,
/// and a released lease makes its row due again.
fn coalescing_supersedes_older_queued_rows_not_running(stores: &mut Stores) {
    let work = ["evt_c1", "evt_c2", "evt_c3", "evt_c4"].map(|id| event(id, true));
    let done = batch(stores, work.into(), 10);
    assert_eq!(outcomes(done).len(), 4);
    let running = stores
        .outbox
        .due(&Poll::new(r#"["forward"]"#, 10, 1))
        .unwrap();
    assert_eq!(running[0].key, "evt_c1");
    let coalesce = Write::Coalesce {
        kind: "forward".into(),
        running: vec![running[0].id],
    };
    let superseded = stores.writer.run_batch(vec![Work::Write(&coalesce)], 11);
    assert_eq!(written(superseded.unwrap()), 2);
    let left =
        "SELECT count(*) FROM outbox WHERE status = 'pending' AND key IN ('evt_c1', 'evt_c4')";
    assert_eq!(count(stores, left), 2, "the running row and the newest");
    let kept = "SELECT count(*) FROM outbox WHERE status = 'superseded' AND done_at = 11 \
                AND key IN ('evt_c2', 'evt_c3')";
    assert_eq!(count(stores, kept), 2, "kept, as superseded");
    let again = stores.writer.run_batch(vec![Work::Write(&coalesce)], 12);
    assert_eq!(written(again.unwrap()), 0, "nothing older is queued");
    let release = Write::Release {
        id: running[0].id,
        queued: running[0].queued,
        lease: running[0].lease,
    };
    let released = stores.writer.run_batch(vec![Work::Write(&release)], 12);
    assert_eq!(written(released.unwrap()), 1);
    let due: Vec<String> = stores
        .outbox
        .due(&Poll::new(r#"["forward"]"#, 12, 10))
        .unwrap()
        .into_iter()
        .map(|r| r.key)
        .collect();
    assert_eq!(due, ["evt_c1", "evt_c4"], "released: due again at once");
}

/// A row's lease is released (its kind paused) or renewed (its attempt starts, or runs long)
/// only by the instance that holds it: once it lapsed and another instance leased the row, the
/// first instance neither releases, renews nor attempts it; the holder does. SQLite has no
/// leases (one server a file): there a release is the no-op it always was.
fn a_lapsed_lease_another_instance_took_is_left_to_it(stores: &mut Stores, database: &Database) {
    assert_eq!(
        events(stores, vec![event("evt_lease", true)], 10),
        [Ok(Outcome::Processed)]
    );
    let kinds = r#"["forward"]"#;
    let first = stores
        .outbox
        .due(&Poll::new(kinds, 10, 1))
        .unwrap()
        .remove(0);
    let lapsed = 10 + StorageConfig::default().outbox_lease.as_secs() as i64;
    let other = open(database, &StorageConfig::default(), Access::Command).unwrap();
    let second = other
        .outbox
        .due(&Poll::new(kinds, lapsed, 1))
        .unwrap()
        .remove(0);
    assert_eq!(
        second.id, first.id,
        "the lease lapsed: another instance takes the row"
    );
    let leases = first.lease.is_some();
    let release = |row: &crate::outbox::PendingRow| Write::Release {
        id: row.id,
        queued: row.queued,
        lease: row.lease,
    };
    assert_eq!(write(stores, &release(&first), lapsed), u64::from(!leases));
    assert_eq!(
        stores.outbox.payload(&first, lapsed).unwrap().is_some(),
        !leases,
        "not the first instance's to attempt"
    );
    assert_eq!(
        stores
            .outbox
            .due(&Poll::new(kinds, lapsed + 1, 10))
            .unwrap()
            .is_empty(),
        leases,
        "still the second instance's"
    );
    assert_eq!(
        stores.outbox.renew(&[first.id], lapsed + 1).unwrap(),
        0,
        "not the first instance's to renew"
    );
    assert_eq!(
        other.outbox.renew(&[second.id], lapsed + 1).unwrap(),
        u64::from(leases),
        "its holder renews it"
    );
    assert_eq!(
        write(stores, &release(&second), lapsed + 1),
        1,
        "its holder releases it"
    );
    let due = stores
        .outbox
        .due(&Poll::new(kinds, lapsed + 1, 10))
        .unwrap();
    assert_eq!(due.len(), 1, "released: due again for every instance");
    assert!(stores
        .outbox
        .payload(&due[0], lapsed + 1)
        .unwrap()
        .is_some());
}

/// Retention deletes the claims received before its cutoff, and only those.
fn retention_deletes_only_older_claims(stores: &mut Stores) {
    batch(stores, vec![event("evt_old", false)], 100);
    batch(stores, vec![event("evt_new", false)], 200);
    let prune = Write::PruneEvents { before: 150 };
    assert_eq!(write(stores, &prune, 300), 1);
    let left = "SELECT count(*) FROM webhook_events WHERE event_id = 'evt_new'";
    assert_eq!(count(stores, left), 1);
    assert_eq!(count(stores, "SELECT count(*) FROM webhook_events"), 1);
}

/// Refusals are counted per source, reason and minute (added to, so a second write of the same
/// minute adds up), their messages kept a few per source and reason, both pruned by age in the
/// same write, and read back by reason with their newest messages; the console's event filter
/// and a kind's revival read and change only what they name.
fn refusals_are_capped_and_pruned_and_the_console_reads_them(stores: &mut Stores) {
    use crate::store::refusals::{RefusalCount, RefusalMessage};
    let counted = |source: &str, reason: &str, at: i64, count: i64| RefusalCount {
        source: source.into(),
        reason: reason.into(),
        minute: at / 60,
        count,
        last_at: at,
    };
    let said = |source: &str, reason: &str, at: i64, message: &str| RefusalMessage {
        source: source.into(),
        reason: reason.into(),
        at,
        message: message.into(),
    };
    let first = Write::Refusals {
        counts: vec![
            counted("src", "invalid_signature", 10, 7),
            counted("src", "invalid_signature", 1000, 2),
            counted("src", "invalid_event", 1002, 2),
            counted("other", "invalid_signature", 1003, 2),
        ],
        messages: vec![
            said("src", "invalid_signature", 10, "too old to keep"),
            said("src", "invalid_signature", 1000, "no signature matches"),
            said(
                "src",
                "invalid_signature",
                1001,
                "missing Stripe-Signature header",
            ),
            said("src", "invalid_signature", 1001, "a third"),
            said("src", "invalid_event", 1002, "no `id`"),
            said("other", "invalid_signature", 1003, "other's"),
        ],
        before: 0,
        messages_kept: 3,
    };
    assert_eq!(write(stores, &first, 1100), 10);
    // The same minute again: added to its row. Past the age: minute 0 and its message go;
    // past 3 messages for (src, invalid_signature): its oldest goes.
    let second = Write::Refusals {
        counts: vec![counted("src", "invalid_signature", 1004, 5)],
        messages: vec![
            said("src", "invalid_signature", 1004, "no signature matches"),
            said("src", "invalid_signature", 1004, "a fourth"),
        ],
        before: 500,
        messages_kept: 3,
    };
    assert_eq!(write(stores, &second, 1100), 3);
    assert_eq!(
        count(
            stores,
            "SELECT count(*) FROM hookledger_refusals WHERE source = 'src'"
        ),
        2
    );
    assert_eq!(
        count(
            stores,
            "SELECT CAST(sum(count) AS BIGINT) FROM hookledger_refusals \
             WHERE source = 'src' AND reason = 'invalid_signature'"
        ),
        7
    );
    assert_eq!(
        count(
            stores,
            "SELECT count(*) FROM hookledger_refusal_messages \
             WHERE source = 'src' AND reason = 'invalid_signature'"
        ),
        3
    );
    assert_eq!(
        count(
            stores,
            "SELECT count(*) FROM hookledger_refusal_messages WHERE message = 'too old to keep' \
             OR message = 'missing Stripe-Signature header'"
        ),
        0
    );
    let names = vec!["src".to_string(), "other".to_string()];
    let summaries = stores
        .reader
        .read(|ledger| crate::store::console::summaries(ledger, &names, 1100))
        .unwrap();
    let src = &summaries[0];
    assert_eq!(src.refused(), 9);
    let reasons: Vec<(&str, i64)> = src
        .refusals
        .iter()
        .map(|r| (r.reason.as_str(), r.count))
        .collect();
    assert_eq!(reasons, [("invalid_signature", 7), ("invalid_event", 2)]);
    let messages: Vec<&str> = src.refusals[0]
        .messages
        .iter()
        .map(|(_, m)| m.as_str())
        .collect();
    assert_eq!(messages, ["a fourth", "no signature matches", "a third"]);
    assert_eq!(summaries[1].refused(), 2);

    batch(
        stores,
        vec![
            event("evt_a1", true),
            event("evt_a2", true),
            event("evt_b", false),
        ],
        900,
    );
    let filter = crate::store::console::EventFilter {
        id_prefix: Some("evt_a".into()),
        from: Some(900),
        ..Default::default()
    };
    let found = stores
        .reader
        .read(|ledger| crate::store::console::events(ledger, &filter, 10, None))
        .unwrap();
    let mut ids: Vec<&str> = found.iter().map(|e| e.event_id.as_str()).collect();
    ids.sort();
    assert_eq!(ids, ["evt_a1", "evt_a2"]);
    // A page from a key: the events after it in the list's order, newest first.
    let key = crate::store::console::EventKey {
        received_at: found[0].received_at,
        source: found[0].source.clone(),
        event_id: found[0].event_id.clone(),
    };
    let after = stores
        .reader
        .read(|ledger| crate::store::console::events(ledger, &filter, 10, Some(&key)))
        .unwrap();
    let after: Vec<&str> = after.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(after, [found[1].event_id.as_str()]);
    // A prefix is a range, not a pattern: `%` and `_` are themselves.
    for prefix in ["evt_a%", "evt%a", "evt_b1", "evt_c"] {
        let none = crate::store::console::EventFilter {
            id_prefix: Some(prefix.into()),
            ..Default::default()
        };
        assert!(
            stores
                .reader
                .read(|ledger| crate::store::console::events(ledger, &none, 10, None))
                .unwrap()
                .is_empty(),
            "{prefix}"
        );
    }
    let later = crate::store::console::EventFilter {
        from: Some(901),
        ..filter
    };
    assert!(stores
        .reader
        .read(|ledger| crate::store::console::events(ledger, &later, 10, None))
        .unwrap()
        .is_empty());
    let detail = stores
        .reader
        .read(|ledger| crate::store::console::event(ledger, "src", "evt_a1"))
        .unwrap()
        .expect("evt_a1");
    assert_eq!(detail.outbox.len(), 1);
    assert_eq!(detail.payload.as_deref(), Some(&br#"{"id":"evt_a1"}"#[..]));

    let dead = Write::Record {
        id: detail.outbox[0].id,
        queued: 0,
        attempt: Attempt::Dead {
            error: "HTTP 410".into(),
            output: None,
        },
    };
    assert_eq!(write(stores, &dead, 950), 1);
    let other = Write::ReviveKind {
        kind: "other".into(),
    };
    assert_eq!(write(stores, &other, 960), 0);
    let forward = Write::ReviveKind {
        kind: "forward".into(),
    };
    assert_eq!(write(stores, &forward, 960), 1);
    assert_eq!(
        count(
            stores,
            "SELECT count(*) FROM outbox WHERE status = 'pending'"
        ),
        2
    );
}

/// An incident opens once with its message, a second open (another instance, a restart)
/// queues nothing, refreshes keep it from clearing while seen, and it clears once.
fn an_alert_incident_opens_and_clears_once_each_with_its_message(stores: &mut Stores) {
    use crate::store::alerts::{Change, Incident};
    let incident = |change| {
        Write::Alert(Incident {
            alert: "ops".into(),
            cause: "refused",
            subject: "stripe".into(),
            change,
        })
    };
    let open = incident(Change::Open {
        kind: "alert:ops".into(),
        payload: b"{\"text\":\"on\"}".to_vec(),
    });
    let clear = |quiet_since| {
        incident(Change::Clear {
            kind: "alert:ops".into(),
            payload: b"{\"text\":\"off\"}".to_vec(),
            quiet_since,
        })
    };
    assert_eq!(write(stores, &open, 100), 1);
    assert_eq!(write(stores, &open, 101), 0, "open already: nothing");
    assert_eq!(write(stores, &incident(Change::Seen), 150), 1);
    assert_eq!(
        write(stores, &clear(140), 160),
        0,
        "seen at 150, after 140: still open"
    );
    assert_eq!(write(stores, &clear(150), 170), 1);
    assert_eq!(
        write(stores, &clear(150), 171),
        0,
        "cleared already: nothing"
    );
    assert_eq!(write(stores, &open, 200), 1, "a new incident");
    let rows = "SELECT count(*) FROM outbox WHERE kind = 'alert:ops' AND source = 'hookledger'";
    assert_eq!(count(stores, rows), 3);
    let open_rows = "SELECT count(*) FROM alert_incidents WHERE cleared_at IS NULL";
    assert_eq!(count(stores, open_rows), 1);
}

/// A handler's own tables, as a built-in handler declares them.
const THINGS: crate::handler::Schema = crate::handler::Schema {
    handler: "things",
    migrations: &[crate::handler::Migration {
        name: "0001_things",
        sqlite: "CREATE TABLE IF NOT EXISTS things (id TEXT PRIMARY KEY, n INTEGER NOT NULL);",
        postgres: "CREATE TABLE IF NOT EXISTS things (id TEXT PRIMARY KEY, n BIGINT NOT NULL);",
    }],
    tables: &[crate::handler::Table {
        name: "things",
        columns: &["id", "n"],
        key: &["id"],
    }],
};

/// A handler's migrations run once each, in the store's dialect, recorded by handler and
/// name; the core's schema has none of its tables before.
fn a_handlers_migrations_run_once_and_make_its_tables(stores: &mut Stores) {
    let recorded = "SELECT count(*) FROM hookledger_handler_migrations WHERE handler = 'things'";
    assert!(
        stores
            .reader
            .read(|r| Ok(r.query("SELECT count(*) FROM things", &[])?))
            .is_err(),
        "no table before the handler's migration"
    );
    assert_eq!(stores.writer.migrate_handler(&THINGS).unwrap(), 1);
    assert_eq!(stores.writer.migrate_handler(&THINGS).unwrap(), 0, "once");
    assert_eq!(count(stores, recorded), 1);
    assert_eq!(count(stores, "SELECT count(*) FROM things"), 0);
}

macro_rules! contract {
    ($store:ident, $open:expr) => {
        mod $store {
            use super::*;

            #[test]
            fn a_handlers_migrations_run_once_and_make_its_tables() {
                let Some((_guard, mut stores, _)) = $open else {
                    return;
                };
                super::a_handlers_migrations_run_once_and_make_its_tables(&mut stores);
            }

            #[test]
            fn claims_once() {
                let Some((_guard, mut stores, _)) = $open else {
                    return;
                };
                super::claims_once(&mut stores);
            }

            #[test]
            fn a_resend_on_another_day_is_a_duplicate() {
                let Some((_guard, mut stores, _)) = $open else {
                    return;
                };
                super::a_resend_on_another_day_is_a_duplicate(&mut stores);
            }

            #[test]
            fn a_failing_event_rolls_back_alone() {
                let Some((_guard, mut stores, _)) = $open else {
                    return;
                };
                super::a_failing_event_rolls_back_alone(&mut stores);
            }

            #[test]
            fn a_handler_over_its_time_limit_fails_its_event_alone() {
                let Some((_guard, mut stores, _)) = $open else {
                    return;
                };
                super::a_handler_over_its_time_limit_fails_its_event_alone(&mut stores);
            }

            #[test]
            fn outbox_rows_are_leased_and_completed() {
                let Some((_guard, mut stores, _)) = $open else {
                    return;
                };
                super::outbox_rows_are_leased_and_completed(&mut stores);
            }

            #[test]
            fn payloads_are_read_by_id_when_attempted() {
                let Some((_guard, mut stores, _)) = $open else {
                    return;
                };
                super::payloads_are_read_by_id_when_attempted(&mut stores);
            }

            #[test]
            fn recovery_makes_rows_waiting_on_backoff_due() {
                let Some((_guard, mut stores, _)) = $open else {
                    return;
                };
                super::recovery_makes_rows_waiting_on_backoff_due(&mut stores);
            }

            #[test]
            fn an_alert_incident_opens_and_clears_once_each_with_its_message() {
                let Some((_guard, mut stores, _)) = $open else {
                    return;
                };
                super::an_alert_incident_opens_and_clears_once_each_with_its_message(&mut stores);
            }

            #[test]
            fn coalescing_supersedes_older_queued_rows_not_running() {
                let Some((_guard, mut stores, _)) = $open else {
                    return;
                };
                super::coalescing_supersedes_older_queued_rows_not_running(&mut stores);
            }

            #[test]
            fn a_lapsed_lease_another_instance_took_is_left_to_it() {
                let Some((_guard, mut stores, database)) = $open else {
                    return;
                };
                super::a_lapsed_lease_another_instance_took_is_left_to_it(&mut stores, &database);
            }

            #[test]
            fn retention_deletes_only_older_claims() {
                let Some((_guard, mut stores, _)) = $open else {
                    return;
                };
                super::retention_deletes_only_older_claims(&mut stores);
            }

            #[test]
            fn refusals_are_capped_and_pruned_and_the_console_reads_them() {
                let Some((_guard, mut stores, _)) = $open else {
                    return;
                };
                super::refusals_are_capped_and_pruned_and_the_console_reads_them(&mut stores);
            }
        }
    };
}

fn sqlite() -> Option<(tempfile::TempDir, Stores, Database)> {
    let dir = tempfile::tempdir().unwrap();
    let database = Database::Sqlite(dir.path().join("h.db"));
    let stores = opened(database.clone(), dir.path());
    Some((dir, stores, database))
}

#[cfg(feature = "postgres")]
fn postgres() -> Option<(
    (crate::store::postgres::scratch::Scratch, tempfile::TempDir),
    Stores,
    Database,
)> {
    let scratch = crate::store::postgres::scratch::Scratch::new()?;
    let dir = tempfile::tempdir().unwrap();
    let database = Database::Postgres(scratch.url.clone());
    let stores = opened(database.clone(), dir.path());
    Some(((scratch, dir), stores, database))
}

contract!(on_sqlite, sqlite());
#[cfg(feature = "postgres")]
contract!(on_postgres, postgres());
