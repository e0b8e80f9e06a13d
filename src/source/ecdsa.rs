//! `ecdsa`: SendGrid's signed Event Webhook (Twilio SendGrid, "Getting started with the Event
//! Webhook security features").
//!
//! | header | value |
//! | --- | --- |
//! | `X-Twilio-Email-Event-Webhook-Signature` | standard base64 of a DER ECDSA P-256 signature over SHA-256 of `timestamp + body` |
//! | `X-Twilio-Email-Event-Webhook-Timestamp` | the signed timestamp, Unix seconds, prepended to the body as sent |
//!
//! The secret is the verification key SendGrid shows under Mail Settings: standard base64 of a
//! DER SubjectPublicKeyInfo (PEM armour around it is accepted too). Any configured key may
//! match, for rotation. A PKCS#8 private key (base64 DER) is accepted as well, for local
//! testing only: the scheme verifies with its public half and [`Scheme::sign`] signs with it
//! (`hookledger send` and the tests); in production give the public key, which cannot sign.
//!
//! The timestamp: SendGrid's SDKs check no age (they verify the signature only) and SendGrid
//! retries a failed POST for up to 24 hours, so the age is not checked unless `tolerance` is
//! configured for the source; the ledger is the replay protection, as for the body HMACs.
//!
//! The envelope: SendGrid posts a JSON array of events (each with its own `sg_event_id`) and
//! no id for the request, so the ledger key of a request is the SHA-256 of its body in
//! lowercase hex, and its type is `batch`; a resend of the same batch is a duplicate. The body
//! must be a JSON array. No event time.

use axum::http::HeaderMap;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use p256::ecdsa::signature::{Signer, Verifier};
use p256::ecdsa::{Signature, SigningKey, VerifyingKey};
use p256::pkcs8::{DecodePrivateKey, DecodePublicKey};
use sha2::{Digest, Sha256};

use super::{check_timestamp, header, Envelope, Scheme, VerifyError};
use crate::event::ParseError;

pub(crate) const SIGNATURE_HEADER: &str = "X-Twilio-Email-Event-Webhook-Signature";
pub(crate) const TIMESTAMP_HEADER: &str = "X-Twilio-Email-Event-Webhook-Timestamp";
/// The type of every request: one request is a batch of events.
pub(crate) const BATCH: &str = "batch";

/// The `ecdsa` scheme: the sender's public keys (any one may match), a private key when one
/// was configured (tests), and the tolerance of the timestamp (0: not checked).
pub(crate) struct Ecdsa {
    pub(crate) keys: Vec<VerifyingKey>,
    pub(crate) signer: Option<SigningKey>,
    pub(crate) tolerance: u64,
}

impl Ecdsa {
    /// From the configured secrets (see the module doc). The error says which secret (by
    /// position) and why, never what it is.
    pub(crate) fn from_secrets(secrets: &[&str], tolerance: u64) -> Result<Ecdsa, String> {
        let mut keys = Vec::with_capacity(secrets.len());
        let mut signer = None;
        for (i, secret) in secrets.iter().enumerate() {
            let (key, private) =
                parse_key(secret).map_err(|why| format!("secret {}: {why}", i + 1))?;
            keys.push(key);
            if signer.is_none() {
                signer = private;
            }
        }
        Ok(Ecdsa {
            keys,
            signer,
            tolerance,
        })
    }
}

/// A key as configured: a public key (SubjectPublicKeyInfo), or a private key (PKCS#8) and its
/// public half.
fn parse_key(secret: &str) -> Result<(VerifyingKey, Option<SigningKey>), &'static str> {
    let base64: String = secret
        .lines()
        .filter(|line| !line.trim_start().starts_with("-----"))
        .flat_map(|line| line.chars().filter(|c| !c.is_whitespace()))
        .collect();
    let der = BASE64
        .decode(base64)
        .map_err(|_| "must be the verification key as SendGrid shows it (standard base64)")?;
    if let Ok(key) = VerifyingKey::from_public_key_der(&der) {
        return Ok((key, None));
    }
    if let Ok(private) = SigningKey::from_pkcs8_der(&der) {
        return Ok((*private.verifying_key(), Some(private)));
    }
    Err("is not a P-256 public key (DER SubjectPublicKeyInfo, as SendGrid shows it)")
}

/// Signs `timestamp + body` with `key`: the value of the signature header.
pub(crate) fn sign(key: &SigningKey, timestamp: &str, body: &[u8]) -> String {
    let signature: Signature = key.sign(&[timestamp.as_bytes(), body].concat());
    BASE64.encode(signature.to_der().as_bytes())
}

/// A header's value as text.
fn text<'h>(headers: &'h HeaderMap, name: &'static str) -> Result<&'h str, VerifyError> {
    let value = header(headers, name).ok_or(VerifyError::MissingHeader(name))?;
    std::str::from_utf8(value)
        .map(str::trim)
        .map_err(|_| VerifyError::MalformedHeader {
            header: name,
            reason: "not UTF-8",
        })
}

/// The signed timestamp as sent, and its value.
fn timestamp(headers: &HeaderMap) -> Result<(&str, i64), VerifyError> {
    let sent = text(headers, TIMESTAMP_HEADER)?;
    let value = sent.parse().map_err(|_| VerifyError::MalformedHeader {
        header: TIMESTAMP_HEADER,
        reason: "not a Unix timestamp",
    })?;
    Ok((sent, value))
}

/// The decoded signature.
fn signature(headers: &HeaderMap) -> Result<Signature, VerifyError> {
    let malformed = |reason| VerifyError::MalformedHeader {
        header: SIGNATURE_HEADER,
        reason,
    };
    let der = BASE64
        .decode(text(headers, SIGNATURE_HEADER)?)
        .map_err(|_| malformed("not standard base64"))?;
    Signature::from_der(&der).map_err(|_| malformed("not a DER ECDSA signature"))
}

impl Scheme for Ecdsa {
    fn precheck(&self, headers: &HeaderMap, now: i64) -> Result<(), VerifyError> {
        signature(headers)?;
        let (_, t) = timestamp(headers)?;
        check_timestamp(t, now, self.tolerance)
    }

    fn verify(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), VerifyError> {
        let signature = signature(headers)?;
        let (sent, t) = timestamp(headers)?;
        let signed = [sent.as_bytes(), body].concat();
        if !self
            .keys
            .iter()
            .any(|key| key.verify(&signed, &signature).is_ok())
        {
            return Err(VerifyError::NoMatch);
        }
        check_timestamp(t, now, self.tolerance)
    }

    fn envelope(&self, _headers: &HeaderMap, body: &[u8]) -> Result<Envelope, ParseError> {
        serde_json::from_slice::<Vec<&serde_json::value::RawValue>>(body).map_err(|e| {
            ParseError::Envelope {
                what: "a SendGrid event batch",
                hint: "it must be a JSON array of events",
                detail: e.into(),
            }
        })?;
        Ok(Envelope {
            id: hex::encode(Sha256::digest(body)),
            kind: BATCH.into(),
            created: None,
        })
    }

    /// Signs with the configured private key; without one (public keys only, as in
    /// production) there is nothing to sign with: see [`Scheme::cannot_sign`].
    fn sign(&self, body: &[u8], now: i64, _id: &str, _kind: &str) -> Vec<(String, String)> {
        let timestamp = now.to_string();
        let mut headers = vec![(TIMESTAMP_HEADER.to_string(), timestamp.clone())];
        if let Some(key) = &self.signer {
            headers.push((SIGNATURE_HEADER.into(), sign(key, &timestamp, body)));
        }
        headers
    }

    fn cannot_sign(&self) -> Option<&'static str> {
        self.signer.is_none().then_some(
            "scheme ecdsa verifies with the sender's public key, which cannot sign (give a \
             PKCS#8 P-256 private key with --secret to sign for a test)",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use p256::pkcs8::{EncodePrivateKey, EncodePublicKey};

    /// `key`'s public key as SendGrid shows one (base64 DER SubjectPublicKeyInfo).
    fn public_of(key: &SigningKey) -> String {
        let public = p256::PublicKey::from(key.verifying_key());
        BASE64.encode(public.to_public_key_der().unwrap().as_bytes())
    }

    /// A fixed private key (test only) and its public key as SendGrid shows one.
    fn test_keys() -> (SigningKey, String) {
        let key = SigningKey::from_slice(&[7u8; 32]).unwrap();
        let public = public_of(&key);
        (key, public)
    }

    fn headers(signature: &str, timestamp: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(SIGNATURE_HEADER, signature.parse().unwrap());
        headers.insert(TIMESTAMP_HEADER, timestamp.parse().unwrap());
        headers
    }

    const BODY: &[u8] = br#"[{"email":"a@example.com","event":"delivered","sg_event_id":"e1"}]"#;

    /// A known answer from outside: the test vector all SendGrid SDKs share (sendgrid-python,
    /// -nodejs, -go, -java, -php, -ruby, their EventWebhook tests): public key, payload,
    /// signature and timestamp copied from those tests.
    #[test]
    fn verifies_the_sendgrid_sdk_test_vector() {
        let public_key = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEEDr2LjtURuePQzplybdC+u4CwrqDqBaWjcMMsTbhdbcwHBcepxo7yAQGhHPTnlvFYPAZFceEu/1FwCM/QmGUhA==";
        let signature = "MEUCIQCtIHJeH93Y+qpYeWrySphQgpNGNr/U+UyUlBkU6n7RAwIgJTz2C+8a8xonZGi6BpSzoQsbVRamr2nlxFDWYNH2j/0=";
        let timestamp = "1588788367";
        let payload =
            br#"{"category":"example_payload","event":"test_event","message_id":"message_id"}"#;
        let scheme = Ecdsa::from_secrets(&[public_key], 0).unwrap();
        let h = headers(signature, timestamp);
        assert_eq!(scheme.verify(&h, payload, 1_588_788_367), Ok(()));
        assert_eq!(
            scheme.verify(&h, br#"{"category":"example_payload"}"#, 1_588_788_367),
            Err(VerifyError::NoMatch)
        );
        // The same SDK tests' "bad key" case (their FAILING_PUBLIC_KEY).
        let other = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEqTxd43gyp8IOEto2LdIfjRQrIbsd4SXZkLW6jDutdhXSJCWHw8REntlo7aNDthvj+y7GjUuFDb/R1NGe1OPzpA==";
        let wrong = Ecdsa::from_secrets(&[other], 0).unwrap();
        assert_eq!(
            wrong.verify(&h, payload, 1_588_788_367),
            Err(VerifyError::NoMatch)
        );
    }

    #[test]
    fn signs_and_verifies_with_rotated_keys() {
        let (key, public) = test_keys();
        let other = public_of(&SigningKey::from_slice(&[9u8; 32]).unwrap());
        let scheme = Ecdsa::from_secrets(&[&other, &public], 0).unwrap();
        let h = headers(&sign(&key, "1700000000", BODY), "1700000000");
        assert_eq!(scheme.precheck(&h, 1_700_000_000), Ok(()));
        assert_eq!(scheme.verify(&h, BODY, 1_700_000_000), Ok(()));
        // The signature covers the timestamp as sent.
        let h = headers(&sign(&key, "1700000000", BODY), "1700000001");
        assert_eq!(
            scheme.verify(&h, BODY, 1_700_000_000),
            Err(VerifyError::NoMatch)
        );
    }

    #[test]
    fn a_private_key_signs_for_tests_and_a_public_key_cannot() {
        let (key, public) = test_keys();
        let secret = p256::SecretKey::from(&key);
        let private = BASE64.encode(secret.to_pkcs8_der().unwrap().as_bytes());
        let signer = Ecdsa::from_secrets(&[&private], 0).unwrap();
        assert_eq!(signer.cannot_sign(), None);
        let mut h = HeaderMap::new();
        for (name, value) in signer.sign(BODY, 1_700_000_000, "", "") {
            h.insert(
                axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        let verifier = Ecdsa::from_secrets(&[&public], 0).unwrap();
        assert_eq!(verifier.verify(&h, BODY, 1_700_000_000), Ok(()));
        assert!(verifier.cannot_sign().is_some());
        // PEM armour around the public key is accepted.
        let pem = format!("-----BEGIN PUBLIC KEY-----\n{public}\n-----END PUBLIC KEY-----\n");
        assert!(Ecdsa::from_secrets(&[&pem], 0).is_ok());
    }

    #[test]
    fn refuses_a_wrong_key() {
        let (key, _) = test_keys();
        let other = public_of(&SigningKey::from_slice(&[9u8; 32]).unwrap());
        let scheme = Ecdsa::from_secrets(&[&other], 0).unwrap();
        let h = headers(&sign(&key, "1700000000", BODY), "1700000000");
        assert_eq!(
            scheme.verify(&h, BODY, 1_700_000_000),
            Err(VerifyError::NoMatch)
        );
    }

    #[test]
    fn refuses_bad_keys_without_quoting_them() {
        for bad in ["not base64!", "AAAA", "c2hvcnQ="] {
            let err = Ecdsa::from_secrets(&["MFkw", bad], 0).err().unwrap();
            assert!(err.starts_with("secret 1: "), "{err}");
            assert!(!err.contains(bad), "{err}");
        }
    }

    #[test]
    fn missing_headers_are_named() {
        let (key, public) = test_keys();
        let scheme = Ecdsa::from_secrets(&[&public], 0).unwrap();
        let h = headers(&sign(&key, "1700000000", BODY), "1700000000");
        for name in [SIGNATURE_HEADER, TIMESTAMP_HEADER] {
            let mut without = h.clone();
            without.remove(name);
            assert_eq!(
                scheme.precheck(&without, 1_700_000_000),
                Err(VerifyError::MissingHeader(name))
            );
            assert_eq!(
                scheme.verify(&without, BODY, 1_700_000_000),
                Err(VerifyError::MissingHeader(name))
            );
        }
    }

    #[test]
    fn bad_base64_or_der_or_timestamp_is_malformed() {
        let (key, public) = test_keys();
        let scheme = Ecdsa::from_secrets(&[&public], 0).unwrap();
        let good = sign(&key, "1700000000", BODY);
        for (signature, timestamp, header, reason) in [
            (
                "not base64!",
                "1700000000",
                SIGNATURE_HEADER,
                "not standard base64",
            ),
            (
                "AAAA",
                "1700000000",
                SIGNATURE_HEADER,
                "not a DER ECDSA signature",
            ),
            (
                good.as_str(),
                "yesterday",
                TIMESTAMP_HEADER,
                "not a Unix timestamp",
            ),
        ] {
            let expected = Err(VerifyError::MalformedHeader { header, reason });
            let h = headers(signature, timestamp);
            assert_eq!(scheme.precheck(&h, 1_700_000_000), expected);
            assert_eq!(scheme.verify(&h, BODY, 1_700_000_000), expected);
        }
    }

    #[test]
    fn the_timestamp_is_checked_only_with_a_tolerance() {
        let (key, public) = test_keys();
        let h = headers(&sign(&key, "1700000000", BODY), "1700000000");
        let unchecked = Ecdsa::from_secrets(&[&public], 0).unwrap();
        assert_eq!(unchecked.verify(&h, BODY, 1_700_086_400), Ok(()));
        let checked = Ecdsa::from_secrets(&[&public], 300).unwrap();
        assert!(matches!(
            checked.precheck(&h, 1_700_000_301),
            Err(VerifyError::TooOld { .. })
        ));
        assert!(matches!(
            checked.verify(&h, BODY, 1_699_999_699),
            Err(VerifyError::InFuture { .. })
        ));
        assert_eq!(checked.verify(&h, BODY, 1_700_000_300), Ok(()));
    }

    #[test]
    fn the_envelope_is_the_body_hash_and_batch() {
        let scheme = Ecdsa::from_secrets(&[&test_keys().1], 0).unwrap();
        let envelope = scheme.envelope(&HeaderMap::new(), BODY).unwrap();
        assert_eq!(envelope.id, hex::encode(Sha256::digest(BODY)));
        assert_eq!(envelope.kind, "batch");
        assert_eq!(envelope.created, None);
        assert!(matches!(
            scheme.envelope(&HeaderMap::new(), br#"{"event":"delivered"}"#),
            Err(ParseError::Envelope { .. })
        ));
    }
}
