//! The `stripe-billing` handler: the seeds' billing rules for Stripe events, as one handler
//! among others.
//!
//! - `customer.subscription.{created,updated,deleted,paused,resumed}` upsert a snapshot in
//!   `subscriptions`, guarded by `(created, rank)`: an event that arrives late never
//!   overwrites a newer one (rank: created 0 < updated/paused/resumed 1 < deleted 2, so at the
//!   same second a deletion beats an update, which beats a creation). Two updates in the same
//!   second keep the first; the tie is logged and counted.
//! - `invoice.paid` and `invoice.payment_succeeded` both describe one payment: credits are
//!   added (and `plan_until` moved to the later period end) only when `invoice_payments` gains
//!   the invoice's row, so a second event for the same invoice adds nothing.
//! - The account is `metadata.account_id` of the invoice, else of
//!   `parent.subscription_details.metadata`, else the Stripe customer id.
//!
//! The body is decoded in [`Handler::prepare`], on the request path; only the guarded SQL runs
//! in the writer.

use serde::Deserialize;

use crate::config::{ConfigError, HandlerSettings, Refresh};
use crate::event::{check_id, Event, JsonError, ParseError};
use crate::handler::{Handler, Migration, Prepared, Schema, Table};
use crate::sql::Dialect;
use crate::sql::StoreError;
use crate::sql::Tx;
use crate::store::outbox;
use crate::stripe::settings;
use crate::time::unix_now;

/// Credits granted per paid invoice unless configured otherwise.
pub(crate) const DEFAULT_CREDITS_PER_INVOICE: i64 = 100;

/// The config file's table of the handler's settings.
pub(crate) const SETTINGS: &str = "stripe_billing";

/// The handler's settings: `[stripe_billing]` of the config file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct BillingSettings {
    /// Credits granted per paid invoice (a $0 invoice grants none).
    pub(crate) credits_per_invoice: i64,
}

impl Default for BillingSettings {
    fn default() -> Self {
        BillingSettings {
            credits_per_invoice: DEFAULT_CREDITS_PER_INVOICE,
        }
    }
}

impl BillingSettings {
    /// The settings the config holds for the handler; errors name the table.
    pub(crate) fn of(settings: &HandlerSettings) -> Result<BillingSettings, ConfigError> {
        settings.decode(SETTINGS)
    }
}

/// The handler, with the credits it grants per paid invoice.
pub(crate) struct StripeBilling {
    pub(crate) credits_per_invoice: i64,
    /// When to queue a fetch of the current subscription from Stripe's API ([`REFRESH`]);
    /// `None` without an API key.
    pub(crate) refresh: Option<Refresh>,
}

/// The handler's own tables and the migrations that make them (`src/stripe/migrations/`), run
/// when a source names the handler: a database whose sources never do has none of them. A
/// database made before they were the wing's has them from hookledger's first migration as
/// released; the wing's first migration creates each only if it is missing, so those keep
/// theirs, rows and all, and record the migration as applied.
pub(crate) const SCHEMA: Schema = Schema {
    handler: settings::BILLING,
    migrations: &[Migration {
        name: "0001_billing",
        sqlite: include_str!("migrations/sqlite/0001_billing.sql"),
        postgres: include_str!("migrations/postgres/0001_billing.sql"),
    }],
    tables: &[
        Table {
            name: "subscriptions",
            columns: &[
                "id",
                "customer_id",
                "account_id",
                "status",
                "provider_updated_at",
                "event_rank",
                "event_id",
            ],
            key: &["id"],
        },
        Table {
            name: "invoice_payments",
            columns: &["stripe_invoice_id", "account_id", "amount_paid", "event_id"],
            key: &["stripe_invoice_id"],
        },
        Table {
            name: "accounts",
            columns: &["id", "credits", "plan_until"],
            key: &["id"],
        },
    ],
};

/// The outbox kind of a fetch of the current subscription from Stripe's API, after commit;
/// its payload is [`RefreshJob`].
pub(crate) const REFRESH: &str = "stripe_refresh";

/// What a [`REFRESH`] row asks for: subscription `subscription`, whose events tied at second
/// `at` (Stripe's clock).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct RefreshJob {
    pub(crate) subscription: String,
    pub(crate) at: i64,
}

/// The rank of a snapshot fetched from the API, stored at the last second before the fetch
/// began: above every event of that second (the fetch saw all of them), below every event of
/// a later second.
const FETCHED_RANK: i64 = 3;

impl Handler for StripeBilling {
    fn name(&self) -> &str {
        "stripe-billing"
    }

    fn prepare(&self, event: &Event) -> Result<Prepared, ParseError> {
        Ok(match decode(&event.kind, &event.body)? {
            Some(change) => Prepared::new(change),
            None => Prepared::none(),
        })
    }

    fn handle(&self, tx: &Tx<'_>, event: &Event, prepared: Prepared) -> Result<(), StoreError> {
        let Some(change) = prepared.take::<Change>() else {
            return Ok(());
        };
        // Stripe events always carry `created`; the stripe scheme refuses a body without it.
        let created = event.created.unwrap_or_default();
        let applied = apply(tx, &event.id, created, &change, self.credits_per_invoice)?;
        log::debug!("stripe-billing {} {}: {applied:?}", event.id, event.kind);
        if let Change::Subscription(s) = &change {
            self.maybe_refresh(tx, event, s, applied)?;
        }
        Ok(())
    }

    /// On PostgreSQL, a batch in three or four statements ([`batch`]); elsewhere one by one.
    /// With refreshes on, subscription events go one by one on PostgreSQL too: whether one
    /// ties is known only then.
    fn handle_all(&self, tx: &Tx<'_>, events: Vec<(&Event, Prepared)>) -> Result<(), StoreError> {
        if tx.dialect() != Dialect::Postgres {
            return events
                .into_iter()
                .try_for_each(|(event, prepared)| self.handle(tx, event, prepared));
        }
        let mut changes: Vec<(&Event, Change)> = events
            .into_iter()
            .filter_map(|(event, prepared)| Some((event, prepared.take::<Change>()?)))
            .collect();
        if self.refresh.is_some() {
            let (subscriptions, invoices) = changes
                .into_iter()
                .partition(|(_, c)| matches!(c, Change::Subscription(_)));
            for (event, change) in subscriptions {
                self.handle(tx, event, Prepared::new(change))?;
            }
            changes = invoices;
        }
        batch::apply(tx, &changes, self.credits_per_invoice)
    }
}

impl StripeBilling {
    /// Queues a fetch of subscription `s` after commit when its event tied with the stored
    /// one (the first would stay, though which is current is unknown), or after every
    /// subscription event with `refresh = "always"`.
    fn maybe_refresh(
        &self,
        tx: &Tx<'_>,
        event: &Event,
        s: &SubscriptionChange,
        applied: Applied,
    ) -> Result<(), StoreError> {
        let wanted = match self.refresh {
            Some(Refresh::Always) => true,
            Some(Refresh::Ties) => applied == Applied::Tie,
            Some(Refresh::Off) | None => false,
        };
        if !wanted {
            return Ok(());
        }
        let job = RefreshJob {
            subscription: s.id.clone(),
            at: event.created.unwrap_or_default(),
        };
        let payload = serde_json::to_vec(&job).map_err(|e| StoreError::Database(e.to_string()))?;
        let now = unix_now();
        // Not before the tie's second is over: the fetch must see all of it.
        let due = now.max(job.at) + 1;
        outbox::enqueue(tx.session(), REFRESH, event, &payload, due, now)?;
        log::info!(
            "stripe-billing {} {}: {applied:?}; the current subscription {} will be fetched",
            event.id,
            event.kind,
            s.id
        );
        Ok(())
    }
}

/// Subscription `json` as Stripe's API returns it, as a snapshot to store.
/// Only `status` is needed: the row exists (a subscription event made it), and a customer or
/// account the answer leaves out stays as stored (`customer_id` empty).
pub(crate) fn decode_subscription(id: &str, json: &[u8]) -> Result<SubscriptionChange, ParseError> {
    #[derive(Deserialize)]
    struct Fetched {
        status: String,
        customer: Option<IdRef>,
        metadata: Option<Metadata>,
    }
    let object: Fetched = serde_json::from_slice(json).map_err(|e| ParseError::Object {
        kind: "subscription".into(),
        detail: e.into(),
    })?;
    Ok(SubscriptionChange {
        id: id.to_string(),
        customer_id: object.customer.map(IdRef::into_id).unwrap_or_default(),
        account_id: non_empty_account(object.metadata),
        status: object.status,
        rank: FETCHED_RANK,
    })
}

/// What an event changes, decided by its type and decoded on the request path. Other types
/// change nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A `customer.subscription.*` snapshot, guarded by `(created, rank)`.
    Subscription(SubscriptionChange),
    /// `invoice.paid` / `invoice.payment_succeeded`, guarded by the invoice id.
    InvoicePaid(InvoicePayment),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionChange {
    pub id: String,
    pub customer_id: String,
    pub account_id: Option<String>,
    pub status: String,
    /// Orders events with the same `created` second: created 0 < updated 1 < deleted 2.
    pub rank: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvoicePayment {
    pub invoice_id: String,
    pub account_id: String,
    pub amount_paid: i64,
    /// The end of the period the payment covers: the latest line period end, else the
    /// invoice's `period_end`.
    pub period_end: Option<i64>,
}

/// Only `data.object` of the body is read; the envelope is the scheme's.
#[derive(Deserialize)]
struct Body<T> {
    data: Option<Data<T>>,
}

#[derive(Deserialize)]
struct Data<T> {
    object: T,
}

#[derive(Deserialize)]
struct Metadata {
    account_id: Option<String>,
}

/// Stripe sends ids for related objects; an expanded object (`{"id": …}`) is accepted too.
#[derive(Deserialize)]
#[serde(untagged)]
enum IdRef {
    Id(String),
    Object { id: String },
}

impl IdRef {
    fn into_id(self) -> String {
        match self {
            IdRef::Id(id) | IdRef::Object { id } => id,
        }
    }
}

#[derive(Deserialize)]
struct SubscriptionObject {
    id: String,
    customer: IdRef,
    status: String,
    metadata: Option<Metadata>,
}

#[derive(Deserialize)]
struct InvoiceObject {
    id: String,
    customer: Option<IdRef>,
    amount_paid: i64,
    period_end: Option<i64>,
    metadata: Option<Metadata>,
    parent: Option<InvoiceParent>,
    lines: Option<List<InvoiceLine>>,
}

#[derive(Deserialize)]
struct InvoiceParent {
    subscription_details: Option<SubscriptionDetails>,
}

#[derive(Deserialize)]
struct SubscriptionDetails {
    metadata: Option<Metadata>,
}

#[derive(Deserialize)]
struct List<T> {
    data: Vec<T>,
}

#[derive(Deserialize)]
struct InvoiceLine {
    period: Option<Period>,
}

#[derive(Deserialize)]
struct Period {
    end: Option<i64>,
}

/// The rank of a subscription event type, or `None` if the type is not one.
fn subscription_rank(kind: &str) -> Option<i64> {
    match kind {
        "customer.subscription.created" => Some(0),
        "customer.subscription.updated"
        | "customer.subscription.paused"
        | "customer.subscription.resumed" => Some(1),
        "customer.subscription.deleted" => Some(2),
        _ => None,
    }
}

fn is_invoice_payment(kind: &str) -> bool {
    matches!(kind, "invoice.paid" | "invoice.payment_succeeded")
}

fn non_empty_account(metadata: Option<Metadata>) -> Option<String> {
    metadata
        .and_then(|m| m.account_id)
        .filter(|id| !id.is_empty())
}

/// Decodes what event `kind` changes from its verified `body`; `None` for types that change
/// nothing.
pub fn decode(kind: &str, body: &[u8]) -> Result<Option<Change>, ParseError> {
    let object_error = |detail: JsonError| ParseError::Object {
        kind: kind.to_string(),
        detail,
    };
    fn object<T: serde::de::DeserializeOwned>(
        body: &[u8],
        error: impl Fn(JsonError) -> ParseError,
    ) -> Result<T, ParseError> {
        let Body::<T> { data } = serde_json::from_slice(body).map_err(|e| error(e.into()))?;
        data.map(|d| d.object)
            .ok_or_else(|| error(JsonError::other("missing field `data`")))
    }
    let change = if let Some(rank) = subscription_rank(kind) {
        let object: SubscriptionObject = object(body, object_error)?;
        check_id("data.object.id", &object.id)?;
        Change::Subscription(SubscriptionChange {
            id: object.id,
            customer_id: object.customer.into_id(),
            account_id: non_empty_account(object.metadata),
            status: object.status,
            rank,
        })
    } else if is_invoice_payment(kind) {
        let object: InvoiceObject = object(body, object_error)?;
        check_id("data.object.id", &object.id)?;
        if object.amount_paid < 0 {
            return Err(object_error(JsonError::other("`amount_paid` is negative")));
        }
        let period_end = object
            .lines
            .and_then(|lines| lines.data.into_iter().filter_map(|l| l.period?.end).max())
            .or(object.period_end);
        let account_id = non_empty_account(object.metadata)
            .or_else(|| non_empty_account(object.parent?.subscription_details?.metadata))
            .or_else(|| {
                object
                    .customer
                    .map(IdRef::into_id)
                    .filter(|id| !id.is_empty())
            })
            .ok_or_else(|| {
                object_error(JsonError::other(
                    "no metadata.account_id and no customer to credit",
                ))
            })?;
        Change::InvoicePaid(InvoicePayment {
            invoice_id: object.id,
            account_id,
            amount_paid: object.amount_paid,
            period_end,
        })
    } else {
        return Ok(None);
    };
    Ok(Some(change))
}

/// What applying a change did, for the log line and counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Applied {
    /// State changed.
    Changed,
    /// The guard kept newer state; nothing changed.
    Stale,
    /// The invoice was already counted (by another event for it); nothing changed.
    AlreadyCounted,
    /// A subscription event with the same `(created, rank)` as the stored one: the first wins.
    Tie,
}

/// The guarded upsert of a subscription snapshot, after its `INSERT … VALUES`/`SELECT`: the
/// same on one event and on a batch (`batch.rs`).
macro_rules! subscription_guard {
    () => {
        "ON CONFLICT (id) DO UPDATE SET
             customer_id = excluded.customer_id,
             account_id = excluded.account_id,
             status = excluded.status,
             provider_updated_at = excluded.provider_updated_at,
             event_rank = excluded.event_rank,
             event_id = excluded.event_id
         -- only a strictly newer (created, rank) wins: late and equal events change nothing
         WHERE (excluded.provider_updated_at, excluded.event_rank)
             > (subscriptions.provider_updated_at, subscriptions.event_rank)"
    };
}

/// Adding a paid invoice's credits and plan end to its account, after its `INSERT INTO
/// accounts (id, credits, plan_until) …`: the same on one event and on a batch.
macro_rules! account_credit {
    () => {
        "ON CONFLICT (id) DO UPDATE SET
             credits = accounts.credits + excluded.credits,
             -- the later end wins, so an old invoice never shortens the plan (a CASE, as
             -- SQLite's max() and PostgreSQL's greatest() differ)
             plan_until = CASE
                 WHEN excluded.plan_until > accounts.plan_until OR accounts.plan_until IS NULL
                 THEN excluded.plan_until
                 ELSE accounts.plan_until
             END"
    };
}

/// Applies `change` of event `event_id` (created at `created`) inside the caller's transaction.
/// The SQL is the same on SQLite and PostgreSQL.
pub(crate) fn apply(
    tx: &Tx<'_>,
    event_id: &str,
    created: i64,
    change: &Change,
    credits_per_invoice: i64,
) -> Result<Applied, StoreError> {
    match change {
        Change::Subscription(s) => upsert_subscription(tx, event_id, created, s),
        Change::InvoicePaid(payment) => record_payment(tx, event_id, payment, credits_per_invoice),
    }
}

fn upsert_subscription(
    tx: &Tx<'_>,
    event_id: &str,
    created: i64,
    s: &SubscriptionChange,
) -> Result<Applied, StoreError> {
    let changed = tx.execute(
        concat!(
            "INSERT INTO subscriptions
                 (id, customer_id, account_id, status, provider_updated_at, event_rank, event_id)
             VALUES ($1, $2, $3, $4, $5, $6, $7) ",
            subscription_guard!()
        ),
        &[
            &s.id,
            &s.customer_id,
            &s.account_id,
            &s.status,
            &created,
            &s.rank,
            &event_id,
        ],
    )?;
    if changed == 1 {
        return Ok(Applied::Changed);
    }
    let stored = tx.query_opt(
        "SELECT provider_updated_at, event_rank FROM subscriptions WHERE id = $1",
        &[&s.id],
    )?;
    if let Some(row) = stored {
        if (row.get::<i64>(0)?, row.get::<i64>(1)?) == (created, s.rank) {
            bump_counter(tx, "subscription_ties")?;
            return Ok(Applied::Tie);
        }
    }
    Ok(Applied::Stale)
}

/// Stores `snapshot`, fetched from the API for a tie at second `at` by a request that began
/// at second `started`, as the state at the end of the second before `started` (or of `at`,
/// should Stripe's clock be ahead of ours): it wins over every event up to that second and
/// over an earlier snapshot of it, and loses to any later event. Whether it changed the row.
pub(crate) fn store_fetched(
    tx: &Tx<'_>,
    snapshot: &SubscriptionChange,
    at: i64,
    started: i64,
) -> Result<bool, StoreError> {
    let second = (started - 1).max(at);
    // An update: the subscription event that queued the fetch stored the row. A later fetch
    // for the same second replaces an earlier one: >=, not >.
    let changed = tx.execute(
        "UPDATE subscriptions SET
             customer_id = COALESCE(NULLIF($2, ''), customer_id),
             account_id = COALESCE($3, account_id),
             status = $4,
             provider_updated_at = $5,
             event_rank = $6,
             event_id = $7
         WHERE id = $1 AND ($5, $6) >= (provider_updated_at, event_rank)",
        &[
            &snapshot.id,
            &snapshot.customer_id,
            &snapshot.account_id,
            &snapshot.status,
            &second,
            &snapshot.rank,
            &format!("api:{second}"),
        ],
    )?;
    Ok(changed == 1)
}

fn record_payment(
    tx: &Tx<'_>,
    event_id: &str,
    p: &InvoicePayment,
    credits_per_invoice: i64,
) -> Result<Applied, StoreError> {
    // The second guard: whichever event reports this invoice first inserts the row.
    let inserted = tx.execute(
        "INSERT INTO invoice_payments (stripe_invoice_id, account_id, amount_paid, event_id)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (stripe_invoice_id) DO NOTHING",
        &[&p.invoice_id, &p.account_id, &p.amount_paid, &event_id],
    )?;
    if inserted == 0 {
        return Ok(Applied::AlreadyCounted);
    }
    // A $0 invoice (a trial, a 100 % coupon) is paid too: it extends the plan, but nothing was
    // bought, so it grants no credits.
    let credits = if p.amount_paid > 0 {
        credits_per_invoice
    } else {
        0
    };
    tx.execute(
        concat!(
            "INSERT INTO accounts (id, credits, plan_until) VALUES ($1, $2, $3) ",
            account_credit!()
        ),
        &[&p.account_id, &credits, &p.period_end],
    )?;
    Ok(Applied::Changed)
}

fn bump_counter(tx: &Tx<'_>, name: &str) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO counters (name, value) VALUES ($1, 1)
         ON CONFLICT (name) DO UPDATE SET value = counters.value + 1",
        &[&name],
    )?;
    Ok(())
}

mod batch;
#[cfg(test)]
mod props;

#[cfg(test)]
mod decode_tests {
    use super::*;

    /// What the handler decodes from a body; the type is read from the body as the stripe
    /// scheme would.
    fn parse(json: &str) -> Result<Option<Change>, ParseError> {
        let kind = serde_json::from_str::<serde_json::Value>(json).unwrap()["type"]
            .as_str()
            .unwrap()
            .to_string();
        decode(&kind, json.as_bytes())
    }

    #[test]
    fn unknown_type_needs_no_data() {
        let e = parse(r#"{"id":"evt_1","type":"thing.happened","created":7,"data":{"object":42}}"#);
        assert_eq!(e, Ok(None));
    }

    #[test]
    fn subscription_event_reads_snapshot() {
        let e = parse(r#"{"id":"evt_1","type":"customer.subscription.deleted","created":7,
            "data":{"object":{"id":"sub_1","customer":"cus_1","status":"canceled","metadata":{}}}}"#)
        .unwrap();
        assert_eq!(
            e,
            Some(Change::Subscription(SubscriptionChange {
                id: "sub_1".into(),
                customer_id: "cus_1".into(),
                account_id: None,
                status: "canceled".into(),
                rank: 2
            }))
        );
    }

    #[test]
    fn invoice_account_falls_back_to_parent_then_customer() {
        let with_parent = r#"{"id":"evt_1","type":"invoice.paid","created":7,"data":{"object":{
            "id":"in_1","customer":"cus_1","amount_paid":2000,"period_end":5,"metadata":{},
            "parent":{"subscription_details":{"metadata":{"account_id":"acct_9"}}},
            "lines":{"data":[{"period":{"end":100}},{"period":{"end":90}}]}}}}"#;
        let Some(Change::InvoicePaid(p)) = parse(with_parent).unwrap() else {
            panic!("not an invoice payment")
        };
        assert_eq!((p.account_id.as_str(), p.period_end), ("acct_9", Some(100)));

        let bare = r#"{"id":"evt_1","type":"invoice.payment_succeeded","created":7,"data":{"object":{
            "id":"in_1","customer":"cus_1","amount_paid":2000,"period_end":5}}}"#;
        let Some(Change::InvoicePaid(p)) = parse(bare).unwrap() else {
            panic!("not an invoice payment")
        };
        assert_eq!((p.account_id.as_str(), p.period_end), ("cus_1", Some(5)));
    }

    #[test]
    fn invoice_with_empty_customer_and_no_account_is_rejected() {
        let e = parse(
            r#"{"id":"evt_1","type":"invoice.paid","created":7,"data":{"object":{
            "id":"in_1","customer":"","amount_paid":1}}}"#,
        );
        assert!(matches!(e, Err(ParseError::Object { .. })), "{e:?}");
    }

    #[test]
    fn known_type_with_wrong_object_is_rejected() {
        let e = parse(
            r#"{"id":"evt_1","type":"invoice.paid","created":7,"data":{"object":{"id":"in_1"}}}"#,
        );
        assert!(matches!(e, Err(ParseError::Object { .. })));
        let e = parse(r#"{"id":"evt_1","type":"customer.subscription.updated","created":7}"#);
        assert!(matches!(e, Err(ParseError::Object { .. })));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::store::sqlite::SqliteStore;
    use crate::store::Store;

    /// A database with the handler's tables.
    fn db() -> SqliteStore {
        let mut store = SqliteStore::open_in_memory().unwrap();
        store.migrate_handler(&SCHEMA).unwrap();
        store
    }

    /// The handler's migrations as this source has them. Once released, a database that ran
    /// one records its SHA-256, and a start on different text is refused (`app_schema.rs`):
    /// never edit one, add the next (and its line here).
    #[test]
    fn the_handlers_migrations_are_the_ones_released() {
        use sha2::{Digest, Sha256};
        let hashes: Vec<(&str, String, String)> = SCHEMA
            .migrations
            .iter()
            .map(|m| {
                (
                    m.name,
                    hex::encode(Sha256::digest(m.sqlite)),
                    hex::encode(Sha256::digest(m.postgres)),
                )
            })
            .collect();
        assert_eq!(
            hashes,
            [(
                "0001_billing",
                "999060df1fcd6e2fd035ea614bd87468912d8cf310db3655bce826c845cfe71c".to_string(),
                "81283ca4a9e06b62a1b48252740eb3c185febb905a47d556fdac474a3ce5aee8".to_string()
            )]
        );
    }

    fn sub(status: &str, rank: i64) -> Change {
        Change::Subscription(SubscriptionChange {
            id: "sub_1".into(),
            customer_id: "cus_1".into(),
            account_id: Some("acct_1".into()),
            status: status.into(),
            rank,
        })
    }

    fn status(store: &SqliteStore) -> (String, String) {
        store
            .connection()
            .query_row("SELECT status, event_id FROM subscriptions", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap()
    }

    #[test]
    fn older_subscription_event_is_stale() {
        let c = db();
        assert_eq!(
            apply(&c.tx(), "e2", 110, &sub("canceled", 1), 100),
            Ok(Applied::Changed)
        );
        assert_eq!(
            apply(&c.tx(), "e1", 100, &sub("active", 0), 100),
            Ok(Applied::Stale)
        );
        assert_eq!(status(&c), ("canceled".into(), "e2".into()));
    }

    #[test]
    fn same_second_rank_decides_and_ties_keep_first() {
        let c = db();
        assert_eq!(
            apply(&c.tx(), "del", 100, &sub("canceled", 2), 100),
            Ok(Applied::Changed)
        );
        assert_eq!(
            apply(&c.tx(), "upd", 100, &sub("active", 1), 100),
            Ok(Applied::Stale)
        );
        assert_eq!(status(&c), ("canceled".into(), "del".into()));

        let c = db();
        assert_eq!(
            apply(&c.tx(), "u1", 100, &sub("past_due", 1), 100),
            Ok(Applied::Changed)
        );
        assert_eq!(
            apply(&c.tx(), "u2", 100, &sub("active", 1), 100),
            Ok(Applied::Tie)
        );
        assert_eq!(status(&c), ("past_due".into(), "u1".into()));
        let ties: i64 = c
            .connection()
            .query_row(
                "SELECT value FROM counters WHERE name = 'subscription_ties'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(ties, 1);
    }

    /// A fetched snapshot stands for the end of the second before its fetch began (never
    /// earlier than the tie): it beats that second's events and an earlier fetch of it, and
    /// loses to any later event.
    #[test]
    fn a_fetched_snapshot_beats_its_seconds_events_and_loses_to_later_ones() {
        let c = db();
        apply(&c.tx(), "u1", 100, &sub("active", 1), 100).unwrap();
        let fetched = decode_subscription(
            "sub_1",
            br#"{"id":"sub_1","object":"subscription","customer":{"id":"cus_1"},
                 "status":"canceled","metadata":{"account_id":"acct_1"}}"#,
        )
        .unwrap();
        assert_eq!(fetched.rank, FETCHED_RANK);
        // Begun at 105: the state at the end of 104.
        assert_eq!(store_fetched(&c.tx(), &fetched, 100, 105), Ok(true));
        assert_eq!(status(&c), ("canceled".into(), "api:104".into()));
        assert_eq!(
            apply(&c.tx(), "u2", 104, &sub("past_due", 2), 100),
            Ok(Applied::Stale)
        );
        // A second fetch for the same second replaces the first.
        let again = SubscriptionChange {
            status: "unpaid".into(),
            ..fetched.clone()
        };
        assert_eq!(store_fetched(&c.tx(), &again, 100, 105), Ok(true));
        assert_eq!(status(&c).0, "unpaid");
        // Begun in the tie's own second (our clock behind Stripe's): stored at the tie.
        assert_eq!(store_fetched(&c.tx(), &fetched, 200, 150), Ok(true));
        assert_eq!(status(&c), ("canceled".into(), "api:200".into()));
        assert_eq!(store_fetched(&c.tx(), &again, 100, 105), Ok(false));
        assert_eq!(
            apply(&c.tx(), "u3", 201, &sub("active", 1), 100),
            Ok(Applied::Changed)
        );
        assert_eq!(status(&c), ("active".into(), "u3".into()));
        // A terse answer (a status only) keeps the stored customer and account.
        let terse = decode_subscription("sub_1", br#"{"status":"past_due"}"#).unwrap();
        assert_eq!(store_fetched(&c.tx(), &terse, 300, 302), Ok(true));
        let row: (String, String, Option<String>) = c
            .connection()
            .query_row(
                "SELECT status, customer_id, account_id FROM subscriptions",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        assert_eq!(
            row,
            ("past_due".into(), "cus_1".into(), Some("acct_1".into()))
        );
        assert!(decode_subscription("sub_1", br#"{"id":"sub_1"}"#).is_err());
        // No row, nothing to refresh.
        let other = SubscriptionChange {
            id: "sub_none".into(),
            ..terse
        };
        assert_eq!(store_fetched(&c.tx(), &other, 300, 400), Ok(false));
    }

    #[test]
    fn invoice_credits_once_and_plan_until_only_grows() {
        let c = db();
        let pay = |id: &str, end: Option<i64>| {
            Change::InvoicePaid(InvoicePayment {
                invoice_id: id.into(),
                account_id: "acct_1".into(),
                amount_paid: 2000,
                period_end: end,
            })
        };
        assert_eq!(
            apply(&c.tx(), "e1", 1, &pay("in_1", Some(500)), 100),
            Ok(Applied::Changed)
        );
        assert_eq!(
            apply(&c.tx(), "e2", 1, &pay("in_1", Some(900)), 100),
            Ok(Applied::AlreadyCounted)
        );
        assert_eq!(
            apply(&c.tx(), "e3", 1, &pay("in_2", Some(300)), 100),
            Ok(Applied::Changed)
        );
        assert_eq!(
            apply(&c.tx(), "e4", 1, &pay("in_3", None), 100),
            Ok(Applied::Changed)
        );
        let (credits, until): (i64, Option<i64>) = c
            .connection()
            .query_row("SELECT credits, plan_until FROM accounts", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap();
        assert_eq!((credits, until), (300, Some(500)));
    }
}
