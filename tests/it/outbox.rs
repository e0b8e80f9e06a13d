//! Delivery to the app: the outbox row is written with the claim, the worker delivers it after
//! commit with Standard Webhooks headers, retries on a schedule, and never loses a row.

use std::time::Duration;

use base64::Engine;
use hmac::Mac;

use crate::util::*;

const WAIT: Duration = Duration::from_secs(20);

fn forwarding(app: &FakeApp, schedule: &str) -> Vec<String> {
    [
        "--forward-to",
        &app.url(),
        "--forward-secret",
        FORWARD_SECRET,
        "--forward-schedule",
        schedule,
        "--forward-timeout",
        "2s",
    ]
    .map(str::to_string)
    .to_vec()
}

fn start(dir: Option<&std::path::Path>, args: &[String]) -> Server {
    let args = strs(args);
    match dir {
        Some(dir) => Server::start_in(dir, &args),
        None => Server::start(&args),
    }
}

/// Verifies a delivery the way the Standard Webhooks spec says, independently of hookledger's
/// own verifier: base64-decoded key, HMAC-SHA256 over `id.timestamp.body`.
fn assert_standard_signature(d: &Delivery) {
    let key = base64::engine::general_purpose::STANDARD
        .decode(FORWARD_SECRET.trim_start_matches("whsec_"))
        .unwrap();
    let id = &d.headers["webhook-id"];
    let ts = &d.headers["webhook-timestamp"];
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(&d.body);
    let expected = format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    );
    let signatures: Vec<&str> = d.headers["webhook-signature"].split(' ').collect();
    assert!(signatures.contains(&expected.as_str()), "{:?}", d.headers);
    let age = now() - ts.parse::<i64>().unwrap();
    assert!((0..=60).contains(&age), "timestamp {ts} is not now");
}

#[test]
fn processed_event_is_delivered_signed_with_idempotency_key() {
    let app = FakeApp::start(&[]);
    let server = start(None, &forwarding(&app, "1s"));
    let body = paid("evt_fwd");
    assert_outcome(&server.send(&body), "evt_fwd", "processed");
    let unknown = br#"{"id":"evt_fwd_unknown","type":"some.new_type","created":1}"#;
    assert_outcome(&server.send(unknown), "evt_fwd_unknown", "processed");

    // Attempted side by side (a lane's concurrency): in either order.
    let delivered = app.wait_delivered(2, WAIT);
    let by_id = |id: &str| {
        delivered
            .iter()
            .find(|d| d.headers["webhook-id"] == id)
            .unwrap_or_else(|| panic!("no delivery of {id}"))
    };
    let d = by_id("evt_fwd");
    assert_eq!(d.body, body, "the raw verified body is forwarded");
    assert_eq!(d.headers["content-type"], "application/json");
    assert_eq!(d.headers["idempotency-key"], "evt_fwd");
    assert_eq!(d.headers["webhook-id"], "evt_fwd");
    assert_eq!(d.headers["webhook-source"], "stripe");
    assert_eq!(d.headers["webhook-type"], "invoice.paid");
    assert_standard_signature(d);
    // Unknown types too.
    assert_eq!(by_id("evt_fwd_unknown").body, unknown);
    let db = server.db();
    wait_outbox_status(&db, "evt_fwd_unknown", "done", WAIT);
    assert_eq!(outbox_row(&db, "evt_fwd"), Some(("done".into(), 1, None)));
}

/// The worker polls ids and reads each payload when it attempts the row: a 10 MiB one
/// arrives byte for byte, signed, and so does the small one queued after it.
#[test]
fn a_10_mib_payload_is_delivered_intact() {
    let app = FakeApp::start(&[]);
    let mut args = forwarding(&app, "1s");
    args.extend(["--max-body", "12582912"].map(str::to_string));
    let server = start(None, &args);
    let pad = "x".repeat(10 << 20);
    let big = format!(r#"{{"id":"evt_big","type":"some.big_thing","created":1,"pad":"{pad}"}}"#);
    assert_outcome(&server.send(big.as_bytes()), "evt_big", "processed");
    let small = paid("evt_after_big");
    assert_outcome(&server.send(&small), "evt_after_big", "processed");

    // Attempted at once, side by side (a lane's concurrency): in either order.
    let delivered = app.wait_delivered(2, WAIT);
    let by_id = |id: &str| {
        delivered
            .iter()
            .find(|d| d.headers["webhook-id"] == id)
            .unwrap_or_else(|| panic!("{id} not delivered"))
    };
    assert!(
        by_id("evt_big").body == big.as_bytes(),
        "the 10 MiB body intact"
    );
    assert_standard_signature(by_id("evt_big"));
    assert_eq!(by_id("evt_after_big").body, small);
    let db = server.db();
    wait_outbox_status(&db, "evt_after_big", "done", WAIT);
    wait_outbox_status(&db, "evt_big", "done", WAIT);
}

#[test]
fn app_failing_twice_then_ok_is_delivered_on_attempt_three() {
    let app = FakeApp::start(&[500, 503]);
    let server = start(None, &forwarding(&app, "1s,1s,1s"));
    assert_outcome(&server.send(&paid("evt_retry")), "evt_retry", "processed");
    app.wait_delivered(1, WAIT);
    let db = server.db();
    let row = wait_outbox_status(&db, "evt_retry", "done", WAIT);
    assert_eq!(row, ("done".into(), 3, None));
    let statuses: Vec<u16> = app.deliveries().iter().map(|d| d.status).collect();
    assert_eq!(statuses, [500, 503, 200]);
}

#[test]
fn gone_is_dead_at_once() {
    let app = FakeApp::start(&[410]);
    let server = start(None, &forwarding(&app, "1s,1s"));
    assert_outcome(&server.send(&paid("evt_gone")), "evt_gone", "processed");
    let db = server.db();
    let row = wait_outbox_status(&db, "evt_gone", "dead", WAIT);
    assert_eq!(
        row,
        (
            "dead".into(),
            1,
            Some(format!(
                "HTTP 410 Gone from {}",
                app.url().replace("/hooks", "/…")
            ))
        )
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(app.deliveries().len(), 1, "a dead row is not retried");
}

#[test]
fn schedule_used_up_is_dead_then_outbox_retry_delivers() {
    let app = FakeApp::start(&[500, 500]);
    let server = start(None, &forwarding(&app, "1s"));
    assert_outcome(&server.send(&paid("evt_dead")), "evt_dead", "processed");
    let db = server.db();
    let row = wait_outbox_status(&db, "evt_dead", "dead", WAIT);
    assert_eq!(
        row,
        (
            "dead".into(),
            2,
            Some(format!(
                "HTTP 500 from {}",
                app.url().replace("/hooks", "/…")
            ))
        )
    );

    let db_arg = server.db_arg();
    let db_arg = db_arg.as_str();
    let (code, out, _) = cli(&["outbox", "list", "--status", "dead", "--db", db_arg]);
    assert_eq!(code, 0);
    assert!(
        out.contains("evt_dead") && out.contains("HTTP 500"),
        "{out}"
    );
    let (code, out, _) = cli(&["outbox", "list", "--json", "--db", db_arg]);
    assert_eq!(code, 0);
    let rows: serde_json::Value = serde_json::from_str(&out).unwrap();
    let id = rows[0]["id"].as_i64().unwrap();
    assert_eq!(rows[0]["status"], "dead");

    let (code, _, err) = cli(&["outbox", "retry", &id.to_string(), "--db", db_arg]);
    assert_eq!(code, 0, "{err}");
    app.wait_delivered(1, WAIT);
    wait_outbox_status(&db, "evt_dead", "done", WAIT);
    // Retrying a row that is not dead is an error with a message.
    let (code, _, err) = cli(&["outbox", "retry", &id.to_string(), "--db", db_arg]);
    assert_eq!(code, 2);
    assert!(err.contains("not dead"), "{err}");
}

#[test]
fn retry_all_dead_revives_every_dead_row() {
    let app = FakeApp::start(&[410, 410]);
    let server = start(None, &forwarding(&app, "1s"));
    for id in ["evt_d1", "evt_d2"] {
        assert_outcome(&server.send(&paid(id)), id, "processed");
    }
    let db = server.db();
    wait_for(WAIT, || {
        (db.count("SELECT count(*) FROM outbox WHERE status = 'dead'") == 2).then_some(())
    })
    .expect("rows not dead");
    let (code, out, _) = cli(&["outbox", "retry", "--all-dead", "--db", &server.db_arg()]);
    assert_eq!(code, 0);
    assert!(out.contains("2 dead row(s)"), "{out}");
    app.wait_delivered(2, WAIT);
}

#[test]
fn sigkill_with_rows_pending_then_restart_delivers() {
    if skipped_through_pooler("the killed server's rows wait for their lease") {
        return;
    }
    // The app is down (503, on a port it keeps): the rows stay pending.
    let app = FakeApp::start_down();
    let args = down_app_args(&app.url());
    let mut server = start(None, &args);
    for i in 0..5 {
        let id = format!("evt_pend{i}");
        assert_outcome(&server.send(&paid(&id)), &id, "processed");
    }
    server.kill();
    assert_eq!(
        server
            .db()
            .count("SELECT count(*) FROM outbox WHERE status = 'pending'"),
        5
    );

    // The app comes up on the same port; hookledger restarts and delivers all five.
    app.up();
    let restarted = start(Some(&server.dir), &args);
    let delivered = app.wait_delivered(5, WAIT);
    let mut ids: Vec<String> = delivered
        .iter()
        .map(|d| d.headers["webhook-id"].clone())
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        (0..5).map(|i| format!("evt_pend{i}")).collect::<Vec<_>>()
    );
    let db = restarted.db();
    wait_for(WAIT, || {
        (db.count("SELECT count(*) FROM outbox WHERE status = 'done'") == 5).then_some(())
    })
    .expect("rows not marked done");
}

#[test]
fn duplicate_webhooks_are_delivered_once() {
    let app = FakeApp::start(&[]);
    let server = start(None, &forwarding(&app, "1s"));
    let body = paid("evt_once");
    let replies: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..5).map(|_| s.spawn(|| server.send(&body))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(replies.iter().all(|r| r.status == 200));
    assert_outcome(&server.send(&body), "evt_once", "duplicate");
    app.wait_delivered(1, WAIT);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(app.deliveries().len(), 1);
    assert_eq!(server.db().count("SELECT count(*) FROM outbox"), 1);
}

#[test]
fn replay_forwards_a_stored_event_again() {
    let app = FakeApp::start(&[]);
    let server = start(None, &forwarding(&app, "1s"));
    let body = paid("evt_replay");
    assert_outcome(&server.send(&body), "evt_replay", "processed");
    app.wait_delivered(1, WAIT);
    let db = server.db();
    wait_outbox_status(&db, "evt_replay", "done", WAIT);

    let db_arg = server.db_arg();
    let (code, out, err) = cli(&["replay", "evt_replay", "--db", &db_arg]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("evt_replay"));
    let delivered = app.wait_delivered(2, WAIT);
    assert_eq!(delivered[1].body, body);
    assert_eq!(delivered[1].headers["idempotency-key"], "evt_replay");
    assert_eq!(
        db.count("SELECT count(*) FROM outbox"),
        1,
        "the same row, revived"
    );

    let (code, _, err) = cli(&["replay", "evt_nope", "--db", &db_arg]);
    assert_eq!(code, 2);
    assert!(err.contains("no event evt_nope"), "{err}");
}

/// `replay` while an attempt of the same row is in flight: the attempt's success must not
/// mark the replayed row done, or the app would never get the replay.
#[test]
fn a_replay_during_an_attempt_in_flight_is_delivered_after_it() {
    let app = FakeApp::start(&[]);
    app.hold();
    let server = start(None, &forwarding(&app, "1s"));
    assert_outcome(
        &server.send(&paid("evt_inflight")),
        "evt_inflight",
        "processed",
    );
    wait_for(WAIT, || (app.deliveries().len() == 1).then_some(()))
        .expect("the first attempt did not arrive");

    let (code, out, err) = cli(&["replay", "evt_inflight", "--db", &server.db_arg()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("queued"), "{out}");
    app.release();

    let delivered = app.wait_delivered(2, WAIT);
    assert!(
        delivered
            .iter()
            .all(|d| d.headers["webhook-id"] == "evt_inflight"),
        "{delivered:?}"
    );
    let (status, attempts, _) = wait_outbox_status(&server.db(), "evt_inflight", "done", WAIT);
    assert_eq!(
        (status.as_str(), attempts),
        ("done", 1),
        "one attempt since the replay"
    );
}

#[test]
fn events_list_and_show() {
    let server = Server::start(&[]);
    let body = paid("evt_show");
    assert_outcome(&server.send(&body), "evt_show", "processed");
    let other = br#"{"id":"evt_other","type":"customer.created","created":1}"#;
    assert_outcome(&server.send(other), "evt_other", "processed");
    let db_arg = server.db_arg();

    let (code, out, _) = cli(&["events", "list", "--db", &db_arg]);
    assert_eq!(code, 0);
    assert!(
        out.contains("evt_show") && out.contains("evt_other"),
        "{out}"
    );
    let (_, out, _) = cli(&[
        "events",
        "list",
        "--type",
        "invoice.paid",
        "--json",
        "--db",
        &db_arg,
    ]);
    let rows: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 1);
    assert_eq!(rows[0]["event_id"], "evt_show");
    assert_eq!(rows[0]["payload_bytes"], body.len());
    let (_, out, _) = cli(&["events", "list", "--since", "1h", "--json", "--db", &db_arg]);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out)
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        2
    );
    server.db().execute(
        "UPDATE webhook_events SET received_at = received_at - 7200 WHERE event_id = 'evt_other'",
        &[],
    );
    let (_, out, _) = cli(&["events", "list", "--since", "1h", "--json", "--db", &db_arg]);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out)
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        1
    );

    let (code, out, _) = cli(&["events", "show", "evt_show", "--db", &db_arg]);
    assert_eq!(code, 0);
    let shown: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["payload"]["data"]["object"]["id"], "in_evt_show");
    assert!(
        out.contains("\n    \"payload\": {\n") || out.contains("\n  \"payload\": {\n"),
        "pretty-printed: {out}"
    );
    let (code, _, err) = cli(&["events", "show", "evt_missing", "--db", &db_arg]);
    assert_eq!(code, 2);
    assert!(err.contains("no event evt_missing"));
    let (code, _, err) = cli(&["events", "list", "--db", "/nonexistent/x.db"]);
    assert_eq!(code, 2);
    assert!(err.contains("does not exist"), "{err}");
}

/// Retention has two ages: payloads are cleared after `--payload-days` (30), claims deleted
/// after `--retention-days` (400), delivered outbox rows after a week.
#[test]
fn retention_clears_old_payloads_deletes_old_claims_and_refuses_one_day() {
    // The server keeps everything itself: its start-up prune (a thread of its own) could
    // otherwise delete the claim moved back below before the refused prune is checked (a
    // PostgreSQL run saw it). The prunes under test are the CLI's.
    let server = Server::start(&["--retention-days", "never", "--payload-days", "never"]);
    for id in ["evt_ancient", "evt_old", "evt_new"] {
        assert_outcome(&server.send(&paid(id)), id, "processed");
    }
    let db = server.db();
    let day = 86_400;
    db.batch(&format!(
        "UPDATE webhook_events SET received_at = received_at - 401 * {day} WHERE event_id = 'evt_ancient';
         UPDATE webhook_events SET received_at = received_at - 31 * {day} WHERE event_id = 'evt_old';"
    ));
    db.execute(
        "INSERT INTO outbox (kind, source, key, payload, status, next_attempt_at, created_at, done_at) VALUES
           ('forward', 'stripe', 'done_old', $1, 'done', 0, 0, $2),
           ('forward', 'stripe', 'done_new', $1, 'done', 0, 0, $3),
           ('forward', 'stripe', 'dead_old', $1, 'dead', 0, 0, NULL),
           ('forward', 'stripe', 'pending_old', $1, 'pending', $4, 0, NULL)",
        &[
            &b"{}".to_vec(),
            &(now() - 8 * day),
            &(now() - 6 * day),
            &(now() + 365 * day),
        ],
    );
    let db_arg = server.db_arg();

    let (code, _, err) = cli(&["prune", "--retention-days", "1", "--db", &db_arg]);
    assert_eq!(code, 2);
    assert!(
        err.contains(
            "--retention-days (retention.claim_days): is shorter than the providers' retry window"
        ),
        "{err}"
    );
    assert_eq!(ledger_count(&db), 3, "a refused prune deletes nothing");

    let (code, out, err) = cli(&["prune", "--db", &db_arg]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("ledger rows older than 400 days")
            && out.contains("payloads older than 30 days")
            && out.contains("delivered outbox rows"),
        "{out}"
    );
    let left = db.strings(
        "SELECT event_id || ':' || CASE WHEN payload IS NULL THEN 'cleared' ELSE 'kept' END
         FROM webhook_events ORDER BY event_id",
    );
    assert_eq!(
        left,
        ["evt_new:kept", "evt_old:cleared"],
        "the old claim stays, without its payload"
    );
    let keys = db.strings("SELECT key FROM outbox ORDER BY key");
    assert_eq!(keys, ["dead_old", "done_new", "pending_old"]);
    // Effects stay: the ledger forgets the claim, not the credits.
    assert_eq!(credits(&db, "acct_1"), 300);
    // The old claim still makes a resend a duplicate.
    assert_outcome(&server.send(&paid("evt_old")), "evt_old", "duplicate");
    // A replay needs the payload.
    let (code, _, err) = cli(&["replay", "evt_old", "--db", &db_arg]);
    assert_eq!(code, 2);
    assert!(err.contains("payload was cleared"), "{err}");

    // serve refuses it too, with exit code 2.
    let (code, _, err) = cli(&[
        "serve",
        "--retention-days",
        "2",
        "--stripe-secret",
        SECRET,
        "--db",
        &db_arg,
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("retention"), "{err}");
}

/// The server's own prune (at start-up, in short batches with pauses between them) deletes
/// every expired claim while it keeps answering: each event sent meanwhile is committed, and
/// the prune logs what it did once done.
#[test]
fn the_servers_prune_deletes_every_expired_claim_while_requests_are_served() {
    let dir = test_dir();
    let keep_all = ["--retention-days", "never", "--payload-days", "never"];
    let mut server = Server::start_in(dir.path(), &keep_all);
    assert_outcome(&server.send(&paid("evt_now")), "evt_now", "processed");
    let db = server.db();
    db.batch(&format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000)
         INSERT INTO webhook_events (source, event_id, event_type, received_at)
         SELECT 'stripe', 'evt_old_' || i, 'invoice.paid', {} FROM n",
        now() - 500 * 86_400
    ));
    assert_eq!(server.terminate(), Some(0));

    // Default retention (400 days): the start-up prune has 3,000 claims to delete.
    let server = Server::start_in(dir.path(), &[]);
    let mut sent = 0;
    let pruned = wait_for(Duration::from_secs(60), || {
        let id = format!("evt_during_{sent}");
        assert_outcome(&server.send(&paid(&id)), &id, "processed");
        sent += 1;
        let log = server.log();
        (log.contains("retention: deleted 3000 ledger rows") && sent >= 3).then_some(log)
    })
    .unwrap_or_else(|| panic!("no prune logged: {}", server.log()));
    assert!(pruned.contains("older than 400 days"), "{pruned}");
    assert_eq!(
        db.count("SELECT count(*) FROM webhook_events WHERE event_id LIKE 'evt_old_%'"),
        0
    );
    assert_eq!(
        db.count("SELECT count(*) FROM webhook_events WHERE event_id LIKE 'evt_during_%'"),
        sent,
        "every event sent during the prune was committed"
    );
    assert_eq!(ledger_count(&db), sent + 1);
}
/// `u64::MAX` days ("keep for ever" to a user) once wrapped the cutoff into the future and
/// deleted every claim; `never` says it in words. Nothing is deleted, and a resend is still a
/// duplicate.
#[test]
fn retention_of_u64_max_or_never_deletes_no_claim() {
    let server = Server::start(&[]);
    for id in ["evt_keep_1", "evt_keep_2"] {
        assert_outcome(&server.send(&paid(id)), id, "processed");
    }
    let db = server.db();
    db.batch("UPDATE webhook_events SET received_at = received_at - 40 * 86400 WHERE event_id = 'evt_keep_1'");
    let db_arg = server.db_arg();
    let (code, out, err) = cli(&[
        "prune",
        "--db",
        &db_arg,
        "--retention-days",
        "never",
        "--payload-days",
        "never",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("deleted 0 ledger rows (kept for ever), cleared 0 payloads (kept for ever)"),
        "{out}"
    );
    let (code, out, err) = cli(&[
        "prune",
        "--db",
        &db_arg,
        "--retention-days",
        "18446744073709551615",
    ]);
    assert_eq!(code, 0, "{err}");
    // The old payload is cleared, by this prune or by the server's own start-up prune (a
    // thread of its own, which may run after the UPDATE): the state below is the same.
    assert!(
        out.contains("deleted 0 ledger rows (kept for ever), cleared ")
            && out.contains(" payloads older than 30 days"),
        "{out}"
    );
    assert_eq!(
        db.strings(
            "SELECT event_id || ':' || CASE WHEN payload IS NULL THEN 'cleared' ELSE 'kept' END
             FROM webhook_events ORDER BY event_id"
        ),
        ["evt_keep_1:cleared", "evt_keep_2:kept"]
    );
    for id in ["evt_keep_1", "evt_keep_2"] {
        assert_outcome(&server.send(&paid(id)), id, "duplicate");
    }
    let (code, _, err) = cli(&["prune", "--db", &db_arg, "--retention-days", "forever"]);
    assert_eq!(code, 2);
    assert!(err.contains("never"), "{err}");
}

/// A ledger whose newest claim is 500 days old is what a clock 500 days ahead sees: ages are
/// counted from the newest claim, so nothing the newest claim's clock would keep is pruned,
/// and the gap is logged.
#[test]
fn a_clock_500_days_past_the_newest_claim_prunes_no_claim() {
    // The server's own prune keeps everything: its start-up run (a thread of its own) reads
    // the newest claim before the UPDATE below and could clear the payloads after it.
    let server = Server::start(&["--retention-days", "never", "--payload-days", "never"]);
    for id in ["evt_clock_1", "evt_clock_2"] {
        assert_outcome(&server.send(&paid(id)), id, "processed");
    }
    let db = server.db();
    db.batch("UPDATE webhook_events SET received_at = received_at - 500 * 86400");
    let (code, out, err) = cli(&["prune", "--db", &server.db_arg()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("deleted 0 ledger rows"), "{out}");
    assert!(out.contains("cleared 0 payloads"), "{out}");
    assert!(err.contains("500 days past the newest claim"), "{err}");
    assert_eq!(
        db.strings(
            "SELECT event_id || ':' || CASE WHEN payload IS NULL THEN 'cleared' ELSE 'kept' END
             FROM webhook_events ORDER BY event_id"
        ),
        ["evt_clock_1:kept", "evt_clock_2:kept"]
    );
    for id in ["evt_clock_1", "evt_clock_2"] {
        assert_outcome(&server.send(&paid(id)), id, "duplicate");
    }
}

#[test]
fn sigterm_during_a_stream_keeps_every_acknowledged_event_and_delivers_after_restart() {
    // The app is down during the stream (503, on a port it keeps), so everything stays
    // pending through the shutdown.
    let app = FakeApp::start_down();
    let args = down_app_args(&app.url());
    let mut server = start(None, &args);
    let server_url = server.url();
    let streamed = stream_until(&server_url, 4, paid_numbered("evt_t"), &[503], |acked| {
        wait_for(WAIT, || (acked() >= 100).then_some(())).unwrap();
        server.terminate()
    });
    assert_eq!(
        streamed.stopped,
        Some(0),
        "graceful shutdown exits 0: {}",
        server.log()
    );
    let acked = streamed.acked;

    app.up();
    let restarted = start(Some(&server.dir), &args);
    let db = restarted.db();
    let lost = missing_from_ledger(&db, &acked);
    assert!(lost.is_empty(), "acknowledged but lost: {lost:?}");
    assert_one_outbox_row_per_claim(&db);
    let rows = ledger_count(&db) as usize;
    let delivered = app.wait_delivered(rows, Duration::from_secs(60));
    let mut ids: Vec<&str> = delivered
        .iter()
        .map(|d| d.headers["webhook-id"].as_str())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), rows);
    for id in &acked {
        assert!(ids.contains(&id.as_str()), "{id} not delivered");
    }
}

/// The official Python `standardwebhooks` library accepts a real delivery. `.ci/run`
/// installs it; elsewhere the test says it was skipped, unless HOOKLEDGER_REQUIRE_PYTHON_SWH
/// is set (as in CI), where a missing library fails.
#[test]
fn official_python_library_verifies_a_delivery() {
    let has_library = std::process::Command::new("python3")
        .args(["-c", "import standardwebhooks"])
        .status()
        .is_ok_and(|s| s.success());
    if !prerequisite(
        has_library,
        "HOOKLEDGER_REQUIRE_PYTHON_SWH",
        "python standardwebhooks not installed (python3 -m pip install standardwebhooks)",
    ) {
        return;
    }
    let app = FakeApp::start(&[]);
    let server = start(None, &forwarding(&app, "1s"));
    assert_outcome(&server.send(&paid("evt_py")), "evt_py", "processed");
    let d = app.wait_delivered(1, WAIT).remove(0);
    let script = r#"
import json, sys
from standardwebhooks.webhooks import Webhook
secret, headers, body = sys.argv[1], json.loads(sys.argv[2]), sys.stdin.buffer.read()
print(Webhook(secret).verify(body, headers)["id"])
"#;
    let headers = serde_json::to_string(&d.headers).unwrap();
    let mut child = std::process::Command::new("python3")
        .args(["-c", script, FORWARD_SECRET, &headers])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(&d.body).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "evt_py");
}

/// An outbox row an effect queued with a BLOB `kind` or `key` (SQLite stores what it is given;
/// before migration 6 nothing refused it) made `/metrics`, `/status` and `outbox list` fail
/// for good, and a BLOB key of a delivered kind stopped the worker's every poll. They are shown
/// as `x'…'`, and the worker goes on.
#[test]
fn outbox_rows_with_a_blob_kind_or_key_leave_metrics_status_outbox_list_and_the_worker_working() {
    if skipped_on_postgres("a TEXT column holds only text on PostgreSQL") {
        return;
    }
    let app = FakeApp::start(&[]);
    let server = start(None, &forwarding(&app, "1s"));
    let db = server.db();
    // As written before the guard of migration 6 existed.
    db.batch(
        "DROP TRIGGER IF EXISTS outbox_text_identity_insert;
         INSERT INTO outbox (kind, source, key, payload, status) VALUES
             (x'00', 'stripe', 'k_blob_kind', x'7b7d', 'pending'),
             (x'ff', 'stripe', 'k_dead', x'7b7d', 'dead'),
             ('forward', 'stripe', x'ff00', x'7b7d', 'pending'),
             ('forward', x'fe', 'k_blob_source', x'7b7d', 'dead');",
    );
    let (status, metrics) = server.admin_get("/metrics");
    assert_eq!(status, 200, "{metrics}");
    assert!(
        metrics.contains(r#"hookledger_outbox_rows{kind="x'00'",status="pending"} 1"#),
        "{metrics}"
    );
    let (status, page) = server.admin_get("/status");
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("x&#39;FF&#39;"), "{page}");
    let (code, out, err) = cli(&["outbox", "list", "--db", &server.db_arg()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("x'00'") && out.contains("x'FF00'"), "{out}");
    let (code, out, err) = cli(&["outbox", "list", "--json", "--db", &server.db_arg()]);
    assert_eq!(code, 0, "{err}");
    let rows: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(rows[3]["source"], "x'FE'");

    // The forward row with a BLOB key is attempted like any other; the worker goes on.
    assert_outcome(
        &server.send(&paid("evt_after_blob")),
        "evt_after_blob",
        "processed",
    );
    let delivered = app.wait_delivered(2, WAIT);
    let mut ids: Vec<&str> = delivered
        .iter()
        .map(|d| d.headers["webhook-id"].as_str())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, ["evt_after_blob", "x'FF00'"]);
    wait_outbox_status(&db, "evt_after_blob", "done", WAIT);
}

/// Regression (a black-box probe): with rows in tens of thousands of kinds nobody delivers
/// (an effect that writes a new kind per event), `/status` and `/metrics` listed each kind,
/// each looked up among all the others: seconds, then minutes. They name the kinds with a lane
/// and the 100 with the most rows, and count the rest as one.
#[test]
fn rows_in_ten_thousand_kinds_are_summed_past_a_hundred_on_status_and_metrics() {
    let app = FakeApp::start(&[]);
    let server = start(None, &forwarding(&app, "1h"));
    let db = server.db();
    // 10,000 kinds of one row each, and one kind of many rows.
    db.batch(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 10000)
         INSERT INTO outbox (kind, source, key, payload, status, next_attempt_at)
         SELECT 'junk_' || i, 'stripe', 'k' || i, '{}', 'pending', 4102444800 FROM n;
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 50)
         INSERT INTO outbox (kind, source, key, payload, status, next_attempt_at)
         SELECT 'busy', 'stripe', 'b' || i, '{}', 'dead', 4102444800 FROM n;",
    );
    let (status, metrics) = server.admin_get("/metrics");
    assert_eq!(status, 200);
    let kinds: std::collections::BTreeSet<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("hookledger_outbox_rows{"))
        .filter_map(|l| l.split("kind=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(kinds.len(), 101, "100 named and the rest as one: {kinds:?}");
    assert!(
        kinds.contains("busy"),
        "the kind with the most rows is named"
    );
    assert!(
        metrics.contains(r#"hookledger_outbox_rows{kind="(other kinds)",status="pending"} 9901"#),
        "the 9,901 kinds past the first 100 are counted as one"
    );
    let (status, page) = server.admin_get("/status");
    assert_eq!(status, 200);
    assert!(
        page.contains("(other kinds)"),
        "{}",
        &page[..2000.min(page.len())]
    );
    assert!(
        page.matches("junk_").count() <= 99,
        "at most 99 junk kinds named"
    );
}

/// `[forward]` with `on`: only the events a route matches are forwarded, each row with the
/// value at the route's `key` as its `coalesce_key`; the others are processed and queue nothing.
#[test]
fn forward_with_routes_delivers_only_the_events_they_match() {
    let app = FakeApp::start(&[]);
    let dir = test_dir();
    let config = dir.path().join("hookledger.toml");
    std::fs::write(
        &config,
        format!(
            r#"[[source]]
name = "stripe"
scheme = "stripe"
secrets = ["env:STRIPE_WEBHOOK_SECRET"]

[forward]
url = "{}"
secret = "{FORWARD_SECRET}"
on = [{{ source = "stripe", types = ["invoice.paid"], key = "/data/object/customer",
         when = {{ "/data/object/status" = ["paid", "open"] }} }}]
"#,
            app.url()
        ),
    )
    .unwrap();
    let server = Server::start_in(dir.path(), &["--config", config.to_str().unwrap()]);
    let event = |id: &str, kind: &str| {
        hookledger::internals::invoice_event(
            id,
            kind,
            now(),
            &format!("in_{id}"),
            "cus_7",
            "acct_1",
        )
        .into_bytes()
    };
    let paid = event("evt_routed", "invoice.paid");
    assert_outcome(&server.send(&paid), "evt_routed", "processed");
    let created = event("evt_not_routed", "invoice.created");
    assert_outcome(&server.send(&created), "evt_not_routed", "processed");
    app.wait_delivered(1, WAIT);
    assert_eq!(app.deliveries()[0].body, paid);
    let db = server.db();
    let rows: Vec<(String, String)> = db.all(
        "SELECT key, coalesce_key FROM outbox WHERE kind = 'forward'",
        &[],
    );
    assert_eq!(rows, [("evt_routed".to_string(), "cus_7".to_string())]);
    assert_eq!(db.count("SELECT count(*) FROM webhook_events"), 2);
}
