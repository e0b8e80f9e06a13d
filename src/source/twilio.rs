//! Twilio's request signature (<https://www.twilio.com/docs/usage/webhooks/webhooks-security>):
//! `X-Twilio-Signature` is the base64 HMAC-SHA1, under the account's auth token, of the full
//! URL Twilio called (scheme, host, path and query) followed by, for a form body
//! (`application/x-www-form-urlencoded`, what messaging and voice webhooks send), each form
//! parameter's name and value, sorted by name (then by value, as Twilio's SDKs do for a
//! repeated name), with no separators. For a JSON body Twilio puts `bodySHA256=<hex SHA-256
//! of the body>` in the URL's query and signs the URL alone: both the signature and that hash
//! are checked.
//!
//! The URL signed is the source's `public_url` (the URL set at Twilio, without a query; behind
//! a proxy the URL a request reaches is not the one signed) followed by the request's own query
//! as received. Twilio signs no timestamp: the ledger claim is the only replay protection. A
//! form signature covers the decoded parameters, not the body's bytes (another order or
//! encoding of the same parameters verifies): the event id is what makes a resend a duplicate.
//!
//! The envelope: the id is the `I-Twilio-Idempotency-Token` header (the same on Twilio's
//! retries); else the form's `MessageSid`, `CallSid` or `SmsSid` (the first present), followed
//! by `.` and the status when there is one (the callbacks of one message or call share its
//! sid); else the JSON body's `/sid`. The type is the form's `MessageStatus` or `SmsStatus` as
//! `message.<status>`, or `CallStatus` as `call.<status>`; else `twilio`.
//!
//! `sign` (for `hookledger send`) signs the body as form parameters, with the `public_url` as
//! the URL (send posts without a query), and sends the event id as `I-Twilio-Idempotency-Token`;
//! a JSON body would need `bodySHA256` in the URL, which `send` does not add.

use std::borrow::Cow;

use axum::http::HeaderMap;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha1::Sha1;
use sha2::{Digest, Sha256};

use super::{header, Envelope, Scheme, VerifyError};
use crate::config::Secret;
use crate::event::{check_id, ParseError};

pub(crate) const SIGNATURE: &str = "X-Twilio-Signature";
pub(crate) const IDEMPOTENCY: &str = "I-Twilio-Idempotency-Token";
const BODY_SHA256: &str = "bodySHA256";

/// Twilio's signature, with the account's auth tokens (any may match) and the URL set at
/// Twilio.
pub(crate) struct Twilio {
    pub(crate) secrets: Vec<Secret>,
    pub(crate) public_url: String,
}

/// The form parameters of `bytes`, sorted by name, then value.
fn sorted_params(bytes: &[u8]) -> Vec<(Cow<'_, str>, Cow<'_, str>)> {
    let mut params: Vec<_> = url::form_urlencoded::parse(bytes).collect();
    params.sort();
    params
}

/// The base64 HMAC-SHA1 under `key` of `url` followed by each of `params`' name and value.
pub(crate) fn compute(key: &Secret, url: &str, params: &[(Cow<'_, str>, Cow<'_, str>)]) -> Vec<u8> {
    let mut mac = Hmac::<Sha1>::new_from_slice(key.expose().as_bytes()).expect("any key length");
    mac.update(url.as_bytes());
    for (name, value) in params {
        mac.update(name.as_bytes());
        mac.update(value.as_bytes());
    }
    mac.finalize().into_bytes().to_vec()
}

impl Twilio {
    /// The signature from the headers, decoded.
    fn signature(&self, headers: &HeaderMap) -> Result<Vec<u8>, VerifyError> {
        let value = header(headers, SIGNATURE).ok_or(VerifyError::MissingHeader(SIGNATURE))?;
        let malformed = |reason| VerifyError::MalformedHeader {
            header: SIGNATURE,
            reason,
        };
        // One signature: 28 characters of base64.
        if value.len() > 64 {
            return Err(malformed("too long for one base64 HMAC-SHA1"));
        }
        let decoded = BASE64
            .decode(value.trim_ascii())
            .map_err(|_| malformed("not base64"))?;
        if decoded.len() != 20 {
            return Err(malformed("not a base64 HMAC-SHA1 (20 bytes)"));
        }
        Ok(decoded)
    }

    /// The URL signed: `public_url` and the request's query as received.
    fn url(&self, query: Option<&str>) -> String {
        match query {
            Some(query) => format!("{}?{query}", self.public_url),
            None => self.public_url.clone(),
        }
    }
}

impl Scheme for Twilio {
    fn precheck(&self, headers: &HeaderMap, _now: i64) -> Result<(), VerifyError> {
        self.signature(headers).map(drop)
    }

    /// Without the request's query: as a request to `public_url` itself.
    fn verify(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), VerifyError> {
        self.verify_request(headers, None, body, now)
    }

    fn verify_request(
        &self,
        headers: &HeaderMap,
        query: Option<&str>,
        body: &[u8],
        _now: i64,
    ) -> Result<(), VerifyError> {
        let signature = self.signature(headers)?;
        let url = self.url(query);
        let body_sha256 = query.and_then(|q| {
            url::form_urlencoded::parse(q.as_bytes())
                .find(|(name, _)| name == BODY_SHA256)
                .map(|(_, value)| value.into_owned())
        });
        let params = match &body_sha256 {
            // A JSON body: the URL alone is signed, and it carries the body's hash.
            Some(_) => Vec::new(),
            None => sorted_params(body),
        };
        let matches = self.secrets.iter().any(|key| {
            let mut mac =
                Hmac::<Sha1>::new_from_slice(key.expose().as_bytes()).expect("any key length");
            mac.update(url.as_bytes());
            for (name, value) in &params {
                mac.update(name.as_bytes());
                mac.update(value.as_bytes());
            }
            mac.verify_slice(&signature).is_ok()
        });
        if !matches {
            return Err(VerifyError::NoMatch);
        }
        if let Some(expected) = body_sha256 {
            let actual = hex::encode(Sha256::digest(body));
            if !expected.eq_ignore_ascii_case(&actual) {
                return Err(VerifyError::NoMatch);
            }
        }
        Ok(())
    }

    fn envelope(&self, headers: &HeaderMap, body: &[u8]) -> Result<Envelope, ParseError> {
        let token = header(headers, IDEMPOTENCY)
            .and_then(|v| std::str::from_utf8(v).ok())
            .map(str::to_string);
        let (id, kind) = if body.trim_ascii_start().starts_with(b"{") {
            let sid = serde_json::from_slice::<serde_json::Value>(body)
                .ok()
                .and_then(|v| {
                    v.pointer("/sid")
                        .and_then(|s| s.as_str().map(str::to_string))
                });
            (token.or(sid), "twilio".to_string())
        } else {
            let params: Vec<(Cow<'_, str>, Cow<'_, str>)> =
                url::form_urlencoded::parse(body).collect();
            let field = |names: &[&str]| {
                names.iter().find_map(|name| {
                    params
                        .iter()
                        .find(|(n, v)| n == name && !v.is_empty())
                        .map(|(_, v)| v.to_string())
                })
            };
            let status = field(&["MessageStatus", "SmsStatus"])
                .map(|s| format!("message.{s}"))
                .or_else(|| field(&["CallStatus"]).map(|s| format!("call.{s}")));
            let sid = field(&["MessageSid", "CallSid", "SmsSid"]).map(|sid| {
                match status.as_deref().and_then(|s| s.split_once('.')) {
                    Some((_, s)) => format!("{sid}.{s}"),
                    None => sid,
                }
            });
            (token.or(sid), status.unwrap_or_else(|| "twilio".into()))
        };
        let id = id.ok_or_else(|| {
            ParseError::Missing(format!(
                "{IDEMPOTENCY} header, MessageSid, CallSid or SmsSid parameter, or `/sid` in the body"
            ))
        })?;
        check_id("id", &id)?;
        check_id("type", &kind)?;
        Ok(Envelope {
            id,
            kind,
            created: None,
        })
    }

    fn sign(&self, body: &[u8], _now: i64, id: &str, _kind: &str) -> Vec<(String, String)> {
        let signature = compute(&self.secrets[0], &self.public_url, &sorted_params(body));
        vec![
            (SIGNATURE.to_string(), BASE64.encode(signature)),
            (IDEMPOTENCY.to_string(), id.to_string()),
            (
                "Content-Type".to_string(),
                "application/x-www-form-urlencoded".to_string(),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn twilio(token: &str, public_url: &str) -> Twilio {
        Twilio {
            secrets: vec![Secret::new(token)],
            public_url: public_url.into(),
        }
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    /// The example of Twilio's "Webhooks security" page.
    const DOCS_BODY: &[u8] =
        b"CallSid=CA1234567890ABCDE&Caller=%2B12349013030&Digits=1234&From=%2B12349013030&To=%2B18005551212";
    const DOCS_SIGNATURE: &str = "0/KCTR6DLpKmkAf8muzZqo1nDgQ=";

    #[test]
    fn twilios_documented_example_verifies() {
        let source = twilio("12345", "https://mycompany.com/myapp.php");
        let params = sorted_params(DOCS_BODY);
        let url = "https://mycompany.com/myapp.php?foo=1&bar=2";
        let signature = compute(&Secret::new("12345"), url, &params);
        assert_eq!(BASE64.encode(signature), DOCS_SIGNATURE);
        // The same parameters in another order and encoding are the same signed content.
        let shuffled: &[u8] = b"To=%2B18005551212&From=%2b12349013030&Digits=1234&Caller=%2B12349013030&CallSid=CA1234567890ABCDE";
        let h = headers(&[(SIGNATURE, DOCS_SIGNATURE)]);
        assert_eq!(source.precheck(&h, 0), Ok(()));
        for body in [DOCS_BODY, shuffled] {
            assert_eq!(
                source.verify_request(&h, Some("foo=1&bar=2"), body, 0),
                Ok(())
            );
        }
    }

    #[test]
    fn a_missing_or_malformed_signature_is_refused_before_the_body() {
        let source = twilio("12345", "https://mycompany.com/myapp.php");
        assert_eq!(
            source.precheck(&HeaderMap::new(), 0),
            Err(VerifyError::MissingHeader(SIGNATURE))
        );
        for bad in ["not base64!", "c2hvcnQ="] {
            assert!(matches!(
                source.precheck(&headers(&[(SIGNATURE, bad)]), 0),
                Err(VerifyError::MalformedHeader { .. })
            ));
        }
    }

    #[test]
    fn a_wrong_token_is_refused() {
        let source = twilio("54321", "https://mycompany.com/myapp.php");
        let h = headers(&[(SIGNATURE, DOCS_SIGNATURE)]);
        assert_eq!(
            source.verify_request(&h, Some("foo=1&bar=2"), DOCS_BODY, 0),
            Err(VerifyError::NoMatch)
        );
    }

    #[test]
    fn a_changed_parameter_url_or_query_is_refused() {
        let source = twilio("12345", "https://mycompany.com/myapp.php");
        let h = headers(&[(SIGNATURE, DOCS_SIGNATURE)]);
        let changed = String::from_utf8_lossy(DOCS_BODY).replace("Digits=1234", "Digits=1235");
        for (query, body) in [
            (Some("foo=1&bar=2"), changed.as_bytes()),
            (Some("foo=1&bar=3"), DOCS_BODY),
            (None, DOCS_BODY),
        ] {
            assert_eq!(
                source.verify_request(&h, query, body, 0),
                Err(VerifyError::NoMatch),
                "{query:?}"
            );
        }
        let elsewhere = twilio("12345", "https://mycompany.com/other.php");
        assert_eq!(
            elsewhere.verify_request(&h, Some("foo=1&bar=2"), DOCS_BODY, 0),
            Err(VerifyError::NoMatch)
        );
    }

    #[test]
    fn a_json_body_is_checked_against_the_signed_body_sha256() {
        let source = twilio("12345", "https://mycompany.com/myapp.php");
        let body = br#"{"sid":"EV0123456789abcdef0123456789abcdef","status":"ok"}"#;
        let query = format!("{BODY_SHA256}={}", hex::encode(Sha256::digest(body)));
        let url = format!("https://mycompany.com/myapp.php?{query}");
        let signature = BASE64.encode(compute(&Secret::new("12345"), &url, &[]));
        let h = headers(&[(SIGNATURE, &signature)]);
        assert_eq!(source.verify_request(&h, Some(&query), body, 0), Ok(()));
        let mut changed = body.to_vec();
        changed[10] ^= 0x01;
        assert_eq!(
            source.verify_request(&h, Some(&query), &changed, 0),
            Err(VerifyError::NoMatch)
        );
        let envelope = source.envelope(&h, body).unwrap();
        assert_eq!(envelope.id, "EV0123456789abcdef0123456789abcdef");
        assert_eq!(envelope.kind, "twilio");
    }

    #[test]
    fn what_sign_makes_verifies_and_the_envelope_reads_the_callback() {
        let source = twilio(
            "an-auth-token-of-32-characters-x",
            "https://h.example/webhooks/twilio",
        );
        let body = b"MessageSid=SM0123&MessageStatus=delivered&AccountSid=AC0123";
        let signed = source.sign(body, 0, "hl_0123", "");
        let mut h = HeaderMap::new();
        for (name, value) in &signed {
            h.insert(
                axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        assert_eq!(source.verify_request(&h, None, body, 0), Ok(()));
        let envelope = source.envelope(&h, body).unwrap();
        assert_eq!(
            (envelope.id.as_str(), envelope.kind.as_str()),
            ("hl_0123", "message.delivered")
        );
        let bare = source.envelope(&HeaderMap::new(), body).unwrap();
        assert_eq!(bare.id, "SM0123.delivered");
        let call = source
            .envelope(&HeaderMap::new(), b"CallSid=CA0123&CallStatus=completed")
            .unwrap();
        assert_eq!(
            (call.id.as_str(), call.kind.as_str()),
            ("CA0123.completed", "call.completed")
        );
        assert!(source.envelope(&HeaderMap::new(), b"Foo=1").is_err());
    }
}
