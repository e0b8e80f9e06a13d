//! Verified bytes → a typed event. Only the fields hookledger acts on are read; unknown fields
//! and unknown event types are accepted (Stripe adds both without notice).
//!
//! The envelope (`id`, `type`, `created`) is required of every event. `data.object` is only
//! parsed for the types that change state, so an unknown type with an unusual shape is still
//! recorded and acknowledged.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

/// Longer ids than this are not Stripe ids; the bound keeps the ledger key small.
const MAX_ID_LEN: usize = 255;

/// Why a verified body is not an event hookledger can record. The `Display` text goes to the
/// sender (it may quote their body back to them); [`ParseError::summary`] goes to the log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("body is not a Stripe event ({0}); it must be JSON with a string `id`, a string `type` and an integer `created`")]
    Envelope(JsonError),
    #[error("`{0}` must be a non-empty string of at most 255 bytes")]
    BadId(&'static str),
    #[error("{kind} event has an unexpected `data.object` ({detail})")]
    Object { kind: String, detail: JsonError },
}

/// A JSON error: serde's message (which can quote the input) and where it happened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct JsonError {
    message: String,
    line: usize,
    column: usize,
}

impl From<serde_json::Error> for JsonError {
    fn from(e: serde_json::Error) -> Self {
        JsonError {
            message: e.to_string(),
            line: e.line(),
            column: e.column(),
        }
    }
}

impl JsonError {
    fn other(message: &str) -> Self {
        JsonError {
            message: message.to_string(),
            line: 0,
            column: 0,
        }
    }
}

impl ParseError {
    /// A description that quotes nothing from the body, for the log.
    pub fn summary(&self) -> String {
        match self {
            ParseError::Envelope(e) => format!(
                "body is not a Stripe event (JSON error at line {} column {})",
                e.line, e.column
            ),
            ParseError::BadId(field) => format!("`{field}` is empty or too long"),
            ParseError::Object { kind, detail } => format!(
                "{kind} event has an unexpected data.object (at line {} column {})",
                detail.line, detail.column
            ),
        }
    }
}

/// What an event does to the app's state, decided by its type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// A `customer.subscription.*` snapshot, guarded by `(created, rank)`.
    Subscription(SubscriptionChange),
    /// `invoice.paid` / `invoice.payment_succeeded`, guarded by the invoice id.
    InvoicePaid(InvoicePayment),
    /// Recorded in the ledger (and forwarded), no state change.
    None,
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

/// A parsed, verified event. `body` is the exact verified bytes, stored as the payload.
#[derive(Debug, Clone)]
pub struct Event {
    pub source: &'static str,
    pub id: String,
    pub kind: String,
    pub created: i64,
    pub effect: Effect,
    pub body: bytes::Bytes,
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    created: i64,
    #[serde(borrow)]
    data: Option<&'a RawValue>,
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

/// Parses a verified Stripe event body.
pub fn parse_stripe(body: bytes::Bytes) -> Result<Event, ParseError> {
    let envelope: Envelope =
        serde_json::from_slice(&body).map_err(|e| ParseError::Envelope(e.into()))?;
    for (name, value) in [("id", &envelope.id), ("type", &envelope.kind)] {
        if value.is_empty() || value.len() > MAX_ID_LEN {
            return Err(ParseError::BadId(name));
        }
    }
    let kind = envelope.kind.as_ref();
    let object_error = |detail: JsonError| ParseError::Object {
        kind: kind.to_string(),
        detail,
    };
    let data = || {
        envelope
            .data
            .ok_or_else(|| object_error(JsonError::other("missing field `data`")))
    };
    let effect = if let Some(rank) = subscription_rank(kind) {
        let Data::<SubscriptionObject> { object } =
            serde_json::from_str(data()?.get()).map_err(|e| object_error(e.into()))?;
        Effect::Subscription(SubscriptionChange {
            id: object.id,
            customer_id: object.customer.into_id(),
            account_id: non_empty_account(object.metadata),
            status: object.status,
            rank,
        })
    } else if is_invoice_payment(kind) {
        let Data::<InvoiceObject> { object } =
            serde_json::from_str(data()?.get()).map_err(|e| object_error(e.into()))?;
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
        Effect::InvoicePaid(InvoicePayment {
            invoice_id: object.id,
            account_id,
            amount_paid: object.amount_paid,
            period_end,
        })
    } else {
        Effect::None
    };
    Ok(Event {
        source: "stripe",
        id: envelope.id.into_owned(),
        kind: envelope.kind.into_owned(),
        created: envelope.created,
        effect,
        body: body.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Event, ParseError> {
        parse_stripe(bytes::Bytes::copy_from_slice(json.as_bytes()))
    }

    #[test]
    fn envelope_requires_id_type_created() {
        for bad in [
            "not json",
            "[]",
            r#"{"type":"x","created":1}"#,
            r#"{"id":1,"type":"x","created":1}"#,
            r#"{"id":"evt_1","created":1}"#,
            r#"{"id":"evt_1","type":"x"}"#,
            r#"{"id":"evt_1","type":"x","created":"1"}"#,
            r#"{"id":"evt_1","type":"x","created":1.5}"#,
        ] {
            assert!(matches!(parse(bad), Err(ParseError::Envelope(_))), "{bad}");
        }
        assert_eq!(
            parse(r#"{"id":"","type":"x","created":1}"#).unwrap_err(),
            ParseError::BadId("id")
        );
    }

    #[test]
    fn unknown_type_needs_no_data() {
        let e = parse(r#"{"id":"evt_1","type":"thing.happened","created":7,"data":{"object":42}}"#)
            .unwrap();
        assert_eq!(
            (e.id.as_str(), e.created, e.effect),
            ("evt_1", 7, Effect::None)
        );
    }

    #[test]
    fn subscription_event_reads_snapshot() {
        let e = parse(r#"{"id":"evt_1","type":"customer.subscription.deleted","created":7,
            "data":{"object":{"id":"sub_1","customer":"cus_1","status":"canceled","metadata":{}}}}"#)
        .unwrap();
        assert_eq!(
            e.effect,
            Effect::Subscription(SubscriptionChange {
                id: "sub_1".into(),
                customer_id: "cus_1".into(),
                account_id: None,
                status: "canceled".into(),
                rank: 2
            })
        );
    }

    #[test]
    fn invoice_account_falls_back_to_parent_then_customer() {
        let with_parent = r#"{"id":"evt_1","type":"invoice.paid","created":7,"data":{"object":{
            "id":"in_1","customer":"cus_1","amount_paid":2000,"period_end":5,"metadata":{},
            "parent":{"subscription_details":{"metadata":{"account_id":"acct_9"}}},
            "lines":{"data":[{"period":{"end":100}},{"period":{"end":90}}]}}}}"#;
        let Effect::InvoicePaid(p) = parse(with_parent).unwrap().effect else {
            panic!("not an invoice payment")
        };
        assert_eq!((p.account_id.as_str(), p.period_end), ("acct_9", Some(100)));

        let bare = r#"{"id":"evt_1","type":"invoice.payment_succeeded","created":7,"data":{"object":{
            "id":"in_1","customer":"cus_1","amount_paid":2000,"period_end":5}}}"#;
        let Effect::InvoicePaid(p) = parse(bare).unwrap().effect else {
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
