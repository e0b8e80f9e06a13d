//! Stripe's webhook signature: `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>…]`.
//!
//! The signed string is `"{t}.{raw body}"`, the key is the whole secret string (`whsec_…`
//! included, not base64-decoded), the MAC is HMAC-SHA256 in lowercase hex. Any `v1` may
//! match any configured secret (rotation); `v0` and unknown schemes are ignored.

use std::borrow::Cow;

use axum::http::HeaderMap;
use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;

use super::{check_timestamp, header, Envelope, Scheme, VerifyError, MAX_SIGNATURES};
use crate::config::Secret;
use crate::event::{check_id, ParseError};

pub const HEADER: &str = "Stripe-Signature";

/// The `stripe` scheme: its secrets (any one may match, for rotation) and the tolerance of the
/// signed timestamp in seconds (0 turns the check off).
pub(crate) struct Stripe {
    pub(crate) secrets: Vec<Secret>,
    pub(crate) tolerance: u64,
}

impl Scheme for Stripe {
    fn precheck(&self, headers: &HeaderMap, now: i64) -> Result<(), VerifyError> {
        let value = header(headers, HEADER).ok_or(VerifyError::MissingHeader(HEADER))?;
        check_timestamp(parse_header(value)?.timestamp, now, self.tolerance)
    }

    fn verify(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), VerifyError> {
        verify(
            &self.secrets,
            header(headers, HEADER),
            body,
            now,
            self.tolerance,
        )
        .map(drop)
    }

    fn envelope(&self, _headers: &HeaderMap, body: &[u8]) -> Result<Envelope, ParseError> {
        envelope(body)
    }

    fn sign(&self, body: &[u8], now: i64, _id: &str, _kind: &str) -> Vec<(String, String)> {
        vec![(HEADER.into(), sign(&self.secrets[0], now, body))]
    }
}

/// The envelope every Stripe event has; `data` is the handlers' business.
#[derive(Deserialize)]
struct StripeEnvelope<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    created: i64,
}

/// Reads `id`, `type` and `created` of a verified Stripe event body.
pub fn envelope(body: &[u8]) -> Result<Envelope, ParseError> {
    let e: StripeEnvelope = serde_json::from_slice(body).map_err(|e| ParseError::Envelope {
        what: "a Stripe event",
        hint: "it must be JSON with a string `id`, a string `type` and an integer `created`",
        detail: e.into(),
    })?;
    check_id("id", &e.id)?;
    check_id("type", &e.kind)?;
    Ok(Envelope {
        id: e.id.into_owned(),
        kind: e.kind.into_owned(),
        created: Some(e.created),
    })
}

/// The parsed header: timestamp and the decoded `v1` signatures.
#[derive(Debug, PartialEq, Eq)]
pub struct SignatureHeader {
    pub timestamp: i64,
    pub v1: Vec<[u8; 32]>,
}

/// Parses a `Stripe-Signature` value. A `v1` that is not 64 hex digits cannot match anything
/// and is skipped, as Stripe's SDKs do; more than 16 `v1` entries is refused.
pub fn parse_header(value: &[u8]) -> Result<SignatureHeader, VerifyError> {
    let malformed = |reason| VerifyError::MalformedHeader {
        header: HEADER,
        reason,
    };
    let value = std::str::from_utf8(value).map_err(|_| malformed("not UTF-8"))?;
    let mut timestamp = None;
    let mut v1 = Vec::new();
    let mut v1_entries = 0;
    for item in value.split(',') {
        let Some((key, val)) = item.trim().split_once('=') else {
            continue;
        };
        match key {
            "t" => {
                if timestamp.is_some() {
                    return Err(malformed("more than one t="));
                }
                let t = val
                    .parse::<i64>()
                    .map_err(|_| malformed("t= is not a Unix timestamp"))?;
                timestamp = Some(t);
            }
            "v1" => {
                if v1_entries == MAX_SIGNATURES {
                    return Err(VerifyError::TooManySignatures {
                        header: HEADER,
                        max: MAX_SIGNATURES,
                    });
                }
                v1_entries += 1;
                let mut sig = [0u8; 32];
                if hex::decode_to_slice(val, &mut sig).is_ok() {
                    v1.push(sig);
                }
            }
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or(malformed(
        "no t=<timestamp>; expected t=<unix>,v1=<hex signature>",
    ))?;
    if v1.is_empty() {
        return Err(VerifyError::NoV1Signature(HEADER));
    }
    Ok(SignatureHeader { timestamp, v1 })
}

/// HMAC-SHA256 of `"{t}.{body}"` under `secret`.
pub fn compute(secret: &Secret, timestamp: i64, body: &[u8]) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.expose().as_bytes())
        .expect("HMAC accepts keys of any length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.finalize().into_bytes().into()
}

/// The header Stripe would send for `body` at `timestamp` (used by `hookledger send`, the
/// demo, the load generator and the tests).
pub fn sign(secret: &Secret, timestamp: i64, body: &[u8]) -> String {
    format!(
        "t={timestamp},v1={}",
        hex::encode(compute(secret, timestamp, body))
    )
}

/// Verifies a request: some `v1` must match some secret, then the timestamp must be within
/// `tolerance` of `now`. Returns the signed timestamp.
pub fn verify(
    secrets: &[Secret],
    header: Option<&[u8]>,
    body: &[u8],
    now: i64,
    tolerance: u64,
) -> Result<i64, VerifyError> {
    let header = parse_header(header.ok_or(VerifyError::MissingHeader(HEADER))?)?;
    let matched = secrets.iter().any(|secret| {
        let expected = compute(secret, header.timestamp, body);
        // Every candidate is compared (no early exit on the first byte that differs).
        header
            .v1
            .iter()
            .any(|candidate| constant_time_eq::constant_time_eq_32(&expected, candidate))
    });
    if !matched {
        return Err(VerifyError::NoMatch);
    }
    check_timestamp(header.timestamp, now, tolerance)?;
    Ok(header.timestamp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> Vec<Secret> {
        vec![Secret::new("whsec_test_secret")]
    }

    const BODY: &[u8] = b"{\n  \"id\": \"evt_test_webhook\",\n  \"object\": \"event\"\n}";

    #[test]
    fn parses_docs_example_with_v0() {
        let h = parse_header(b"t=1492774577,v1=5257a869e7ecebeda32affa62cdca3fa51cad7e77a0e56ff536d0ce8e108d8bd,v0=6ffbb59b2300aae63f272406069a9788598b792a944a07aba816edb039989a39").unwrap();
        assert_eq!(h.timestamp, 1492774577);
        assert_eq!(h.v1.len(), 1);
        assert_eq!(
            hex::encode(h.v1[0]),
            "5257a869e7ecebeda32affa62cdca3fa51cad7e77a0e56ff536d0ce8e108d8bd"
        );
    }

    #[test]
    fn rejects_malformed_headers() {
        for bad in [
            &b"bad_header"[..],
            b"t=",
            b"t=not_a_number,v1=abc",
            b"t=1,t=2,v1=00",
            b"\xff\xfe",
        ] {
            assert!(
                matches!(parse_header(bad), Err(VerifyError::MalformedHeader { .. })),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(
            parse_header(b"v1,t=1"),
            Err(VerifyError::NoV1Signature(HEADER))
        );
        assert_eq!(
            parse_header(b"t=1,v0=00"),
            Err(VerifyError::NoV1Signature(HEADER))
        );
        assert_eq!(
            parse_header(b"t=1,v1=nothex"),
            Err(VerifyError::NoV1Signature(HEADER))
        );
    }

    #[test]
    fn a_header_with_more_v1_entries_than_the_cap_is_refused_by_name() {
        let at_cap = format!("t=1{}", ",v1=00".repeat(MAX_SIGNATURES));
        assert_eq!(
            parse_header(at_cap.as_bytes()),
            Err(VerifyError::NoV1Signature(HEADER))
        );
        let over = format!("{at_cap},v1={}", "ab".repeat(32));
        assert_eq!(
            parse_header(over.as_bytes()),
            Err(VerifyError::TooManySignatures {
                header: HEADER,
                max: MAX_SIGNATURES
            })
        );
    }

    #[test]
    fn precheck_refuses_a_missing_malformed_or_stale_header_without_a_body() {
        let scheme = Stripe {
            secrets: secret(),
            tolerance: 300,
        };
        let mut headers = HeaderMap::new();
        assert_eq!(
            scheme.precheck(&headers, 1000),
            Err(VerifyError::MissingHeader(HEADER))
        );
        headers.insert(HEADER, "t=oops,v1=00".parse().unwrap());
        assert!(matches!(
            scheme.precheck(&headers, 1000),
            Err(VerifyError::MalformedHeader { .. })
        ));
        // A forged but fresh header passes: only the body can show it is forged.
        headers.insert(
            HEADER,
            format!("t=1000,v1={}", "ab".repeat(32)).parse().unwrap(),
        );
        assert_eq!(scheme.precheck(&headers, 1000), Ok(()));
        assert!(matches!(
            scheme.precheck(&headers, 1301),
            Err(VerifyError::TooOld { .. })
        ));
        assert!(matches!(
            scheme.precheck(&headers, 699),
            Err(VerifyError::InFuture { .. })
        ));
    }

    #[test]
    fn signs_known_answer() {
        let header = sign(&secret()[0], 1614000000, BODY);
        assert_eq!(
            header,
            "t=1614000000,v1=c76c49018d9b52fccdcd31671cd7e967d390b03c729ef00a54172568783e272c"
        );
    }

    #[test]
    fn any_secret_may_match() {
        let header = sign(&Secret::new("whsec_new"), 1000, BODY);
        let secrets = vec![Secret::new("whsec_old"), Secret::new("whsec_new")];
        assert_eq!(
            verify(&secrets, Some(header.as_bytes()), BODY, 1000, 300),
            Ok(1000)
        );
        assert_eq!(
            verify(&secrets[..1], Some(header.as_bytes()), BODY, 1000, 300),
            Err(VerifyError::NoMatch)
        );
    }

    #[test]
    fn tolerance_applies_both_ways_and_zero_disables() {
        let header = sign(&secret()[0], 1000, BODY);
        let h = Some(header.as_bytes());
        assert_eq!(verify(&secret(), h, BODY, 1300, 300), Ok(1000));
        assert!(matches!(
            verify(&secret(), h, BODY, 1301, 300),
            Err(VerifyError::TooOld { age: 301, .. })
        ));
        assert_eq!(verify(&secret(), h, BODY, 700, 300), Ok(1000));
        assert!(matches!(
            verify(&secret(), h, BODY, 699, 300),
            Err(VerifyError::InFuture { ahead: 301, .. })
        ));
        assert_eq!(verify(&secret(), h, BODY, 99_999_999, 0), Ok(1000));
    }

    #[test]
    fn missing_header_and_tampered_body() {
        assert_eq!(
            verify(&secret(), None, BODY, 0, 300),
            Err(VerifyError::MissingHeader(HEADER))
        );
        let header = sign(&secret()[0], 1000, BODY);
        let mut tampered = BODY.to_vec();
        tampered.push(b'[');
        assert_eq!(
            verify(&secret(), Some(header.as_bytes()), &tampered, 1000, 300),
            Err(VerifyError::NoMatch)
        );
    }

    #[test]
    fn envelope_requires_id_type_created_and_ignores_data() {
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
            assert!(
                matches!(envelope(bad.as_bytes()), Err(ParseError::Envelope { .. })),
                "{bad}"
            );
        }
        assert_eq!(
            envelope(br#"{"id":"","type":"x","created":1}"#).unwrap_err(),
            ParseError::BadId("id")
        );
        let e =
            envelope(br#"{"id":"evt_1","type":"thing.happened","created":7,"data":{"object":42}}"#);
        assert_eq!(
            e,
            Ok(Envelope {
                id: "evt_1".into(),
                kind: "thing.happened".into(),
                created: Some(7)
            })
        );
    }
}
