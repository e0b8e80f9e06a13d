//! The Stripe billing handler over HTTP: credits once per paid invoice, and subscription
//! snapshots guarded by event time.

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
