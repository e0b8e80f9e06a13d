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
    let owner: String = db
        .query_row(
            "SELECT event_id FROM invoice_payments WHERE stripe_invoice_id = 'in_same'",
            [],
            |r| r.get(0),
        )
        .unwrap();
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
        let (rank, event): (i64, String) = db
            .query_row("SELECT event_rank, event_id FROM subscriptions", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap();
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
        count(
            &db,
            "SELECT value FROM counters WHERE name = 'subscription_ties'"
        ),
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
    let claimed: std::collections::BTreeSet<String> =
        strings(&db, "SELECT event_id FROM webhook_events")
            .iter()
            .map(|id| invoice_of(id))
            .collect();
    let paid: std::collections::BTreeSet<String> =
        strings(&db, "SELECT stripe_invoice_id FROM invoice_payments")
            .into_iter()
            .collect();
    assert_eq!(paid, claimed, "one payment row per invoice with a claim");
    assert_eq!(
        count(&db, "SELECT count(*) FROM invoice_payments") as usize,
        claimed.len()
    );
    assert_eq!(credits(&db, "acct_b"), 100 * claimed.len() as i64);
}
