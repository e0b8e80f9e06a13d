//! Invariants shared by the fuzz targets. Each `check_*` runs the library function on a hostile
//! input and panics (which libFuzzer reports as a crash) if a property that the request path
//! relies on does not hold.

use hookledger::internals::stripe::{self, SignatureHeader};
use hookledger::internals::stripe_billing::{decode, Change};
use hookledger::internals::Envelope;
use hookledger::{ParseError, VerifyError};

/// The cap `parse_header` puts on `v1` entries (`MAX_SIGNATURES` in `source/stripe.rs`).
pub const MAX_SIGNATURES: usize = 16;

/// The longest `id` / `type` the parser accepts (`MAX_ID_LEN` in `event.rs`).
pub const MAX_ID_LEN: usize = 255;

/// Lowercase hex, without pulling `hex` into the fuzz crate.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses `value` as a `Stripe-Signature` header and checks what an `Ok` promises: a
/// timestamp, 1..=16 signatures each spelled in the input, and the same result from the
/// canonical re-encoding. Errors must be the two header errors, with a message that is safe
/// to return (it quotes nothing from the header).
pub fn check_header(value: &[u8]) -> Result<SignatureHeader, VerifyError> {
    let parsed = stripe::parse_header(value);
    match &parsed {
        Ok(h) => {
            assert!(!h.v1.is_empty(), "Ok without a v1 signature");
            assert!(h.v1.len() <= MAX_SIGNATURES, "{} v1 signatures", h.v1.len());
            let text = std::str::from_utf8(value)
                .expect("Ok for a non-UTF-8 header")
                .to_ascii_lowercase();
            assert!(text.contains("t="), "Ok without t=");
            for sig in &h.v1 {
                let hex = to_hex(sig);
                assert!(text.contains(&hex), "v1 {hex} is not in the header");
            }
            let canonical = canonical_header(h);
            assert_eq!(
                stripe::parse_header(canonical.as_bytes()).as_ref(),
                Ok(h),
                "re-encoded header {canonical:?} parses differently"
            );
        }
        Err(e) => {
            assert!(
                matches!(
                    e,
                    VerifyError::MalformedHeader { .. } | VerifyError::NoV1Signature(_)
                ),
                "unexpected error from parse_header: {e:?}"
            );
            assert_message_is_safe(&e.to_string());
        }
    }
    assert_eq!(
        stripe::parse_header(value),
        parsed,
        "parse_header is not deterministic"
    );
    parsed
}

/// `t=<t>,v1=<hex>,…` for a parsed header.
pub fn canonical_header(h: &SignatureHeader) -> String {
    let mut out = format!("t={}", h.timestamp);
    for sig in &h.v1 {
        out.push_str(",v1=");
        out.push_str(&to_hex(sig));
    }
    out
}

/// Reads `body` as the stripe source does (envelope) and as the billing handler does (its
/// change), and checks what an `Ok` promises: a non-empty `id` and `type` of at most 255 bytes,
/// an event time, and a change that matches the type. Every error's log summary must quote
/// nothing from the body.
pub fn check_event(body: &[u8]) -> Result<(Envelope, Option<Change>), ParseError> {
    let parsed = stripe::envelope(body)
        .and_then(|e| decode(&e.kind, body).map(|change| (e, change)));
    match &parsed {
        Ok((e, change)) => {
            for (name, value) in [("id", &e.id), ("type", &e.kind)] {
                assert!(
                    !value.is_empty() && value.len() <= MAX_ID_LEN,
                    "{name} of {} bytes accepted",
                    value.len()
                );
            }
            assert!(e.created.is_some(), "a Stripe event without `created`");
            check_change(&e.kind, change.as_ref());
        }
        Err(err) => {
            // The Display text may quote the body (it goes back to the sender); the summary
            // goes to the log and must not.
            let _ = err.to_string();
            assert_message_is_safe(&err.summary());
        }
    }
    parsed
}

fn check_change(kind: &str, change: Option<&Change>) {
    let rank = match kind {
        "customer.subscription.created" => Some(0),
        "customer.subscription.updated"
        | "customer.subscription.paused"
        | "customer.subscription.resumed" => Some(1),
        "customer.subscription.deleted" => Some(2),
        _ => None,
    };
    let invoice = matches!(kind, "invoice.paid" | "invoice.payment_succeeded");
    match change {
        Some(Change::Subscription(change)) => {
            assert_eq!(Some(change.rank), rank, "{kind} has rank {}", change.rank);
            if let Some(account) = &change.account_id {
                assert!(!account.is_empty(), "empty account_id kept");
            }
        }
        Some(Change::InvoicePaid(_)) => assert!(invoice, "{kind} decoded as an invoice payment"),
        None => assert!(
            rank.is_none() && !invoice,
            "{kind} changes nothing but should"
        ),
    }
}

/// A message for the log or a fixed reason string: short, printable ASCII, one line. Anything
/// longer or stranger has echoed hostile input.
fn assert_message_is_safe(message: &str) {
    assert!(
        message.len() <= 200
            && message.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
            && !message.is_empty(),
        "message may echo the input: {message:?}"
    );
}
