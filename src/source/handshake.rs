//! Handshakes: the challenge a sender posts to a URL before it delivers there (Slack's
//! `url_verification`, Zoom's `endpoint.url_validation`, Twitch EventSub's
//! `webhook_callback_verification`). Read only from a request whose signature verified; the
//! answer claims nothing.

use axum::http::HeaderMap;
use hmac::Mac;
use serde::Deserialize;

use crate::config::{Handshake, Secret};
use crate::event::ParseError;

/// Twitch names the kind of each message in this header.
const TWITCH_MESSAGE_TYPE: &str = "twitch-eventsub-message-type";

/// The answer to a handshake: a 200 with `body` as `content_type`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Challenge {
    /// The handshake's type, for the log and the counts (`url_verification`).
    pub(crate) kind: &'static str,
    pub(crate) content_type: &'static str,
    pub(crate) body: String,
}

/// A source's handshake, with the secret Zoom's answer is made with.
pub(crate) struct Handshaker {
    handshake: Handshake,
    secret: Secret,
}

/// What the handshakes' bodies hold; every field optional, for events look alike.
#[derive(Deserialize)]
struct Fields {
    #[serde(rename = "type")]
    kind: Option<serde_json::Value>,
    event: Option<serde_json::Value>,
    challenge: Option<serde_json::Value>,
    payload: Option<Payload>,
}

#[derive(Deserialize)]
struct Payload {
    #[serde(rename = "plainToken")]
    plain_token: Option<serde_json::Value>,
}

impl Handshaker {
    /// `handshake`, answered (Zoom) with `secret`, the source's first.
    pub(crate) fn new(handshake: Handshake, secret: Secret) -> Handshaker {
        Handshaker { handshake, secret }
    }

    /// The answer when the verified request is a handshake; `None` when it is an event.
    /// A handshake without the value to answer with is the sender's fault.
    pub(crate) fn answer(
        &self,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Option<Challenge>, ParseError> {
        let message_type = headers.get(TWITCH_MESSAGE_TYPE).map(|v| v.as_bytes());
        if self.handshake == Handshake::Twitch
            && message_type != Some(b"webhook_callback_verification")
        {
            // Twitch says which messages are handshakes: the others' bodies are not read here.
            return Ok(None);
        }
        // A body that is not a JSON object is no handshake: the event path says what is wrong.
        let Ok(fields) = serde_json::from_slice::<Fields>(body) else {
            return Ok(None);
        };
        let is =
            |v: &Option<serde_json::Value>, s: &str| v.as_ref().and_then(|v| v.as_str()) == Some(s);
        let text = |v: Option<serde_json::Value>, what: &str| match v {
            Some(serde_json::Value::String(s)) => Ok(s),
            _ => Err(ParseError::Missing(format!(
                "{what} (a string) in the body"
            ))),
        };
        match self.handshake {
            Handshake::Slack if is(&fields.kind, "url_verification") => {
                let challenge = text(fields.challenge, "`challenge`")?;
                Ok(Some(Challenge {
                    kind: "url_verification",
                    content_type: "application/json",
                    body: serde_json::json!({ "challenge": challenge }).to_string(),
                }))
            }
            Handshake::Zoom if is(&fields.event, "endpoint.url_validation") => {
                let token = fields.payload.and_then(|p| p.plain_token);
                let token = text(token, "`payload.plainToken`")?;
                let encrypted = self.zoom_token(&token);
                Ok(Some(Challenge {
                    kind: "endpoint.url_validation",
                    content_type: "application/json",
                    body: serde_json::json!({ "plainToken": token, "encryptedToken": encrypted })
                        .to_string(),
                }))
            }
            Handshake::Twitch => {
                let challenge = text(fields.challenge, "`challenge`")?;
                Ok(Some(Challenge {
                    kind: "webhook_callback_verification",
                    content_type: "text/plain",
                    body: challenge,
                }))
            }
            _ => Ok(None),
        }
    }

    /// Zoom's `encryptedToken`: hex(HMAC-SHA256(secret token, plainToken)).
    fn zoom_token(&self, plain: &str) -> String {
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(self.secret.expose().as_bytes())
            .expect("HMAC takes any key length");
        mac.update(plain.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn of(handshake: Handshake) -> Handshaker {
        Handshaker::new(handshake, Secret::new("zoom_secret_token"))
    }

    #[test]
    fn slack_url_verification_is_answered_with_its_challenge() {
        let body = br#"{"token":"t","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
        let answer = of(Handshake::Slack)
            .answer(&HeaderMap::new(), body)
            .unwrap();
        let answer = answer.expect("a handshake");
        assert_eq!(answer.kind, "url_verification");
        assert_eq!(
            answer.body,
            r#"{"challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}"#
        );
        let event = br#"{"type":"event_callback","event_id":"Ev1","event":{"type":"message"}}"#;
        assert_eq!(
            of(Handshake::Slack).answer(&HeaderMap::new(), event),
            Ok(None)
        );
        let empty = br#"{"type":"url_verification"}"#;
        assert!(of(Handshake::Slack)
            .answer(&HeaderMap::new(), empty)
            .is_err());
    }

    #[test]
    fn zoom_url_validation_is_answered_with_the_token_and_its_hmac() {
        let body = br#"{"payload":{"plainToken":"qgg8vlvZRS6UYooatFL8Aw"},"event_ts":1654503849680,"event":"endpoint.url_validation"}"#;
        let answer = of(Handshake::Zoom)
            .answer(&HeaderMap::new(), body)
            .unwrap()
            .expect("a handshake");
        // hex(HMAC-SHA256("zoom_secret_token", "qgg8vlvZRS6UYooatFL8Aw")), by Python's hmac.
        let expected = "bd48235863f4a6323ccc4963c594908b7c97f88b4a6a95278f4f093690b12726";
        let value: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
        assert_eq!(value["plainToken"], "qgg8vlvZRS6UYooatFL8Aw");
        let got = value["encryptedToken"].as_str().unwrap();
        assert_eq!(got.len(), 64);
        assert_eq!(got, expected);
    }

    #[test]
    fn a_twitch_verification_is_read_only_when_its_header_says_so() {
        let body = br#"{"challenge":"pogchamp-kappa-360noscope-vohiyo","subscription":{}}"#;
        let twitch = of(Handshake::Twitch);
        assert_eq!(twitch.answer(&HeaderMap::new(), body), Ok(None));
        let mut headers = HeaderMap::new();
        headers.insert(
            TWITCH_MESSAGE_TYPE,
            HeaderValue::from_static("webhook_callback_verification"),
        );
        let answer = twitch.answer(&headers, body).unwrap().expect("a handshake");
        assert_eq!(answer.content_type, "text/plain");
        assert_eq!(answer.body, "pogchamp-kappa-360noscope-vohiyo");
        assert!(twitch.answer(&headers, b"{}").is_err());
    }
}
