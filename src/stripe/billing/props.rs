//! Property tests for the two guarantees that must hold whatever order or multiplicity events
//! arrive in:
//! - subscription snapshots: the final row depends only on the set of events, not their order;
//! - duplicate deliveries through the real writer thread: every event id is recorded once and
//!   every invoice is credited once.
//!
//! Event bodies are built with `dev::stripe_samples` and go through the real stripe envelope
//! and the handler's decoding, so the rank and the invoice id come from the event type and
//! body, as in production.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use proptest::prelude::*;
use rusqlite::Connection;

use crate::config::WriterConfig;
use crate::event::Event;
use crate::handler::{Handler, Submission};
use crate::source::stripe;
use crate::store::pipeline::Batch;
use crate::store::sqlite::SqliteStore;
use crate::store::{Outcome, Store};
use crate::stripe::billing::{self as state, Change, StripeBilling, SCHEMA};
use crate::stripe::samples as sample;
use crate::writer;

const CREDITS_PER_INVOICE: i64 = 100;

/// A Stripe-like `created` for every generated event, so the bodies look real.
const BASE_CREATED: i64 = 1_721_953_934;

/// The event as the stripe source reads it, and what the billing handler decodes of it.
fn parse(body: String) -> (Event, Option<Change>) {
    let envelope = stripe::envelope(body.as_bytes()).expect("sample events parse");
    let change = state::decode(&envelope.kind, body.as_bytes()).expect("sample events decode");
    let event = Event {
        source: "stripe".into(),
        id: envelope.id,
        kind: envelope.kind,
        created: envelope.created,
        body: body.into(),
    };
    (event, change)
}

// ---------------------------------------------------------------------------------------------
// Subscriptions: order does not matter when every (created, rank) is distinct.

/// One `customer.subscription.*` event of subscription `sub_1`.
#[derive(Debug, Clone)]
struct SubEvent {
    created: i64,
    rank: i64,
    /// Which of the rank-1 types (updated / paused / resumed) to send.
    variant: usize,
    status: &'static str,
    account: &'static str,
}

impl SubEvent {
    fn kind(&self) -> &'static str {
        match self.rank {
            0 => "customer.subscription.created",
            1 => [
                "customer.subscription.updated",
                "customer.subscription.paused",
                "customer.subscription.resumed",
            ][self.variant],
            _ => "customer.subscription.deleted",
        }
    }

    /// The event id names its `(created, rank)`, so ids are distinct exactly when pairs are.
    fn id(&self) -> String {
        format!("evt_sub_{}_{}", self.created, self.rank)
    }

    fn event(&self) -> (Event, Option<Change>) {
        parse(sample::subscription_event(
            &self.id(),
            self.kind(),
            self.created,
            "sub_1",
            "cus_1",
            self.account,
            self.status,
        ))
    }
}

const STATUSES: &[&str] = &[
    "incomplete",
    "trialing",
    "active",
    "past_due",
    "paused",
    "canceled",
    "unpaid",
];

/// Distinct `(created, rank)` pairs (a small `created` range, so same-second events where only
/// the rank decides are common), each with random attributes, in ascending order.
fn sorted_sub_events() -> impl Strategy<Value = Vec<SubEvent>> {
    proptest::collection::btree_set((0i64..4, 0i64..3), 1..10)
        .prop_flat_map(|pairs| {
            let n = pairs.len();
            let attrs = proptest::collection::vec(
                (
                    0usize..3,
                    proptest::sample::select(STATUSES),
                    proptest::sample::select(&["acct_a", "acct_b"][..]),
                ),
                n,
            );
            (Just(pairs), attrs)
        })
        .prop_map(|(pairs, attrs)| {
            pairs
                .into_iter()
                .zip(attrs)
                .map(|((offset, rank), (variant, status, account))| SubEvent {
                    created: BASE_CREATED + offset,
                    rank,
                    variant,
                    status,
                    account,
                })
                .collect()
        })
}

type SubscriptionRow = (String, String, Option<String>, String, i64, i64, String);

/// Claims and applies `events` in order, each in its own transaction as the writer does, and
/// returns the one `subscriptions` row.
fn apply_in_order(events: &[SubEvent]) -> SubscriptionRow {
    let mut store = SqliteStore::open_in_memory().unwrap();
    store.migrate_handler(&SCHEMA).unwrap();
    for e in events {
        let (event, change) = e.event();
        store.connection().execute_batch("BEGIN").unwrap();
        let stored = crate::payload::compress(&event.body, None);
        assert!(
            store.claim(&event, &stored, 0).unwrap(),
            "{} is new",
            event.id
        );
        let applied = state::apply(
            &store.tx(),
            &event.id,
            event.created.unwrap(),
            &change.expect("a subscription change"),
            CREDITS_PER_INVOICE,
        )
        .unwrap();
        // Pairs are distinct, so the guard never sees a tie.
        assert_ne!(applied, state::Applied::Tie, "{}", event.id);
        store.connection().execute_batch("COMMIT").unwrap();
    }
    store
        .connection()
        .query_row(
            "SELECT id, customer_id, account_id, status, provider_updated_at, event_rank, event_id
         FROM subscriptions",
            [],
            |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                ))
            },
        )
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn subscription_row_is_independent_of_arrival_order(
        (sorted, shuffled) in sorted_sub_events()
            .prop_flat_map(|sorted| (Just(sorted.clone()), Just(sorted).prop_shuffle()))
    ) {
        let in_order = apply_in_order(&sorted);
        let permuted = apply_in_order(&shuffled);
        prop_assert_eq!(&permuted, &in_order);

        // And the row is the newest event's snapshot, not merely the same wrong one twice.
        let newest = sorted.last().unwrap();
        let expected: SubscriptionRow = (
            "sub_1".into(),
            "cus_1".into(),
            Some(newest.account.into()),
            newest.status.into(),
            newest.created,
            newest.rank,
            newest.id(),
        );
        prop_assert_eq!(in_order, expected);
    }
}

// ---------------------------------------------------------------------------------------------
// Invoices: duplicate deliveries from several threads through the real writer.

/// One delivery: which invoice, which of the two payment event types, and which "resend" of
/// it (Stripe may report one payment under several event ids). The event id is derived from
/// all three, so equal deliveries are byte-identical redeliveries of one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Delivery {
    invoice: u8,
    succeeded: bool,
    resend: u8,
}

impl Delivery {
    fn event_id(&self) -> String {
        format!(
            "evt_in{}_{}_{}",
            self.invoice,
            if self.succeeded { "succ" } else { "paid" },
            self.resend
        )
    }

    fn invoice_id(&self) -> String {
        format!("in_{}", self.invoice)
    }

    /// Invoices alternate between two accounts, so credits must also land on the right one.
    fn account(&self) -> String {
        format!("acct_{}", self.invoice % 2)
    }

    fn body(&self) -> String {
        let kind = if self.succeeded {
            "invoice.payment_succeeded"
        } else {
            "invoice.paid"
        };
        sample::invoice_event(
            &self.event_id(),
            kind,
            BASE_CREATED + i64::from(self.invoice),
            &self.invoice_id(),
            &format!("cus_{}", self.invoice),
            &self.account(),
        )
    }
}

fn delivery() -> impl Strategy<Value = Delivery> {
    (0u8..4, any::<bool>(), 0u8..2).prop_map(|(invoice, succeeded, resend)| Delivery {
        invoice,
        succeeded,
        resend,
    })
}

/// Deliveries per case stay below the queue depth, so `try_submit` is never refused and no
/// retry is needed.
const MAX_DELIVERIES: usize = 48;
const QUEUE_DEPTH: usize = 64;

fn count(conn: &Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn duplicate_deliveries_credit_each_invoice_once(
        deliveries in proptest::collection::vec(delivery(), 1..MAX_DELIVERIES),
        threads in 1usize..=4,
        batch_max in 1usize..=8,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hookledger.db");
        let mut store = SqliteStore::open(&path, Duration::from_secs(5)).unwrap();
        store.migrate_handler(&SCHEMA).unwrap();
        let config = WriterConfig {
            batch_max,
            queue_depth: QUEUE_DEPTH,
            ..WriterConfig::default()
        };
        let (handle, writer) = writer::spawn(Box::new(store), config, None, Default::default()).unwrap();
        let billing: Arc<dyn Handler> = Arc::new(StripeBilling {
            credits_per_invoice: CREDITS_PER_INVOICE,
            refresh: None,
        });

        // Round-robin the deliveries over the threads; each thread submits all of its share
        // before waiting, so batches mix threads and duplicates.
        let start = Arc::new(Barrier::new(threads));
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let mine: Vec<Delivery> =
                    deliveries.iter().skip(t).step_by(threads).copied().collect();
                let handle = handle.clone();
                let start = Arc::clone(&start);
                let billing = billing.clone();
                std::thread::spawn(move || {
                    let submissions: Vec<Submission> = mine
                        .iter()
                        .map(|d| {
                            let (event, _) = parse(d.body());
                            let prepared = billing.prepare(&event).expect("prepares");
                            Submission {
                                token: None,
                                event,
                                handlers: vec![(billing.clone(), prepared)],
                                forward: false,
                                routed: Vec::new(),
                                stored: None,
                            }
                        })
                        .collect();
                    start.wait();
                    let replies: Vec<_> = submissions
                        .into_iter()
                        .map(|s| handle.try_submit(s).expect("queue has room"))
                        .collect();
                    replies
                        .into_iter()
                        .map(|rx| rx.blocking_recv().expect("writer replied").expect("stored"))
                        .collect::<Vec<Outcome>>()
                })
            })
            .collect();
        let outcomes: Vec<Outcome> = workers
            .into_iter()
            .flat_map(|w| w.join().expect("worker thread"))
            .collect();
        drop(handle);
        writer.join();

        let distinct_events: BTreeSet<Delivery> = deliveries.iter().copied().collect();
        let distinct_invoices: BTreeSet<u8> = deliveries.iter().map(|d| d.invoice).collect();
        let processed = outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Processed))
            .count();
        prop_assert_eq!(processed, distinct_events.len());
        prop_assert_eq!(outcomes.len() - processed, deliveries.len() - distinct_events.len());

        let conn = Connection::open(&path).unwrap();
        prop_assert_eq!(
            count(&conn, "SELECT count(*) FROM webhook_events") as usize,
            distinct_events.len()
        );
        prop_assert_eq!(
            count(&conn, "SELECT count(*) FROM invoice_payments") as usize,
            distinct_invoices.len()
        );
        prop_assert_eq!(
            count(&conn, "SELECT coalesce(sum(credits), 0) FROM accounts"),
            CREDITS_PER_INVOICE * distinct_invoices.len() as i64
        );

        // Per account too: each invoice's credit went to its own account.
        let mut expected: BTreeMap<String, i64> = BTreeMap::new();
        for invoice in &distinct_invoices {
            let d = Delivery { invoice: *invoice, succeeded: false, resend: 0 };
            *expected.entry(d.account()).or_default() += CREDITS_PER_INVOICE;
        }
        let mut stmt = conn.prepare("SELECT id, credits FROM accounts ORDER BY id").unwrap();
        let actual: BTreeMap<String, i64> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        prop_assert_eq!(actual, expected);
    }
}
