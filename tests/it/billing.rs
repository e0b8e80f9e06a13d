//! The Stripe billing handler over HTTP: credits once per paid invoice, and subscription
//! snapshots guarded by event time.

use std::time::Duration;

use hookledger::internals::{invoice_event, subscription_event};

use crate::util::*;

fn sub_event(event_id: &str, kind: &str, created: i64, status: &str) -> Vec<u8> {
    subscription_event(event_id, kind, created, "sub_1", "cus_1", "acct_1", status).into_bytes()
}

#[test]
fn second_event_for_same_invoice_adds_no_credits() {
    let server = Server::start(&[]);
    assert_outcome(
        &server.send(&paid_invoice("evt_a", "in_same")),
        "evt_a",
        "processed",
    );
    let succeeded = invoice_event(
        "evt_b",
        "invoice.payment_succeeded",
        now(),
        "in_same",
        "cus_1",
        "acct_1",
    );
    assert_outcome(&server.send(succeeded.as_bytes()), "evt_b", "processed");
    let db = server.db();
    assert_eq!(ledger_count(&db), 2);
    assert_eq!(credits(&db, "acct_1"), 100);
    let owner: String = db.one(
        "SELECT event_id FROM invoice_payments WHERE stripe_invoice_id = 'in_same'",
        &[],
    );
    assert_eq!(owner, "evt_a");
}

#[test]
fn credits_per_invoice_is_configurable() {
    let server = Server::start(&["--credits-per-invoice", "7"]);
    assert_outcome(
        &server.send(&paid_invoice("evt_c", "in_c")),
        "evt_c",
        "processed",
    );
    assert_eq!(credits(&server.db(), "acct_1"), 7);
}

#[test]
fn late_created_does_not_undo_newer_update() {
    let server = Server::start(&[]);
    let t = 1_700_000_000;
    let updated = sub_event(
        "evt_upd",
        "customer.subscription.updated",
        t + 10,
        "canceled",
    );
    let created = sub_event("evt_cre", "customer.subscription.created", t, "active");
    assert_outcome(&server.send(&updated), "evt_upd", "processed");
    assert_outcome(&server.send(&created), "evt_cre", "processed");
    let db = server.db();
    assert_eq!(
        subscription_status(&db, "sub_1").as_deref(),
        Some("canceled")
    );
    assert_eq!(ledger_count(&db), 2, "the late event is still recorded");
}

#[test]
fn deleted_beats_updated_in_the_same_second_in_either_order() {
    for (first, second) in [("deleted", "updated"), ("updated", "deleted")] {
        let server = Server::start(&[]);
        let t = 1_700_000_000;
        let status = |kind: &str| {
            if kind == "deleted" {
                "canceled"
            } else {
                "active"
            }
        };
        for kind in [first, second] {
            let body = sub_event(
                &format!("evt_{kind}"),
                &format!("customer.subscription.{kind}"),
                t,
                status(kind),
            );
            assert_outcome(&server.send(&body), &format!("evt_{kind}"), "processed");
        }
        let db = server.db();
        assert_eq!(
            subscription_status(&db, "sub_1").as_deref(),
            Some("canceled"),
            "{first} then {second}"
        );
        let (rank, event): (i64, String) =
            db.one("SELECT event_rank, event_id FROM subscriptions", &[]);
        assert_eq!((rank, event.as_str()), (2, "evt_deleted"));
    }
}

#[test]
fn two_updates_in_the_same_second_keep_the_first_and_count_the_tie() {
    let server = Server::start(&[]);
    let t = 1_700_000_000;
    let first = sub_event("evt_u1", "customer.subscription.updated", t, "past_due");
    let second = sub_event("evt_u2", "customer.subscription.updated", t, "active");
    assert_outcome(&server.send(&first), "evt_u1", "processed");
    assert_outcome(&server.send(&second), "evt_u2", "processed");
    let db = server.db();
    assert_eq!(
        subscription_status(&db, "sub_1").as_deref(),
        Some("past_due")
    );
    assert_eq!(
        db.count("SELECT value FROM counters WHERE name = 'subscription_ties'"),
        1
    );
}

/// SIGKILL while paid invoices and their second reports (`invoice.payment_succeeded`) stream
/// in: after the restart each invoice with a claimed event has one payment row and its credits
/// once, however the kill fell between the two reports.
#[test]
fn sigkill_during_a_stream_grants_once_per_paid_invoice() {
    let mut server = Server::start(&[]);
    let url = server.url();
    let next = |worker: u64, i: usize| {
        let id = format!("evt_b{worker}_{i}");
        let kind = if i.is_multiple_of(2) {
            "invoice.paid"
        } else {
            "invoice.payment_succeeded"
        };
        let invoice = format!("in_b{worker}_{}", i / 2);
        let body = invoice_event(&id, kind, now(), &invoice, "cus_b", "acct_b");
        (id, body.into_bytes())
    };
    let streamed = stream_until(&url, 4, next, &[], |acked| {
        wait_for(Duration::from_secs(30), || (acked() >= 200).then_some(()))
            .expect("events were not acknowledged");
        server.kill();
    });

    let restarted = Server::start_in(&server.dir, &[]);
    let db = restarted.db();
    assert!(missing_from_ledger(&db, &streamed.acked).is_empty());
    // The invoice each claimed event names: evt_b{w}_{i} reports in_b{w}_{i / 2}.
    let invoice_of = |id: &str| {
        let (worker, i) = id.trim_start_matches("evt_b").split_once('_').unwrap();
        format!("in_b{worker}_{}", i.parse::<usize>().unwrap() / 2)
    };
    let claimed: std::collections::BTreeSet<String> = db
        .strings("SELECT event_id FROM webhook_events")
        .iter()
        .map(|id| invoice_of(id))
        .collect();
    let paid: std::collections::BTreeSet<String> = db
        .strings("SELECT stripe_invoice_id FROM invoice_payments")
        .into_iter()
        .collect();
    assert_eq!(paid, claimed, "one payment row per invoice with a claim");
    assert_eq!(
        db.count("SELECT count(*) FROM invoice_payments") as usize,
        claimed.len()
    );
    assert_eq!(credits(&db, "acct_b"), 100 * claimed.len() as i64);
}

/// An invoice event with `data.object` fields replaced by `changes`.
fn invoice_with(event_id: &str, invoice: &str, changes: serde_json::Value) -> Vec<u8> {
    let body = invoice_event(event_id, "invoice.paid", now(), invoice, "cus_1", "acct_1");
    let mut event: serde_json::Value = serde_json::from_str(&body).unwrap();
    for (field, value) in changes.as_object().unwrap() {
        event["data"]["object"][field] = value.clone();
    }
    event.to_string().into_bytes()
}

/// A $0 invoice (a trial, a 100 % coupon) is paid: it is recorded and extends the plan, but
/// grants no credits, as nothing was bought.
#[test]
fn a_zero_amount_invoice_extends_the_plan_and_grants_no_credits() {
    let server = Server::start(&[]);
    let body = invoice_with(
        "evt_trial",
        "in_trial",
        serde_json::json!({"amount_paid": 0}),
    );
    assert_outcome(&server.send(&body), "evt_trial", "processed");
    let db = server.db();
    assert_eq!(credits(&db, "acct_1"), 0);
    assert_eq!(
        db.count("SELECT count(*) FROM invoice_payments WHERE stripe_invoice_id = 'in_trial'"),
        1
    );
    assert_eq!(
        db.count("SELECT count(*) FROM accounts WHERE id = 'acct_1' AND plan_until > 0"),
        1
    );
    // A paid invoice afterwards grants its credits as usual.
    assert_outcome(
        &server.send(&paid_invoice("evt_after", "in_after")),
        "evt_after",
        "processed",
    );
    assert_eq!(credits(&db, "acct_1"), 100);
}

/// The book (docs/src/guarantees.md) says a billing event without what it needs is a 400: an
/// empty invoice or subscription id, a negative amount.
#[test]
fn empty_object_ids_and_a_negative_amount_are_refused_and_write_nothing() {
    let server = Server::start(&[]);
    for (id, body) in [
        (
            "evt_noinv",
            invoice_with("evt_noinv", "in_x", serde_json::json!({"id": ""})),
        ),
        (
            "evt_blankinv",
            invoice_with("evt_blankinv", "in_x", serde_json::json!({"id": "  "})),
        ),
        (
            "evt_neg",
            invoice_with("evt_neg", "in_neg", serde_json::json!({"amount_paid": -5})),
        ),
        (
            "evt_nosub",
            subscription_event(
                "evt_nosub",
                "customer.subscription.updated",
                now(),
                "",
                "cus_1",
                "acct_1",
                "active",
            )
            .into_bytes(),
        ),
    ] {
        let reply = server.send(&body);
        assert_error(&reply, 400, "invalid_event");
        assert!(
            reply.body.contains("data.object") || reply.body.contains("amount_paid"),
            "{id}: {}",
            reply.body
        );
    }
    assert_eq!(snapshot(&server.db()), snapshot(&Server::start(&[]).db()));
}

/// The tables the billing writes, as text, for comparing two databases.
fn billing_tables(server: &Server) -> Vec<(String, Vec<String>)> {
    snapshot(&server.db())
        .into_iter()
        .filter(|(table, _)| {
            ["accounts", "counters", "invoice_payments", "subscriptions"].contains(&table.as_str())
        })
        .collect()
}

/// The seeds' scenario, each step's replies as text: a failure mid-apply and its retry, ten
/// concurrent copies, a second event for one invoice, out-of-order and same-second
/// subscription events, a $0 invoice, and every real-shaped fixture event.
fn billing_scenario(server: &Server) -> Vec<String> {
    let replies = std::cell::RefCell::new(Vec::new());
    let send = |body: &[u8]| {
        let reply = server.send(body);
        let outcome = json(&reply)["outcome"].as_str().unwrap_or("-").to_string();
        replies
            .borrow_mut()
            .push(format!("{} {outcome}", reply.status));
    };
    // Event times are fixed, so two runs a second apart write the same rows.
    let t = 1_700_000_000;
    let invoice = |id: &str, kind: &str, invoice: &str| {
        invoice_event(id, kind, t, invoice, "cus_1", "acct_1").into_bytes()
    };
    let paid_invoice = |id: &str, inv: &str| invoice(id, "invoice.paid", inv);
    let db = server.db();
    send(&paid_invoice("evt_first", "in_first"));
    db.inject_failure("fail_credit", "UPDATE", "accounts", "true", "injected");
    send(&paid_invoice("evt_fail", "in_fail"));
    db.remove_failure("fail_credit", "accounts");
    send(&paid_invoice("evt_fail", "in_fail"));
    let copies = paid_invoice("evt_par", "in_par");
    let mut outcomes: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..10).map(|_| s.spawn(|| server.send(&copies))).collect();
        handles
            .into_iter()
            .map(|h| {
                json(&h.join().unwrap())["outcome"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    });
    outcomes.sort();
    replies.borrow_mut().push(outcomes.join(","));
    send(&invoice("evt_par2", "invoice.payment_succeeded", "in_par"));
    for (id, kind, created, sub, status) in [
        ("evt_s1", "updated", t + 10, "sub_1", "canceled"),
        ("evt_s2", "created", t, "sub_1", "active"),
        ("evt_s3", "deleted", t, "sub_2", "canceled"),
        ("evt_s4", "updated", t, "sub_2", "active"),
        ("evt_s5", "updated", t, "sub_3", "past_due"),
        ("evt_s6", "updated", t, "sub_3", "active"),
        ("evt_s7", "resumed", t + 1, "sub_3", "active"),
    ] {
        let kind = format!("customer.subscription.{kind}");
        send(subscription_event(id, &kind, created, sub, "cus_2", "acct_2", status).as_bytes());
    }
    let trial = String::from_utf8(paid_invoice("evt_trial", "in_trial"))
        .unwrap()
        .replace("\"amount_paid\": 2000", "\"amount_paid\": 0");
    send(trial.as_bytes());
    for name in fixture_names() {
        send(&fixture(&name));
    }
    replies.into_inner()
}

/// `examples/stripe-billing-sql`: the built-in handler's billing in SQL alone, with no Rust
/// handler (its `postgres/` twin on PostgreSQL). The same events through both give the same
/// answers and the same tables, row for row.
#[test]
fn the_sql_only_billing_example_matches_the_built_in_handler_table_for_table() {
    let built_in = Server::start(&[]);
    let dir = test_dir();
    let example = match store() {
        Store::Sqlite => "examples/stripe-billing-sql/hookledger.toml",
        Store::Postgres => "examples/stripe-billing-sql/postgres/hookledger.toml",
    };
    let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(example);
    let sql_only = Server::start_in(dir.path(), &["--config", config.to_str().unwrap()]);

    let with_handler = billing_scenario(&built_in);
    let with_sql = billing_scenario(&sql_only);
    assert_eq!(with_handler, with_sql, "the same answers");
    assert!(
        with_handler.contains(&"500 -".to_string()),
        "{with_handler:?}"
    );
    assert_eq!(billing_tables(&built_in), billing_tables(&sql_only));
    // And the scenario did what the seeds say.
    let db = sql_only.db();
    assert_eq!(
        credits(&db, "acct_1"),
        300,
        "in_first, in_fail, in_par, once each; trial none"
    );
    assert_eq!(
        subscription_status(&db, "sub_1").as_deref(),
        Some("canceled")
    );
    assert_eq!(
        subscription_status(&db, "sub_2").as_deref(),
        Some("canceled")
    );
    assert_eq!(
        db.count("SELECT value FROM counters WHERE name = 'subscription_ties'"),
        1
    );
    assert_eq!(
        db.count("SELECT count(*) FROM hookledger_app_migrations"),
        1
    );
}
