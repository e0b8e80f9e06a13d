//! Standard Webhooks (standardwebhooks.com): how hookledger signs its deliveries to the app,
//! so the app can verify them with the official `standardwebhooks` libraries, and the scheme of
//! the senders that sign the same way (Svix, Clerk, Resend, ...).
//!
//! Headers `webhook-id`, `webhook-timestamp`, `webhook-signature`; the signed content is
//! `"{id}.{timestamp}.{body}"`; the key is the base64-decoded part of the secret after
//! `whsec_`; the signature is `v1,<standard base64 HMAC-SHA256>`, several space-separated.
//!
//! Asymmetric signatures (the spec's `v1a`): `v1a,<standard base64 ed25519 signature>` over
//! the same content, verified with the sender's public key given as a secret `whpk_<base64>`.
//! A source may list `whsec_` and `whpk_` secrets together (rotation from one to the other);
//! any one that matches any entry of its kind is enough. `whsk_<base64>` (an ed25519 private
//! key) is accepted too, for tests and `hookledger send`: it verifies with its public half and
//! signs `v1a`. A `whpk_` key cannot sign.
//!
//! Svix and the senders built on it (Clerk, Resend, ...) send the same three headers named
//! `svix-id`, `svix-timestamp`, `svix-signature`. As the Svix libraries do, a request is read
//! with one complete set: `webhook-*` when all three are present, else `svix-*`; one header of
//! each set is never combined (precheck, verify and envelope all read the same set).

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use axum::http::HeaderMap;
use ed25519_dalek::{Signature as Ed25519Signature, Signer as _};
use serde::Deserialize;

use super::{check_timestamp, header, Envelope, Scheme, VerifyError, MAX_SIGNATURES};
use crate::config::{decode_standard_key, decode_standard_secret, StandardKey};
use crate::event::{check_id, ParseError};

pub(crate) const ID_HEADER: &str = "webhook-id";
pub(crate) const TIMESTAMP_HEADER: &str = "webhook-timestamp";
pub(crate) const SIGNATURE_HEADER: &str = "webhook-signature";

/// One set of the three signature headers: id, timestamp, signature.
struct HeaderSet {
    id: &'static str,
    timestamp: &'static str,
    signature: &'static str,
}

/// Standard Webhooks' names first, then Svix's.
const HEADER_SETS: [HeaderSet; 2] = [
    HeaderSet {
        id: ID_HEADER,
        timestamp: TIMESTAMP_HEADER,
        signature: SIGNATURE_HEADER,
    },
    HeaderSet {
        id: "svix-id",
        timestamp: "svix-timestamp",
        signature: "svix-signature",
    },
];

/// The three signature headers of a request, read from one set.
struct Signed<'h> {
    id: &'h str,
    timestamp: &'h str,
    signature: &'h str,
    /// The name of the signature header, for errors.
    signature_header: &'static str,
    timestamp_header: &'static str,
}

/// The `standard` scheme for incoming webhooks: the sender's keys (any one may match, for
/// rotation) and the tolerance of the signed timestamp in seconds (0 turns the check off).
pub(crate) struct Standard {
    pub(crate) keys: Vec<Key>,
    pub(crate) tolerance: u64,
}

/// One key of a `standard` source (see the module doc).
pub(crate) enum Key {
    /// `whsec_`: the shared HMAC key; checks `v1,` entries.
    Symmetric(SigningKey),
    /// `whpk_`: the sender's ed25519 public key; checks `v1a,` entries.
    Public(ed25519_dalek::VerifyingKey),
    /// `whsk_`: an ed25519 private key (tests, `hookledger send`); checks `v1a,` entries with
    /// its public half.
    Private(ed25519_dalek::SigningKey),
}

impl Key {
    /// From a configured secret. The error says why, never what the secret is.
    pub(crate) fn from_secret(secret: &str) -> Result<Key, String> {
        Ok(match decode_standard_key(secret)? {
            StandardKey::Hmac(key) => Key::Symmetric(SigningKey(key)),
            StandardKey::Public(key) => Key::Public(
                ed25519_dalek::VerifyingKey::from_bytes(&key)
                    .map_err(|_| "a whpk_ key is not a valid ed25519 public key".to_string())?,
            ),
            StandardKey::Private(key) => Key::Private(match <[u8; 64]>::try_from(key.as_slice()) {
                Ok(pair) => ed25519_dalek::SigningKey::from_keypair_bytes(&pair).map_err(|_| {
                    "a 64-byte whsk_ key must be the seed then its own public key".to_string()
                })?,
                Err(_) => ed25519_dalek::SigningKey::from_bytes(
                    &key.try_into()
                        .map_err(|_| "a whsk_ key has 32 or 64 bytes".to_string())?,
                ),
            }),
        })
    }

    /// Whether any of `candidates` is this key's signature of `id`, `timestamp`, `body`.
    fn matches(&self, candidates: &Candidates, id: &str, timestamp: i64, body: &[u8]) -> bool {
        let public = match self {
            Key::Symmetric(key) => {
                let expected = key.mac(id, timestamp, body);
                // Every candidate is compared (no early exit on the first byte that differs).
                return candidates.v1.iter().fold(false, |m, c| {
                    m | constant_time_eq::constant_time_eq(c, &expected)
                });
            }
            Key::Public(key) => *key,
            Key::Private(key) => key.verifying_key(),
        };
        if candidates.v1a.is_empty() {
            return false;
        }
        let content = signed_content(id, timestamp, body);
        candidates
            .v1a
            .iter()
            .any(|signature| public.verify_strict(&content, signature).is_ok())
    }

    /// The signature header entry for one request, for a key that can sign.
    fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> Option<String> {
        match self {
            Key::Symmetric(key) => Some(key.sign(id, timestamp, body)),
            Key::Private(key) => {
                let signature = key.sign(&signed_content(id, timestamp, body));
                Some(format!("v1a,{}", BASE64.encode(signature.to_bytes())))
            }
            Key::Public(_) => None,
        }
    }
}

/// `"{id}.{timestamp}.{body}"`, what both kinds of signature sign.
fn signed_content(id: &str, timestamp: i64, body: &[u8]) -> Vec<u8> {
    [
        id.as_bytes(),
        b".",
        timestamp.to_string().as_bytes(),
        b".",
        body,
    ]
    .concat()
}

/// The decoded entries of a signature header: `v1,` HMACs and `v1a,` ed25519 signatures. An
/// entry that does not decode (bad base64, an ed25519 signature not of 64 bytes) matches
/// nothing, as a decoy from another key would not.
struct Candidates {
    v1: Vec<Vec<u8>>,
    v1a: Vec<Ed25519Signature>,
}

impl Scheme for Standard {
    fn precheck(&self, headers: &HeaderMap, now: i64) -> Result<(), VerifyError> {
        let signed = signature_headers(headers)?;
        let (timestamp, _) = parse_signed(&signed)?;
        check_timestamp(timestamp, now, self.tolerance)
    }

    fn verify(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), VerifyError> {
        let signed = signature_headers(headers)?;
        verify_any(&self.keys, &signed, body, now, self.tolerance)
    }

    fn envelope(&self, headers: &HeaderMap, body: &[u8]) -> Result<Envelope, ParseError> {
        #[derive(Deserialize)]
        struct Body {
            /// Without one (Svix's own example has none): the source's default type.
            #[serde(rename = "type", default)]
            kind: Option<String>,
            timestamp: Option<serde_json::Value>,
        }
        // Verified, so one set is complete (the same one verify read).
        let id = signature_headers(headers).map_or("", |signed| signed.id);
        check_id(ID_HEADER, id)?;
        let body: Body = serde_json::from_slice(body).map_err(|e| ParseError::Envelope {
            what: "a Standard Webhooks event",
            hint: "it must be JSON (a `type` in it, if any, a string)",
            detail: e.into(),
        })?;
        if let Some(kind) = &body.kind {
            check_id("type", kind)?;
        }
        Ok(Envelope {
            id: id.to_string(),
            kind: body.kind.unwrap_or_default(),
            created: body.timestamp.as_ref().and_then(event_time),
        })
    }

    /// Signs with the first key that can (a `whsec_` or a `whsk_` one); with none, the
    /// signature header is left out (see [`Scheme::cannot_sign`]).
    fn sign(&self, body: &[u8], now: i64, id: &str, _kind: &str) -> Vec<(String, String)> {
        let mut headers = vec![
            (ID_HEADER.into(), id.into()),
            (TIMESTAMP_HEADER.into(), now.to_string()),
        ];
        if let Some(signature) = self.keys.iter().find_map(|key| key.sign(id, now, body)) {
            headers.push((SIGNATURE_HEADER.into(), signature));
        }
        headers
    }

    fn cannot_sign(&self) -> Option<&'static str> {
        let can = self.keys.iter().any(|k| !matches!(k, Key::Public(_)));
        (!can).then_some(
            "scheme standard signs with a whsec_ secret (or a whsk_ private key); a whpk_ \
             public key cannot sign",
        )
    }
}

/// The three signature headers as text, from the first complete set of [`HEADER_SETS`]. When
/// none is complete: the first missing header of the set the request has a part of, and if it
/// has parts of both, an error (a mix is never read).
fn signature_headers(headers: &HeaderMap) -> Result<Signed<'_>, VerifyError> {
    let text = |name: &'static str| -> Result<Option<&str>, VerifyError> {
        header(headers, name)
            .map(|value| {
                std::str::from_utf8(value).map_err(|_| VerifyError::MalformedHeader {
                    header: name,
                    reason: "not UTF-8",
                })
            })
            .transpose()
    };
    let mut partial: Option<&'static str> = None;
    for set in &HEADER_SETS {
        let (id, timestamp, signature) =
            (text(set.id)?, text(set.timestamp)?, text(set.signature)?);
        match (id, timestamp, signature) {
            (Some(id), Some(timestamp), Some(signature)) => {
                return Ok(Signed {
                    id,
                    timestamp,
                    signature,
                    signature_header: set.signature,
                    timestamp_header: set.timestamp,
                })
            }
            (None, None, None) => {}
            _ if partial.is_some() => {
                return Err(VerifyError::MalformedHeader {
                    header: set.id,
                    reason: "parts of two header sets: send webhook-id, webhook-timestamp and \
                             webhook-signature, or svix-id, svix-timestamp and svix-signature, \
                             never some of each",
                })
            }
            (id, timestamp, _) => {
                partial = Some(if id.is_none() {
                    set.id
                } else if timestamp.is_none() {
                    set.timestamp
                } else {
                    set.signature
                })
            }
        }
    }
    Err(VerifyError::MissingHeader(partial.unwrap_or(ID_HEADER)))
}

/// The signed timestamp and the decoded `v1,` and `v1a,` signatures (at most
/// [`MAX_SIGNATURES`] in all; other entries are ignored).
fn parse_signed(signed: &Signed<'_>) -> Result<(i64, Candidates), VerifyError> {
    let timestamp: i64 =
        signed
            .timestamp
            .trim()
            .parse()
            .map_err(|_| VerifyError::MalformedHeader {
                header: signed.timestamp_header,
                reason: "not a Unix timestamp",
            })?;
    let entries: Vec<(bool, &str)> = signed
        .signature
        .split(' ')
        .filter_map(|entry| {
            (entry.strip_prefix("v1,").map(|e| (false, e)))
                .or_else(|| entry.strip_prefix("v1a,").map(|e| (true, e)))
        })
        .collect();
    if entries.len() > MAX_SIGNATURES {
        return Err(VerifyError::TooManySignatures {
            header: signed.signature_header,
            max: MAX_SIGNATURES,
        });
    }
    if entries.is_empty() {
        return Err(VerifyError::NoV1Signature(signed.signature_header));
    }
    let mut candidates = Candidates {
        v1: Vec::new(),
        v1a: Vec::new(),
    };
    for (asymmetric, encoded) in entries {
        let decoded = BASE64.decode(encoded).unwrap_or_default();
        if !asymmetric {
            candidates.v1.push(decoded);
        } else if let Ok(signature) = Ed25519Signature::from_slice(&decoded) {
            candidates.v1a.push(signature);
        }
    }
    Ok((timestamp, candidates))
}

/// The body's `timestamp`: an RFC 3339 string, or an integer of Unix seconds (milliseconds
/// when above 10^11). Anything else is no event time.
fn event_time(value: &serde_json::Value) -> Option<i64> {
    match value {
        serde_json::Value::Number(n) => {
            let n = n.as_i64()?;
            Some(if n > 100_000_000_000 { n / 1000 } else { n })
        }
        serde_json::Value::String(s) => crate::time::parse_rfc3339(s),
        _ => None,
    }
}

/// A Standard Webhooks key, decoded from its `whsec_<base64>` form.
#[derive(Clone)]
pub struct SigningKey(Vec<u8>);

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey(<redacted>)")
    }
}

impl SigningKey {
    /// Accepts `whsec_<base64>` (and, like the official libraries, bare base64).
    pub fn from_secret(secret: &str) -> Result<Self, String> {
        decode_standard_secret(secret).map(SigningKey)
    }

    /// A fresh random key in `whsec_<base64>` form, from the operating system's CSPRNG.
    pub fn generate() -> std::io::Result<String> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).map_err(std::io::Error::from)?;
        Ok(format!("whsec_{}", BASE64.encode(key)))
    }

    fn mac(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> [u8; 32] {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC accepts keys of any length");
        mac.update(msg_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac.finalize().into_bytes().into()
    }

    /// The `webhook-signature` value for one delivery.
    pub fn sign(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
        format!("v1,{}", BASE64.encode(self.mac(msg_id, timestamp, body)))
    }

    /// Verifies a delivery as the app would: any space-separated `v1,` entry may match.
    pub fn verify(
        &self,
        msg_id: &str,
        timestamp: &str,
        signature: &str,
        body: &[u8],
        now: i64,
        tolerance: u64,
    ) -> Result<(), VerifyError> {
        let signed = Signed {
            id: msg_id,
            timestamp,
            signature,
            signature_header: SIGNATURE_HEADER,
            timestamp_header: TIMESTAMP_HEADER,
        };
        verify_any(
            &[Key::Symmetric(self.clone())],
            &signed,
            body,
            now,
            tolerance,
        )
    }
}

/// Verifies a request: any entry of `signature` may match any of `keys` (`v1,` a `whsec_` one,
/// `v1a,` an ed25519 one), then the timestamp must be within `tolerance` of `now`.
fn verify_any(
    keys: &[Key],
    signed: &Signed<'_>,
    body: &[u8],
    now: i64,
    tolerance: u64,
) -> Result<(), VerifyError> {
    let (timestamp, candidates) = parse_signed(signed)?;
    let matched = keys
        .iter()
        .any(|key| key.matches(&candidates, signed.id, timestamp, body));
    if !matched {
        return Err(VerifyError::NoMatch);
    }
    check_timestamp(timestamp, now, tolerance)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signs_official_vector() {
        let key = SigningKey::from_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(
            hex::encode(&key.0),
            "31f290f6bf06298aab4f08d43c3f082cf648a362da2da4b0"
        );
        assert_eq!(
            key.sign(
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1614265330,
                b"{\"test\": 2432232314}"
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn rejects_bad_secret() {
        assert!(SigningKey::from_secret("whsec_not base64!").is_err());
        assert!(SigningKey::from_secret("whsec_c2hvcnQ=").is_err());
        assert!(SigningKey::from_secret(&SigningKey::generate().unwrap()).is_ok());
    }

    #[test]
    fn scheme_verifies_rotated_keys_and_reads_the_envelope() {
        let old = SigningKey::from_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let new = SigningKey::from_secret(&SigningKey::generate().unwrap()).unwrap();
        let body =
            br#"{"type":"user.created","timestamp":"2022-11-03T20:26:10.344522Z","data":{}}"#;
        let mut headers = HeaderMap::new();
        headers.insert(ID_HEADER, "msg_1".parse().unwrap());
        headers.insert(TIMESTAMP_HEADER, "1000".parse().unwrap());
        let signature = format!("v1,bm90IGl0 {}", new.sign("msg_1", 1000, body));
        headers.insert(SIGNATURE_HEADER, signature.parse().unwrap());
        let scheme = Standard {
            keys: vec![Key::Symmetric(old.clone()), Key::Symmetric(new)],
            tolerance: 300,
        };
        assert_eq!(scheme.verify(&headers, body, 1100), Ok(()));
        assert!(matches!(
            scheme.verify(&headers, body, 1400),
            Err(VerifyError::TooOld { .. })
        ));
        let only_old = Standard {
            keys: vec![Key::Symmetric(old)],
            tolerance: 300,
        };
        assert_eq!(
            only_old.verify(&headers, body, 1100),
            Err(VerifyError::NoMatch)
        );
        headers.remove(ID_HEADER);
        assert_eq!(
            scheme.verify(&headers, body, 1100),
            Err(VerifyError::MissingHeader(ID_HEADER))
        );
        assert_eq!(
            scheme.precheck(&headers, 1100),
            Err(VerifyError::MissingHeader(ID_HEADER))
        );
        headers.insert(ID_HEADER, "msg_1".parse().unwrap());
        assert_eq!(scheme.precheck(&headers, 1100), Ok(()));
        assert!(matches!(
            scheme.precheck(&headers, 1400),
            Err(VerifyError::TooOld { .. })
        ));
        let crowded = format!("{signature}{}", " v1,AAAA".repeat(MAX_SIGNATURES));
        headers.insert(SIGNATURE_HEADER, crowded.parse().unwrap());
        assert!(matches!(
            scheme.precheck(&headers, 1100),
            Err(VerifyError::TooManySignatures { .. })
        ));
        assert_eq!(
            scheme.envelope(&headers, body),
            Ok(Envelope {
                id: "msg_1".into(),
                kind: "user.created".into(),
                created: Some(1_667_507_170)
            })
        );
    }

    /// The headers of `set` (0: webhook-*, 1: svix-*) for `body` signed with `key`.
    fn headers_of(set: usize, key: &SigningKey, id: &str, t: i64, body: &[u8]) -> HeaderMap {
        let names = &HEADER_SETS[set];
        let mut headers = HeaderMap::new();
        headers.insert(names.id, id.parse().unwrap());
        headers.insert(names.timestamp, t.to_string().parse().unwrap());
        headers.insert(names.signature, key.sign(id, t, body).parse().unwrap());
        headers
    }

    fn vector_scheme() -> (SigningKey, Standard) {
        let key = SigningKey::from_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let scheme = Standard {
            keys: vec![Key::Symmetric(key.clone())],
            tolerance: 300,
        };
        (key, scheme)
    }

    #[test]
    fn svix_headers_are_read_like_webhook_headers() {
        let (key, scheme) = vector_scheme();
        let body = br#"{"type":"user.created","data":{}}"#;
        let headers = headers_of(1, &key, "msg_svix", 1000, body);
        assert_eq!(scheme.precheck(&headers, 1000), Ok(()));
        assert_eq!(scheme.verify(&headers, body, 1000), Ok(()));
        assert_eq!(scheme.envelope(&headers, body).unwrap().id, "msg_svix");
        assert!(matches!(
            scheme.precheck(&headers, 1400),
            Err(VerifyError::TooOld { .. })
        ));
        let mut headers = headers;
        headers.insert("svix-signature", "v1,AAAA".parse().unwrap());
        assert_eq!(
            scheme.verify(&headers, body, 1000),
            Err(VerifyError::NoMatch)
        );
        headers.insert("svix-timestamp", "soon".parse().unwrap());
        assert_eq!(
            scheme.precheck(&headers, 1000),
            Err(VerifyError::MalformedHeader {
                header: "svix-timestamp",
                reason: "not a Unix timestamp"
            })
        );
    }

    #[test]
    fn a_complete_webhook_set_is_preferred_to_svix() {
        let (key, scheme) = vector_scheme();
        let body = br#"{"type":"user.created","data":{}}"#;
        // Both complete: webhook-* is read (its signature is wrong, svix's is right).
        let mut headers = headers_of(1, &key, "msg_svix", 1000, body);
        headers.insert(ID_HEADER, "msg_webhook".parse().unwrap());
        headers.insert(TIMESTAMP_HEADER, "1000".parse().unwrap());
        headers.insert(SIGNATURE_HEADER, "v1,AAAA".parse().unwrap());
        assert_eq!(
            scheme.verify(&headers, body, 1000),
            Err(VerifyError::NoMatch)
        );
        let good = key.sign("msg_webhook", 1000, body);
        headers.insert(SIGNATURE_HEADER, good.parse().unwrap());
        assert_eq!(scheme.verify(&headers, body, 1000), Ok(()));
        assert_eq!(scheme.envelope(&headers, body).unwrap().id, "msg_webhook");
        // A partial webhook-* set beside a complete svix-* set: svix-* is read.
        headers.remove(SIGNATURE_HEADER);
        assert_eq!(scheme.verify(&headers, body, 1000), Ok(()));
        assert_eq!(scheme.envelope(&headers, body).unwrap().id, "msg_svix");
    }

    #[test]
    fn one_header_of_each_set_is_never_combined() {
        let (key, scheme) = vector_scheme();
        let body = br#"{"type":"user.created","data":{}}"#;
        let webhook = headers_of(0, &key, "msg_1", 1000, body);
        let svix = headers_of(1, &key, "msg_1", 1000, body);
        // webhook-id and webhook-timestamp with svix-signature: no complete set.
        let mut mixed = webhook.clone();
        mixed.remove(SIGNATURE_HEADER);
        mixed.insert("svix-signature", svix["svix-signature"].clone());
        for result in [
            scheme.precheck(&mixed, 1000),
            scheme.verify(&mixed, body, 1000),
        ] {
            assert!(
                matches!(
                    result,
                    Err(VerifyError::MalformedHeader {
                        header: "svix-id",
                        ..
                    })
                ),
                "{result:?}"
            );
        }
        assert!(scheme.envelope(&mixed, body).is_err());
    }

    #[test]
    fn the_missing_header_is_named_from_the_set_present() {
        let (key, scheme) = vector_scheme();
        let body = b"{}";
        let mut svix = headers_of(1, &key, "msg_1", 1000, body);
        svix.remove("svix-signature");
        assert_eq!(
            scheme.verify(&svix, body, 1000),
            Err(VerifyError::MissingHeader("svix-signature"))
        );
        let mut webhook = headers_of(0, &key, "msg_1", 1000, body);
        webhook.remove(TIMESTAMP_HEADER);
        assert_eq!(
            scheme.precheck(&webhook, 1000),
            Err(VerifyError::MissingHeader(TIMESTAMP_HEADER))
        );
        assert_eq!(
            scheme.precheck(&HeaderMap::new(), 1000),
            Err(VerifyError::MissingHeader(ID_HEADER))
        );
    }

    /// An ed25519 key pair whose seed is the bytes 0 to 31, and the `v1a` signature of the
    /// Standard Webhooks vector (`sign-function-works`: id, timestamp, payload) with it,
    /// computed with Python's `cryptography` (48.0.0), not by this crate. Ed25519 signatures
    /// are deterministic, so this is a known answer.
    const ED_SECRET: &str = "whsk_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    const ED_PUBLIC: &str = "whpk_A6EHv/POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg=";
    const ED_V1A: &str = "v1a,yoUrgEkc12aGqm0n4Sydmdz55xJfTz4AsAgieHFjmkR7LJtqVCZOQYzvvHjI5kAey+r4iaBGxTFRrl2iBQxtDQ==";
    const VECTOR_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const VECTOR_T: i64 = 1614265330;
    const VECTOR_BODY: &[u8] = b"{\"test\": 2432232314}";
    const VECTOR_V1: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn scheme_of(secrets: &[&str]) -> Standard {
        Standard {
            keys: secrets
                .iter()
                .map(|s| Key::from_secret(s).unwrap())
                .collect(),
            tolerance: 300,
        }
    }

    fn vector_headers(signature: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(ID_HEADER, VECTOR_ID.parse().unwrap());
        headers.insert(TIMESTAMP_HEADER, VECTOR_T.to_string().parse().unwrap());
        headers.insert(SIGNATURE_HEADER, signature.parse().unwrap());
        headers
    }

    #[test]
    fn v1a_known_answer_signed_by_whsk_and_verified_by_whpk() {
        let signer = scheme_of(&[ED_SECRET]);
        let headers = signer.sign(VECTOR_BODY, VECTOR_T, VECTOR_ID, "");
        assert_eq!(
            headers[2],
            (SIGNATURE_HEADER.to_string(), ED_V1A.to_string())
        );
        let verifier = scheme_of(&[ED_PUBLIC]);
        let headers = vector_headers(ED_V1A);
        assert_eq!(verifier.verify(&headers, VECTOR_BODY, VECTOR_T), Ok(()));
        assert_eq!(signer.verify(&headers, VECTOR_BODY, VECTOR_T), Ok(()));
        assert_eq!(
            verifier.verify(&headers, b"{\"test\": 2432232315}", VECTOR_T),
            Err(VerifyError::NoMatch)
        );
        assert!(matches!(
            verifier.verify(&headers, VECTOR_BODY, VECTOR_T + 301),
            Err(VerifyError::TooOld { .. })
        ));
        // The 64-byte form (seed, then its public key) is the same key.
        let pair = ed25519_dalek::SigningKey::from_bytes(
            &(0..32).collect::<Vec<u8>>().try_into().unwrap(),
        )
        .to_keypair_bytes();
        let long = format!("whsk_{}", BASE64.encode(pair));
        assert_eq!(
            scheme_of(&[&long]).verify(&headers, VECTOR_BODY, VECTOR_T),
            Ok(())
        );
    }

    #[test]
    fn whsec_and_whpk_keys_mix_during_rotation() {
        let scheme = scheme_of(&[ED_PUBLIC, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]);
        for signature in [
            VECTOR_V1.to_string(),
            ED_V1A.to_string(),
            format!("{VECTOR_V1} {ED_V1A}"),
            format!("v1a,{} {VECTOR_V1}", BASE64.encode([0u8; 64])),
        ] {
            let headers = vector_headers(&signature);
            assert_eq!(
                scheme.verify(&headers, VECTOR_BODY, VECTOR_T),
                Ok(()),
                "{signature}"
            );
        }
        // A v1a entry is not checked against an HMAC key, nor v1 against an ed25519 key.
        let only_hmac = scheme_of(&["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]);
        let only_ed = scheme_of(&[ED_PUBLIC]);
        assert_eq!(
            only_hmac.verify(&vector_headers(ED_V1A), VECTOR_BODY, VECTOR_T),
            Err(VerifyError::NoMatch)
        );
        assert_eq!(
            only_ed.verify(&vector_headers(VECTOR_V1), VECTOR_BODY, VECTOR_T),
            Err(VerifyError::NoMatch)
        );
    }

    #[test]
    fn v1a_with_a_wrong_key_bad_base64_or_a_wrong_length_matches_nothing() {
        let other = ed25519_dalek::SigningKey::from_bytes(&[9u8; 32]);
        let other = format!("whpk_{}", BASE64.encode(other.verifying_key().to_bytes()));
        let cases = [
            (other.as_str(), ED_V1A.to_string()),
            (ED_PUBLIC, "v1a,not*base64".to_string()),
            (ED_PUBLIC, format!("v1a,{}", BASE64.encode([1u8; 63]))),
        ];
        for (key, signature) in cases {
            let scheme = scheme_of(&[key]);
            let headers = vector_headers(&signature);
            assert_eq!(scheme.precheck(&headers, VECTOR_T), Ok(()), "{signature}");
            assert_eq!(
                scheme.verify(&headers, VECTOR_BODY, VECTOR_T),
                Err(VerifyError::NoMatch),
                "{signature}"
            );
        }
    }

    #[test]
    fn a_public_key_cannot_sign() {
        let scheme = scheme_of(&[ED_PUBLIC]);
        assert!(scheme.cannot_sign().unwrap().contains("whpk_"));
        let headers = scheme.sign(VECTOR_BODY, VECTOR_T, VECTOR_ID, "");
        assert!(headers.iter().all(|(name, _)| name != SIGNATURE_HEADER));
        // With a whsec_ key after it, that one signs.
        let scheme = scheme_of(&[ED_PUBLIC, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]);
        assert_eq!(scheme.cannot_sign(), None);
        let headers = scheme.sign(VECTOR_BODY, VECTOR_T, VECTOR_ID, "");
        assert_eq!(headers[2].1, VECTOR_V1);
    }

    #[test]
    fn invalid_ed25519_keys_are_refused_without_quoting_them() {
        // Not every 32 bytes are a point of the curve.
        let invalid = (0..=255u8)
            .map(|b| format!("whpk_{}", BASE64.encode([b; 32])))
            .find(|k| Key::from_secret(k).is_err())
            .expect("some 32 bytes are no ed25519 public key");
        let err = Key::from_secret(&invalid).err().unwrap();
        assert!(err.contains("not a valid ed25519 public key") && !err.contains(&invalid[5..]));
        // A 64-byte private key whose second half is not its public key.
        let mismatched = format!("whsk_{}", BASE64.encode([3u8; 64]));
        let err = Key::from_secret(&mismatched).err().unwrap();
        assert!(
            err.contains("its own public key") && !err.contains(&mismatched[5..]),
            "{err}"
        );
    }

    #[test]
    fn event_times_from_rfc3339_or_unix_seconds_or_milliseconds() {
        use serde_json::json;
        assert_eq!(event_time(&json!("1970-01-01T00:00:00Z")), Some(0));
        assert_eq!(
            event_time(&json!("2024-07-26T00:34:14+02:00")),
            Some(1_721_946_854)
        );
        assert_eq!(event_time(&json!(1_721_954_054)), Some(1_721_954_054));
        assert_eq!(
            event_time(&json!(1_721_954_054_123_i64)),
            Some(1_721_954_054)
        );
        assert_eq!(event_time(&json!("yesterday")), None);
        assert_eq!(event_time(&json!("2024-13-01T00:00:00Z")), None);
        assert_eq!(event_time(&json!(true)), None);
    }
}
