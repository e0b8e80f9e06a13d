//! Guarded writes of the app's business state. Every function takes the writer's open
//! transaction (or savepoint) and never commits.
//!
//! Two guards, both in SQL:
//! - snapshot state (subscriptions) keeps the row with the greatest `(created, rank)`, so an
//!   event that arrives late never overwrites a newer one;
//! - additive effects (credits) run only when `invoice_payments` gains a row, so a second event
//!   for the same invoice (`invoice.paid` and `invoice.payment_succeeded`, or a resend under a
//!   new id) adds nothing.

use rusqlite::{params, Connection, OptionalExtension};

use crate::event::{Effect, InvoicePayment, SubscriptionChange};

/// What applying an effect did, for the log line and counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// State changed.
    Changed,
    /// The guard kept newer (or already counted) state; nothing changed.
    Stale,
    /// A subscription event with the same `(created, rank)` as the stored one: the first wins.
    Tie,
    /// The event type changes no state.
    Nothing,
}

/// Applies `effect` of event `event_id` (created at `created`) inside the caller's transaction.
pub fn apply(
    tx: &Connection,
    event_id: &str,
    created: i64,
    effect: &Effect,
    credits_per_invoice: i64,
) -> rusqlite::Result<Applied> {
    match effect {
        Effect::Subscription(change) => upsert_subscription(tx, event_id, created, change),
        Effect::InvoicePaid(payment) => record_payment(tx, event_id, payment, credits_per_invoice),
        Effect::None => Ok(Applied::Nothing),
    }
}

fn upsert_subscription(
    tx: &Connection,
    event_id: &str,
    created: i64,
    s: &SubscriptionChange,
) -> rusqlite::Result<Applied> {
    let changed = tx
        .prepare_cached(
            "INSERT INTO subscriptions
                 (id, customer_id, account_id, status, provider_updated_at, event_rank, event_id)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
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
        )?
        .execute(params![
            s.id,
            s.customer_id,
            s.account_id,
            s.status,
            created,
            s.rank,
            event_id
        ])?;
    if changed == 1 {
        return Ok(Applied::Changed);
    }
    let stored: Option<(i64, i64)> = tx
        .prepare_cached("SELECT provider_updated_at, event_rank FROM subscriptions WHERE id = ?1")?
        .query_row([&s.id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    if stored == Some((created, s.rank)) {
        bump_counter(tx, "subscription_ties")?;
        return Ok(Applied::Tie);
    }
    Ok(Applied::Stale)
}

fn record_payment(
    tx: &Connection,
    event_id: &str,
    p: &InvoicePayment,
    credits_per_invoice: i64,
) -> rusqlite::Result<Applied> {
    // The second guard: whichever event reports this invoice first inserts the row.
    let inserted = tx
        .prepare_cached(
            "INSERT OR IGNORE INTO invoice_payments
                 (stripe_invoice_id, account_id, amount_paid, event_id)
             VALUES (?1, ?2, ?3, ?4)",
        )?
        .execute(params![p.invoice_id, p.account_id, p.amount_paid, event_id])?;
    if inserted == 0 {
        return Ok(Applied::Stale);
    }
    tx.prepare_cached(
        "INSERT INTO accounts (id, credits, plan_until) VALUES (?1, ?2, ?3)
         ON CONFLICT (id) DO UPDATE SET
             credits = credits + excluded.credits,
             -- max() keeps the later end, so an old invoice never shortens the plan
             plan_until = max(coalesce(plan_until, excluded.plan_until),
                              coalesce(excluded.plan_until, plan_until))",
    )?
    .execute(params![p.account_id, credits_per_invoice, p.period_end])?;
    Ok(Applied::Changed)
}

fn bump_counter(tx: &Connection, name: &str) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT INTO counters (name, value) VALUES (?1, 1)
         ON CONFLICT (name) DO UPDATE SET value = value + 1",
    )?
    .execute([name])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db() -> Connection {
        let mut conn = Connection::open_in_memory().unwrap();
        crate::store::sqlite::migrate(&mut conn).unwrap();
        conn
    }

    fn sub(status: &str, rank: i64) -> Effect {
        Effect::Subscription(SubscriptionChange {
            id: "sub_1".into(),
            customer_id: "cus_1".into(),
            account_id: Some("acct_1".into()),
            status: status.into(),
            rank,
        })
    }

    fn status(conn: &Connection) -> (String, String) {
        conn.query_row("SELECT status, event_id FROM subscriptions", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap()
    }

    #[test]
    fn older_subscription_event_is_stale() {
        let c = db();
        assert_eq!(
            apply(&c, "e2", 110, &sub("canceled", 1), 100),
            Ok(Applied::Changed)
        );
        assert_eq!(
            apply(&c, "e1", 100, &sub("active", 0), 100),
            Ok(Applied::Stale)
        );
        assert_eq!(status(&c), ("canceled".into(), "e2".into()));
    }

    #[test]
    fn same_second_rank_decides_and_ties_keep_first() {
        let c = db();
        assert_eq!(
            apply(&c, "del", 100, &sub("canceled", 2), 100),
            Ok(Applied::Changed)
        );
        assert_eq!(
            apply(&c, "upd", 100, &sub("active", 1), 100),
            Ok(Applied::Stale)
        );
        assert_eq!(status(&c), ("canceled".into(), "del".into()));

        let c = db();
        assert_eq!(
            apply(&c, "u1", 100, &sub("past_due", 1), 100),
            Ok(Applied::Changed)
        );
        assert_eq!(
            apply(&c, "u2", 100, &sub("active", 1), 100),
            Ok(Applied::Tie)
        );
        assert_eq!(status(&c), ("past_due".into(), "u1".into()));
        let ties: i64 = c
            .query_row(
                "SELECT value FROM counters WHERE name = 'subscription_ties'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(ties, 1);
    }

    #[test]
    fn invoice_credits_once_and_plan_until_only_grows() {
        let c = db();
        let pay = |id: &str, end: Option<i64>| {
            Effect::InvoicePaid(InvoicePayment {
                invoice_id: id.into(),
                account_id: "acct_1".into(),
                amount_paid: 2000,
                period_end: end,
            })
        };
        assert_eq!(
            apply(&c, "e1", 1, &pay("in_1", Some(500)), 100),
            Ok(Applied::Changed)
        );
        assert_eq!(
            apply(&c, "e2", 1, &pay("in_1", Some(900)), 100),
            Ok(Applied::Stale)
        );
        assert_eq!(
            apply(&c, "e3", 1, &pay("in_2", Some(300)), 100),
            Ok(Applied::Changed)
        );
        assert_eq!(
            apply(&c, "e4", 1, &pay("in_3", None), 100),
            Ok(Applied::Changed)
        );
        let (credits, until): (i64, Option<i64>) = c
            .query_row("SELECT credits, plan_until FROM accounts", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap();
        assert_eq!((credits, until), (300, Some(500)));
    }
}
