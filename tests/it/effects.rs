//! The app's own effects: `[schema]` migrations and `[[effect]]` SQL, run inside the claim's
//! transaction, asserted on the app's tables.

use std::path::Path;
use std::time::Duration;

use hookledger::internals::invoice_event;

use crate::util::*;

const MIGRATION: &str = "
CREATE TABLE orders (
    invoice_id TEXT PRIMARY KEY,
    event_id   TEXT NOT NULL,
    source     TEXT NOT NULL,
    amount     BIGINT NOT NULL CHECK (amount >= 0)
);
CREATE TABLE totals (name TEXT PRIMARY KEY, amount BIGINT NOT NULL);
INSERT INTO totals VALUES ('paid', 0);
CREATE TABLE seen (source TEXT, event_id TEXT, event_type TEXT, created BIGINT);
";

/// The config: the stripe source, the migration, one order per invoice with the running
/// total, and a row in `seen` for every event.
fn config() -> String {
    let orders = match store() {
        Store::Sqlite => {
            "
-- One order per invoice, whichever event reports it first.
INSERT INTO orders (invoice_id, event_id, source, amount)
VALUES (json_extract(:body, '$.data.object.id'), :event_id, :source,
        json_extract(:body, '$.data.object.amount_paid'))
ON CONFLICT (invoice_id) DO NOTHING;
UPDATE totals SET amount = amount + json_extract(:body, '$.data.object.amount_paid')
WHERE name = 'paid' AND changes() = 1;"
        }
        Store::Postgres => {
            "
-- One order per invoice, whichever event reports it first.
WITH invoice AS (SELECT CAST(:body AS jsonb) -> 'data' -> 'object' AS o),
     made AS (
         INSERT INTO orders (invoice_id, event_id, source, amount)
         SELECT o ->> 'id', :event_id, :source, CAST(o ->> 'amount_paid' AS BIGINT) FROM invoice
         ON CONFLICT (invoice_id) DO NOTHING
         RETURNING amount)
UPDATE totals SET amount = totals.amount + made.amount FROM made WHERE name = 'paid'"
        }
    };
    format!(
        r#"
[schema]
migrations = "migrations/"

[[source]]
name = "stripe"
scheme = "stripe"
secrets = ["env:STRIPE_WEBHOOK_SECRET"]

[[effect]]
source = "stripe"
on = ["invoice.paid", "invoice.payment_succeeded"]
sql = """{orders}
"""

[[effect]]
source = "stripe"
on = "*"
sql = "INSERT INTO seen VALUES (:source, :event_id, :event_type, :created)"
"#
    )
}

/// A folder with the config file and its migration; returns the config's path.
fn app_dir(dir: &Path, config: &str) -> String {
    std::fs::create_dir_all(dir.join("migrations")).unwrap();
    std::fs::write(dir.join("migrations/001_orders.sql"), MIGRATION).unwrap();
    let path = dir.join("hookledger.toml");
    std::fs::write(&path, config).unwrap();
    path.to_str().unwrap().to_string()
}

fn start(dir: &Path) -> Server {
    let config = app_dir(dir, &config());
    Server::start_in(dir, &["--config", &config])
}

fn total(server: &Server) -> i64 {
    server
        .db()
        .count("SELECT amount FROM totals WHERE name = 'paid'")
}

#[test]
fn effects_run_once_per_event_with_their_parameters() {
    let dir = test_dir();
    let server = start(dir.path());
    let paid = paid_invoice("evt_a", "in_a");
    assert_outcome(&server.send(&paid), "evt_a", "processed");
    assert_outcome(&server.send(&paid), "evt_a", "duplicate");
    let second = invoice_event(
        "evt_b",
        "invoice.payment_succeeded",
        now(),
        "in_a",
        "cus_1",
        "acct_1",
    );
    assert_outcome(&server.send(second.as_bytes()), "evt_b", "processed");
    let other =
        br#"{"id":"evt_c","type":"customer.created","created":1700000000,"data":{"object":{}}}"#;
    assert_outcome(&server.send(other), "evt_c", "processed");

    let db = server.db();
    assert_eq!(
        db.strings(
            "SELECT invoice_id || '/' || event_id || '/' || source || '/' || amount FROM orders"
        ),
        ["in_a/evt_a/stripe/2000"]
    );
    assert_eq!(
        total(&server),
        2000,
        "the second report of in_a adds nothing"
    );
    assert_eq!(
        db.strings("SELECT event_id || '/' || event_type || '/' || coalesce(CAST(created AS TEXT), 'null') FROM seen ORDER BY event_id"),
        [
            format!("evt_a/invoice.paid/{}", now_ish(&db, "evt_a")),
            format!("evt_b/invoice.payment_succeeded/{}", now_ish(&db, "evt_b")),
            "evt_c/customer.created/1700000000".to_string()
        ]
    );
    // The built-in stripe-billing handler is not enabled on this source: none of its tables
    // either, nor a record of its migrations.
    let tables = db.tables();
    for table in [
        "subscriptions",
        "invoice_payments",
        "accounts",
        "hookledger_handler_migrations",
    ] {
        assert!(!tables.iter().any(|t| t == table), "{table}: {tables:?}");
    }
}

/// The `created` the ledger recorded for `id` (the body's, which the effect got as :created).
fn now_ish(db: &Db, id: &str) -> i64 {
    db.one(
        "SELECT created FROM webhook_events WHERE event_id = $1",
        &[&id],
    )
}

/// A statement that raises rolls back that event alone: 500, no ledger row, no effect; the
/// provider's retry applies it once the cause is gone.
#[test]
fn a_raising_statement_rolls_back_its_event_and_the_retry_applies_it() {
    let dir = test_dir();
    let server = start(dir.path());
    let db = server.db();
    db.inject_failure(
        "refuse_in_x",
        "INSERT",
        "orders",
        "new.invoice_id = 'in_x'",
        "injected by the test",
    );
    assert_outcome(&server.send(&paid("evt_ok")), "evt_ok", "processed");
    let body = paid_invoice("evt_x", "in_x");
    let reply = server.send(&body);
    assert_error(&reply, 500, "internal");
    assert!(!reply.body.contains("injected"), "{}", reply.body);
    assert_eq!(
        db.strings("SELECT event_id FROM webhook_events"),
        ["evt_ok"]
    );
    assert_eq!(
        db.count("SELECT count(*) FROM seen"),
        1,
        "the other effect rolled back too"
    );
    wait_for(Duration::from_secs(5), || {
        let log = server.log();
        (log.contains("effect 1") && log.contains("injected by the test")).then_some(())
    })
    .expect("the log names the effect and the database's message");

    db.remove_failure("refuse_in_x", "orders");
    assert_outcome(&server.send(&body), "evt_x", "processed");
    assert_eq!(total(&server), 4000);
    // A CHECK constraint raises too (no Rust handler refuses a negative amount here).
    let negative = String::from_utf8(paid_invoice("evt_neg_amount", "in_neg"))
        .unwrap()
        .replace("\"amount_paid\": 2000", "\"amount_paid\": -5");
    assert_error(&server.send(negative.as_bytes()), 500, "internal");
    assert_eq!(
        db.count("SELECT count(*) FROM webhook_events WHERE event_id = 'evt_neg_amount'"),
        0
    );
    assert_eq!(total(&server), 4000);
}

/// SIGKILL while events stream in: after the restart the app's tables hold exactly one effect
/// per claimed event.
#[test]
fn sigkill_during_a_stream_applies_each_sql_effect_once() {
    let dir = test_dir();
    let config = app_dir(dir.path(), &config());
    let mut server = Server::start_in(dir.path(), &["--config", &config]);
    let url = server.url();
    let streamed = stream_until(&url, 4, paid_numbered("evt_s"), &[], |acked| {
        wait_for(Duration::from_secs(30), || (acked() >= 200).then_some(()))
            .expect("events were not acknowledged");
        server.kill();
    });
    let restarted = Server::start_in(dir.path(), &["--config", &config]);
    let db = restarted.db();
    assert!(missing_from_ledger(&db, &streamed.acked).is_empty());
    let claims = ledger_count(&db);
    assert_eq!(db.count("SELECT count(*) FROM orders"), claims);
    assert_eq!(db.count("SELECT count(*) FROM seen"), claims);
    assert_eq!(total(&restarted), 2000 * claims);
    assert_eq!(
        db.count("SELECT count(*) FROM hookledger_app_migrations"),
        1,
        "the migration ran once, not again on restart"
    );
}

/// An effect queues its own external call: one outbox row per key, however many events name
/// it, delivered by the worker to its kind's URL, signed like `forward`.
#[test]
fn an_effect_queues_a_delivery_of_its_own_kind_once_per_key() {
    let app = FakeApp::start(&[]);
    let dir = test_dir();
    let receipt = match store() {
        Store::Sqlite => {
            "
INSERT INTO outbox (kind, source, key, payload)
VALUES ('send_receipt', :source, json_extract(:body, '$.data.object.id'),
        json_object('invoice', json_extract(:body, '$.data.object.id'),
                    'amount', json_extract(:body, '$.data.object.amount_paid')))
ON CONFLICT DO NOTHING"
        }
        // The payload column is BYTEA: the JSON's UTF-8 bytes.
        Store::Postgres => {
            "
INSERT INTO outbox (kind, source, key, payload)
SELECT 'send_receipt', :source, o ->> 'id',
       convert_to(CAST(jsonb_build_object('invoice', o -> 'id', 'amount', o -> 'amount_paid')
                       AS TEXT), 'UTF8')
FROM (SELECT CAST(:body AS jsonb) -> 'data' -> 'object' AS o) AS invoice
ON CONFLICT DO NOTHING"
        }
    };
    let config = format!(
        r#"{}
[[delivery]]
kind = "send_receipt"
url = "{}"
secret = "{FORWARD_SECRET}"
schedule = ["1s"]

[[effect]]
source = "stripe"
on = "invoice.*"
sql = """{receipt}
"""
"#,
        config(),
        app.url()
    );
    let path = app_dir(dir.path(), &config);
    let server = Server::start_in(dir.path(), &["--config", &path]);
    assert_outcome(
        &server.send(&paid_invoice("evt_r1", "in_r")),
        "evt_r1",
        "processed",
    );
    let second = invoice_event(
        "evt_r2",
        "invoice.payment_succeeded",
        now(),
        "in_r",
        "cus_1",
        "acct_1",
    );
    assert_outcome(&server.send(second.as_bytes()), "evt_r2", "processed");

    let delivered = app.wait_delivered(1, Duration::from_secs(20));
    let d = &delivered[0];
    assert_eq!(d.headers["webhook-id"], "in_r");
    assert_eq!(d.headers["webhook-source"], "stripe");
    let payload: serde_json::Value = serde_json::from_slice(&d.body).unwrap();
    assert_eq!(
        payload,
        serde_json::json!({"invoice": "in_r", "amount": 2000})
    );
    let db = server.db();
    wait_for(Duration::from_secs(20), || {
        (db.count("SELECT count(*) FROM outbox WHERE kind = 'send_receipt' AND status = 'done'")
            == 1)
            .then_some(())
    })
    .expect("the receipt row is done");
    assert_eq!(
        db.count("SELECT count(*) FROM outbox WHERE kind = 'send_receipt'"),
        1
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(app.deliveries().len(), 1, "once per key");
}

/// An effect that runs past `writer.effect_timeout` (a recursive query driven by a body value
/// on SQLite, a sleep on PostgreSQL) fails its event alone, after about the limit: the events
/// sent with it are processed, and nothing of the slow one stands. Without the limit it would
/// hold the one writer, and every other event, for minutes.
#[test]
fn a_slow_effect_fails_its_event_alone_at_the_time_limit() {
    let dir = test_dir();
    let (spin, effect) = match store() {
        Store::Sqlite => (
            "1000000000000",
            "
WITH RECURSIVE spin(n) AS (
    SELECT 0 UNION ALL
    SELECT n + 1 FROM spin WHERE n < coalesce(json_extract(:body, '$.spin'), 0))
INSERT INTO seen (source, event_id, event_type, created)
SELECT :source, :event_id, :event_type, max(n) FROM spin",
        ),
        Store::Postgres => (
            "600",
            "
INSERT INTO seen (source, event_id, event_type, created)
SELECT :source, :event_id, :event_type, :created
FROM pg_sleep(coalesce(CAST(CAST(:body AS jsonb) ->> 'spin' AS float8), 0))",
        ),
    };
    let config = format!(
        r#"
[schema]
migrations = "migrations/"

[writer]
effect_timeout = "1s"

[[source]]
name = "stripe"
scheme = "stripe"
secrets = ["env:STRIPE_WEBHOOK_SECRET"]

[[effect]]
source = "stripe"
on = "*"
sql = """{effect}
"""
"#
    );
    let path = app_dir(dir.path(), &config);
    let server = Server::start_in(dir.path(), &["--config", &path]);
    let event = |id: &str, spin: &str| {
        format!(
            r#"{{"id":"{id}","object":"event","type":"thing.happened","created":{},"spin":{spin},"data":{{"object":{{}}}}}}"#,
            now()
        )
    };
    let bodies: Vec<String> = [
        ("evt_1", "0"),
        ("evt_slow", spin),
        ("evt_2", "0"),
        ("evt_3", "0"),
    ]
    .iter()
    .map(|(id, spin)| event(id, spin))
    .collect();
    let started = std::time::Instant::now();
    let replies: Vec<_> = std::thread::scope(|s| {
        let sent: Vec<_> = bodies
            .iter()
            .map(|body| {
                let server = &server;
                s.spawn(move || server.send(body.as_bytes()))
            })
            .collect();
        sent.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let took = started.elapsed();
    assert_error(&replies[1], 500, "internal");
    for (reply, id) in [
        (&replies[0], "evt_1"),
        (&replies[2], "evt_2"),
        (&replies[3], "evt_3"),
    ] {
        assert_outcome(reply, id, "processed");
    }
    // About the limit (1 s); once or twice on PostgreSQL (the batch together, then job by
    // job), never the spin.
    assert!(took < Duration::from_secs(10), "{took:?}");
    let db = server.db();
    assert_eq!(
        db.strings("SELECT event_id FROM webhook_events ORDER BY event_id"),
        ["evt_1", "evt_2", "evt_3"]
    );
    assert_eq!(
        db.strings("SELECT event_id FROM seen ORDER BY event_id"),
        ["evt_1", "evt_2", "evt_3"]
    );
    wait_for(Duration::from_secs(5), || {
        server
            .log()
            .contains("time limit (writer.effect_timeout")
            .then_some(())
    })
    .expect("the log says why the event failed");
}

/// `examples/effects` (its `postgres/` twin on PostgreSQL), as shipped: its own migration
/// creates the tables its effects write, and an event in makes the app's rows: one order per
/// invoice, the running total, one receipt queued in the outbox.
#[test]
fn the_effects_example_writes_the_tables_its_own_migration_creates() {
    let example = match store() {
        Store::Sqlite => "examples/effects/hookledger.toml",
        Store::Postgres => "examples/effects/postgres/hookledger.toml",
    };
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join(example);
    let server = Server::start(&["--config", config.to_str().unwrap()]);
    let db = server.db();
    assert_eq!(
        db.count("SELECT count(*) FROM orders"),
        0,
        "the migration made the table"
    );

    assert_outcome(
        &server.send(&fixture("invoice.paid")),
        "evt_1Pgci1B7WZ01zgkWrMGF0FaA",
        "processed",
    );
    let order: (String, String, i64) =
        db.one("SELECT invoice_id, event_id, amount FROM orders", &[]);
    assert_eq!(
        order,
        (
            "in_1Pgc6tB7WZ01zgkWu9fdqL6I".to_string(),
            "evt_1Pgci1B7WZ01zgkWrMGF0FaA".to_string(),
            2000
        )
    );
    assert_eq!(total(&server), 2000);
    assert_eq!(
        db.strings("SELECT key FROM outbox WHERE kind = 'send_receipt'"),
        ["in_1Pgc6tB7WZ01zgkWu9fdqL6I"]
    );

    // The second event about the same payment is claimed, and adds no order, no amount and
    // no receipt.
    assert_outcome(
        &server.send(&fixture("invoice.payment_succeeded")),
        "evt_1PgcGQB7WZ01zgkWFJrikLTV",
        "processed",
    );
    assert_eq!(ledger_count(&db), 2);
    assert_eq!(db.count("SELECT count(*) FROM orders"), 1);
    assert_eq!(total(&server), 2000);
    assert_eq!(
        db.count("SELECT count(*) FROM outbox WHERE kind = 'send_receipt'"),
        1
    );
    assert_eq!(
        db.strings("SELECT name FROM hookledger_app_migrations"),
        ["001_orders.sql"]
    );
}

/// An effect that queues a row with a key already in the outbox (a plain INSERT, no ON
/// CONFLICT) never fails its event: every event is processed (200, in the ledger). On a
/// coalescing kind the newer row supersedes the one of its key: that row is queued again with
/// the newer payload, delivered again once done, and attempted again after an attempt that
/// was running when the newer one came; on another kind the key is once (the first payload).
#[test]
fn a_repeated_outbox_key_supersedes_on_a_coalescing_kind_and_is_once_on_another() {
    let (deploys, receipts) = (FakeApp::start(&[]), FakeApp::start(&[]));
    let dir = test_dir();
    let queue = |kind: &str| match store() {
        Store::Sqlite => format!(
            "INSERT INTO outbox (kind, source, key, payload)
             VALUES ('{kind}', :source, json_extract(:body, '$.data.object.id'), :event_id)"
        ),
        Store::Postgres => format!(
            "INSERT INTO outbox (kind, source, key, payload)
             SELECT '{kind}', :source, CAST(:body AS jsonb) -> 'data' -> 'object' ->> 'id',
                    convert_to(CAST(:event_id AS TEXT), 'UTF8')"
        ),
    };
    let config = format!(
        r#"{}
[[delivery]]
kind = "deploy"
url = "{}"
secret = "{FORWARD_SECRET}"
schedule = ["1s"]
coalesce = true

[[delivery]]
kind = "receipt"
url = "{}"
secret = "{FORWARD_SECRET}"
schedule = ["1s"]

[[effect]]
source = "stripe"
on = "invoice.*"
sql = """{}"""

[[effect]]
source = "stripe"
on = "invoice.*"
sql = """{}"""
"#,
        config(),
        deploys.url(),
        receipts.url(),
        queue("deploy"),
        queue("receipt"),
    );
    let path = app_dir(dir.path(), &config);
    let server = Server::start_in(dir.path(), &["--config", &path]);
    let db = server.db();
    let bodies = |app: &FakeApp| -> Vec<String> {
        app.deliveries()
            .iter()
            .map(|d| String::from_utf8_lossy(&d.body).into_owned())
            .collect()
    };
    let done = |kind: &str| {
        let db = &db;
        let sql = format!("SELECT count(*) FROM outbox WHERE kind = '{kind}' AND status = 'done'");
        wait_for(Duration::from_secs(20), move || {
            (db.count(&sql) == 1).then_some(())
        })
        .unwrap_or_else(|| panic!("the {kind} row is done"));
    };
    assert_outcome(
        &server.send(&paid_invoice("evt_k1", "in_k")),
        "evt_k1",
        "processed",
    );
    deploys.wait_delivered(1, Duration::from_secs(20));
    receipts.wait_delivered(1, Duration::from_secs(20));
    done("deploy");
    done("receipt");

    // The key again, its row done: delivered again on the coalescing kind, with the newer
    // payload.
    assert_outcome(
        &server.send(&paid_invoice("evt_k2", "in_k")),
        "evt_k2",
        "processed",
    );
    deploys.wait_delivered(2, Duration::from_secs(20));
    done("deploy");

    // Again while the row's attempt runs: that attempt's answer is not recorded, and the row
    // is attempted again with the newest payload once it ended.
    deploys.hold();
    assert_outcome(
        &server.send(&paid_invoice("evt_k3", "in_k")),
        "evt_k3",
        "processed",
    );
    wait_for(Duration::from_secs(20), || {
        (deploys.deliveries().len() == 3).then_some(())
    })
    .expect("the third deploy is being attempted");
    assert_outcome(
        &server.send(&paid_invoice("evt_k4", "in_k")),
        "evt_k4",
        "processed",
    );
    deploys.release();
    deploys.wait_delivered(4, Duration::from_secs(30));
    done("deploy");
    std::thread::sleep(Duration::from_millis(1500));

    assert_eq!(ledger_count(&db), 4, "every event is in the ledger");
    assert_eq!(bodies(&deploys), ["evt_k1", "evt_k2", "evt_k3", "evt_k4"]);
    assert_eq!(
        bodies(&receipts),
        ["evt_k1"],
        "once per key on another kind"
    );
    let rows: Vec<(String, String, i64)> = db.all(
        "SELECT kind, status, queued FROM outbox WHERE kind <> 'forward' ORDER BY kind",
        &[],
    );
    assert_eq!(
        rows,
        [
            ("deploy".to_string(), "done".to_string(), 3),
            ("receipt".to_string(), "done".to_string(), 0)
        ],
        "one row per key: the deploy row queued again three times"
    );
}
