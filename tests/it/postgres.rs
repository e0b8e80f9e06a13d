//! The PostgreSQL store's own promises: two instances on one database (a claim race, a
//! SIGKILL with outbox rows leased).
//!
//! These run in both modes (`HOOKLEDGER_TEST_STORE` unset or `postgres`), each on a database
//! of its own on the server at `HOOKLEDGER_TEST_POSTGRES` ([`postgres_db_in`]), whenever that
//! server answers; where none does they are skipped, or fail under
//! `HOOKLEDGER_REQUIRE_POSTGRES`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use hookledger::internals::Client;

use crate::util::*;

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

/// The serve arguments to forward to `app` with `--outbox-lease 3s` and many 1 s retries.
fn forwarding(app_url: &str) -> Vec<String> {
    let mut args = down_app_args(app_url);
    args.extend(["--outbox-lease".to_string(), "3s".to_string()]);
    args
}

/// What the senders to one instance saw.
#[derive(Default)]
struct Answers {
    /// The ids answered 200 `processed`, and when.
    acked: Mutex<Vec<(String, Instant)>>,
    /// The `error` of each 503.
    refused: Mutex<Vec<String>>,
    /// Every other answer, and every request without an answer, and when.
    unexpected: Mutex<Vec<(Instant, String)>>,
}

impl Answers {
    fn acked(&self) -> Vec<String> {
        self.acked
            .lock()
            .unwrap()
            .iter()
            .map(|(id, _)| id.clone())
            .collect()
    }

    fn acked_count(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    fn unexpected(&self, what: String) {
        let at = Instant::now();
        self.unexpected.lock().unwrap().push((at, what));
    }

    fn unexpected_answers(&self) -> Vec<(Instant, String)> {
        self.unexpected.lock().unwrap().clone()
    }
}

/// Starts `workers` threads in `scope` that send new paid invoice events
/// (`{prefix}{worker}_{i}`) to `url` until `stop` is set, recording every answer in
/// `answers`. A sender stops at its first request without an answer.
fn send_until<'s>(
    scope: &'s std::thread::Scope<'s, '_>,
    url: String,
    prefix: &'s str,
    workers: u64,
    stop: &'s AtomicBool,
    answers: &'s Answers,
) {
    for worker in 0..workers {
        let url = url.clone();
        scope.spawn(move || {
            let client = Client::new(Duration::from_secs(10));
            for i in 0.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let id = format!("{prefix}{worker}_{i}");
                let reply = match client.send(&url, &paid(&id), &secret(), now()) {
                    Ok(reply) => reply,
                    Err(e) => {
                        answers.unexpected(format!("{id}: no answer: {e}"));
                        break;
                    }
                };
                let body: serde_json::Value = serde_json::from_str(&reply.body).unwrap_or_default();
                match reply.status {
                    200 if body["outcome"] == "processed" => {
                        answers.acked.lock().unwrap().push((id, Instant::now()));
                    }
                    503 => {
                        let kind = body["error"].as_str().unwrap_or("(no error kind)");
                        answers.refused.lock().unwrap().push(kind.to_string());
                    }
                    _ => {
                        answers.unexpected(format!("{id}: {} {}", reply.status, reply.body));
                    }
                }
            }
        });
    }
}

/// The `idempotency-key`s `app` was sent (answered or still held).
fn delivered_keys(app: &FakeApp) -> BTreeSet<String> {
    app.deliveries()
        .iter()
        .filter_map(|d| d.headers.get("idempotency-key").cloned())
        .collect()
}

/// Waits until no outbox row is pending; a test failure, with the rows left, if one still is
/// after `deadline` (or if one is dead).
fn wait_outbox_all_done(db: &Db, deadline: Duration) {
    let settled = wait_for(deadline, || {
        (db.count("SELECT count(*) FROM outbox WHERE status <> 'done'") == 0).then_some(())
    });
    if settled.is_none() {
        let left: Vec<String> = db.strings(
            "SELECT key || ' ' || status || ' attempts ' || CAST(attempts AS TEXT)
                    || ' ' || coalesce(last_error, '')
             FROM outbox WHERE status <> 'done' ORDER BY id LIMIT 20",
        );
        panic!("outbox rows not delivered after {deadline:?}: {left:#?}");
    }
}

#[test]
fn two_instances_one_event_at_once_give_one_processed_and_one_duplicate() {
    let Some((_dir, url)) = pg_database() else {
        return;
    };
    let a = Server::start_on(&url, &[]);
    let b = Server::start_on(&url, &[]);
    const EVENTS: usize = 1000;
    // Pairs in flight at once: so that batches of several claims meet on both instances.
    const LANES: usize = 32;
    // One body per event, the same bytes to both instances (as a provider's resend).
    let events: Vec<(String, Vec<u8>)> = (0..EVENTS)
        .map(|i| {
            let id = format!("evt_pair{i}");
            let body = paid(&id);
            (id, body)
        })
        .collect();
    // Per event: what each instance answered (status, outcome or error).
    let answers: Mutex<BTreeMap<String, [String; 2]>> = Mutex::new(BTreeMap::new());
    std::thread::scope(|s| {
        for lane in 0..LANES {
            let barrier = std::sync::Arc::new(Barrier::new(2));
            for (k, server) in [&a, &b].into_iter().enumerate() {
                let (barrier, events, answers) = (barrier.clone(), &events, &answers);
                s.spawn(move || {
                    for (id, body) in events.iter().skip(lane).step_by(LANES) {
                        barrier.wait();
                        let reply = server.send(body);
                        let json: serde_json::Value =
                            serde_json::from_str(&reply.body).unwrap_or_default();
                        let what = match reply.status {
                            200 if json["event_id"] == id.as_str() => {
                                json["outcome"].as_str().unwrap_or("").to_string()
                            }
                            status => format!("{status} {}", reply.body),
                        };
                        answers
                            .lock()
                            .unwrap()
                            .entry(id.clone())
                            .or_insert_with(Default::default)[k] = what;
                    }
                });
            }
        }
    });

    let answers = answers.into_inner().unwrap();
    assert_eq!(answers.len(), EVENTS);
    let wrong: Vec<_> = answers
        .iter()
        .filter(|(_, pair)| {
            let mut sorted = (*pair).clone();
            sorted.sort();
            sorted != ["duplicate", "processed"]
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {EVENTS} pairs not one processed and one duplicate: {wrong:#?}\nA's log:\n{}\nB's log:\n{}",
        wrong.len(),
        a.log(),
        b.log()
    );
    let by_a = answers.values().filter(|p| p[0] == "processed").count();
    eprintln!("processed by A: {by_a}, by B: {}", EVENTS - by_a);

    let db = Db::open(&url);
    let ids: Vec<String> = answers.keys().cloned().collect();
    assert_eq!(missing_from_ledger(&db, &ids), Vec::<&String>::new());
    assert_eq!(ledger_count(&db), EVENTS as i64, "one ledger row per event");
    // The billing effect ran once per event: one payment row each, 100 credits each.
    assert_eq!(
        db.count("SELECT count(*) FROM invoice_payments"),
        EVENTS as i64
    );
    assert_eq!(
        db.count(
            "SELECT count(*) FROM invoice_payments p
             JOIN webhook_events e ON e.event_id = p.event_id"
        ),
        EVENTS as i64,
        "each payment row names its event"
    );
    assert_eq!(credits(&db, "acct_1"), 100 * EVENTS as i64);
}

#[test]
fn a_kill_9_of_one_of_two_instances_under_load_loses_nothing_and_the_survivor_delivers_its_leased_rows(
) {
    let Some((_dir, url)) = pg_database() else {
        return;
    };
    let app = FakeApp::start(&[]);
    let args = forwarding(&app.url());
    let args = strs(&args);
    // The application name tells the two instances' connections (and so their leases) apart.
    let mut a = Server::start_on(&format!("{url}?application_name=hl_instance_a"), &args);
    let b = Server::start_on(&format!("{url}?application_name=hl_instance_b"), &args);
    let db = Db::open(&url);
    let leased_by_a = "SELECT id, key FROM outbox WHERE status = 'pending' AND leased_by IN
                           (SELECT pid FROM pg_stat_activity
                            WHERE application_name = 'hl_instance_a')
                       ORDER BY id";

    let (stop_a, stop_b) = (AtomicBool::new(false), AtomicBool::new(false));
    let (to_a, to_b) = (Answers::default(), Answers::default());
    let (killed_at, (a_leased, in_flight)) = std::thread::scope(|s| {
        send_until(s, a.url(), "evt_ka", 2, &stop_a, &to_a);
        send_until(s, b.url(), "evt_kb", 2, &stop_b, &to_b);
        let under_way = wait_for(Duration::from_secs(20), || {
            (to_a.acked_count() >= 100 && to_b.acked_count() >= 100).then_some(())
        });
        // Held: each instance's worker is stuck on an attempt, its other leased rows waiting.
        app.hold();
        let held_at = app.deliveries().len();
        // Until an attempt the app holds is of a row A leased: A's, in flight.
        let a_leased = wait_for(Duration::from_secs(10), || {
            let leased: BTreeMap<String, i64> = db
                .all::<(i64, String)>(leased_by_a, &[])
                .into_iter()
                .map(|(id, key)| (key, id))
                .collect();
            let in_flight: Vec<String> = app.deliveries()[held_at..]
                .iter()
                .filter_map(|d| d.headers.get("idempotency-key"))
                .filter(|key| leased.contains_key(*key))
                .cloned()
                .collect();
            (!in_flight.is_empty()).then_some((leased, in_flight))
        });
        // Keeps streaming to B a moment after A died.
        // Before the kill: A's senders see it before `kill` returns.
        let killed_at = Instant::now();
        a.kill();
        std::thread::sleep(Duration::from_millis(500));
        stop_a.store(true, Ordering::Relaxed);
        stop_b.store(true, Ordering::Relaxed);
        under_way.expect("events were not acknowledged by both instances");
        (
            killed_at,
            a_leased.expect("no attempt of instance A in flight while the app held them"),
        )
    });
    app.release();

    assert_eq!(to_b.unexpected_answers(), vec![], "B's answers");
    let a_unexpected: Vec<_> = to_a
        .unexpected_answers()
        .into_iter()
        .filter(|(at, _)| *at < killed_at)
        .collect();
    assert_eq!(a_unexpected, vec![], "A's answers before the kill");
    let acked: Vec<String> = to_a.acked().into_iter().chain(to_b.acked()).collect();
    let missing = missing_from_ledger(&db, &acked);
    assert!(missing.is_empty(), "acknowledged events lost: {missing:?}");
    assert_one_outbox_row_per_claim(&db);

    // A's connections are gone with it: its leases are free at once, and B delivers them.
    wait_outbox_all_done(&db, Duration::from_secs(20));
    let not_done: Vec<String> = a_leased
        .keys()
        .map(|key| (key, outbox_row(&db, key)))
        .filter(|(_, row)| row.as_ref().is_none_or(|r| r.0 != "done"))
        .map(|(key, row)| format!("{key}: {row:?}"))
        .collect();
    assert_eq!(not_done, Vec::<String>::new(), "A's leased rows, after B");
    // The attempt A had in flight was never recorded: B made it again.
    for key in &in_flight {
        let sent = app
            .deliveries()
            .iter()
            .filter(|d| d.headers.get("idempotency-key") == Some(key))
            .count();
        assert!(
            sent >= 2,
            "{key}, in flight from A, was sent {sent} time(s)"
        );
    }
    let keys = delivered_keys(&app);
    let ledger = db.strings("SELECT event_id FROM webhook_events");
    let undelivered: Vec<&String> = ledger.iter().filter(|id| !keys.contains(*id)).collect();
    assert!(
        undelivered.is_empty(),
        "{} events never reached the app: {undelivered:?}",
        undelivered.len()
    );
    let refused_a = to_a.refused.lock().unwrap().clone();
    let refused_b = to_b.refused.lock().unwrap().clone();
    eprintln!(
        "acknowledged {} (A {}, B {}), refused {} (A {:?}, B {:?}), A had {} rows leased \
         ({} in flight), {} deliveries for {} events",
        acked.len(),
        to_a.acked_count(),
        to_b.acked_count(),
        refused_a.len() + refused_b.len(),
        refused_a.iter().collect::<BTreeSet<_>>(),
        refused_b.iter().collect::<BTreeSet<_>>(),
        a_leased.len(),
        in_flight.len(),
        app.deliveries().len(),
        ledger.len()
    );
}
