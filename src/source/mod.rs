//! Sources: who sends webhooks, and how their requests are verified and read.
//!
//! A [`Source`] is a name (`POST /webhooks/{name}`), a [`Scheme`] and the handlers its events
//! run. Every scheme has one shape: [`Scheme::precheck`] looks at the signature headers before
//! the body is read, [`Scheme::verify`] checks the signature on the raw bytes,
//! [`Scheme::envelope`] reads the ledger key and type (from the body or the headers). One file
//! per kind of scheme, sign and verify side by side with known-answer vectors: Stripe,
//! Standard Webhooks (which is also how hookledger signs its deliveries to the app), the
//! HMACs (GitHub, Shopify, configured `hmac`), SendGrid's ECDSA (`ecdsa`), the shared
//! secrets sent as they are (`token`, `basic`), and Twilio's signature of the URL and form
//! parameters (`twilio`).
//!
//! What a source may add once a request verified: a [`Handshaker`] answers the challenge its
//! sender posts before it delivers (`handshake.rs`), and a [`Split`] cuts a body that is an
//! array of events into its elements (`split.rs`).

pub(crate) mod catalog;
pub(crate) mod credential;
pub(crate) mod ecdsa;
pub(crate) mod handshake;
pub(crate) mod hmac;
pub(crate) mod mailgun;
mod route;
pub(crate) mod split;
pub(crate) mod standard;
pub(crate) mod stripe;
pub(crate) mod twilio;

use std::sync::Arc;

use axum::http::HeaderMap;

use crate::config::{Locator, SchemeName, SourceConfig};
use crate::event::{Event, ParseError};
use crate::handler::{Handler, Submission};
use crate::payload::Dictionaries;
pub(crate) use handshake::{Challenge, Handshaker};
pub(crate) use route::Routes;
pub(crate) use split::Split;

/// One signature scheme with its secrets and settings.
pub(crate) trait Scheme: Send + Sync + 'static {
    /// Checks what can be checked before the body is read: the signature headers are present
    /// and well formed, and a signed timestamp is within the tolerance of `now`. A request
    /// that fails here is refused without reading its body, so a sender without the secret
    /// cannot make hookledger hold its bodies in memory.
    fn precheck(&self, headers: &HeaderMap, now: i64) -> Result<(), VerifyError>;

    /// Checks the request's signature over the exact `body` (and its timestamp, where the
    /// scheme signs one, against `now`). Nothing of the body is parsed before this passes,
    /// except by a scheme whose signature is in the body (Mailgun's `signature` object), which
    /// reads that object only.
    fn verify(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), VerifyError>;

    /// [`Scheme::verify`] with the request's query string as received (`a=1&b=2`, without
    /// `?`), for a scheme that signs the URL it was called at (Twilio); the request path calls
    /// this. The others' signatures do not cover the query.
    fn verify_request(
        &self,
        headers: &HeaderMap,
        _query: Option<&str>,
        body: &[u8],
        now: i64,
    ) -> Result<(), VerifyError> {
        self.verify(headers, body, now)
    }

    /// Reads what the ledger needs from a verified request.
    fn envelope(&self, headers: &HeaderMap, body: &[u8]) -> Result<Envelope, ParseError>;

    /// The headers this scheme's sender would send with `body` at `now`, signed with the first
    /// secret, for an event `id` of type `kind` where the scheme sends those in headers. For
    /// `hookledger send` and the tests, not the request path.
    fn sign(&self, body: &[u8], now: i64, id: &str, kind: &str) -> Vec<(String, String)>;

    /// Why [`Scheme::sign`] cannot sign with this source's secrets (a public key cannot), if
    /// it cannot; `hookledger send` says so instead of sending an unsigned request.
    fn cannot_sign(&self) -> Option<&'static str> {
        None
    }

    /// `body` as this scheme's sender would send it at `now`, signed with the first secret,
    /// when the signature is written into the body (Mailgun's); `None` when the body is sent
    /// as it is. For `hookledger send` and the tests, not the request path.
    fn sign_body(&self, _body: &[u8], _now: i64) -> Option<Vec<u8>> {
        None
    }

    /// The single-use token of a verified `body`'s signature, when the scheme signs a token
    /// and a time rather than the event (Mailgun's): the same signature on another event is a
    /// replay, refused by claiming the token with the event. `None` for a scheme that signs
    /// the body itself.
    fn token(&self, _body: &[u8]) -> Option<String> {
        None
    }
}

/// What a scheme reads from a verified request: the event id (the ledger key within its
/// source), its type, and its event time when the scheme has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub id: String,
    pub kind: String,
    pub created: Option<i64>,
}

/// Each source with its handlers, by name.
pub(crate) type Sources = std::collections::HashMap<Arc<str>, Arc<Source>>;

/// The sources the request path reads: one pointer, swapped whole by a reload (a request
/// takes its source's `Arc` and keeps it to its answer).
pub(crate) type LiveSources = arc_swap::ArcSwap<Sources>;

/// A named sender: `POST /webhooks/{name}`.
pub(crate) struct Source {
    pub(crate) name: Arc<str>,
    pub(crate) scheme: Box<dyn Scheme>,
    /// Run in order inside the claim's transaction, for every new event.
    pub(crate) handlers: Vec<Arc<dyn Handler>>,
    /// Queue every new event for delivery to the app.
    pub(crate) forward: bool,
    /// The kinds its new events queue a row of when a route matches them.
    pub(crate) routes: Routes,
    /// Largest body in bytes.
    pub(crate) max_body: usize,
    /// The handshake its sender posts before it delivers, if any.
    pub(crate) handshake: Option<Handshaker>,
    /// Where its events are when a body is an array of them.
    pub(crate) split: Option<Split>,
    /// Where the config says the event id and type are, over the scheme's own places (`id`,
    /// `type` on a scheme that reads its own; a configured scheme's are its own).
    pub(crate) overrides: Overrides,
    /// The dictionary its payloads are compressed with, once trained (shared by every source
    /// of the server and the trainer that fills it in).
    pub(crate) payloads: Arc<Dictionaries>,
}

impl Source {
    /// `event` of this source as the writer takes it: each handler's preparation (decoding on
    /// the caller's thread), and whether to forward it.
    pub(crate) fn submission(&self, event: Event) -> Result<Submission, ParseError> {
        let handlers = self
            .handlers
            .iter()
            .map(|h| Ok((h.clone(), h.prepare(&event)?)))
            .collect::<Result<Vec<_>, ParseError>>()?;
        // Compressed here, on the request's thread: the writer's thread has one job.
        let stored = self.payloads.compress(&self.name, &event.body);
        Ok(Submission {
            token: self.scheme.token(&event.body),
            routed: self.routes.rows(&event),
            event,
            handlers,
            forward: self.forward,
            stored: Some(stored),
        })
    }

    /// What the ledger needs from a verified request: the scheme's envelope, with the id and
    /// the type read where the config says instead, where it says. A type found nowhere is
    /// the source's name (Svix's own example has none, nor do Slack's slash commands): an app
    /// that takes several sources' events still tells them apart, and no provider's own type
    /// is shadowed. An id found nowhere refuses the request.
    pub(crate) fn envelope(
        &self,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Envelope, ParseError> {
        let mut reader = hmac::Reader::new(headers, body);
        let mut envelope = match &self.overrides.id {
            None => self.scheme.envelope(headers, body)?,
            Some(place) => {
                let id = reader
                    .read(place)
                    .ok_or_else(|| ParseError::Missing(place.what()))?;
                crate::event::check_id("id", &id)?;
                // The scheme's own reading may fail for want of the id it reads: it is
                // overridden, so what it read besides (type, time) is kept where it has any.
                let own = self.scheme.envelope(headers, body).ok();
                Envelope {
                    id,
                    kind: own.as_ref().map(|o| o.kind.clone()).unwrap_or_default(),
                    created: own.and_then(|o| o.created),
                }
            }
        };
        if let Some(place) = &self.overrides.kind {
            envelope.kind = reader.read(place).unwrap_or_default();
            if !envelope.kind.is_empty() {
                crate::event::check_id("type", &envelope.kind)?;
            }
        }
        if envelope.kind.is_empty() {
            envelope.kind = self.name.to_string();
        }
        Ok(envelope)
    }

    /// The headers that carry `id` and `kind` where the config puts them in headers over the
    /// scheme's own (for `hookledger send`).
    pub(crate) fn override_headers(&self, id: &str, kind: &str) -> Vec<(String, String)> {
        hmac::headers_at([
            (self.overrides.id.as_ref(), id),
            (self.overrides.kind.as_ref(), kind),
        ])
    }

    /// The answer to the verified request when it is a handshake its sender requires before
    /// it delivers; `None` when it is an event (or the source has no handshake).
    pub(crate) fn challenge(
        &self,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Option<Challenge>, ParseError> {
        match &self.handshake {
            Some(handshake) => handshake.answer(headers, body),
            None => Ok(None),
        }
    }

    /// Builds the source `config` describes (validated), with no handlers yet (the
    /// composition root adds them).
    pub(crate) fn from_config(
        config: &SourceConfig,
        forward: bool,
        default_max_body: usize,
        payloads: Arc<Dictionaries>,
    ) -> anyhow::Result<Source> {
        let secrets = config.secrets.clone();
        let tolerance = config
            .tolerance
            .map_or(crate::config::DEFAULT_TOLERANCE_SECS, |t| t.as_secs());
        let scheme: Box<dyn Scheme> = match config.scheme {
            SchemeName::Stripe => Box::new(stripe::Stripe { secrets, tolerance }),
            SchemeName::Standard => Box::new(standard::Standard {
                keys: secrets
                    .iter()
                    .map(|s| standard::Key::from_secret(s.expose()))
                    .collect::<Result<_, _>>()
                    .map_err(|why| anyhow::anyhow!("source `{}`: secrets: {why}", config.name))?,
                tolerance,
            }),
            SchemeName::Ecdsa => {
                let secrets: Vec<&str> = secrets.iter().map(|s| s.expose()).collect();
                // Unlike the others, no age check unless configured (see ecdsa.rs).
                let tolerance = config.tolerance.map_or(0, |t| t.as_secs());
                Box::new(
                    ecdsa::Ecdsa::from_secrets(&secrets, tolerance).map_err(|why| {
                        anyhow::anyhow!("source `{}`: secrets: {why}", config.name)
                    })?,
                )
            }
            SchemeName::Github => Box::new(hmac::BodyHmac::github(secrets)),
            SchemeName::Shopify => Box::new(hmac::BodyHmac::shopify(secrets)),
            SchemeName::Hmac => {
                let (Some(body_hmac), Some(id)) = (&config.hmac, &config.id) else {
                    anyhow::bail!("source `{}`: hmac and id are needed", config.name);
                };
                Box::new(hmac::BodyHmac::configured(
                    secrets,
                    body_hmac,
                    config.public_url.as_deref(),
                    tolerance,
                    id,
                    config.kind.as_ref(),
                ))
            }
            SchemeName::Token => {
                let (Some(token), Some(id)) = (&config.token, &config.id) else {
                    anyhow::bail!("source `{}`: token and id are needed", config.name);
                };
                Box::new(credential::Token {
                    keys: secrets,
                    header: hmac::leak(&token.header),
                    id: hmac::Place::from_locator(id),
                    kind: kind_place(config),
                })
            }
            SchemeName::Basic => {
                let Some(id) = &config.id else {
                    anyhow::bail!("source `{}`: id is needed", config.name);
                };
                Box::new(credential::Basic {
                    keys: secrets,
                    id: hmac::Place::from_locator(id),
                    kind: kind_place(config),
                })
            }
            SchemeName::Mailgun => Box::new(mailgun::Mailgun { secrets, tolerance }),
            SchemeName::Twilio => {
                let Some(public_url) = &config.public_url else {
                    anyhow::bail!("source `{}`: public_url is needed", config.name);
                };
                Box::new(twilio::Twilio {
                    secrets,
                    public_url: public_url.clone(),
                })
            }
        };
        Ok(Source {
            name: Arc::from(config.name.as_str()),
            scheme,
            handlers: Vec::new(),
            forward,
            routes: Routes::default(),
            max_body: config.max_body(default_max_body),
            handshake: config
                .handshake
                .zip(config.secrets.first())
                .map(|(h, secret)| Handshaker::new(h, secret.clone())),
            split: split_of(config),
            overrides: overrides_of(config),
            payloads,
        })
    }
}

/// Where the config says the event id and type are, over a scheme's own places.
#[derive(Debug, Default)]
pub(crate) struct Overrides {
    id: Option<hmac::Place>,
    kind: Option<hmac::Place>,
}

/// The `id` and `type` of `config` over its scheme's own: none on a configured scheme (they
/// are its own places) or a batch (they are read inside each element).
fn overrides_of(config: &SourceConfig) -> Overrides {
    if config.scheme.configured() || config.split.is_some() {
        return Overrides::default();
    }
    Overrides {
        id: config.id.as_ref().map(hmac::Place::from_locator),
        kind: config.kind.as_ref().map(hmac::Place::from_locator),
    }
}

/// Where a configured scheme reads the type: nowhere without a `type` (the default type).
fn kind_place(config: &SourceConfig) -> hmac::Place {
    config
        .kind
        .as_ref()
        .map_or(hmac::Place::Nowhere, hmac::Place::from_locator)
}

/// The split `config` describes: its `split` pointer, and the `id` and `type` JSON pointers
/// read inside each element (validated with the config).
fn split_of(config: &SourceConfig) -> Option<Split> {
    let array = config.split.as_deref()?;
    match (&config.id, &config.kind) {
        (Some(Locator::Json(id)), Some(Locator::Json(kind))) => Some(
            Split::new(array, id, kind).with_max(
                config
                    .max_events
                    .unwrap_or(crate::config::DEFAULT_MAX_EVENTS),
                format!("source `{}`.max_events", config.name),
            ),
        ),
        _ => None,
    }
}

/// The value of header `name`, if present.
fn header<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h [u8]> {
    headers.get(name).map(|v| v.as_bytes())
}

/// More signatures in one header than any sender rotating its secrets would send (one per
/// active secret, a handful at most); the cap bounds the work a hostile header can cause.
const MAX_SIGNATURES: usize = 16;

/// Why a signature was not accepted. The messages say what the sender should fix; none
/// contains a secret or the expected signature.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("missing {0} header")]
    MissingHeader(&'static str),
    #[error("malformed {header} header: {reason}")]
    MalformedHeader {
        header: &'static str,
        reason: &'static str,
    },
    #[error(
        "no v1 signature in the {0} header (only v1 is checked; v0 and other schemes are ignored)"
    )]
    NoV1Signature(&'static str),
    #[error(
        "the {header} header has more than {max} signatures; a sender signs once per active \
         secret, so this is not a real delivery"
    )]
    TooManySignatures { header: &'static str, max: usize },
    #[error(
        "no signature matches: check the signing secret, and make sure the raw request body \
         reaches hookledger unchanged (no JSON re-encoding, no whitespace or charset changes by a proxy)"
    )]
    NoMatch,
    #[error("timestamp is {age} s old, more than the tolerance of {tolerance} s (a replay, or a clock far off)")]
    TooOld { age: i64, tolerance: u64 },
    #[error("timestamp is {ahead} s in the future, more than the tolerance of {tolerance} s (check the sender's clock)")]
    InFuture { ahead: i64, tolerance: u64 },
    /// The signature written in the body (Mailgun's `signature` object) is missing or
    /// malformed.
    #[error("the body's `signature` object: {0}")]
    BodySignature(&'static str),
}

/// Checks `t` against `now`: older than `tolerance` or further than `tolerance` in the future
/// is refused. A tolerance of 0 turns the check off (for replaying recorded fixtures only).
pub(crate) fn check_timestamp(t: i64, now: i64, tolerance: u64) -> Result<(), VerifyError> {
    if tolerance == 0 {
        return Ok(());
    }
    let tol = i64::try_from(tolerance).unwrap_or(i64::MAX);
    let age = now.saturating_sub(t);
    if age > tol {
        return Err(VerifyError::TooOld { age, tolerance });
    }
    let ahead = t.saturating_sub(now);
    if ahead > tol {
        return Err(VerifyError::InFuture { ahead, tolerance });
    }
    Ok(())
}

/// What the schemes' tests share.
#[cfg(test)]
pub(crate) mod testing {
    use axum::http::HeaderMap;

    use super::{Scheme, VerifyError};

    /// `scheme`'s precheck refuses a request without `header` as missing, and one with each
    /// of `bad` in it as malformed.
    pub(crate) fn refuses_missing_and_malformed(
        scheme: &dyn Scheme,
        header: &'static str,
        bad: &[&str],
    ) {
        let mut headers = HeaderMap::new();
        assert_eq!(
            scheme.precheck(&headers, 0),
            Err(VerifyError::MissingHeader(header))
        );
        for bad in bad {
            headers.insert(header, bad.parse().unwrap());
            assert!(
                matches!(
                    scheme.precheck(&headers, 0),
                    Err(VerifyError::MalformedHeader { .. })
                ),
                "{bad}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extreme_timestamps_do_not_overflow() {
        assert!(matches!(
            check_timestamp(i64::MAX, -5, 300),
            Err(VerifyError::InFuture { .. })
        ));
        assert!(matches!(
            check_timestamp(i64::MIN, i64::MAX, 300),
            Err(VerifyError::TooOld { .. })
        ));
    }
}
