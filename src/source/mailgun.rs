//! Mailgun's webhook signature: the body is JSON `{"signature": {"timestamp": "…", "token":
//! "…", "signature": "<hex>"}, "event-data": {…}}`, and `signature.signature` is the lowercase
//! hex HMAC-SHA256, keyed with the webhook signing key (as UTF-8), of `timestamp` followed by
//! `token`, both as sent
//! (<https://documentation.mailgun.com/docs/mailgun/user-manual/events/webhooks/>, "Securing
//! webhooks").
//!
//! This is the only scheme whose signature is in the body, so it is the only one that parses
//! the body to verify: nothing is in the headers ([`Scheme::precheck`] has nothing to check),
//! the body is still read only up to the source's `max_body`, and `verify` reads the
//! `signature` object and nothing else (the rest is skipped as JSON, not interpreted) before
//! the HMAC matches.
//!
//! What a match proves: that someone with the signing key made this timestamp and token. It
//! proves nothing about `event-data`: Mailgun does not sign the event, so a body with a valid
//! `signature` object and another `event-data` verifies too. What stops a captured request
//! from being replayed is the signed timestamp, refused outside the tolerance (default 5 min)
//! either way, and the ledger's claim on `event-data.id`: an event id is processed once. What
//! stops its signature being reused on another event within the tolerance is the token, used
//! once ([`Scheme::token`]): claimed with the event, a second event with it is refused. Mailgun's own SDKs (the Python `mailgun`
//! package, npm `mailgun.js`) do not verify webhooks, so the published algorithm is the only
//! reference; the tests compute it independently.
//!
//! The envelope: id `/event-data/id`, type `/event-data/event`, event time
//! `/event-data/timestamp` (Unix seconds with a fraction; the whole seconds are kept).

use axum::http::HeaderMap;
use hmac::{Hmac, Mac};
use serde::Deserialize;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use super::{check_timestamp, Envelope, Scheme, VerifyError};
use crate::config::Secret;
use crate::event::{check_id, JsonError, ParseError};

/// The `mailgun` scheme: its signing keys (any one may match, for rotation) and the tolerance
/// of the signed timestamp in seconds (0 turns the check off).
pub(crate) struct Mailgun {
    pub(crate) secrets: Vec<Secret>,
    pub(crate) tolerance: u64,
}

/// The part of the body `verify` reads; everything else is skipped unread.
#[derive(Deserialize)]
struct Signed<'a> {
    #[serde(borrow)]
    signature: Option<SignatureObject<'a>>,
}

#[derive(Deserialize)]
struct SignatureObject<'a> {
    #[serde(borrow)]
    timestamp: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    token: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    signature: std::borrow::Cow<'a, str>,
}

/// The hex HMAC-SHA256 of `timestamp` then `token` under `key`.
fn compute(key: &Secret, timestamp: &str, token: &str) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(key.expose().as_bytes())
        .expect("HMAC takes a key of any length");
    mac.update(timestamp.as_bytes());
    mac.update(token.as_bytes());
    mac.finalize().into_bytes().into()
}

/// Longest token accepted: Mailgun's are 50 hex digits; the cap bounds the work of a hostile
/// body.
const MAX_TOKEN: usize = 256;

impl Scheme for Mailgun {
    fn precheck(&self, _headers: &HeaderMap, _now: i64) -> Result<(), VerifyError> {
        // The signature is in the body: nothing in the headers to check.
        Ok(())
    }

    fn verify(&self, _headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), VerifyError> {
        let signed: Signed = serde_json::from_slice(body)
            .map_err(|_| VerifyError::BodySignature("the body is not a JSON object"))?;
        let signature = signed.signature.ok_or(VerifyError::BodySignature(
            "missing (the body has no `signature` object)",
        ))?;
        let timestamp: i64 = signature
            .timestamp
            .parse()
            .map_err(|_| VerifyError::BodySignature("`timestamp` is not Unix seconds"))?;
        if signature.token.is_empty() || signature.token.len() > MAX_TOKEN {
            return Err(VerifyError::BodySignature(
                "`token` is empty or too long to be Mailgun's",
            ));
        }
        let mut claimed = [0u8; 32];
        hex::decode_to_slice(signature.signature.as_bytes(), &mut claimed).map_err(|_| {
            VerifyError::BodySignature("`signature` is not 64 hex digits (HMAC-SHA256)")
        })?;
        check_timestamp(timestamp, now, self.tolerance)?;
        let matched = self.secrets.iter().fold(false, |m, key| {
            let expected = compute(key, &signature.timestamp, &signature.token);
            m | constant_time_eq::constant_time_eq_32(&expected, &claimed)
        });
        if matched {
            Ok(())
        } else {
            Err(VerifyError::NoMatch)
        }
    }

    fn envelope(&self, _headers: &HeaderMap, body: &[u8]) -> Result<Envelope, ParseError> {
        envelope(body)
    }

    fn sign(&self, _body: &[u8], _now: i64, _id: &str, _kind: &str) -> Vec<(String, String)> {
        // The signature is in the body (see `sign_body`); no header carries it.
        Vec::new()
    }

    /// Mailgun's advice: a token seen before is a replay, even within the tolerance.
    fn token(&self, body: &[u8]) -> Option<String> {
        let signed: Signed = serde_json::from_slice(body).ok()?;
        Some(signed.signature?.token.into_owned())
    }

    fn sign_body(&self, body: &[u8], now: i64) -> Option<Vec<u8>> {
        sign_body(&self.secrets[0], body, now)
    }
}

/// `body` with its `signature` object made as Mailgun makes it at `now` with `key`: the
/// object replaces the body's own (or is put first when the body has none), and every other
/// byte of the body is kept as it is. The token is the first 50 hex digits of the SHA-256 of
/// `body` as given, so the same file gets the same token. `None` if `body` is not a JSON
/// object.
pub(crate) fn sign_body(key: &Secret, body: &[u8], now: i64) -> Option<Vec<u8>> {
    #[derive(Deserialize)]
    struct Top<'a> {
        #[serde(borrow)]
        signature: Option<&'a RawValue>,
    }
    let top: Top = serde_json::from_slice(body).ok()?;
    let timestamp = now.to_string();
    let token = hex::encode(Sha256::digest(body))[..50].to_string();
    let signature = hex::encode(compute(key, &timestamp, &token));
    let object =
        format!(r#"{{"timestamp":"{timestamp}","token":"{token}","signature":"{signature}"}}"#);
    let mut out = Vec::with_capacity(body.len() + object.len() + 16);
    match top.signature {
        Some(raw) => {
            // The raw value is a slice of `body`: splice the new object in its place.
            let start = raw.get().as_ptr() as usize - body.as_ptr() as usize;
            let end = start + raw.get().len();
            out.extend_from_slice(&body[..start]);
            out.extend_from_slice(object.as_bytes());
            out.extend_from_slice(&body[end..]);
        }
        None => {
            let open = body.iter().position(|b| *b == b'{')?;
            let empty = body[open + 1..]
                .iter()
                .find(|b| !b.is_ascii_whitespace())
                .is_some_and(|b| *b == b'}');
            out.extend_from_slice(&body[..=open]);
            out.extend_from_slice(br#""signature":"#);
            out.extend_from_slice(object.as_bytes());
            if !empty {
                out.push(b',');
            }
            out.extend_from_slice(&body[open + 1..]);
        }
    }
    Some(out)
}

/// The envelope of a verified Mailgun body.
pub(crate) fn envelope(body: &[u8]) -> Result<Envelope, ParseError> {
    #[derive(Deserialize)]
    struct Body<'a> {
        #[serde(rename = "event-data", borrow)]
        data: EventData<'a>,
    }
    #[derive(Deserialize)]
    struct EventData<'a> {
        #[serde(borrow)]
        id: std::borrow::Cow<'a, str>,
        #[serde(borrow)]
        event: std::borrow::Cow<'a, str>,
        timestamp: Option<f64>,
    }
    let parsed: Body = serde_json::from_slice(body).map_err(|e| ParseError::Envelope {
        what: "a Mailgun event",
        hint: "Mailgun sends {\"signature\": {…}, \"event-data\": {\"id\": \"…\", \"event\": \
               \"…\", \"timestamp\": …}}",
        detail: JsonError::from(e),
    })?;
    let data = parsed.data;
    check_id("id", &data.id)?;
    check_id("type", &data.event)?;
    let created = data
        .timestamp
        .filter(|t| t.is_finite() && t.abs() < 1e15)
        .map(|t| t.floor() as i64);
    Ok(Envelope {
        id: data.id.into_owned(),
        kind: data.event.into_owned(),
        created,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "key-mailgun-test-signing-key-0123";
    const BODY: &[u8] = br#"{"signature":{"timestamp":"1529006854","token":"a8ce0edb2dd8301dee6c2405235584e45aa91d1e9f979f3de0","signature":"SIG"},"event-data":{"id":"CPgfbmQMTCKtHW6uIWtuVe","event":"delivered","timestamp":1521472262.908181,"recipient":"alice@example.com"}}"#;

    fn scheme(keys: &[&str], tolerance: u64) -> Mailgun {
        Mailgun {
            secrets: keys.iter().map(|k| Secret::new(*k)).collect(),
            tolerance,
        }
    }

    /// Hex HMAC-SHA256 of `timestamp + token`, computed here with the `hmac` crate, apart
    /// from the module's code.
    fn known_answer(key: &str, timestamp: &str, token: &str) -> String {
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key.as_bytes()).unwrap();
        mac.update(format!("{timestamp}{token}").as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }

    fn body_with(timestamp: &str, signature: &str) -> Vec<u8> {
        String::from_utf8(BODY.to_vec())
            .unwrap()
            .replace("1529006854", timestamp)
            .replace("SIG", signature)
            .into_bytes()
    }

    fn signed_body(key: &str) -> Vec<u8> {
        body_with(
            "1529006854",
            &known_answer(
                key,
                "1529006854",
                "a8ce0edb2dd8301dee6c2405235584e45aa91d1e9f979f3de0",
            ),
        )
    }

    #[test]
    fn a_signature_computed_as_mailguns_docs_say_verifies_with_any_key() {
        let body = signed_body(KEY);
        let headers = HeaderMap::new();
        assert_eq!(
            scheme(&[KEY], 300).verify(&headers, &body, 1529006854),
            Ok(())
        );
        assert_eq!(
            scheme(&["key-old", KEY], 300).verify(&headers, &body, 1529006900),
            Ok(())
        );
        assert_eq!(scheme(&[KEY], 300).precheck(&headers, 0), Ok(()));
    }

    #[test]
    fn a_missing_signature_object_is_refused() {
        let body = br#"{"event-data":{"id":"x","event":"delivered"}}"#;
        assert!(matches!(
            scheme(&[KEY], 300).verify(&HeaderMap::new(), body, 0),
            Err(VerifyError::BodySignature(_))
        ));
        assert!(matches!(
            scheme(&[KEY], 300).verify(&HeaderMap::new(), b"not json", 0),
            Err(VerifyError::BodySignature(_))
        ));
    }

    #[test]
    fn a_wrong_key_does_not_match() {
        let body = signed_body("another-key");
        assert_eq!(
            scheme(&[KEY], 300).verify(&HeaderMap::new(), &body, 1529006854),
            Err(VerifyError::NoMatch)
        );
    }

    #[test]
    fn a_timestamp_too_old_or_in_the_future_is_refused_and_zero_disables() {
        let body = signed_body(KEY);
        let h = HeaderMap::new();
        assert!(matches!(
            scheme(&[KEY], 300).verify(&h, &body, 1529006854 + 301),
            Err(VerifyError::TooOld { age: 301, .. })
        ));
        assert!(matches!(
            scheme(&[KEY], 300).verify(&h, &body, 1529006854 - 301),
            Err(VerifyError::InFuture { ahead: 301, .. })
        ));
        assert_eq!(scheme(&[KEY], 0).verify(&h, &body, 0), Ok(()));
    }

    #[test]
    fn a_signature_that_is_not_hex_is_refused() {
        for bad in ["zz", "abc", &"g".repeat(64), &"ab".repeat(33)] {
            let body = body_with("1529006854", bad);
            assert!(
                matches!(
                    scheme(&[KEY], 0).verify(&HeaderMap::new(), &body, 0),
                    Err(VerifyError::BodySignature(_))
                ),
                "{bad}"
            );
        }
        let body = body_with("not-a-time", &known_answer(KEY, "not-a-time", "t"));
        assert!(matches!(
            scheme(&[KEY], 0).verify(&HeaderMap::new(), &body, 0),
            Err(VerifyError::BodySignature(_))
        ));
    }

    #[test]
    fn the_event_is_not_signed_so_a_changed_event_still_verifies() {
        // What the module doc says: the claim and the tolerance are the replay guard.
        let body = String::from_utf8(signed_body(KEY))
            .unwrap()
            .replace("delivered", "failed");
        assert_eq!(
            scheme(&[KEY], 0).verify(&HeaderMap::new(), body.as_bytes(), 0),
            Ok(())
        );
    }

    #[test]
    fn envelope_reads_id_event_and_whole_seconds() {
        assert_eq!(
            envelope(BODY),
            Ok(Envelope {
                id: "CPgfbmQMTCKtHW6uIWtuVe".into(),
                kind: "delivered".into(),
                created: Some(1521472262),
            })
        );
        assert!(matches!(
            envelope(br#"{"event-data":{"event":"delivered"}}"#),
            Err(ParseError::Envelope { .. })
        ));
        assert_eq!(
            envelope(br#"{"event-data":{"id":"","event":"delivered"}}"#),
            Err(ParseError::BadId("id"))
        );
        assert_eq!(
            envelope(br#"{"event-data":{"id":"x","event":"opened"}}"#).map(|e| e.created),
            Ok(None)
        );
    }

    #[test]
    fn sign_body_replaces_the_signature_and_keeps_every_other_byte() {
        let key = Secret::new(KEY);
        let signed = sign_body(&key, BODY, 1700000000).unwrap();
        assert_eq!(
            scheme(&[KEY], 300).verify(&HeaderMap::new(), &signed, 1700000000),
            Ok(())
        );
        let text = String::from_utf8(signed.clone()).unwrap();
        let original = std::str::from_utf8(BODY).unwrap();
        let data = &original[original.find(r#","event-data""#).unwrap()..];
        assert!(text.ends_with(data), "{text}");
        // The same file gets the same token, so the same body at the same time.
        assert_eq!(sign_body(&key, BODY, 1700000000).unwrap(), signed);
        // Without a signature object, one is put first.
        let bare = br#"{ "event-data": {"id": "x", "event": "delivered"} }"#;
        let signed = sign_body(&key, bare, 5).unwrap();
        assert!(signed.ends_with(br#", "event-data": {"id": "x", "event": "delivered"} }"#));
        assert_eq!(
            scheme(&[KEY], 0).verify(&HeaderMap::new(), &signed, 0),
            Ok(())
        );
        assert_eq!(sign_body(&key, b"[]", 5), None);
    }
}
