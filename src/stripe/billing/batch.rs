//! stripe-billing for a whole batch on PostgreSQL, in one statement sent with the COMMIT
//! instead of one or two per event, with the same result as applying the events one by one
//! in batch order:
//!
//! - Subscriptions: walking each subscription's events in batch order (a window over them)
//!   decides which event's snapshot ends up stored (the last strictly newer one) and how many
//!   ties there were; the winners are written in one guarded upsert (the guard still decides
//!   against a concurrent instance), in id order.
//! - Invoices: the batch's first report of each invoice inserts its row, and the credits (and
//!   the later plan end) of those it inserted go to their accounts, in account order.

use serde_json::json;

use crate::event::Event;
use crate::sql::StoreError;
use crate::sql::Tx;
use crate::stripe::billing::Change;

pub(super) fn apply(
    tx: &Tx<'_>,
    changes: &[(&Event, Change)],
    credits_per_invoice: i64,
) -> Result<(), StoreError> {
    let mut subscriptions = Vec::new();
    let mut invoices = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (pos, (event, change)) in changes.iter().enumerate() {
        match change {
            Change::Subscription(s) => subscriptions.push(json!({
                "pos": pos, "id": s.id, "customer_id": s.customer_id,
                "account_id": s.account_id, "status": s.status,
                "created": event.created.unwrap_or_default(), "rank": s.rank,
                "event_id": event.id,
            })),
            // The first report of each invoice in the batch is the one that may count.
            Change::InvoicePaid(p) if seen.insert(p.invoice_id.as_str()) => invoices.push(json!({
                "invoice_id": p.invoice_id, "account_id": p.account_id,
                "amount_paid": p.amount_paid, "event_id": event.id, "period_end": p.period_end,
            })),
            Change::InvoicePaid(_) => {}
        }
    }
    if subscriptions.is_empty() && invoices.is_empty() {
        return Ok(());
    }
    // Nothing here needs its count: it goes with the COMMIT, in the same round trip.
    tx.defer(
        BATCH_SQL,
        &[
            &serde_json::Value::Array(subscriptions).to_string(),
            &serde_json::Value::Array(invoices).to_string(),
            &credits_per_invoice,
        ],
    )?;
    Ok(())
}

/// The whole batch in one statement (one round trip). `$1`: the subscription events in batch
/// order, `$2`: the first report of each invoice, `$3`: credits per paid invoice.
///
/// A subscription event's key is `created * 4 + rank` (rank < 4), so `(created, rank)`
/// compares as one number. Walking the events of a subscription in batch order, what is
/// stored "before" an event is the greater of the stored key and the keys of the events before
/// it: the event wins if it is greater (the last winner is written, still guarded), ties if it
/// is equal (counted; the first stays), and is stale otherwise.
const BATCH_SQL: &str = concat!(
    "
WITH sub_input AS (
    SELECT * FROM jsonb_to_recordset($1::text::jsonb) AS i (pos bigint, id text,
        customer_id text, account_id text, status text, created bigint, rank bigint,
        event_id text)
), walk AS (
    SELECT i.*, i.created * 4 + i.rank AS k,
           greatest(s.provider_updated_at * 4 + s.event_rank,
                    max(i.created * 4 + i.rank) OVER (PARTITION BY i.id ORDER BY i.pos
                        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)) AS before_k
    FROM sub_input i LEFT JOIN subscriptions s ON s.id = i.id
), upserted AS (
    INSERT INTO subscriptions
        (id, customer_id, account_id, status, provider_updated_at, event_rank, event_id)
    SELECT id, customer_id, account_id, status, created, rank, event_id FROM (
        SELECT DISTINCT ON (id) * FROM walk WHERE before_k IS NULL OR k > before_k
        ORDER BY id, pos DESC
    ) winners
    ORDER BY id
    ",
    subscription_guard!(),
    "
), ties AS (
    INSERT INTO counters (name, value)
    SELECT 'subscription_ties', count(*) FROM walk WHERE k = before_k HAVING count(*) > 0
    ON CONFLICT (name) DO UPDATE SET value = counters.value + excluded.value
), invoice_input AS (
    SELECT * FROM jsonb_to_recordset($2::text::jsonb) AS i (invoice_id text,
        account_id text, amount_paid bigint, event_id text, period_end bigint)
), paid AS (
    -- the second guard: whichever event reports an invoice first inserts its row
    INSERT INTO invoice_payments (stripe_invoice_id, account_id, amount_paid, event_id)
    SELECT invoice_id, account_id, amount_paid, event_id FROM invoice_input ORDER BY invoice_id
    ON CONFLICT (stripe_invoice_id) DO NOTHING
    RETURNING stripe_invoice_id
)
INSERT INTO accounts (id, credits, plan_until)
-- a $0 invoice extends the plan but grants no credits
SELECT i.account_id, sum(CASE WHEN i.amount_paid > 0 THEN $3::bigint ELSE 0 END),
       max(i.period_end)
FROM invoice_input i JOIN paid p ON p.stripe_invoice_id = i.invoice_id
GROUP BY i.account_id
ORDER BY i.account_id
",
    account_credit!()
);

/// The batch statement against one by one, on PostgreSQL: random batches of subscription
/// events (many in one second, so ties and stale events) and invoice reports (several per
/// invoice, some $0) leave the same tables either way. Needs a server at
/// `HOOKLEDGER_TEST_POSTGRES` (skipped without one, failing under HOOKLEDGER_REQUIRE_POSTGRES).
#[cfg(all(test, feature = "postgres"))]
mod tests {
    use super::*;
    use crate::handler::{Handler, Prepared};
    use crate::sql::Session;
    use crate::store::postgres::scratch::Scratch;
    use crate::store::postgres::PgStore;
    use crate::store::Store;
    use crate::stripe::billing::StripeBilling;
    use crate::stripe::samples as sample;

    fn events(rng: &mut fastrand::Rng) -> Vec<Event> {
        (0..rng.usize(1..60))
            .map(|i| {
                let id = format!("evt_{i}");
                let body = if rng.bool() {
                    let kind = ["created", "updated", "deleted", "paused"][rng.usize(..4)];
                    sample::subscription_event(
                        &id,
                        &format!("customer.subscription.{kind}"),
                        1_700_000_000 + rng.i64(0..3),
                        &format!("sub_{}", rng.usize(..3)),
                        "cus_1",
                        &format!("acct_{}", rng.usize(..3)),
                        ["active", "past_due", "canceled"][rng.usize(..3)],
                    )
                } else {
                    let mut body = sample::invoice_event(
                        &id,
                        ["invoice.paid", "invoice.payment_succeeded"][rng.usize(..2)],
                        1_700_000_000,
                        &format!("in_{}", rng.usize(..8)),
                        "cus_1",
                        &format!("acct_{}", rng.usize(..3)),
                    );
                    if rng.usize(..5) == 0 {
                        body = body.replace("\"amount_paid\": 2000,", "\"amount_paid\": 0,");
                    }
                    body
                };
                let envelope = crate::source::stripe::envelope(body.as_bytes()).unwrap();
                Event {
                    source: "stripe".into(),
                    id: envelope.id,
                    kind: envelope.kind,
                    created: envelope.created,
                    body: body.into(),
                }
            })
            .collect()
    }

    fn tables(session: &dyn Session) -> Vec<Vec<crate::sql::Row>> {
        [
            "SELECT * FROM subscriptions ORDER BY id",
            "SELECT * FROM invoice_payments ORDER BY stripe_invoice_id",
            "SELECT * FROM accounts ORDER BY id",
            "SELECT * FROM counters ORDER BY name",
            // The refreshes a tie queues (with refresh on).
            "SELECT kind, source, key, payload FROM outbox ORDER BY kind, key",
        ]
        .iter()
        .map(|sql| session.query(sql, &[]).unwrap())
        .collect()
    }

    #[test]
    fn a_batch_leaves_the_same_tables_as_its_events_one_by_one() {
        rounds(None);
    }

    /// With refreshes on, subscription events go one by one and invoices in the batch
    /// statement, in one batch: still the same tables, the queued refreshes included.
    #[test]
    fn with_refreshes_a_mixed_batch_leaves_the_same_tables_too() {
        rounds(Some(crate::config::Refresh::Ties));
    }

    fn rounds(refresh: Option<crate::config::Refresh>) {
        let (Some(one), Some(all)) = (Scratch::new(), Scratch::new()) else {
            return;
        };
        let mut one_by_one = PgStore::open(&one.url, std::time::Duration::from_secs(5)).unwrap();
        let mut together = PgStore::open(&all.url, std::time::Duration::from_secs(5)).unwrap();
        for store in [&mut one_by_one, &mut together] {
            store
                .migrate_handler(&crate::stripe::billing::SCHEMA)
                .unwrap();
        }
        let handler = StripeBilling {
            credits_per_invoice: 100,
            refresh,
        };
        let mut rng = fastrand::Rng::with_seed(7);
        let prepared = |e: &Event| handler.prepare(e).unwrap();
        for round in 0..40 {
            let events = events(&mut rng);
            one_by_one.begin().unwrap();
            for event in &events {
                handler
                    .handle(&Tx::new(one_by_one.session()), event, prepared(event))
                    .unwrap();
            }
            one_by_one.commit().unwrap();
            together.begin().unwrap();
            let batch: Vec<(&Event, Prepared)> = events.iter().map(|e| (e, prepared(e))).collect();
            handler
                .handle_all(&Tx::new(together.session()), batch)
                .unwrap();
            together.commit().unwrap();
            assert_eq!(
                tables(one_by_one.session()),
                tables(together.session()),
                "round {round}: {} events",
                events.len()
            );
        }
        let ties = tables(together.session())[3].clone();
        assert!(!ties.is_empty(), "the rounds had ties");
        let refreshes = tables(together.session())[4].len();
        assert_eq!(
            refreshes > 0,
            refresh.is_some(),
            "{refreshes} refreshes queued"
        );
    }
}
