//! Schemes that sign the body alone with an HMAC: GitHub, Shopify, and any in-house sender
//! (`hmac`, configured). None signs a timestamp, so the ledger claim is their only replay
//! protection (retention keeps claims for `retention.claim_days`).
//!
//! | scheme | signature header | key | event id | type | event time |
//! | --- | --- | --- | --- | --- | --- |
//! | github | `X-Hub-Signature-256: sha256=<hex>` | secret as UTF-8 | `X-GitHub-Delivery` | `X-GitHub-Event` (+ `.` + body `action`) | none |
//! | shopify | `X-Shopify-Hmac-Sha256: <base64>` | app client secret | `X-Shopify-Webhook-Id`, else `X-Shopify-Event-Id` | `X-Shopify-Topic` | `X-Shopify-Triggered-At`, unsigned |
//! | hmac | configured | secret as UTF-8 | configured | configured | none |

use axum::http::HeaderMap;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac as HmacMac, Mac};
use sha2::{Sha256, Sha512};

use super::{header, Envelope, Scheme, VerifyError};
use crate::config::Secret;
use crate::config::{HmacAlgorithm, HmacConfig, HmacEncoding, Locator};
use crate::event::{check_id, ParseError};

/// Where a value of the request is, with header names fixed for the life of the process.
#[derive(Debug, Clone)]
pub(crate) enum Place {
    Header(&'static str),
    /// A JSON pointer into the body.
    Json(String),
}

impl Place {
    /// From a configured locator. Header names are leaked: sources are built once, at start-up.
    fn from_locator(locator: &Locator) -> Place {
        match locator {
            Locator::Header(name) => Place::Header(Box::leak(name.clone().into_boxed_str())),
            Locator::Json(pointer) => Place::Json(pointer.clone()),
        }
    }

    fn what(&self) -> String {
        match self {
            Place::Header(name) => format!("{name} header"),
            Place::Json(pointer) => format!("`{pointer}` in the body"),
        }
    }
}

/// A body-only HMAC scheme (see the module doc).
pub(crate) struct BodyHmac {
    pub(crate) keys: Vec<Secret>,
    pub(crate) header: &'static str,
    pub(crate) algorithm: HmacAlgorithm,
    pub(crate) encoding: HmacEncoding,
    pub(crate) prefix: String,
    /// The first of these that is present is the event id.
    pub(crate) id: Vec<Place>,
    pub(crate) kind: Place,
    /// GitHub: the type is the event header, then `.` and the body's `action` when it has one.
    pub(crate) action_suffix: bool,
    /// Shopify: an unsigned RFC 3339 header with the event time, for ordering only.
    pub(crate) time_header: Option<&'static str>,
}

pub(crate) const GITHUB_SIGNATURE: &str = "X-Hub-Signature-256";
pub(crate) const GITHUB_DELIVERY: &str = "X-GitHub-Delivery";
pub(crate) const GITHUB_EVENT: &str = "X-GitHub-Event";
pub(crate) const SHOPIFY_SIGNATURE: &str = "X-Shopify-Hmac-Sha256";
pub(crate) const SHOPIFY_WEBHOOK_ID: &str = "X-Shopify-Webhook-Id";
pub(crate) const SHOPIFY_EVENT_ID: &str = "X-Shopify-Event-Id";
pub(crate) const SHOPIFY_TOPIC: &str = "X-Shopify-Topic";
pub(crate) const SHOPIFY_TRIGGERED_AT: &str = "X-Shopify-Triggered-At";

impl BodyHmac {
    pub(crate) fn github(keys: Vec<Secret>) -> BodyHmac {
        BodyHmac {
            keys,
            header: GITHUB_SIGNATURE,
            algorithm: HmacAlgorithm::Sha256,
            encoding: HmacEncoding::Hex,
            prefix: "sha256=".into(),
            id: vec![Place::Header(GITHUB_DELIVERY)],
            kind: Place::Header(GITHUB_EVENT),
            action_suffix: true,
            time_header: None,
        }
    }

    pub(crate) fn shopify(keys: Vec<Secret>) -> BodyHmac {
        BodyHmac {
            keys,
            header: SHOPIFY_SIGNATURE,
            algorithm: HmacAlgorithm::Sha256,
            encoding: HmacEncoding::Base64,
            prefix: String::new(),
            id: vec![
                Place::Header(SHOPIFY_WEBHOOK_ID),
                Place::Header(SHOPIFY_EVENT_ID),
            ],
            kind: Place::Header(SHOPIFY_TOPIC),
            action_suffix: false,
            time_header: Some(SHOPIFY_TRIGGERED_AT),
        }
    }

    /// A configured `hmac` source (validated: `id` and `type` are set).
    pub(crate) fn configured(
        keys: Vec<Secret>,
        hmac: &HmacConfig,
        id: &Locator,
        kind: &Locator,
    ) -> BodyHmac {
        BodyHmac {
            keys,
            header: Box::leak(hmac.header.clone().into_boxed_str()),
            algorithm: hmac.algorithm,
            encoding: hmac.encoding,
            prefix: hmac.prefix.clone(),
            id: vec![Place::from_locator(id)],
            kind: Place::from_locator(kind),
            action_suffix: false,
            time_header: None,
        }
    }

    fn digest_len(&self) -> usize {
        match self.algorithm {
            HmacAlgorithm::Sha256 => 32,
            HmacAlgorithm::Sha512 => 64,
        }
    }

    /// The MAC of `body` under `key`.
    pub(crate) fn mac(&self, key: &Secret, body: &[u8]) -> Vec<u8> {
        let key = key.expose().as_bytes();
        match self.algorithm {
            HmacAlgorithm::Sha256 => {
                let mut mac = HmacMac::<Sha256>::new_from_slice(key).expect("any key length");
                mac.update(body);
                mac.finalize().into_bytes().to_vec()
            }
            HmacAlgorithm::Sha512 => {
                let mut mac = HmacMac::<Sha512>::new_from_slice(key).expect("any key length");
                mac.update(body);
                mac.finalize().into_bytes().to_vec()
            }
        }
    }

    /// The signature header's value for `body` under `key`.
    pub(crate) fn signature(&self, key: &Secret, body: &[u8]) -> String {
        let mac = self.mac(key, body);
        let encoded = match self.encoding {
            HmacEncoding::Hex => hex::encode(mac),
            HmacEncoding::Base64 => BASE64.encode(mac),
        };
        format!("{}{encoded}", self.prefix)
    }

    /// The decoded signature of the request.
    fn claimed(&self, headers: &HeaderMap) -> Result<Vec<u8>, VerifyError> {
        let malformed = |reason| VerifyError::MalformedHeader {
            header: self.header,
            reason,
        };
        let value = header(headers, self.header).ok_or(VerifyError::MissingHeader(self.header))?;
        let value = std::str::from_utf8(value).map_err(|_| malformed("not UTF-8"))?;
        let encoded = value
            .trim()
            .strip_prefix(self.prefix.as_str())
            .ok_or(malformed("it does not start with the expected prefix"))?;
        let decoded = match self.encoding {
            HmacEncoding::Hex => hex::decode(encoded).ok(),
            HmacEncoding::Base64 => BASE64.decode(encoded).ok(),
        };
        match decoded {
            Some(mac) if mac.len() == self.digest_len() => Ok(mac),
            _ => Err(malformed("not an encoded HMAC of the expected length")),
        }
    }
}

impl Scheme for BodyHmac {
    fn precheck(&self, headers: &HeaderMap, _now: i64) -> Result<(), VerifyError> {
        self.claimed(headers).map(drop)
    }

    fn verify(&self, headers: &HeaderMap, body: &[u8], _now: i64) -> Result<(), VerifyError> {
        let claimed = self.claimed(headers)?;
        // Every key is tried (no early exit), each compared in constant time.
        let matched = self.keys.iter().fold(false, |m, key| {
            m | constant_time_eq::constant_time_eq(&self.mac(key, body), &claimed)
        });
        if matched {
            Ok(())
        } else {
            Err(VerifyError::NoMatch)
        }
    }

    fn envelope(&self, headers: &HeaderMap, body: &[u8]) -> Result<Envelope, ParseError> {
        // The body is parsed only if a value is read from it (it need not be JSON otherwise).
        let mut json: Option<Option<serde_json::Value>> = None;
        let mut read = |place: &Place| -> Option<String> {
            match place {
                Place::Header(name) => header(headers, name)
                    .and_then(|v| std::str::from_utf8(v).ok())
                    .map(str::to_string),
                Place::Json(pointer) => {
                    let value = json.get_or_insert_with(|| serde_json::from_slice(body).ok());
                    match value.as_ref()?.pointer(pointer)? {
                        serde_json::Value::String(s) => Some(s.clone()),
                        serde_json::Value::Number(n) => Some(n.to_string()),
                        _ => None,
                    }
                }
            }
        };
        let id = self
            .id
            .iter()
            .find_map(&mut read)
            .ok_or_else(|| ParseError::Missing(self.id[0].what()))?;
        check_id("id", &id)?;
        let mut kind = read(&self.kind).ok_or_else(|| ParseError::Missing(self.kind.what()))?;
        if self.action_suffix {
            if let Some(action) = read(&Place::Json("/action".into())) {
                kind = format!("{kind}.{action}");
            }
        }
        check_id("type", &kind)?;
        let created = self
            .time_header
            .and_then(|name| header(headers, name))
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(crate::time::parse_rfc3339);
        Ok(Envelope { id, kind, created })
    }

    fn sign(&self, body: &[u8], now: i64, id: &str, kind: &str) -> Vec<(String, String)> {
        let mut headers = vec![(self.header.to_string(), self.signature(&self.keys[0], body))];
        if let Some(Place::Header(name)) = self.id.first() {
            headers.push((name.to_string(), id.to_string()));
        }
        if let Place::Header(name) = &self.kind {
            headers.push((name.to_string(), kind.to_string()));
        }
        if let Some(name) = self.time_header {
            headers.push((name.to_string(), crate::time::format_rfc3339(now)));
        }
        headers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GitHub's published vector (docs: "Testing the webhook payload validation").
    #[test]
    fn github_docs_vector() {
        let scheme = BodyHmac::github(vec![Secret::new("It's a Secret to Everybody")]);
        let key = &scheme.keys[0];
        assert_eq!(
            scheme.signature(key, b"Hello, World!"),
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
        );
        let mut headers = HeaderMap::new();
        headers.insert(
            GITHUB_SIGNATURE,
            scheme.signature(key, b"Hello, World!").parse().unwrap(),
        );
        assert_eq!(scheme.verify(&headers, b"Hello, World!", 0), Ok(()));
        assert_eq!(
            scheme.verify(&headers, b"Hello, World?", 0),
            Err(VerifyError::NoMatch)
        );
    }

    /// Computed vectors (Shopify publishes none): the same inputs as GitHub's, base64.
    #[test]
    fn shopify_computed_vectors() {
        let scheme = BodyHmac::shopify(vec![Secret::new("It's a Secret to Everybody")]);
        assert_eq!(
            scheme.signature(&scheme.keys[0], b"Hello, World!"),
            "dXEH6g6yUJ/CESIczphLijdXC211hsIsRvQ3nIsEPhc="
        );
        let scheme = BodyHmac::shopify(vec![Secret::new("test_secret")]);
        assert_eq!(
            scheme.signature(&scheme.keys[0], b"{}"),
            "dIomMpiYavYNlSAFvWWH63/jalqfHdr5TKTLRnKUc8s="
        );
    }

    #[test]
    fn precheck_refuses_a_missing_or_malformed_signature() {
        let scheme = BodyHmac::github(vec![Secret::new("It's a Secret to Everybody")]);
        let mut headers = HeaderMap::new();
        assert_eq!(
            scheme.precheck(&headers, 0),
            Err(VerifyError::MissingHeader(GITHUB_SIGNATURE))
        );
        for bad in [
            "sha1=01dc10d0c83e72ed246219cdd91669667fe2ca59",
            "sha256=zz",
            "sha256=00",
        ] {
            headers.insert(GITHUB_SIGNATURE, bad.parse().unwrap());
            assert!(
                matches!(
                    scheme.precheck(&headers, 0),
                    Err(VerifyError::MalformedHeader { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn github_envelope_reads_headers_and_the_action() {
        let scheme = BodyHmac::github(vec![Secret::new("It's a Secret to Everybody")]);
        let mut headers = HeaderMap::new();
        headers.insert(GITHUB_EVENT, "issues".parse().unwrap());
        assert_eq!(
            scheme.envelope(&headers, b"{}"),
            Err(ParseError::Missing("X-GitHub-Delivery header".into()))
        );
        headers.insert(
            GITHUB_DELIVERY,
            "72d3162e-cc78-11e3-81ab-4c9367dc0958".parse().unwrap(),
        );
        let envelope = scheme
            .envelope(&headers, br#"{"action":"opened","issue":{}}"#)
            .unwrap();
        assert_eq!(envelope.id, "72d3162e-cc78-11e3-81ab-4c9367dc0958");
        assert_eq!(envelope.kind, "issues.opened");
        assert_eq!(envelope.created, None);
        // A form-encoded body has no action to read.
        let envelope = scheme.envelope(&headers, b"payload=%7B%7D").unwrap();
        assert_eq!(envelope.kind, "issues");
    }

    #[test]
    fn shopify_envelope_falls_back_to_the_event_id_and_reads_the_time() {
        let scheme = BodyHmac::shopify(vec![Secret::new("test_secret")]);
        let mut headers = HeaderMap::new();
        headers.insert(SHOPIFY_EVENT_ID, "evt-1".parse().unwrap());
        headers.insert(SHOPIFY_TOPIC, "orders/create".parse().unwrap());
        headers.insert(
            SHOPIFY_TRIGGERED_AT,
            "2024-07-26T00:34:14Z".parse().unwrap(),
        );
        let envelope = scheme.envelope(&headers, b"{}").unwrap();
        assert_eq!(
            (
                envelope.id.as_str(),
                envelope.kind.as_str(),
                envelope.created
            ),
            ("evt-1", "orders/create", Some(1_721_954_054))
        );
        headers.insert(SHOPIFY_WEBHOOK_ID, "wh-1".parse().unwrap());
        assert_eq!(scheme.envelope(&headers, b"{}").unwrap().id, "wh-1");
    }

    #[test]
    fn configured_hmac_reads_json_pointers_with_sha512_base64() {
        let config = HmacConfig {
            header: "X-Acme-Signature".into(),
            algorithm: HmacAlgorithm::Sha512,
            encoding: HmacEncoding::Base64,
            prefix: "v1=".into(),
        };
        let scheme = BodyHmac::configured(
            vec![Secret::new("acme_secret_123")],
            &config,
            &Locator::Json("/id".into()),
            &Locator::Json("/event/name".into()),
        );
        let body = br#"{"id":42,"event":{"name":"order.paid"}}"#;
        let mut headers = HeaderMap::new();
        let signature = scheme.signature(&scheme.keys[0], body);
        assert!(signature.starts_with("v1=") && signature.len() == 3 + 88);
        headers.insert("x-acme-signature", signature.parse().unwrap());
        assert_eq!(scheme.verify(&headers, body, 0), Ok(()));
        let envelope = scheme.envelope(&headers, body).unwrap();
        assert_eq!(
            (envelope.id.as_str(), envelope.kind.as_str()),
            ("42", "order.paid")
        );
        assert_eq!(
            scheme.envelope(&headers, b"{}"),
            Err(ParseError::Missing("`/id` in the body".into()))
        );
    }
}
