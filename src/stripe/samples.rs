//! Realistic Stripe event bodies for the demo and the load generator, shaped like the real
//! thing (envelope, `data.object`, metadata, invoice lines) so that parsing and storage cost
//! what they cost in production.

use std::fmt::Write;

/// A `customer.subscription.*` event.
pub fn subscription_event(
    event_id: &str,
    kind: &str,
    created: i64,
    subscription_id: &str,
    customer_id: &str,
    account_id: &str,
    status: &str,
) -> String {
    let object = format!(
        r#"      "id": "{subscription_id}",
      "object": "subscription",
      "billing_cycle_anchor": {created},
      "cancel_at_period_end": false,
      "collection_method": "charge_automatically",
      "created": {created},
      "currency": "usd",
      "customer": "{customer_id}",
      "items": {{
        "object": "list",
        "data": [
          {{
            "id": "si_{subscription_id}",
            "object": "subscription_item",
            "current_period_end": {period_end},
            "current_period_start": {created},
            "price": {{
              "id": "price_1PgafmB7WZ01zgkW6dKueIc5",
              "object": "price",
              "active": true,
              "currency": "usd",
              "product": "prod_QXg1hqf4jFNsqG",
              "recurring": {{ "interval": "month", "interval_count": 1, "usage_type": "licensed" }},
              "type": "recurring",
              "unit_amount": 2000
            }},
            "quantity": 1
          }}
        ],
        "has_more": false
      }},
      "livemode": false,
      "metadata": {{ "account_id": "{account_id}" }},
      "start_date": {created},
      "status": "{status}"
"#,
        period_end = created + 30 * 86_400,
    );
    envelope(event_id, kind, created, &object)
}

/// An `invoice.paid` (or `invoice.payment_succeeded`) event for one invoice.
pub fn invoice_event(
    event_id: &str,
    kind: &str,
    created: i64,
    invoice_id: &str,
    customer_id: &str,
    account_id: &str,
) -> String {
    let period_end = created + 30 * 86_400;
    let mut lines = String::new();
    write!(
        lines,
        r#"{{
            "id": "il_{invoice_id}",
            "object": "line_item",
            "amount": 2000,
            "currency": "usd",
            "description": "1 × Product (at $20.00 / month)",
            "period": {{ "end": {period_end}, "start": {created} }},
            "pricing": {{ "price_details": {{ "price": "price_1PgafmB7WZ01zgkW6dKueIc5", "product": "prod_QXg1hqf4jFNsqG" }}, "type": "price_details", "unit_amount_decimal": "2000" }},
            "quantity": 1
          }}"#
    )
    .expect("writing to a String");
    let object = format!(
        r#"      "id": "{invoice_id}",
      "object": "invoice",
      "account_country": "US",
      "amount_due": 2000,
      "amount_paid": 2000,
      "amount_remaining": 0,
      "attempt_count": 1,
      "attempted": true,
      "billing_reason": "subscription_cycle",
      "collection_method": "charge_automatically",
      "created": {created},
      "currency": "usd",
      "customer": "{customer_id}",
      "customer_email": "jenny.rosen@example.com",
      "lines": {{
        "object": "list",
        "data": [
          {lines}
        ],
        "has_more": false,
        "total_count": 1
      }},
      "livemode": false,
      "metadata": {{ "account_id": "{account_id}" }},
      "parent": {{
        "quote_details": null,
        "subscription_details": {{ "metadata": {{ "account_id": "{account_id}" }}, "subscription": "sub_{customer_id}" }},
        "type": "subscription_details"
      }},
      "period_end": {created},
      "period_start": {created},
      "status": "paid",
      "status_transitions": {{ "finalized_at": {created}, "paid_at": {created} }},
      "subtotal": 2000,
      "total": 2000
"#
    );
    envelope(event_id, kind, created, &object)
}

/// An event's envelope around its `data.object`'s fields (`object`, their lines as written).
fn envelope(event_id: &str, kind: &str, created: i64, object: &str) -> String {
    format!(
        r#"{{
  "id": "{event_id}",
  "object": "event",
  "api_version": "2026-07-29.dahlia",
  "created": {created},
  "data": {{
    "object": {{
{object}    }}
  }},
  "livemode": false,
  "pending_webhooks": 1,
  "request": {{ "id": null, "idempotency_key": null }},
  "type": "{kind}"
}}
"#
    )
}
