//! stripe-billing for a whole batch on PostgreSQL, in a few statements instead of one or two
//! per event, with the same result as applying the events one by one in batch order:
//!
//! - Subscriptions: the stored `(created, rank)` of the batch's subscriptions is read once;
//!   walking the events in order decides, per subscription, which event's snapshot ends up
//!   stored (the last strictly newer one) and how many ties there were; the winners are
//!   written in one guarded upsert (the guard still decides against a concurrent instance).
//! - Invoices: one statement inserts the batch's first report of each invoice and adds the
//!   credits (and the later plan end) of those it inserted to their accounts, in account order.

use std::collections::HashMap;

use serde_json::json;

use crate::event::Event;
use crate::handler::stripe_billing::{Change, InvoicePayment, SubscriptionChange};
use crate::handler::Tx;
use crate::store::StoreError;

pub(super) fn apply(
    tx: &Tx<'_>,
    changes: &[(&Event, Change)],
    credits_per_invoice: i64,
) -> Result<(), StoreError> {
    let mut subscriptions = Vec::new();
    let mut payments = Vec::new();
    for (event, change) in changes {
        match change {
            Change::Subscription(s) => subscriptions.push((*event, s)),
            Change::InvoicePaid(p) => payments.push((*event, p)),
        }
    }
    if !subscriptions.is_empty() {
        upsert_subscriptions(tx, &subscriptions)?;
    }
    if !payments.is_empty() {
        record_payments(tx, &payments, credits_per_invoice)?;
    }
    Ok(())
}

fn upsert_subscriptions(
    tx: &Tx<'_>,
    events: &[(&Event, &SubscriptionChange)],
) -> Result<(), StoreError> {
    let ids: Vec<&str> = events.iter().map(|(_, s)| s.id.as_str()).collect();
    let mut stored: HashMap<String, (i64, i64)> = HashMap::new();
    for row in tx.query(
        "SELECT id, provider_updated_at, event_rank FROM subscriptions
         WHERE id IN (SELECT jsonb_array_elements_text($1::text::jsonb))",
        &[&json!(ids).to_string()],
    )? {
        stored.insert(row.get(0)?, (row.get(1)?, row.get(2)?));
    }
    // As one by one: an event wins if strictly newer than what is stored by then; equal is a
    // tie (the first stays).
    let mut winners: HashMap<&str, (&Event, &SubscriptionChange)> = HashMap::new();
    let mut ties = 0i64;
    for &(event, s) in events {
        let key = (event.created.unwrap_or_default(), s.rank);
        match stored.get(&s.id) {
            Some(current) if key < *current => {}
            Some(current) if key == *current => ties += 1,
            _ => {
                stored.insert(s.id.clone(), key);
                winners.insert(&s.id, (event, s));
            }
        }
    }
    let mut rows: Vec<serde_json::Value> = winners
        .values()
        .map(|(event, s)| {
            json!({
                "id": s.id, "customer_id": s.customer_id, "account_id": s.account_id,
                "status": s.status, "provider_updated_at": event.created.unwrap_or_default(),
                "event_rank": s.rank, "event_id": event.id,
            })
        })
        .collect();
    // In id order, as every instance locks them.
    rows.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    tx.execute(
        "INSERT INTO subscriptions
             (id, customer_id, account_id, status, provider_updated_at, event_rank, event_id)
         SELECT id, customer_id, account_id, status, provider_updated_at, event_rank, event_id
         FROM jsonb_to_recordset($1::text::jsonb) AS s (id text, customer_id text,
             account_id text, status text, provider_updated_at bigint, event_rank bigint,
             event_id text)
         ORDER BY id
         ON CONFLICT (id) DO UPDATE SET
             customer_id = excluded.customer_id,
             account_id = excluded.account_id,
             status = excluded.status,
             provider_updated_at = excluded.provider_updated_at,
             event_rank = excluded.event_rank,
             event_id = excluded.event_id
         -- only a strictly newer (created, rank) wins: late and equal events change nothing
         WHERE (excluded.provider_updated_at, excluded.event_rank)
             > (subscriptions.provider_updated_at, subscriptions.event_rank)",
        &[&serde_json::Value::Array(rows).to_string()],
    )?;
    if ties > 0 {
        tx.execute(
            "INSERT INTO counters (name, value) VALUES ('subscription_ties', $1)
             ON CONFLICT (name) DO UPDATE SET value = counters.value + excluded.value",
            &[&ties],
        )?;
    }
    Ok(())
}

fn record_payments(
    tx: &Tx<'_>,
    events: &[(&Event, &InvoicePayment)],
    credits_per_invoice: i64,
) -> Result<(), StoreError> {
    // The first report of each invoice in the batch is the one that may count.
    let mut seen = std::collections::HashSet::new();
    let rows: Vec<serde_json::Value> = events
        .iter()
        .filter(|(_, p)| seen.insert(p.invoice_id.as_str()))
        .map(|(event, p)| {
            json!({
                "invoice_id": p.invoice_id, "account_id": p.account_id,
                "amount_paid": p.amount_paid, "event_id": event.id, "period_end": p.period_end,
            })
        })
        .collect();
    tx.execute(
        "WITH input AS (
             SELECT * FROM jsonb_to_recordset($1::text::jsonb) AS i (invoice_id text,
                 account_id text, amount_paid bigint, event_id text, period_end bigint)
         ), paid AS (
             -- the second guard: whichever event reports an invoice first inserts its row
             INSERT INTO invoice_payments (stripe_invoice_id, account_id, amount_paid, event_id)
             SELECT invoice_id, account_id, amount_paid, event_id FROM input ORDER BY invoice_id
             ON CONFLICT (stripe_invoice_id) DO NOTHING
             RETURNING stripe_invoice_id
         )
         INSERT INTO accounts (id, credits, plan_until)
         -- a $0 invoice extends the plan but grants no credits
         SELECT i.account_id, sum(CASE WHEN i.amount_paid > 0 THEN $2 ELSE 0 END),
                max(i.period_end)
         FROM input i JOIN paid p ON p.stripe_invoice_id = i.invoice_id
         GROUP BY i.account_id
         ORDER BY i.account_id
         ON CONFLICT (id) DO UPDATE SET
             credits = accounts.credits + excluded.credits,
             -- the later end wins, so an old invoice never shortens the plan
             plan_until = CASE
                 WHEN excluded.plan_until > accounts.plan_until OR accounts.plan_until IS NULL
                 THEN excluded.plan_until
                 ELSE accounts.plan_until
             END",
        &[
            &serde_json::Value::Array(rows).to_string(),
            &credits_per_invoice,
        ],
    )?;
    Ok(())
}
