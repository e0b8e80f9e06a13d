//! Schemes that send the shared secret itself rather than a signature: a token in a header
//! (`token`: GitLab's `X-Gitlab-Token`) and HTTP Basic credentials (`basic`: Postmark, each
//! secret `user:password`). Nothing ties the secret to the body, and nothing is timed: anyone
//! who sees one request (a proxy's log) can send any body until the secret is rotated, and
//! the ledger claim is the only replay protection. Prefer a signing scheme where the sender
//! offers one.
//!
//! The presented value and each secret are compared as SHA-256 digests, in constant time and
//! against every secret, so neither the comparison's time nor its length says how much of a
//! guess was right.

use axum::http::HeaderMap;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use sha2::{Digest, Sha256};

use super::hmac::{headers_at, read_envelope, Place};
use super::{header, Envelope, Scheme, VerifyError};
use crate::config::Secret;
use crate::event::ParseError;

/// The header of HTTP Basic credentials.
pub(crate) const AUTHORIZATION: &str = "Authorization";

/// Whether `presented` is one of `keys`, every key compared in constant time.
fn matches_any(keys: &[Secret], presented: &[u8]) -> bool {
    let presented = Sha256::digest(presented);
    keys.iter().fold(false, |m, key| {
        m | constant_time_eq::constant_time_eq(&Sha256::digest(key.expose().as_bytes()), &presented)
    })
}

/// Headers naming the event `id` and type `kind`, where they are headers.
fn envelope_headers(
    id: &Place,
    kind: &Place,
    id_value: &str,
    kind_value: &str,
) -> Vec<(String, String)> {
    headers_at([(Some(id), id_value), (Some(kind), kind_value)])
}

/// A shared token in a header.
pub(crate) struct Token {
    pub(crate) keys: Vec<Secret>,
    pub(crate) header: &'static str,
    pub(crate) id: Place,
    pub(crate) kind: Place,
}

impl Token {
    fn presented<'h>(&self, headers: &'h HeaderMap) -> Result<&'h [u8], VerifyError> {
        match header(headers, self.header) {
            None => Err(VerifyError::MissingHeader(self.header)),
            Some(v) if v.trim_ascii().is_empty() => Err(VerifyError::MalformedHeader {
                header: self.header,
                reason: "it is empty",
            }),
            Some(v) => Ok(v.trim_ascii()),
        }
    }
}

impl Scheme for Token {
    fn precheck(&self, headers: &HeaderMap, _now: i64) -> Result<(), VerifyError> {
        self.presented(headers).map(drop)
    }

    fn verify(&self, headers: &HeaderMap, _body: &[u8], _now: i64) -> Result<(), VerifyError> {
        matches_any(&self.keys, self.presented(headers)?)
            .then_some(())
            .ok_or(VerifyError::NoMatch)
    }

    fn envelope(&self, headers: &HeaderMap, body: &[u8]) -> Result<Envelope, ParseError> {
        envelope_at(headers, body, &self.id, &self.kind)
    }

    fn sign(&self, _body: &[u8], _now: i64, id: &str, kind: &str) -> Vec<(String, String)> {
        let mut headers = vec![(self.header.to_string(), self.keys[0].expose().to_string())];
        headers.extend(envelope_headers(&self.id, &self.kind, id, kind));
        headers
    }
}

/// The id and type of a request whose credential proves only who sent it: where the source
/// says they are, and nothing of them signed.
fn envelope_at(
    headers: &HeaderMap,
    body: &[u8],
    id: &Place,
    kind: &Place,
) -> Result<Envelope, ParseError> {
    read_envelope(headers, body, std::slice::from_ref(id), kind, false, None)
}

/// HTTP Basic credentials; each secret is `user:password`.
pub(crate) struct Basic {
    pub(crate) keys: Vec<Secret>,
    pub(crate) id: Place,
    pub(crate) kind: Place,
}

impl Basic {
    /// The decoded `user:password` of the request.
    fn presented(headers: &HeaderMap) -> Result<Vec<u8>, VerifyError> {
        let malformed = |reason| VerifyError::MalformedHeader {
            header: AUTHORIZATION,
            reason,
        };
        let value =
            header(headers, AUTHORIZATION).ok_or(VerifyError::MissingHeader(AUTHORIZATION))?;
        let value = value.trim_ascii();
        let (scheme, credentials) = value
            .iter()
            .position(|&b| b == b' ')
            .map(|at| value.split_at(at))
            .ok_or(malformed("not Basic credentials"))?;
        if !scheme.eq_ignore_ascii_case(b"basic") {
            return Err(malformed("not Basic credentials"));
        }
        let decoded = BASE64
            .decode(credentials.trim_ascii())
            .map_err(|_| malformed("the credentials are not base64"))?;
        if !decoded.contains(&b':') {
            return Err(malformed("the credentials are not user:password"));
        }
        Ok(decoded)
    }
}

impl Scheme for Basic {
    fn precheck(&self, headers: &HeaderMap, _now: i64) -> Result<(), VerifyError> {
        Basic::presented(headers).map(drop)
    }

    fn verify(&self, headers: &HeaderMap, _body: &[u8], _now: i64) -> Result<(), VerifyError> {
        matches_any(&self.keys, &Basic::presented(headers)?)
            .then_some(())
            .ok_or(VerifyError::NoMatch)
    }

    fn envelope(&self, headers: &HeaderMap, body: &[u8]) -> Result<Envelope, ParseError> {
        envelope_at(headers, body, &self.id, &self.kind)
    }

    fn sign(&self, _body: &[u8], _now: i64, id: &str, kind: &str) -> Vec<(String, String)> {
        let credentials = BASE64.encode(self.keys[0].expose().as_bytes());
        let mut headers = vec![(AUTHORIZATION.to_string(), format!("Basic {credentials}"))];
        headers.extend(envelope_headers(&self.id, &self.kind, id, kind));
        headers
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::testing::refuses_missing_and_malformed;

    fn headers_of(pairs: &[(String, String)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (k, v) in pairs {
            headers.insert(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        headers
    }

    fn gitlab() -> Token {
        Token {
            keys: vec![
                Secret::new("gitlab_token_old"),
                Secret::new("gitlab_token_new"),
            ],
            header: "X-Gitlab-Token",
            id: Place::Header("X-Gitlab-Event-UUID"),
            kind: Place::Header("X-Gitlab-Event"),
        }
    }

    #[test]
    fn a_token_matches_any_secret_and_names_the_event_from_headers() {
        let scheme = gitlab();
        let mut headers = headers_of(&scheme.sign(b"{}", 0, "uuid-1", "Push Hook"));
        assert_eq!(headers["X-Gitlab-Token"], "gitlab_token_old");
        assert_eq!(scheme.precheck(&headers, 0), Ok(()));
        assert_eq!(scheme.verify(&headers, b"{}", 0), Ok(()));
        let envelope = scheme.envelope(&headers, b"{}").unwrap();
        assert_eq!(
            (envelope.id.as_str(), envelope.kind.as_str()),
            ("uuid-1", "Push Hook")
        );
        headers.insert("X-Gitlab-Token", "gitlab_token_new".parse().unwrap());
        assert_eq!(scheme.verify(&headers, b"{}", 0), Ok(()));
    }

    /// The gitlab preset's id: the `Idempotency-Key` GitLab keeps across resends, else the
    /// UUID (GitLab before 17.4).
    #[test]
    fn an_id_from_a_list_of_places_is_the_first_the_request_has() {
        let scheme = Token {
            id: Place::FirstOf(vec![
                Place::Header("Idempotency-Key"),
                Place::Header("X-Gitlab-Event-UUID"),
            ]),
            ..gitlab()
        };
        let mut headers = headers_of(&scheme.sign(b"{}", 0, "key-1", "Push Hook"));
        assert_eq!(headers["Idempotency-Key"], "key-1");
        headers.insert("X-Gitlab-Event-UUID", "uuid-2".parse().unwrap());
        assert_eq!(scheme.envelope(&headers, b"{}").unwrap().id, "key-1");
        headers.remove("Idempotency-Key");
        assert_eq!(scheme.envelope(&headers, b"{}").unwrap().id, "uuid-2");
        headers.remove("X-Gitlab-Event-UUID");
        assert_eq!(
            scheme.envelope(&headers, b"{}").unwrap_err(),
            ParseError::Missing("Idempotency-Key header or X-Gitlab-Event-UUID header".into())
        );
    }

    #[test]
    fn a_wrong_empty_or_missing_token_is_refused() {
        let scheme = gitlab();
        let mut headers = HeaderMap::new();
        assert_eq!(
            scheme.precheck(&headers, 0),
            Err(VerifyError::MissingHeader("X-Gitlab-Token"))
        );
        headers.insert("X-Gitlab-Token", " ".parse().unwrap());
        assert!(matches!(
            scheme.precheck(&headers, 0),
            Err(VerifyError::MalformedHeader { .. })
        ));
        for wrong in ["gitlab_token_ol", "gitlab_token_old_", "GITLAB_TOKEN_OLD"] {
            headers.insert("X-Gitlab-Token", wrong.parse().unwrap());
            assert_eq!(
                scheme.verify(&headers, b"{}", 0),
                Err(VerifyError::NoMatch),
                "{wrong}"
            );
        }
    }

    fn postmark() -> Basic {
        Basic {
            keys: vec![Secret::new("postmark:correct horse battery")],
            id: Place::Json("/MessageID".into()),
            kind: Place::Json("/RecordType".into()),
        }
    }

    #[test]
    fn basic_credentials_match_user_and_password() {
        let scheme = postmark();
        let signed = scheme.sign(b"{}", 0, "", "");
        // RFC 7617: base64 of `user:password`, computed independently.
        assert_eq!(
            signed,
            [(
                "Authorization".to_string(),
                "Basic cG9zdG1hcms6Y29ycmVjdCBob3JzZSBiYXR0ZXJ5".to_string()
            )]
        );
        let mut headers = headers_of(&signed);
        assert_eq!(scheme.precheck(&headers, 0), Ok(()));
        assert_eq!(scheme.verify(&headers, b"{}", 0), Ok(()));
        headers.insert(
            AUTHORIZATION,
            "basic cG9zdG1hcms6Y29ycmVjdCBob3JzZSBiYXR0ZXJ5"
                .parse()
                .unwrap(),
        );
        assert_eq!(
            scheme.verify(&headers, b"{}", 0),
            Ok(()),
            "the scheme is case-insensitive"
        );
        let body =
            br#"{"RecordType":"Delivery","MessageID":"883953f4-6105-42a2-a16a-77a8eac79483"}"#;
        let envelope = scheme.envelope(&headers, body).unwrap();
        assert_eq!(
            (envelope.id.as_str(), envelope.kind.as_str()),
            ("883953f4-6105-42a2-a16a-77a8eac79483", "Delivery")
        );
    }

    #[test]
    fn missing_malformed_or_wrong_basic_credentials_are_refused() {
        let scheme = postmark();
        refuses_missing_and_malformed(
            &scheme,
            AUTHORIZATION,
            &[
                "Bearer cG9zdG1hcms6eA==",
                "Basic",
                "Basic !!!",
                // `postmark` alone: no `:`.
                "Basic cG9zdG1hcms=",
            ],
        );
        let mut headers = HeaderMap::new();
        // `postmark:wrong`.
        headers.insert(AUTHORIZATION, "Basic cG9zdG1hcms6d3Jvbmc=".parse().unwrap());
        assert_eq!(scheme.precheck(&headers, 0), Ok(()));
        assert_eq!(scheme.verify(&headers, b"{}", 0), Err(VerifyError::NoMatch));
    }
}
