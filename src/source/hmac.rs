//! Schemes that sign with an HMAC: GitHub, Shopify, and any sender described by data
//! (`hmac`, configured): the algorithm, the encoding, what is signed (a template of the body,
//! a signed timestamp, the event id and the public URL), and how the signature header holds
//! one or several signatures. GitHub and Shopify sign no timestamp, so the ledger claim is
//! their only replay protection (retention keeps claims for `retention.claim_days`); a
//! configured source with `hmac.timestamp` also refuses a timestamp outside its tolerance.
//!
//! | scheme | signature header | key | event id | type | event time |
//! | --- | --- | --- | --- | --- | --- |
//! | github | `X-Hub-Signature-256: sha256=<hex>` | secret as UTF-8 | `X-GitHub-Delivery` | `X-GitHub-Event` (+ `.` + body `action`) | none |
//! | shopify | `X-Shopify-Hmac-Sha256: <base64>` | app client secret | `X-Shopify-Webhook-Id`, else `X-Shopify-Event-Id` | `X-Shopify-Topic` | `X-Shopify-Triggered-At`, unsigned |
//! | hmac | configured | secret as UTF-8 | configured | configured | none |
//!
//! What configured sources look like (`hmac = { … }`):
//! - Slack: `header = "X-Slack-Signature", prefix = "v0=", signed = "v0:{timestamp}:{body}",
//!   timestamp = { header = "X-Slack-Request-Timestamp" }`.
//! - Svix-like: `header = "svix-signature", encoding = "base64", prefix = "v1,", separator =
//!   " ", signed = "{id}.{timestamp}.{body}", timestamp = { header = "svix-timestamp" }`
//!   (with `id = { header = "svix-id" }`; the key is the secret's UTF-8, not Svix's decoded
//!   `whsec_` key).
//! - Stripe-like: `header = "X-Signature", prefix = "v1=", separator = ",", signed =
//!   "{timestamp}.{body}", timestamp = { part = "t" }`; Paddle the same with `separator =
//!   ";"`, `prefix = "h1="`, `signed = "{timestamp}:{body}"`, `part = "ts"`.
//! - Square: `signed = "{url}{body}"`, base64, with the source's `public_url`. HubSpot v3:
//!   `signed = "POST{url}{body}{timestamp}"`, `timestamp = { header =
//!   "X-HubSpot-Request-Timestamp", unit = "ms" }`. Twilio is not one of these: it signs the
//!   URL followed by the sorted form parameters, or, for a JSON body, the URL alone with the
//!   body's SHA-256 in its `bodySHA256` query parameter (the request's own query, which no
//!   scheme here sees), so `{url}{body}` matches only a request with an empty body.

use axum::http::HeaderMap;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::digest::KeyInit;
use hmac::{Hmac as HmacMac, Mac};
use sha1::Sha1;
use sha2::{Digest, Sha256, Sha512};

use super::{check_timestamp, header, Envelope, Scheme, VerifyError, MAX_SIGNATURES};
use crate::config::Secret;
use crate::config::{HmacAlgorithm, HmacConfig, HmacEncoding, Locator, Signed};
use crate::event::{check_id, ParseError};

/// Where a value of the request is, with header names fixed for the life of the process.
#[derive(Debug, Clone)]
pub(crate) enum Place {
    Header(&'static str),
    /// A JSON pointer into the body.
    Json(String),
    /// The hex SHA-256 of the raw body.
    BodySha256,
    /// Not configured: never found (a type not configured is the source's default type).
    Nowhere,
    /// The first of these places that the request has.
    FirstOf(Vec<Place>),
}

/// The `(header, value)` of each value whose place is (or starts with) a header, for a
/// request that carries them; a place `None` or not a header is left out.
pub(crate) fn headers_at<'a>(
    values: impl IntoIterator<Item = (Option<&'a Place>, &'a str)>,
) -> Vec<(String, String)> {
    values
        .into_iter()
        .filter_map(|(place, value)| Some((place?.header()?.to_string(), value.to_string())))
        .collect()
}

/// `name`, kept for the life of the process: sources are built once, at start-up.
pub(crate) fn leak(name: &str) -> &'static str {
    Box::leak(name.to_string().into_boxed_str())
}

impl Place {
    /// From a configured locator.
    pub(crate) fn from_locator(locator: &Locator) -> Place {
        match locator {
            Locator::Header(name) => Place::Header(leak(name)),
            Locator::Json(pointer) => Place::Json(pointer.clone()),
            Locator::BodySha256(_) => Place::BodySha256,
            Locator::FirstOf(places) => {
                Place::FirstOf(places.iter().map(Place::from_locator).collect())
            }
        }
    }

    /// The header the value is sent in, where it is one (of a list, the first header).
    pub(crate) fn header(&self) -> Option<&'static str> {
        match self {
            Place::Header(name) => Some(name),
            Place::FirstOf(places) => places.iter().find_map(Place::header),
            Place::Json(_) | Place::BodySha256 | Place::Nowhere => None,
        }
    }

    pub(crate) fn what(&self) -> String {
        match self {
            Place::Header(name) => format!("{name} header"),
            Place::Json(pointer) => format!("`{pointer}` in the body"),
            Place::BodySha256 => "the body's SHA-256".into(),
            Place::Nowhere => "place configured".into(),
            Place::FirstOf(places) => {
                let each: Vec<String> = places.iter().map(Place::what).collect();
                each.join(" or ")
            }
        }
    }
}

/// Reads the values of a verified request at [`Place`]s; the body is parsed once, and only
/// if a value is read from it (it need not be JSON otherwise).
pub(crate) struct Reader<'r> {
    headers: &'r HeaderMap,
    body: &'r [u8],
    json: Option<Option<serde_json::Value>>,
}

impl<'r> Reader<'r> {
    pub(crate) fn new(headers: &'r HeaderMap, body: &'r [u8]) -> Reader<'r> {
        Reader {
            headers,
            body,
            json: None,
        }
    }

    /// The value at `place` as text (a JSON number as written), if the request has one.
    pub(crate) fn read(&mut self, place: &Place) -> Option<String> {
        match place {
            Place::Header(name) => header(self.headers, name)
                .and_then(|v| std::str::from_utf8(v).ok())
                .map(str::to_string),
            Place::Json(pointer) => {
                let body = self.body;
                let value = self
                    .json
                    .get_or_insert_with(|| serde_json::from_slice(body).ok());
                match value.as_ref()?.pointer(pointer)? {
                    serde_json::Value::String(s) => Some(s.clone()),
                    serde_json::Value::Number(n) => Some(n.to_string()),
                    _ => None,
                }
            }
            Place::BodySha256 => Some(hex::encode(Sha256::digest(self.body))),
            Place::Nowhere => None,
            Place::FirstOf(places) => places.iter().find_map(|place| self.read(place)),
        }
    }
}

/// The event id and type of a verified request, read from the places given (the first `id`
/// place present is the id). A type found nowhere is empty: the source's default type
/// ([`crate::source::Source::envelope`]). GitHub's `action_suffix`: the type is followed by
/// `.` and the body's `action` when it has one. `time_header`: an unsigned RFC 3339 event time.
pub(crate) fn read_envelope(
    headers: &HeaderMap,
    body: &[u8],
    ids: &[Place],
    kind: &Place,
    action_suffix: bool,
    time_header: Option<&'static str>,
) -> Result<Envelope, ParseError> {
    let mut reader = Reader::new(headers, body);
    let mut read = |place: &Place| reader.read(place);
    let id = ids
        .iter()
        .find_map(&mut read)
        .ok_or_else(|| ParseError::Missing(ids[0].what()))?;
    check_id("id", &id)?;
    let mut kind = read(kind).unwrap_or_default();
    if !kind.is_empty() {
        if action_suffix {
            if let Some(action) = read(&Place::Json("/action".into())) {
                kind = format!("{kind}.{action}");
            }
        }
        check_id("type", &kind)?;
    }
    let created = time_header
        .and_then(|name| header(headers, name))
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(crate::time::parse_rfc3339);
    Ok(Envelope { id, kind, created })
}

/// One piece of the signed content, the public URL already in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    Text(Vec<u8>),
    Body,
    Timestamp,
    Id,
}

/// Where the signed timestamp is.
#[derive(Debug, Clone)]
pub(crate) enum Stamp {
    Header(&'static str),
    /// The entry `<name>=<value>` of the signature header.
    Part(String),
}

/// How a signed timestamp is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    Seconds,
    Millis,
    /// RFC 3339 text (Twitch EventSub's `2019-11-16T10:11:12.634234626Z`), signed as sent.
    Rfc3339,
}

/// A signed timestamp: where it is, and how it is written.
#[derive(Debug, Clone)]
pub(crate) struct Timestamp {
    pub(crate) at: Stamp,
    pub(crate) unit: Unit,
}

/// An HMAC scheme (see the module doc).
pub(crate) struct BodyHmac {
    pub(crate) keys: Vec<Secret>,
    pub(crate) header: &'static str,
    pub(crate) algorithm: HmacAlgorithm,
    pub(crate) encoding: HmacEncoding,
    pub(crate) prefix: String,
    /// What is signed, in order.
    pub(crate) signed: Vec<Piece>,
    pub(crate) timestamp: Option<Timestamp>,
    /// The signature header holds entries split at this.
    pub(crate) separator: Option<String>,
    pub(crate) tolerance: u64,
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

/// What a request's signature header and timestamp say.
struct Claimed<'h> {
    signatures: Vec<Vec<u8>>,
    /// The timestamp as sent (it is signed as text) and in seconds.
    timestamp: Option<(&'h [u8], i64)>,
}

impl BodyHmac {
    pub(crate) fn github(keys: Vec<Secret>) -> BodyHmac {
        BodyHmac {
            keys,
            header: GITHUB_SIGNATURE,
            algorithm: HmacAlgorithm::Sha256,
            encoding: HmacEncoding::Hex,
            prefix: "sha256=".into(),
            signed: vec![Piece::Body],
            timestamp: None,
            separator: None,
            tolerance: 0,
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
            signed: vec![Piece::Body],
            timestamp: None,
            separator: None,
            tolerance: 0,
            id: vec![
                Place::Header(SHOPIFY_WEBHOOK_ID),
                Place::Header(SHOPIFY_EVENT_ID),
            ],
            kind: Place::Header(SHOPIFY_TOPIC),
            action_suffix: false,
            time_header: Some(SHOPIFY_TRIGGERED_AT),
        }
    }

    /// A configured `hmac` source (validated: `id` is set, `public_url` is when the template
    /// has `{url}`; without a `type`, the source's default type).
    pub(crate) fn configured(
        keys: Vec<Secret>,
        hmac: &HmacConfig,
        public_url: Option<&str>,
        tolerance: u64,
        id: &Locator,
        kind: Option<&Locator>,
    ) -> BodyHmac {
        let signed = hmac
            .pieces()
            .into_iter()
            .map(|piece| match piece {
                Signed::Text(text) => Piece::Text(text.into_bytes()),
                Signed::Url => Piece::Text(public_url.unwrap_or_default().as_bytes().to_vec()),
                Signed::Body => Piece::Body,
                Signed::Timestamp => Piece::Timestamp,
                Signed::Id => Piece::Id,
            })
            .collect();
        let timestamp = hmac.timestamp.as_ref().map(|t| Timestamp {
            at: match (&t.header, &t.part) {
                (Some(header), _) => Stamp::Header(leak(header)),
                (None, part) => Stamp::Part(part.clone().unwrap_or_default()),
            },
            unit: if t.millis() {
                Unit::Millis
            } else if t.rfc3339() {
                Unit::Rfc3339
            } else {
                Unit::Seconds
            },
        });
        BodyHmac {
            keys,
            header: leak(&hmac.header),
            algorithm: hmac.algorithm,
            encoding: hmac.encoding,
            prefix: hmac.prefix.clone(),
            signed,
            timestamp,
            separator: hmac.separator.clone(),
            tolerance,
            id: vec![Place::from_locator(id)],
            kind: kind.map_or(Place::Nowhere, Place::from_locator),
            action_suffix: false,
            time_header: None,
        }
    }

    fn digest_len(&self) -> usize {
        match self.algorithm {
            HmacAlgorithm::Sha1 => 20,
            HmacAlgorithm::Sha256 => 32,
            HmacAlgorithm::Sha512 => 64,
        }
    }

    /// The MAC of the concatenated `parts` under `key`.
    pub(crate) fn mac(&self, key: &Secret, parts: &[&[u8]]) -> Vec<u8> {
        fn run<M: Mac + KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
            let mut mac = <M as Mac>::new_from_slice(key).expect("any key length");
            for part in parts {
                mac.update(part);
            }
            mac.finalize().into_bytes().to_vec()
        }
        let key = key.expose().as_bytes();
        match self.algorithm {
            HmacAlgorithm::Sha1 => run::<HmacMac<Sha1>>(key, parts),
            HmacAlgorithm::Sha256 => run::<HmacMac<Sha256>>(key, parts),
            HmacAlgorithm::Sha512 => run::<HmacMac<Sha512>>(key, parts),
        }
    }

    /// The signed content's parts for `body`, timestamp text `timestamp` and event `id`.
    fn parts<'a>(&'a self, body: &'a [u8], timestamp: &'a [u8], id: &'a [u8]) -> Vec<&'a [u8]> {
        self.signed
            .iter()
            .map(|piece| match piece {
                Piece::Text(text) => text.as_slice(),
                Piece::Body => body,
                Piece::Timestamp => timestamp,
                Piece::Id => id,
            })
            .collect()
    }

    /// One encoded signature entry (`v1=<hex>`) for `body` under `key`, with timestamp text
    /// `timestamp` and event `id` where the template signs them.
    fn entry(&self, key: &Secret, body: &[u8], timestamp: &str, id: &str) -> String {
        let mac = self.mac(key, &self.parts(body, timestamp.as_bytes(), id.as_bytes()));
        let encoded = match self.encoding {
            HmacEncoding::Hex => hex::encode(mac),
            HmacEncoding::Base64 => BASE64.encode(mac),
        };
        format!("{}{encoded}", self.prefix)
    }

    /// The signature header's value for `body` under `key` (a scheme that signs the body
    /// alone).
    #[cfg(test)]
    pub(crate) fn signature(&self, key: &Secret, body: &[u8]) -> String {
        self.entry(key, body, "", "")
    }

    fn malformed(&self, reason: &'static str) -> VerifyError {
        VerifyError::MalformedHeader {
            header: self.header,
            reason,
        }
    }

    /// The decoded signatures and the timestamp of the request.
    fn claimed<'h>(&self, headers: &'h HeaderMap) -> Result<Claimed<'h>, VerifyError> {
        let value = header(headers, self.header).ok_or(VerifyError::MissingHeader(self.header))?;
        let value = std::str::from_utf8(value).map_err(|_| self.malformed("not UTF-8"))?;
        let part = match &self.timestamp {
            Some(Timestamp {
                at: Stamp::Part(name),
                ..
            }) => Some(name.as_str()),
            _ => None,
        };
        let mut signatures = Vec::new();
        let mut in_header = None;
        let entries: Box<dyn Iterator<Item = &str>> = match &self.separator {
            Some(separator) => Box::new(value.split(separator.as_str())),
            None => Box::new(std::iter::once(value)),
        };
        for entry in entries.map(str::trim).filter(|e| !e.is_empty()) {
            let stamp = part.and_then(|p| entry.strip_prefix(p)?.strip_prefix('='));
            if let Some(stamp) = stamp {
                if in_header.replace(stamp).is_some() {
                    return Err(self.malformed("it has two timestamps"));
                }
                continue;
            }
            let Some(encoded) = entry.strip_prefix(self.prefix.as_str()) else {
                if self.separator.is_some() {
                    // Another version or scheme of signature: not this one's to check.
                    continue;
                }
                return Err(self.malformed("it does not start with the expected prefix"));
            };
            if signatures.len() == MAX_SIGNATURES {
                return Err(VerifyError::TooManySignatures {
                    header: self.header,
                    max: MAX_SIGNATURES,
                });
            }
            let decoded = match self.encoding {
                HmacEncoding::Hex => hex::decode(encoded).ok(),
                HmacEncoding::Base64 => BASE64.decode(encoded).ok(),
            };
            match decoded {
                Some(mac) if mac.len() == self.digest_len() => signatures.push(mac),
                _ => return Err(self.malformed("not an encoded HMAC of the expected length")),
            }
        }
        if signatures.is_empty() {
            return Err(self.malformed("no signature with the expected prefix"));
        }
        let timestamp = match &self.timestamp {
            None => None,
            Some(t) => {
                let (text, name) = match t.at {
                    Stamp::Header(name) => (
                        header(headers, name).ok_or(VerifyError::MissingHeader(name))?,
                        name,
                    ),
                    Stamp::Part(_) => (
                        in_header
                            .ok_or(self.malformed("it has no timestamp entry"))?
                            .as_bytes(),
                        self.header,
                    ),
                };
                let seconds = parse_stamp(text, t.unit).ok_or(VerifyError::MalformedHeader {
                    header: name,
                    reason: match t.unit {
                        Unit::Rfc3339 => "the timestamp is not an RFC 3339 date and time",
                        _ => "the timestamp is not a whole number of seconds or milliseconds",
                    },
                })?;
                Some((text, seconds))
            }
        };
        Ok(Claimed {
            signatures,
            timestamp,
        })
    }

    /// The event id as sent in its header, for a template that signs `{id}` (validated: the
    /// id is a header then).
    fn signed_id<'h>(&self, headers: &'h HeaderMap) -> Result<&'h [u8], VerifyError> {
        if !self.signed.contains(&Piece::Id) {
            return Ok(b"");
        }
        match self.id.first().and_then(Place::header) {
            Some(name) => header(headers, name).ok_or(VerifyError::MissingHeader(name)),
            None => Ok(b""),
        }
    }
}

/// A timestamp's text in seconds: ASCII digits only (no sign, no fraction), in seconds or
/// milliseconds; or an RFC 3339 date and time (its fraction of a second dropped).
fn parse_stamp(text: &[u8], unit: Unit) -> Option<i64> {
    if unit == Unit::Rfc3339 {
        return crate::time::parse_rfc3339(std::str::from_utf8(text).ok()?);
    }
    if text.is_empty() || text.len() > 19 || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: i64 = std::str::from_utf8(text).ok()?.parse().ok()?;
    Some(if unit == Unit::Millis { n / 1000 } else { n })
}

impl Scheme for BodyHmac {
    fn precheck(&self, headers: &HeaderMap, now: i64) -> Result<(), VerifyError> {
        let claimed = self.claimed(headers)?;
        self.signed_id(headers)?;
        match claimed.timestamp {
            Some((_, t)) => check_timestamp(t, now, self.tolerance),
            None => Ok(()),
        }
    }

    fn verify(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), VerifyError> {
        let claimed = self.claimed(headers)?;
        let id = self.signed_id(headers)?;
        let text = match claimed.timestamp {
            Some((text, t)) => {
                check_timestamp(t, now, self.tolerance)?;
                text
            }
            None => b"",
        };
        let parts = self.parts(body, text, id);
        // Every key and every signature is tried (no early exit), each compared in constant
        // time.
        let matched = self.keys.iter().fold(false, |m, key| {
            let mac = self.mac(key, &parts);
            claimed.signatures.iter().fold(m, |m, claimed| {
                m | constant_time_eq::constant_time_eq(&mac, claimed)
            })
        });
        if matched {
            Ok(())
        } else {
            Err(VerifyError::NoMatch)
        }
    }

    fn envelope(&self, headers: &HeaderMap, body: &[u8]) -> Result<Envelope, ParseError> {
        read_envelope(
            headers,
            body,
            &self.id,
            &self.kind,
            self.action_suffix,
            self.time_header,
        )
    }

    fn sign(&self, body: &[u8], now: i64, id: &str, kind: &str) -> Vec<(String, String)> {
        let stamp = match self.timestamp.as_ref().map(|t| t.unit) {
            Some(Unit::Millis) => now.saturating_mul(1000).to_string(),
            Some(Unit::Rfc3339) => crate::time::format_rfc3339(now),
            Some(Unit::Seconds) => now.to_string(),
            None => String::new(),
        };
        let entry = self.entry(&self.keys[0], body, &stamp, id);
        let value = match (&self.timestamp, &self.separator) {
            (
                Some(Timestamp {
                    at: Stamp::Part(part),
                    ..
                }),
                Some(separator),
            ) => format!("{part}={stamp}{separator}{entry}"),
            _ => entry,
        };
        let mut headers = vec![(self.header.to_string(), value)];
        if let Some(Timestamp {
            at: Stamp::Header(name),
            ..
        }) = &self.timestamp
        {
            headers.push((name.to_string(), stamp));
        }
        if let Some(name) = self.id.first().and_then(Place::header) {
            headers.push((name.to_string(), id.to_string()));
        }
        if let Some(name) = self.kind.header() {
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
    use crate::source::testing::refuses_missing_and_malformed;

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
        refuses_missing_and_malformed(
            &scheme,
            GITHUB_SIGNATURE,
            &[
                "sha1=01dc10d0c83e72ed246219cdd91669667fe2ca59",
                "sha256=zz",
                "sha256=00",
            ],
        );
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
        let config = HmacConfig::new("X-Acme-Signature")
            .with_algorithm(HmacAlgorithm::Sha512)
            .with_encoding(HmacEncoding::Base64)
            .with_prefix("v1=");
        let scheme = BodyHmac::configured(
            vec![Secret::new("acme_secret_123")],
            &config,
            None,
            300,
            &Locator::Json("/id".into()),
            Some(&Locator::Json("/event/name".into())),
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

    use crate::config::TimestampConfig;

    fn configured(config: HmacConfig, secret: &str, id: Locator) -> BodyHmac {
        BodyHmac::configured(
            vec![Secret::new(secret)],
            &config,
            Some("https://hooks.example.com/webhooks/sq"),
            300,
            &id,
            Some(&Locator::Json("/type".into())),
        )
    }

    fn headers_of(pairs: &[(String, String)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (k, v) in pairs {
            headers.append(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        headers
    }

    /// An HMAC computed here, apart from the scheme's own code.
    fn independent<M: Mac + KeyInit>(key: &str, parts: &[&[u8]]) -> Vec<u8> {
        let mut mac = <M as Mac>::new_from_slice(key.as_bytes()).unwrap();
        for part in parts {
            mac.update(part);
        }
        mac.finalize().into_bytes().to_vec()
    }

    fn slack() -> BodyHmac {
        configured(
            HmacConfig::new("X-Slack-Signature")
                .with_prefix("v0=")
                .with_signed("v0:{timestamp}:{body}")
                .with_timestamp(TimestampConfig::header("X-Slack-Request-Timestamp")),
            "8f742231b10e8888abcd99yyyzzz85a5",
            Locator::BodySha256(true),
        )
    }

    const SLACK_BODY: &[u8] = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";

    /// Slack's documented example ("Verifying requests from Slack").
    #[test]
    fn slack_docs_vector() {
        let scheme = slack();
        let mut headers = HeaderMap::new();
        headers.insert(
            "X-Slack-Signature",
            "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"
                .parse()
                .unwrap(),
        );
        headers.insert("X-Slack-Request-Timestamp", "1531420618".parse().unwrap());
        let now = 1_531_420_618 + 10;
        assert_eq!(scheme.precheck(&headers, now), Ok(()));
        assert_eq!(scheme.verify(&headers, SLACK_BODY, now), Ok(()));
        let mut changed = SLACK_BODY.to_vec();
        changed[0] ^= 1;
        assert_eq!(
            scheme.verify(&headers, &changed, now),
            Err(VerifyError::NoMatch)
        );
        // What `sign` makes at the same time is the documented header.
        let signed = scheme.sign(SLACK_BODY, 1_531_420_618, "", "");
        assert_eq!(
            signed,
            [
                (
                    "X-Slack-Signature".to_string(),
                    "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"
                        .to_string()
                ),
                (
                    "X-Slack-Request-Timestamp".to_string(),
                    "1531420618".to_string()
                ),
            ]
        );
    }

    #[test]
    fn a_signed_timestamp_is_checked_both_ways_in_precheck_and_verify() {
        let scheme = slack();
        let t = 1_700_000_000;
        let headers = headers_of(&scheme.sign(b"x=1", t, "", ""));
        for now in [t - 300, t, t + 300] {
            assert_eq!(scheme.precheck(&headers, now), Ok(()));
            assert_eq!(scheme.verify(&headers, b"x=1", now), Ok(()));
        }
        assert!(matches!(
            scheme.precheck(&headers, t + 301),
            Err(VerifyError::TooOld { age: 301, .. })
        ));
        assert!(matches!(
            scheme.verify(&headers, b"x=1", t + 301),
            Err(VerifyError::TooOld { .. })
        ));
        assert!(matches!(
            scheme.precheck(&headers, t - 301),
            Err(VerifyError::InFuture { ahead: 301, .. })
        ));
        assert!(matches!(
            scheme.verify(&headers, b"x=1", t - 301),
            Err(VerifyError::InFuture { .. })
        ));
    }

    #[test]
    fn a_missing_or_malformed_timestamp_is_refused_before_the_body() {
        let scheme = slack();
        let t = 1_700_000_000;
        let mut headers = headers_of(&scheme.sign(b"x=1", t, "", ""));
        headers.remove("X-Slack-Request-Timestamp");
        assert_eq!(
            scheme.precheck(&headers, t),
            Err(VerifyError::MissingHeader("X-Slack-Request-Timestamp"))
        );
        for bad in ["", "-5", "1.5e9", "17000000000000000000000", " 12a"] {
            headers.insert("X-Slack-Request-Timestamp", bad.parse().unwrap());
            assert!(
                matches!(
                    scheme.precheck(&headers, t),
                    Err(VerifyError::MalformedHeader {
                        header: "X-Slack-Request-Timestamp",
                        ..
                    })
                ),
                "{bad}"
            );
        }
    }

    /// A signed timestamp in milliseconds, the method and the public URL signed too
    /// (HubSpot's v3 shape), computed independently.
    #[test]
    fn milliseconds_and_the_public_url() {
        let scheme = configured(
            HmacConfig::new("X-HubSpot-Signature-v3")
                .with_encoding(HmacEncoding::Base64)
                .with_signed("POST{url}{body}{timestamp}")
                .with_timestamp(TimestampConfig::header("X-HubSpot-Request-Timestamp").in_millis()),
            "hubspot_client_secret",
            Locator::Json("/eventId".into()),
        );
        let body = br#"[{"eventId":1}]"#;
        let expected = BASE64.encode(independent::<HmacMac<Sha256>>(
            "hubspot_client_secret",
            &[
                b"POSThttps://hooks.example.com/webhooks/sq",
                body,
                b"1700000000123",
            ],
        ));
        let mut headers = HeaderMap::new();
        headers.insert("X-HubSpot-Signature-v3", expected.parse().unwrap());
        headers.insert(
            "X-HubSpot-Request-Timestamp",
            "1700000000123".parse().unwrap(),
        );
        assert_eq!(scheme.verify(&headers, body, 1_700_000_100), Ok(()));
        assert!(matches!(
            scheme.verify(&headers, body, 1_700_000_301),
            Err(VerifyError::TooOld { .. })
        ));
        let signed = scheme.sign(body, 1_700_000_000, "", "");
        assert!(signed.contains(&(
            "X-HubSpot-Request-Timestamp".to_string(),
            "1700000000000".to_string()
        )));
        assert_eq!(
            scheme.verify(&headers_of(&signed), body, 1_700_000_000),
            Ok(())
        );
    }

    /// Twitch EventSub's shape: the message id, an RFC 3339 timestamp as sent (nanoseconds and
    /// all) and the body, computed independently; the age is checked on the parsed time.
    #[test]
    fn an_rfc3339_timestamp_signed_as_sent() {
        let scheme = configured(
            HmacConfig::new("Twitch-Eventsub-Message-Signature")
                .with_prefix("sha256=")
                .with_signed("{id}{timestamp}{body}")
                .with_timestamp(
                    TimestampConfig::header("Twitch-Eventsub-Message-Timestamp").in_rfc3339(),
                ),
            "twitch_secret_0123456789",
            Locator::Header("Twitch-Eventsub-Message-Id".into()),
        );
        let body = br#"{"subscription":{"type":"channel.follow"}}"#;
        let stamp = "2019-11-16T10:11:12.634234626Z";
        let at = crate::time::parse_rfc3339(stamp).unwrap();
        let expected = format!(
            "sha256={}",
            hex::encode(independent::<HmacMac<Sha256>>(
                "twitch_secret_0123456789",
                &[
                    b"befa7b53-d79d-478f-86b9-120f112b044e",
                    stamp.as_bytes(),
                    body
                ],
            ))
        );
        let mut headers = HeaderMap::new();
        headers.insert(
            "Twitch-Eventsub-Message-Signature",
            expected.parse().unwrap(),
        );
        headers.insert("Twitch-Eventsub-Message-Timestamp", stamp.parse().unwrap());
        headers.insert(
            "Twitch-Eventsub-Message-Id",
            "befa7b53-d79d-478f-86b9-120f112b044e".parse().unwrap(),
        );
        assert_eq!(scheme.precheck(&headers, at + 10), Ok(()));
        assert_eq!(scheme.verify(&headers, body, at + 10), Ok(()));
        assert!(matches!(
            scheme.verify(&headers, body, at + 301),
            Err(VerifyError::TooOld { .. })
        ));
        assert!(matches!(
            scheme.verify(&headers, body, at - 301),
            Err(VerifyError::InFuture { .. })
        ));
        // The text is signed, not the time: the same instant written otherwise does not match.
        headers.insert(
            "Twitch-Eventsub-Message-Timestamp",
            "2019-11-16T10:11:12Z".parse().unwrap(),
        );
        assert_eq!(
            scheme.verify(&headers, body, at + 10),
            Err(VerifyError::NoMatch)
        );
        for bad in [
            "1573899072",
            "2019-11-16",
            "2019-11-16T10:11:12",
            "yesterday",
        ] {
            headers.insert("Twitch-Eventsub-Message-Timestamp", bad.parse().unwrap());
            assert!(
                matches!(
                    scheme.precheck(&headers, at),
                    Err(VerifyError::MalformedHeader {
                        header: "Twitch-Eventsub-Message-Timestamp",
                        ..
                    })
                ),
                "{bad}"
            );
        }
        // `sign` writes RFC 3339 text, and what it signs verifies.
        let signed = scheme.sign(body, 1_700_000_000, "m-1", "");
        assert!(signed.contains(&(
            "Twitch-Eventsub-Message-Timestamp".to_string(),
            "2023-11-14T22:13:20Z".to_string()
        )));
        assert_eq!(
            scheme.verify(&headers_of(&signed), body, 1_700_000_000),
            Ok(())
        );
    }

    /// Square's shape: the notification URL then the body, base64.
    #[test]
    fn url_then_body() {
        let scheme = configured(
            HmacConfig::new("x-square-hmacsha256-signature")
                .with_encoding(HmacEncoding::Base64)
                .with_signed("{url}{body}"),
            "square_signature_key",
            Locator::Json("/event_id".into()),
        );
        let body = br#"{"event_id":"e1","type":"payment.created"}"#;
        let expected = BASE64.encode(independent::<HmacMac<Sha256>>(
            "square_signature_key",
            &[b"https://hooks.example.com/webhooks/sq", body],
        ));
        assert_eq!(scheme.signature(&scheme.keys[0], body), expected);
        let mut headers = HeaderMap::new();
        headers.insert("x-square-hmacsha256-signature", expected.parse().unwrap());
        assert_eq!(scheme.verify(&headers, body, 0), Ok(()));
        assert_eq!(
            scheme.envelope(&headers, body).unwrap().kind,
            "payment.created"
        );
    }

    /// GitHub's legacy `X-Hub-Signature: sha1=…`.
    #[test]
    fn sha1_for_legacy_senders() {
        let scheme = configured(
            HmacConfig::new("X-Hub-Signature")
                .with_algorithm(HmacAlgorithm::Sha1)
                .with_prefix("sha1="),
            "It's a Secret to Everybody",
            Locator::Header("X-GitHub-Delivery".into()),
        );
        let expected = format!(
            "sha1={}",
            hex::encode(independent::<HmacMac<Sha1>>(
                "It's a Secret to Everybody",
                &[b"Hello, World!"]
            ))
        );
        assert_eq!(
            scheme.signature(&scheme.keys[0], b"Hello, World!"),
            expected
        );
        let mut headers = HeaderMap::new();
        headers.insert("X-Hub-Signature", expected.parse().unwrap());
        assert_eq!(scheme.verify(&headers, b"Hello, World!", 0), Ok(()));
        // A SHA-256 signature is the wrong length for this source.
        headers.insert(
            "X-Hub-Signature",
            "sha1=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
                .parse()
                .unwrap(),
        );
        assert!(matches!(
            scheme.precheck(&headers, 0),
            Err(VerifyError::MalformedHeader { .. })
        ));
    }

    fn svix_like() -> BodyHmac {
        configured(
            HmacConfig::new("svix-signature")
                .with_encoding(HmacEncoding::Base64)
                .with_prefix("v1,")
                .with_separator(" ")
                .with_signed("{id}.{timestamp}.{body}")
                .with_timestamp(TimestampConfig::header("svix-timestamp")),
            "svix_like_secret_1",
            Locator::Header("svix-id".into()),
        )
    }

    /// Several signatures in one header: any may match; other versions are skipped; the id
    /// header is signed.
    #[test]
    fn any_of_several_signatures_matches_and_the_id_is_signed() {
        let scheme = svix_like();
        let t = 1_700_000_000;
        let body = br#"{"type":"user.created"}"#;
        let good = BASE64.encode(independent::<HmacMac<Sha256>>(
            "svix_like_secret_1",
            &[b"msg_1.1700000000.", body],
        ));
        let other = BASE64.encode([7u8; 32]);
        let mut headers = HeaderMap::new();
        headers.insert(
            "svix-signature",
            format!("v2,abc v1,{other}  v1,{good}").parse().unwrap(),
        );
        headers.insert("svix-timestamp", "1700000000".parse().unwrap());
        headers.insert("svix-id", "msg_1".parse().unwrap());
        assert_eq!(scheme.verify(&headers, body, t), Ok(()));
        headers.insert("svix-id", "msg_2".parse().unwrap());
        assert_eq!(scheme.verify(&headers, body, t), Err(VerifyError::NoMatch));
        headers.remove("svix-id");
        assert_eq!(
            scheme.precheck(&headers, t),
            Err(VerifyError::MissingHeader("svix-id"))
        );
        // Only other versions: nothing to check.
        headers.insert("svix-id", "msg_1".parse().unwrap());
        headers.insert("svix-signature", "v2,abc".parse().unwrap());
        assert!(matches!(
            scheme.precheck(&headers, t),
            Err(VerifyError::MalformedHeader { .. })
        ));
        // What sign makes, verify accepts.
        let signed = headers_of(&scheme.sign(body, t, "msg_9", "user.created"));
        assert_eq!(scheme.verify(&signed, body, t), Ok(()));
    }

    #[test]
    fn more_signatures_than_the_cap_are_refused_before_the_body() {
        let scheme = svix_like();
        let one = format!("v1,{}", BASE64.encode([0u8; 32]));
        let mut headers = HeaderMap::new();
        headers.insert("svix-timestamp", "1700000000".parse().unwrap());
        headers.insert("svix-id", "msg_1".parse().unwrap());
        headers.insert(
            "svix-signature",
            vec![one.as_str(); MAX_SIGNATURES]
                .join(" ")
                .parse()
                .unwrap(),
        );
        assert_eq!(scheme.precheck(&headers, 1_700_000_000), Ok(()));
        headers.insert(
            "svix-signature",
            vec![one.as_str(); MAX_SIGNATURES + 1]
                .join(" ")
                .parse()
                .unwrap(),
        );
        assert_eq!(
            scheme.precheck(&headers, 1_700_000_000),
            Err(VerifyError::TooManySignatures {
                header: "svix-signature",
                max: MAX_SIGNATURES
            })
        );
    }

    #[test]
    fn a_badly_encoded_or_wrong_signature_is_refused() {
        let scheme = slack();
        let t = 1_700_000_000;
        let mut headers = headers_of(&scheme.sign(b"x=1", t, "", ""));
        for bad in ["v0=zz", "v0=", "v1=00", "a2114d57"] {
            headers.insert("X-Slack-Signature", bad.parse().unwrap());
            assert!(
                matches!(
                    scheme.precheck(&headers, t),
                    Err(VerifyError::MalformedHeader { .. })
                ),
                "{bad}"
            );
        }
        headers.insert(
            "X-Slack-Signature",
            format!("v0={}", hex::encode([1u8; 32])).parse().unwrap(),
        );
        assert_eq!(scheme.precheck(&headers, t), Ok(()));
        assert_eq!(
            scheme.verify(&headers, b"x=1", t),
            Err(VerifyError::NoMatch)
        );
        headers.remove("X-Slack-Signature");
        assert_eq!(
            scheme.precheck(&headers, t),
            Err(VerifyError::MissingHeader("X-Slack-Signature"))
        );
    }

    /// The timestamp inside the signature header: Stripe's `t=…,v1=…` and Paddle's
    /// `ts=…;h1=…`, as data.
    #[test]
    fn a_timestamp_part_inside_the_signature_header() {
        let paddle = configured(
            HmacConfig::new("Paddle-Signature")
                .with_prefix("h1=")
                .with_separator(";")
                .with_signed("{timestamp}:{body}")
                .with_timestamp(TimestampConfig::part("ts")),
            "pdl_ntfset_secret_1",
            Locator::Json("/event_id".into()),
        );
        let body = br#"{"event_id":"evt_1","event_type":"transaction.paid"}"#;
        let h1 = hex::encode(independent::<HmacMac<Sha256>>(
            "pdl_ntfset_secret_1",
            &[b"1700000000:", body],
        ));
        let mut headers = HeaderMap::new();
        headers.insert(
            "Paddle-Signature",
            format!("ts=1700000000;h1={h1}").parse().unwrap(),
        );
        assert_eq!(paddle.verify(&headers, body, 1_700_000_000), Ok(()));
        assert!(matches!(
            paddle.precheck(&headers, 1_700_000_301),
            Err(VerifyError::TooOld { .. })
        ));
        let signed = paddle.sign(body, 1_700_000_000, "", "");
        assert_eq!(signed[0].1, format!("ts=1700000000;h1={h1}"));
        for (bad, why) in [
            (format!("h1={h1}"), "no timestamp"),
            (format!("ts=1;ts=2;h1={h1}"), "two timestamps"),
            (format!("ts=soon;h1={h1}"), "not a number"),
        ] {
            headers.insert("Paddle-Signature", bad.parse().unwrap());
            assert!(
                matches!(
                    paddle.precheck(&headers, 1_700_000_000),
                    Err(VerifyError::MalformedHeader {
                        header: "Paddle-Signature",
                        ..
                    })
                ),
                "{why}"
            );
        }
        let stripe_like = configured(
            HmacConfig::new("X-Signature")
                .with_prefix("v1=")
                .with_separator(",")
                .with_signed("{timestamp}.{body}")
                .with_timestamp(TimestampConfig::part("t")),
            "whsec_stripe_like_1",
            Locator::Json("/id".into()),
        );
        let v1 = hex::encode(independent::<HmacMac<Sha256>>(
            "whsec_stripe_like_1",
            &[b"1700000000.", body],
        ));
        let mut headers = HeaderMap::new();
        headers.insert(
            "X-Signature",
            format!("t=1700000000,v0=abc,v1={v1}").parse().unwrap(),
        );
        assert_eq!(stripe_like.verify(&headers, body, 1_700_000_000), Ok(()));
    }

    /// `{ body_sha256 = true }`: the id is the body's hex SHA-256, so the same bytes are the
    /// same event and any other bytes another.
    #[test]
    fn the_id_may_be_the_bodys_sha256() {
        let scheme = configured(
            HmacConfig::new("X-Signature"),
            "lemon_squeezy_secret",
            Locator::BodySha256(true),
        );
        let body = br#"{"type":"order_created"}"#;
        let envelope = scheme.envelope(&HeaderMap::new(), body).unwrap();
        // sha256sum of the same bytes.
        assert_eq!(
            envelope.id,
            "067ab005c40690cea3a1932eca7d008375de2489807a33b0b253b37f737472dd"
        );
        assert_eq!(envelope.kind, "order_created");
        let other = scheme
            .envelope(&HeaderMap::new(), br#"{"type":"order_created" }"#)
            .unwrap();
        assert_ne!(other.id, envelope.id);
        // No id header is sent for it.
        assert_eq!(scheme.sign(body, 0, "ignored", "").len(), 1);
    }
}
