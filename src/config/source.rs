//! `[[source]]`: a named sender, its signature scheme, its secrets and its handlers.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::{
    check_secret, decode_standard_key, parse_secret_file, refuse, source_key, ConfigError, Secret,
};

/// One sender: `POST /webhooks/{name}`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct SourceConfig {
    /// The path segment of its URL and the first half of its events' ledger key.
    pub name: String,
    pub scheme: SchemeName,
    /// Any one may match (rotation). In a config file each is `env:NAME`, `file:PATH`,
    /// `credential:NAME` (systemd's `LoadCredential=`) or, discouraged, the secret itself;
    /// once loaded, the secrets themselves.
    #[serde(default)]
    pub secrets: Vec<Secret>,
    /// How far a signed timestamp may be from now (schemes that sign one: `stripe`,
    /// `standard`, `ecdsa`, and `hmac` with `hmac.timestamp`; `0s` turns the check off).
    /// Default: 5 minutes; for `ecdsa`, off (SendGrid's SDKs check no age, and SendGrid
    /// retries for up to 24 hours).
    #[serde(default, with = "super::tolerance")]
    pub tolerance: Option<Duration>,
    /// Built-in handlers run for its events inside the claim's transaction, in order.
    #[serde(default)]
    pub handlers: Vec<String>,
    /// Largest body in bytes. Default: `http.max_body` (1 MiB), and 25 MiB for
    /// scheme github (GitHub's own cap on a payload).
    #[serde(default)]
    pub max_body: Option<usize>,
    /// Scheme `hmac` only: how the signature is made.
    #[serde(default)]
    pub hmac: Option<HmacConfig>,
    /// Scheme `token` only: the header that carries the shared token.
    #[serde(default)]
    pub token: Option<TokenConfig>,
    /// The URL the provider calls (`https://hooks.example.com/webhooks/twilio`), exactly as
    /// configured at the provider, for a scheme that signs it (`{url}` in `hmac.signed`;
    /// scheme `twilio`, without a query: the request's own is appended).
    /// Behind a proxy, the URL the request reached is not the one signed: hence a setting.
    #[serde(default)]
    pub public_url: Option<String>,
    /// Where the event id is: needed by schemes `hmac`, `token` and `basic`; on the others,
    /// over where the scheme reads it (`id = "body_sha256"` for a sender without ids).
    #[serde(default)]
    pub id: Option<Locator>,
    /// Where the event type is, over where the scheme reads it. A request without one (or a
    /// source that says nowhere) gets the source's name as its type.
    #[serde(default, rename = "type")]
    pub kind: Option<Locator>,
    /// The provider's API: the secret key of `reconcile` and of the fresh-state refresh (in a
    /// config file `env:NAME` or `file:PATH`), for schemes whose provider hookledger has an
    /// API client for. A key that may only read is enough.
    #[serde(default)]
    pub api_key: Option<Secret>,
    /// The provider's API: where it is. Default: the provider's own.
    #[serde(default)]
    pub api_base: Option<String>,
    /// The provider's API: `serve` reconciles the ledger with the events the API lists every
    /// `every`, looking back `since` (`reconcile = { every = "1h", since = "3d" }`).
    #[serde(default)]
    pub reconcile: Option<ReconcileConfig>,
    /// GitHub's API: the webhook whose deliveries a reconcile lists
    /// (`"repos/OWNER/REPO/HOOK_ID"` or `"orgs/ORG/HOOK_ID"`).
    #[serde(default)]
    pub hook: Option<String>,
    /// GitHub's API: what a reconcile does with a delivery the ledger lacks: `"apply"` (the
    /// default) reads the delivery's request and applies it as if it had arrived,
    /// `"redeliver"` asks GitHub to deliver it again.
    #[serde(default)]
    pub mode: Option<RecoverMode>,
    /// GitHub's API, with `hook = "app"`: the GitHub App's id, the issuer of its JWT.
    #[serde(default)]
    pub app_id: Option<u64>,
    /// GitHub's API, with `hook = "app"`: the App's private key, the PEM GitHub issues
    /// (`file:PATH` or `credential:NAME`), which signs its JWT.
    #[serde(default)]
    pub private_key: Option<Secret>,
    /// WorkOS's API: the event types a reconcile lists (`["user.created", …]`, those the
    /// webhook endpoint is subscribed to): WorkOS lists only the types a call names.
    #[serde(default)]
    pub event_types: Vec<String>,
    /// The provider's API, with an `api_key` and a handler that keeps a snapshot of an
    /// object: when the object's current state is fetched after commit. Default: on ties.
    #[serde(default)]
    pub refresh: Refresh,
    /// The catalog preset its keys were filled in from (`preset = "clerk"`), if any: the keys
    /// written in the file are over the preset's.
    #[serde(default)]
    pub preset: Option<String>,
    /// The handshake the sender requires before it delivers (`handshake = "slack"`,
    /// `"zoom"` or `"twitch"`), answered once the request's signature verifies; nothing is
    /// claimed for it.
    #[serde(default)]
    pub handshake: Option<Handshake>,
    /// A sender that posts a JSON array of events: a JSON pointer to the array (`"/"` or `""`:
    /// the body itself). Each element is an event of its own, its id and type read inside it
    /// (`id = { json = "/sg_event_id" }`, `type = { json = "/event" }`).
    #[serde(default)]
    pub split: Option<String>,
    /// With `split`: the most events one body may hold; a body with more is refused, 413
    /// `too_many_events`, and nothing of it is stored. Default: 5,000.
    #[serde(default)]
    pub max_events: Option<usize>,
}

/// What a reconcile does with a delivery the ledger lacks, where the provider can redeliver.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RecoverMode {
    /// Read the delivery from the API and apply it, as if it had arrived.
    #[default]
    Apply,
    /// Ask the provider to deliver it again (it arrives as a webhook, signed).
    Redeliver,
}

/// Read by hand so that a wrong value names its key (serde's own message for an enum names
/// neither the key nor, once secrets are hidden, the value).
impl<'de> Deserialize<'de> for RecoverMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match String::deserialize(d)?.as_str() {
            "apply" => Ok(RecoverMode::Apply),
            "redeliver" => Ok(RecoverMode::Redeliver),
            // Not quoted: the config's errors hide quoted values, as a secret may be one.
            _ => Err(serde::de::Error::custom("mode: must be apply or redeliver")),
        }
    }
}

/// `reconcile = { every = "1h", since = "3d" }` of a source: how often the ledger is
/// reconciled with the events the provider's API lists, and how far back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ReconcileConfig {
    #[serde(with = "super::duration")]
    pub every: Duration,
    #[serde(with = "super::duration")]
    pub since: Duration,
}

/// When a handler that keeps a snapshot of an object (a subscription) fetches the object from
/// the provider's API after commit and stores the answer as the newest snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Refresh {
    /// When a subscription event ties with the stored one (same `created` and rank): the
    /// first would win, but which is current is unknown.
    #[default]
    Ties,
    /// After every subscription event.
    Always,
    /// Never: ties keep the first event's state, as without an API key.
    Off,
}

/// The signature schemes hookledger verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum SchemeName {
    Stripe,
    Standard,
    Github,
    Shopify,
    Hmac,
    /// A shared token in a header, compared with each secret (GitLab's `X-Gitlab-Token`).
    Token,
    /// HTTP Basic credentials; each secret is `user:password` (Postmark).
    Basic,
    /// SendGrid's signed Event Webhook: ECDSA P-256, verified with SendGrid's public key.
    Ecdsa,
    /// Mailgun's: an HMAC of a signed timestamp and token, in the body's `signature` object.
    Mailgun,
    /// Twilio's `X-Twilio-Signature`: HMAC-SHA1 of `public_url`, the query and the sorted
    /// form parameters (or the body's SHA-256 in the query); each secret is an auth token.
    Twilio,
}

impl ReconcileConfig {
    /// Every `every`, looking back `since`.
    pub fn new(every: Duration, since: Duration) -> ReconcileConfig {
        ReconcileConfig { every, since }
    }
}

impl SchemeName {
    /// Whether the scheme always signs a timestamp (and so has a tolerance); `hmac` does
    /// when configured to (see [`SourceConfig::signs_time`]).
    pub(crate) fn signs_time(self) -> bool {
        matches!(
            self,
            SchemeName::Stripe | SchemeName::Standard | SchemeName::Ecdsa | SchemeName::Mailgun
        )
    }

    /// The schemes whose event id and type are configured (`id`, `type`).
    pub(crate) fn configured(self) -> bool {
        matches!(
            self,
            SchemeName::Hmac | SchemeName::Token | SchemeName::Basic
        )
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SchemeName::Stripe => "stripe",
            SchemeName::Standard => "standard",
            SchemeName::Github => "github",
            SchemeName::Shopify => "shopify",
            SchemeName::Hmac => "hmac",
            SchemeName::Token => "token",
            SchemeName::Basic => "basic",
            SchemeName::Ecdsa => "ecdsa",
            SchemeName::Mailgun => "mailgun",
            SchemeName::Twilio => "twilio",
        }
    }
}

/// An HMAC over the body, or over a template of the body, a signed timestamp, the event id
/// and the public URL, as most providers and in-house senders make it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct HmacConfig {
    /// The request header that carries the signature.
    pub header: String,
    #[serde(default)]
    pub algorithm: HmacAlgorithm,
    #[serde(default)]
    pub encoding: HmacEncoding,
    /// Text before each encoded signature (`sha256=`, `v0=`, `v1,`), if any. With a
    /// `separator`, entries without it are other versions and are skipped.
    #[serde(default)]
    pub prefix: String,
    /// What is signed: a template of `{body}`, `{timestamp}`, `{id}` and `{url}` (the
    /// source's `public_url`) and literal text: Slack's `v0:{timestamp}:{body}`, Svix's
    /// `{id}.{timestamp}.{body}`, Square's `{url}{body}`. Default: `{body}`.
    #[serde(default)]
    pub signed: Option<String>,
    /// The signed timestamp, checked against the source's `tolerance` both ways.
    #[serde(default)]
    pub timestamp: Option<TimestampConfig>,
    /// Several entries in the signature header, split at this (`","`, `" "`, `";"`): any
    /// signature may match, and a timestamp `part` may be one of them.
    #[serde(default)]
    pub separator: Option<String>,
}

/// Where the signed timestamp of an `hmac` source is: `{ header = "X-Slack-Request-Timestamp" }`,
/// or `{ part = "t" }`, the entry `t=<value>` of the signature header (Stripe-like
/// `t=…,v1=…`, Paddle's `ts=…;h1=…`); `unit` is `"s"` (the default), `"ms"`, or `"rfc3339"`:
/// a date and time as text (Twitch EventSub's `2019-11-16T10:11:12.634234626Z`), signed as
/// sent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct TimestampConfig {
    #[serde(default)]
    pub header: Option<String>,
    #[serde(default)]
    pub part: Option<String>,
    #[serde(default)]
    pub unit: Option<String>,
}

impl TimestampConfig {
    /// In the header `header`, in seconds.
    pub fn header(header: impl Into<String>) -> TimestampConfig {
        TimestampConfig {
            header: Some(header.into()),
            ..TimestampConfig::default()
        }
    }

    /// In the entry `<part>=<value>` of the signature header, in seconds.
    pub fn part(part: impl Into<String>) -> TimestampConfig {
        TimestampConfig {
            part: Some(part.into()),
            ..TimestampConfig::default()
        }
    }

    /// In milliseconds.
    pub fn in_millis(mut self) -> Self {
        self.unit = Some("ms".into());
        self
    }

    /// As RFC 3339 text (`2019-11-16T10:11:12.634234626Z`).
    pub fn in_rfc3339(mut self) -> Self {
        self.unit = Some("rfc3339".into());
        self
    }

    /// Whether the unit is milliseconds (validated: `s`, `ms` or `rfc3339`).
    pub(crate) fn millis(&self) -> bool {
        self.unit.as_deref() == Some("ms")
    }

    /// Whether the timestamp is RFC 3339 text.
    pub(crate) fn rfc3339(&self) -> bool {
        self.unit.as_deref() == Some("rfc3339")
    }
}

/// `token = { header = "X-Gitlab-Token" }` of a `token` source.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct TokenConfig {
    pub header: String,
}

impl TokenConfig {
    pub fn new(header: impl Into<String>) -> TokenConfig {
        TokenConfig {
            header: header.into(),
        }
    }
}

/// One piece of a signed-content template (`hmac.signed`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Signed {
    Text(String),
    Body,
    Timestamp,
    Id,
    Url,
}

/// The default signed content: the body alone.
pub(crate) const SIGNED_BODY: &str = "{body}";

/// `template` in pieces; `{` always opens a placeholder (no literal braces: no provider signs
/// one around its placeholders).
pub(crate) fn parse_signed(template: &str) -> Result<Vec<Signed>, String> {
    let mut pieces = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find(['{', '}']) {
        if open > 0 {
            pieces.push(Signed::Text(rest[..open].to_string()));
        }
        let close = rest[open..]
            .find('}')
            .filter(|_| rest[open..].starts_with('{'))
            .ok_or("has a `{` or `}` that is not part of {body}, {timestamp}, {id} or {url}")?;
        pieces.push(match &rest[open + 1..open + close] {
            "body" => Signed::Body,
            "timestamp" => Signed::Timestamp,
            "id" => Signed::Id,
            "url" => Signed::Url,
            _ => {
                return Err(
                    "has an unknown placeholder (known: {body}, {timestamp}, {id}, {url})".into(),
                )
            }
        });
        rest = &rest[open + close + 1..];
    }
    if !rest.is_empty() {
        pieces.push(Signed::Text(rest.to_string()));
    }
    if !pieces.contains(&Signed::Body) {
        return Err("must contain {body}".into());
    }
    Ok(pieces)
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum HmacAlgorithm {
    /// Legacy only (GitHub's `X-Hub-Signature`, Twilio): SHA-1 HMACs are not broken, but
    /// prefer SHA-256 where the sender offers it.
    Sha1,
    #[default]
    Sha256,
    Sha512,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum HmacEncoding {
    #[default]
    Hex,
    Base64,
}

/// Where a value is: `{ header = "X-Acme-Delivery" }` or `{ json = "/id" }` (a JSON pointer
/// into the body); for the event id also `"body_sha256"` (or `{ body_sha256 = true }`): the hex
/// SHA-256 of the raw body, for senders whose events carry no id. Then a resend of the same bytes is a duplicate,
/// and any two different bodies are two events (a sender that stamps each retry with a new
/// time in the body makes each retry a new event). A list of places
/// (`[{ header = "Idempotency-Key" }, { header = "X-Gitlab-Event-UUID" }]`): the first one the
/// request has.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Locator {
    Header(String),
    Json(String),
    BodySha256(bool),
    FirstOf(Vec<Locator>),
}

impl Locator {
    /// The header the value is sent in, where it is one (of a list, the first header).
    pub(crate) fn header(&self) -> Option<&str> {
        match self {
            Locator::Header(name) => Some(name),
            Locator::FirstOf(places) => places.iter().find_map(Locator::header),
            Locator::Json(_) | Locator::BodySha256(_) => None,
        }
    }
}

/// A [`Locator`] as a table: `{ header = "…" }`, `{ json = "…" }`, `{ body_sha256 = true }`.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum LocatorTable {
    Header(String),
    Json(String),
    BodySha256(bool),
}

/// A [`Locator`] is a table, the text `"body_sha256"` (the same as `{ body_sha256 = true }`),
/// or a list of them.
impl<'de> Deserialize<'de> for Locator {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Locator, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Locator;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(
                    "{ header = \"X-...\" }, { json = \"/field\" }, \"body_sha256\" or a list of them",
                )
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Locator, A::Error> {
                let mut places = Vec::new();
                while let Some(place) = seq.next_element::<Locator>()? {
                    places.push(place);
                }
                Ok(Locator::FirstOf(places))
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Locator, E> {
                match text {
                    "body_sha256" => Ok(Locator::BodySha256(true)),
                    // The text is not quoted back: a misplaced secret must not reach a log.
                    _ => Err(E::custom(
                        "must be the text body_sha256, or a table: { header = … } or { json = … }",
                    )),
                }
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Locator, A::Error> {
                let table =
                    LocatorTable::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(match table {
                    LocatorTable::Header(name) => Locator::Header(name),
                    LocatorTable::Json(pointer) => Locator::Json(pointer),
                    LocatorTable::BodySha256(on) => Locator::BodySha256(on),
                })
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

impl HmacConfig {
    /// The signature in header `header`: HMAC-SHA256 in hex, with no prefix.
    pub fn new(header: impl Into<String>) -> HmacConfig {
        HmacConfig {
            header: header.into(),
            algorithm: HmacAlgorithm::default(),
            encoding: HmacEncoding::default(),
            prefix: String::new(),
            signed: None,
            timestamp: None,
            separator: None,
        }
    }

    /// Signing `template` (see [`HmacConfig::signed`]) instead of the body alone.
    pub fn with_signed(mut self, template: impl Into<String>) -> Self {
        self.signed = Some(template.into());
        self
    }

    /// With a signed timestamp where `timestamp` says.
    pub fn with_timestamp(mut self, timestamp: TimestampConfig) -> Self {
        self.timestamp = Some(timestamp);
        self
    }

    /// With several entries in the signature header, split at `separator`.
    pub fn with_separator(mut self, separator: impl Into<String>) -> Self {
        self.separator = Some(separator.into());
        self
    }

    /// The signed-content template in pieces (validated).
    pub(crate) fn pieces(&self) -> Vec<Signed> {
        parse_signed(self.signed.as_deref().unwrap_or(SIGNED_BODY)).unwrap_or_default()
    }

    pub fn with_algorithm(mut self, algorithm: HmacAlgorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    pub fn with_encoding(mut self, encoding: HmacEncoding) -> Self {
        self.encoding = encoding;
        self
    }

    /// With `prefix` before the encoded signature in the header (`sha256=`).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }
}

/// GitHub caps a webhook payload at 25 MB.
pub(crate) const GITHUB_MAX_BODY: usize = 25 * 1024 * 1024;

impl SourceConfig {
    /// The sender `name` (`POST /webhooks/{name}`), verified by `scheme` with `secrets` (any
    /// one may match, for rotation), with no handler and every default. Scheme hmac needs
    /// more: see [`SourceConfig::hmac`].
    pub fn new(name: impl Into<String>, scheme: SchemeName, secrets: Vec<Secret>) -> SourceConfig {
        SourceConfig {
            name: name.into(),
            scheme,
            secrets,
            tolerance: None,
            handlers: Vec::new(),
            max_body: None,
            hmac: None,
            token: None,
            public_url: None,
            id: None,
            kind: None,
            api_key: None,
            api_base: None,
            reconcile: None,
            hook: None,
            mode: None,
            app_id: None,
            private_key: None,
            event_types: Vec::new(),
            refresh: Refresh::default(),
            preset: None,
            handshake: None,
            split: None,
            max_events: None,
        }
    }

    /// A sender of scheme hmac: its signature made as `hmac` says, its event id and type
    /// where `id` and `kind` say.
    pub fn hmac(
        name: impl Into<String>,
        secrets: Vec<Secret>,
        hmac: HmacConfig,
        id: Locator,
        kind: Locator,
    ) -> SourceConfig {
        SourceConfig {
            hmac: Some(hmac),
            id: Some(id),
            kind: Some(kind),
            ..SourceConfig::new(name, SchemeName::Hmac, secrets)
        }
    }

    /// A sender of scheme token: the token in header `token`.
    pub fn token(
        name: impl Into<String>,
        secrets: Vec<Secret>,
        token: TokenConfig,
        id: Locator,
        kind: Locator,
    ) -> SourceConfig {
        SourceConfig {
            token: Some(token),
            id: Some(id),
            kind: Some(kind),
            ..SourceConfig::new(name, SchemeName::Token, secrets)
        }
    }

    /// A sender of scheme basic: each secret is `user:password`.
    pub fn basic(
        name: impl Into<String>,
        secrets: Vec<Secret>,
        id: Locator,
        kind: Locator,
    ) -> SourceConfig {
        SourceConfig {
            id: Some(id),
            kind: Some(kind),
            ..SourceConfig::new(name, SchemeName::Basic, secrets)
        }
    }

    /// With the URL the provider calls, for a scheme that signs it.
    pub fn with_public_url(mut self, public_url: impl Into<String>) -> Self {
        self.public_url = Some(public_url.into());
        self
    }

    /// Whether this source signs a timestamp (and so has a tolerance).
    pub(crate) fn signs_time(&self) -> bool {
        self.scheme.signs_time()
            || (self.scheme == SchemeName::Hmac
                && self.hmac.as_ref().is_some_and(|h| h.timestamp.is_some()))
    }

    /// The quick start's source: `stripe` with the `stripe-billing` handler.
    pub fn stripe(secrets: Vec<Secret>) -> SourceConfig {
        SourceConfig::new("stripe", SchemeName::Stripe, secrets).with_handler("stripe-billing")
    }

    /// With the built-in handler `handler` run after those before it.
    pub fn with_handler(mut self, handler: impl Into<String>) -> Self {
        self.handlers.push(handler.into());
        self
    }

    /// With this tolerance of a signed timestamp (zero turns the check off).
    pub fn with_tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = Some(tolerance);
        self
    }

    /// With this largest body, in bytes.
    pub fn with_max_body(mut self, max_body: usize) -> Self {
        self.max_body = Some(max_body);
        self
    }

    /// With the secret key of the provider's API.
    pub fn with_api_key(mut self, api_key: Secret) -> Self {
        self.api_key = Some(api_key);
        self
    }

    /// With the provider's API at `api_base`.
    pub fn with_api_base(mut self, api_base: impl Into<String>) -> Self {
        self.api_base = Some(api_base.into());
        self
    }

    /// Reconciled with the provider's API as `reconcile` says.
    pub fn with_reconcile(mut self, reconcile: ReconcileConfig) -> Self {
        self.reconcile = Some(reconcile);
        self
    }

    /// Refreshing snapshots from the provider's API as `refresh` says.
    pub fn with_refresh(mut self, refresh: Refresh) -> Self {
        self.refresh = refresh;
        self
    }

    /// The largest body this source accepts, given the listener's default.
    pub(crate) fn max_body(&self, default: usize) -> usize {
        self.max_body.unwrap_or(match self.scheme {
            SchemeName::Github => GITHUB_MAX_BODY.max(default),
            _ => default,
        })
    }

    /// Replaces each `env:NAME`, `file:PATH` and `credential:NAME` secret with what it names
    /// (`file:` paths relative to `folder`).
    pub(crate) fn resolve_secrets(&mut self, folder: &Path) -> Result<(), ConfigError> {
        self.secrets = resolve_secrets(&source_key(&self.name, "secrets"), &self.secrets, folder)?;
        if let Some(api_key) = &self.api_key {
            let key = source_key(&self.name, "api_key");
            self.api_key = Some(one_secret(&key, api_key, folder)?);
        }
        if let Some(private_key) = &self.private_key {
            let key = source_key(&self.name, "private_key");
            self.private_key = Some(whole_secret(&key, private_key, folder)?);
        }
        Ok(())
    }

    /// Refuses what cannot work, naming the source and the key.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let name = &self.name;
        let key = |field: &str| source_key(name, field);
        if !is_valid_name(name) {
            refuse!(
                key("name"),
                "must be 1 to 64 letters, digits, `-` or `_` (it is the path of \
                 POST /webhooks/<name>)"
            );
        }
        let scheme = self.scheme.as_str();
        if self.secrets.is_empty() {
            refuse!(
                key("secrets"),
                "is empty; add secrets = [\"env:YOUR_VARIABLE\"] with the signing secret from \
                 the provider's dashboard"
            );
        }
        for secret in &self.secrets {
            let checked = match self.scheme {
                SchemeName::Standard => decode_standard_key(secret.expose()).map(drop),
                SchemeName::Basic if !secret.expose().contains(':') => {
                    Err("a basic secret is `user:password` and this one has no `:`".into())
                }
                // A public key: its form is checked when the source is built (start-up).
                SchemeName::Ecdsa => Ok(()),
                _ => check_secret(secret.expose()),
            };
            checked.map_err(|why| ConfigError::new(key("secrets"), format!("refused: {why}")))?;
        }
        if self.tolerance.is_some() && !self.signs_time() {
            refuse!(
                key("tolerance"),
                "does not apply: scheme {scheme} signs no timestamp here (the ledger is its only \
                 replay protection; see retention.claim_days)"
            );
        }
        for (field, set, applies) in [
            ("hmac", self.hmac.is_some(), SchemeName::Hmac),
            ("token", self.token.is_some(), SchemeName::Token),
        ] {
            if set && self.scheme != applies {
                refuse!(
                    key(field),
                    "applies to scheme {} only, not {scheme}",
                    applies.as_str()
                );
            }
        }
        if self.scheme.configured() && self.id.is_none() {
            refuse!(
                key("id"),
                "missing: scheme {scheme} needs id = {{ header = \"X-...\" }}, \
                 {{ json = \"/field\" }} or \"body_sha256\" (the hex SHA-256 of the body)"
            );
        }
        // With `split`, they are read inside each element: see `validate_split`.
        let places = [("id", &self.id), ("type", &self.kind)];
        for (field, locator) in places.into_iter().filter(|_| self.split.is_none()) {
            if let Some(locator) = locator {
                check_locator(&key, field, field, locator)?;
            }
        }
        match self.scheme {
            SchemeName::Hmac => {
                let Some(hmac) = &self.hmac else {
                    refuse!(
                        key("hmac"),
                        "missing: scheme hmac needs \
                         hmac = {{ header = \"X-Signature\", algorithm = \"sha256\", encoding = \"hex\" }}"
                    );
                };
                self.validate_hmac(hmac)?;
            }
            SchemeName::Token => {
                let Some(token) = &self.token else {
                    refuse!(
                        key("token"),
                        "missing: scheme token needs token = {{ header = \"X-Gitlab-Token\" }}"
                    );
                };
                check_header_name(&key("token.header"), &token.header)?;
            }
            _ => {}
        }
        let twilio = self.scheme == SchemeName::Twilio;
        let signs_url = twilio
            || (self.scheme == SchemeName::Hmac
                && self
                    .hmac
                    .as_ref()
                    .is_some_and(|h| h.pieces().contains(&Signed::Url)));
        match &self.public_url {
            None if signs_url => refuse!(
                key("public_url"),
                "missing: {}, so the URL the provider calls must be set \
                 (public_url = \"https://hooks.example.com/webhooks/{name}\")",
                if twilio {
                    "scheme twilio signs the URL"
                } else {
                    "hmac.signed has {url}"
                }
            ),
            Some(_) if !signs_url => refuse!(
                key("public_url"),
                "does not apply: nothing this source checks signs the URL ({{url}} in hmac.signed)"
            ),
            Some(url) => {
                let parsed = url::Url::parse(url)
                    .map_err(|e| ConfigError::new(key("public_url"), format!("not a URL ({e})")))?;
                if !matches!(parsed.scheme(), "http" | "https") || !parsed.has_host() {
                    refuse!(
                        key("public_url"),
                        "must be an http:// or https:// URL with a host"
                    );
                }
                if twilio && url.contains(['?', '#']) {
                    refuse!(
                        key("public_url"),
                        "must have no query: the query of each request is appended to it"
                    );
                }
            }
            None => {}
        }
        self.validate_api()?;
        self.validate_split()
    }
}

impl SourceConfig {
    /// `hmac = { … }` of an hmac source: a valid header, template, timestamp and separator,
    /// each placeholder with what it needs.
    fn validate_hmac(&self, hmac: &HmacConfig) -> Result<(), ConfigError> {
        let key = |field: &str| source_key(&self.name, field);
        check_header_name(&key("hmac.header"), &hmac.header)?;
        let pieces = parse_signed(hmac.signed.as_deref().unwrap_or(SIGNED_BODY))
            .map_err(|why| ConfigError::new(key("hmac.signed"), why))?;
        if let Some(separator) = &hmac.separator {
            if separator.is_empty() {
                refuse!(key("hmac.separator"), "is empty");
            }
        }
        match (&hmac.timestamp, pieces.contains(&Signed::Timestamp)) {
            (None, true) => refuse!(
                key("hmac.timestamp"),
                "missing: hmac.signed has {{timestamp}}; say where it is: \
                 timestamp = {{ header = \"X-Timestamp\" }} or {{ part = \"t\" }}"
            ),
            (Some(_), false) => refuse!(
                key("hmac.signed"),
                "has no {{timestamp}}, so hmac.timestamp would be unsigned (anyone could change it)"
            ),
            (None, false) => {}
            (Some(t), true) => {
                match (&t.header, &t.part) {
                    (Some(header), None) => {
                        check_header_name(&key("hmac.timestamp.header"), header)?
                    }
                    (None, Some(part)) => {
                        if hmac.separator.is_none() {
                            refuse!(
                                key("hmac.timestamp.part"),
                                "needs hmac.separator: the part is one entry of the signature \
                                 header (t=…,v1=…)"
                            );
                        }
                        let bad = |c: char| c == '=' || c.is_whitespace();
                        if part.is_empty() || part.contains(bad) {
                            refuse!(
                                key("hmac.timestamp.part"),
                                "must be the name before `=` of the entry (`t` for t=…)"
                            );
                        }
                    }
                    _ => refuse!(
                        key("hmac.timestamp"),
                        "needs exactly one of header = \"X-Timestamp\" or part = \"t\""
                    ),
                }
                if !matches!(t.unit.as_deref(), None | Some("s" | "ms" | "rfc3339")) {
                    refuse!(
                        key("hmac.timestamp.unit"),
                        "must be \"s\", \"ms\" or \"rfc3339\""
                    );
                }
            }
        }
        if pieces.contains(&Signed::Id) && !matches!(self.id, Some(Locator::Header(_))) {
            refuse!(
                key("hmac.signed"),
                "has {{id}}, which needs id = {{ header = \"X-...\" }} (the body is not read \
                 before its signature is checked)"
            );
        }
        Ok(())
    }

    /// The provider's API settings, as far as they do not depend on the provider: a URL, a
    /// key, a reconcile with a key and bounds. (Which schemes have an API, and how far back
    /// it lists events, are the provider wing's rules, checked at start-up.)
    fn validate_api(&self) -> Result<(), ConfigError> {
        let key = |field: &str| source_key(&self.name, field);
        if let Some(base) = &self.api_base {
            let url = url::Url::parse(base)
                .map_err(|e| ConfigError::new(key("api_base"), format!("not a URL ({e})")))?;
            if !matches!(url.scheme(), "http" | "https") || !url.has_host() {
                refuse!(
                    key("api_base"),
                    "must be an http:// or https:// URL with a host"
                );
            }
        }
        if let Some(api_key) = &self.api_key {
            if api_key.expose().trim().is_empty() {
                refuse!(key("api_key"), "is empty");
            }
        }
        if let Some(r) = &self.reconcile {
            // A GitHub App's hook is read with its private key instead (checked by its wing).
            if self.api_key.is_none() && self.private_key.is_none() {
                refuse!(key("reconcile"), "needs api_key (api_key = \"env:NAME\")");
            }
            if r.every < Duration::from_secs(1) {
                refuse!(key("reconcile.every"), "must be at least 1s");
            }
            if r.since.is_zero() {
                refuse!(key("reconcile.since"), "must be more than 0");
            }
        }
        Ok(())
    }
}

/// Checks the place of the event `field` (`id` or `type`), configured at `at` (`id`, or
/// `id[1]` in a list); `key` names a key of the source.
fn check_locator(
    key: &dyn Fn(&str) -> String,
    field: &str,
    at: &str,
    locator: &Locator,
) -> Result<(), ConfigError> {
    match locator {
        Locator::Header(header) => check_header_name(&key(&format!("{at}.header")), header)?,
        Locator::Json(pointer) if !pointer.starts_with('/') => refuse!(
            key(&format!("{at}.json")),
            "must be a JSON pointer such as \"/id\""
        ),
        Locator::Json(_) => {}
        Locator::BodySha256(_) if field == "type" => refuse!(
            key(&format!("{at}.body_sha256")),
            "applies to id only (a type is read from a header or the body)"
        ),
        Locator::BodySha256(false) => refuse!(
            key(&format!("{at}.body_sha256")),
            "must be true (or say where the id is: {{ header = \"X-...\" }})"
        ),
        Locator::BodySha256(true) => {}
        Locator::FirstOf(places) if places.is_empty() || at != field => refuse!(
            key(at),
            "must be a place, or a list of places that are not lists: \
             [{{ header = \"X-...\" }}, {{ json = \"/field\" }}]"
        ),
        Locator::FirstOf(places) => {
            for (i, place) in places.iter().enumerate() {
                check_locator(key, field, &format!("{field}[{i}]"), place)?;
            }
        }
    }
    Ok(())
}

fn check_header_name(key: &str, header: &str) -> Result<(), ConfigError> {
    if axum::http::HeaderName::from_bytes(header.as_bytes()).is_err() {
        refuse!(key, "is not a valid header name");
    }
    Ok(())
}

/// `secret` resolved as by [`resolve_secrets`], which must give exactly one.
pub(crate) fn one_secret(key: &str, secret: &Secret, folder: &Path) -> Result<Secret, ConfigError> {
    let [one] = resolve_secrets(key, std::slice::from_ref(secret), folder)?
        .try_into()
        .map_err(|_| ConfigError::new(key, "the file must hold exactly one secret"))?;
    Ok(one)
}

/// `secret` resolved as one secret of many lines (a PEM key): a file's or credential's whole
/// text, an environment variable's whole value, or the literal.
fn whole_secret(key: &str, secret: &Secret, folder: &Path) -> Result<Secret, ConfigError> {
    let text = secret.expose();
    let path = if let Some(path) = text.strip_prefix("file:") {
        folder.join(path)
    } else if let Some(name) = text.strip_prefix("credential:") {
        credential_path(key, name)?
    } else {
        return one_secret(key, secret, folder);
    };
    let content = std::fs::read_to_string(&path)
        .map_err(|e| ConfigError::new(key, format!("cannot read {}: {e}", path.display())))?;
    if content.trim().is_empty() {
        refuse!(key, "{} holds no secret", path.display());
    }
    Ok(Secret::new(content.trim()))
}

/// The environment variable systemd sets to the folder of a service's credentials
/// (`LoadCredential=NAME:PATH` puts the file at `$CREDENTIALS_DIRECTORY/NAME`).
pub(crate) const CREDENTIALS_DIRECTORY: &str = "CREDENTIALS_DIRECTORY";

/// Each `env:NAME`, `file:PATH` and `credential:NAME` of `secrets` replaced with what it names
/// (a file or credential may hold several, one per line); a literal stays. `key` names them in
/// errors.
pub(crate) fn resolve_secrets(
    key: &str,
    secrets: &[Secret],
    folder: &Path,
) -> Result<Vec<Secret>, ConfigError> {
    let mut resolved = Vec::with_capacity(secrets.len());
    for secret in secrets {
        let text = secret.expose();
        if let Some(var) = text.strip_prefix("env:") {
            let value = std::env::var(var).map_err(|_| {
                ConfigError::new(key, format!("environment variable {var} is not set"))
            })?;
            resolved.push(Secret::new(value.trim()));
        } else if let Some(path) = text.strip_prefix("file:") {
            resolved.extend(read_secret_file(key, &folder.join(path))?);
        } else if let Some(name) = text.strip_prefix("credential:") {
            resolved.extend(read_secret_file(key, &credential_path(key, name)?)?);
        } else {
            resolved.push(secret.clone());
        }
    }
    Ok(resolved)
}

/// Where the credential `name` is: `$CREDENTIALS_DIRECTORY/name`. The name must be a file name
/// (as systemd's are), so a config cannot reach outside the folder with it.
fn credential_path(key: &str, name: &str) -> Result<std::path::PathBuf, ConfigError> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        refuse!(
            key,
            "credential:{name} is not a credential name (a file name, as in systemd's \
             LoadCredential=NAME:PATH)"
        );
    }
    let Some(folder) = std::env::var_os(CREDENTIALS_DIRECTORY).filter(|f| !f.is_empty()) else {
        refuse!(
            key,
            "credential:{name} needs {CREDENTIALS_DIRECTORY}, which systemd sets for a unit with \
             LoadCredential={name}:PATH; it is not set"
        );
    };
    Ok(Path::new(&folder).join(name))
}

/// The secrets in the file at `path`, at least one.
fn read_secret_file(key: &str, path: &Path) -> Result<Vec<Secret>, ConfigError> {
    let content = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new(key, format!("cannot read {}: {e}", path.display())))?;
    let secrets = parse_secret_file(&content);
    if secrets.is_empty() {
        refuse!(key, "{} holds no secret", path.display());
    }
    Ok(secrets)
}

/// `handshake = "slack" | "zoom" | "twitch"` of a source: the challenge its sender posts
/// before it delivers, answered only once the request's signature verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Handshake {
    /// Slack's `url_verification`: the challenge back.
    Slack,
    /// Zoom's `endpoint.url_validation`: the plain token and its HMAC-SHA256 with the
    /// source's first secret (Zoom's secret token).
    Zoom,
    /// Twitch EventSub's `webhook_callback_verification`: the challenge back, as text.
    Twitch,
}

impl SourceConfig {
    /// Answering `handshake` before the sender delivers.
    pub fn with_handshake(mut self, handshake: Handshake) -> Self {
        self.handshake = Some(handshake);
        self
    }

    /// With a body that is a JSON array of events at `pointer`, each element's id and type
    /// read inside it at the JSON pointers `id` and `kind`.
    pub fn with_split(
        mut self,
        pointer: impl Into<String>,
        id: impl Into<String>,
        kind: impl Into<String>,
    ) -> Self {
        self.split = Some(pointer.into());
        self.id = Some(Locator::Json(id.into()));
        self.kind = Some(Locator::Json(kind.into()));
        self
    }

    /// `split`, and the `id` and `type` it needs inside each element.
    fn validate_split(&self) -> Result<(), ConfigError> {
        let key = |field: &str| source_key(&self.name, field);
        let Some(pointer) = &self.split else {
            if self.max_events.is_some() {
                refuse!(
                    key("max_events"),
                    "applies to a source with split (a body that is an array of events) only"
                );
            }
            return Ok(());
        };
        if self.max_events == Some(0) {
            refuse!(key("max_events"), "must be at least 1");
        }
        if !pointer.is_empty() && !pointer.starts_with('/') {
            refuse!(
                key("split"),
                "must be a JSON pointer to the array of events, such as \"/\" (the body \
                 itself) or \"/events\""
            );
        }
        for (field, locator) in [("id", &self.id), ("type", &self.kind)] {
            match locator {
                Some(Locator::Json(pointer)) if pointer.starts_with('/') => {}
                Some(Locator::Json(_)) => refuse!(
                    key(&format!("{field}.json")),
                    "must be a JSON pointer such as \"/id\""
                ),
                _ => refuse!(
                    key(field),
                    "with split, must be {field} = {{ json = \"/field\" }}: it is read inside \
                     each element of the array"
                ),
            }
        }
        Ok(())
    }
}

/// Whether `name` can be a source's name: 1 to 64 letters, digits, `-` or `_` (it is the path
/// of `POST /webhooks/<name>`).
pub(crate) fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod split_and_handshake_tests {
    use std::path::Path;

    use super::super::Config;
    use super::*;

    fn source(keys: &str) -> Result<Config, ConfigError> {
        let toml = format!(
            "[[source]]\nname = \"sg\"\nscheme = \"github\"\n\
             secrets = [\"sg_literal_secret_123\"]\n{keys}\n"
        );
        let config = Config::from_toml(&toml, Path::new("."))?;
        config.validate()?;
        Ok(config)
    }

    #[test]
    fn split_takes_id_and_type_as_json_pointers_on_any_scheme() {
        let config = source(
            "split = \"/\"\nid = { json = \"/sg_event_id\" }\ntype = { json = \"/event\" }\n\
             handshake = \"zoom\"",
        )
        .unwrap();
        let sg = &config.sources[0];
        assert_eq!(sg.split.as_deref(), Some("/"));
        assert_eq!(sg.id, Some(Locator::Json("/sg_event_id".into())));
        assert_eq!(sg.handshake, Some(Handshake::Zoom));
        for (keys, key) in [
            (
                "split = \"/\"\ntype = { json = \"/event\" }",
                "source `sg`.id",
            ),
            (
                "split = \"/\"\nid = { header = \"X-Id\" }\ntype = { json = \"/event\" }",
                "source `sg`.id",
            ),
            (
                "split = \"/\"\nid = { json = \"/id\" }\ntype = { json = \"event\" }",
                "source `sg`.type.json",
            ),
            (
                "split = \"events\"\nid = { json = \"/id\" }\ntype = { json = \"/t\" }",
                "source `sg`.split",
            ),
        ] {
            let err = source(keys).unwrap_err();
            assert_eq!(err.key, key, "{keys}: {err}");
            assert!(!err.to_string().contains("X-Id"), "{err}");
        }
        let err = source("handshake = \"teams\"").unwrap_err();
        assert!(!err.to_string().contains("teams"), "{err}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key a `[[source]]` named `s` with `text` (after its name) is refused at, or `ok`.
    fn refused_at(text: &str) -> String {
        let source: SourceConfig = toml::from_str(&format!("name = \"s\"\n{text}")).unwrap();
        match source.validate() {
            Ok(()) => "ok".into(),
            Err(e) => {
                assert!(!e.message.contains("secret_12345"), "{e}");
                e.key
            }
        }
    }

    const HMAC: &str = "scheme = \"hmac\"\nsecrets = [\"secret_12345\"]\nid = { header = \"X-Id\" }\ntype = { json = \"/type\" }\n";

    #[test]
    fn templates_are_split_into_placeholders_and_text() {
        assert_eq!(
            parse_signed("v0:{timestamp}:{body}").unwrap(),
            [
                Signed::Text("v0:".into()),
                Signed::Timestamp,
                Signed::Text(":".into()),
                Signed::Body
            ]
        );
        assert_eq!(
            parse_signed("{url}{body}").unwrap(),
            [Signed::Url, Signed::Body]
        );
        for bad in [
            "{timestamp}",
            "{body",
            "{body}}",
            "{Body}",
            "{ts}.{body}",
            "}{body}",
        ] {
            assert!(parse_signed(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_generalized_hmac_is_refused_naming_the_key_that_cannot_work() {
        let slack = "hmac = { header = \"X-Slack-Signature\", prefix = \"v0=\", signed = \"v0:{timestamp}:{body}\", timestamp = { header = \"X-Slack-Request-Timestamp\" } }\ntolerance = \"1m\"\n";
        assert_eq!(refused_at(&format!("{HMAC}{slack}")), "ok");
        let twitch = "hmac = { header = \"X-S\", signed = \"{timestamp}{body}\", timestamp = { header = \"X-T\", unit = \"rfc3339\" } }\n";
        assert_eq!(refused_at(&format!("{HMAC}{twitch}")), "ok");
        for (text, key) in [
            ("hmac = { header = \"X-S\", signed = \"{url}{body}\" }", "source `s`.public_url"),
            ("hmac = { header = \"X-S\" }\npublic_url = \"https://h.example/w\"", "source `s`.public_url"),
            ("hmac = { header = \"X-S\", signed = \"{url}{body}\" }\npublic_url = \"ftp://h.example/w\"", "source `s`.public_url"),
            ("hmac = { header = \"X-S\", signed = \"{body}{extra}\" }", "source `s`.hmac.signed"),
            ("hmac = { header = \"X-S\", signed = \"{timestamp}.{body}\" }", "source `s`.hmac.timestamp"),
            ("hmac = { header = \"X-S\", timestamp = { header = \"X-T\" } }", "source `s`.hmac.signed"),
            ("hmac = { header = \"X-S\", signed = \"{timestamp}.{body}\", timestamp = { header = \"X-T\", unit = \"minutes\" } }", "source `s`.hmac.timestamp.unit"),
            ("hmac = { header = \"X-S\", signed = \"{timestamp}.{body}\", timestamp = { part = \"t\" } }", "source `s`.hmac.timestamp.part"),
            ("hmac = { header = \"X-S\", separator = \",\", signed = \"{timestamp}.{body}\", timestamp = { part = \"t\", header = \"X-T\" } }", "source `s`.hmac.timestamp"),
            ("hmac = { header = \"X-S\", separator = \"\" }", "source `s`.hmac.separator"),
            ("hmac = { header = \"X-S\" }\ntolerance = \"1m\"", "source `s`.tolerance"),
            ("hmac = { header = \"X-S\" }\ntoken = { header = \"X-T\" }", "source `s`.token"),
        ] {
            assert_eq!(refused_at(&format!("{HMAC}{text}\n")), key, "{text}");
        }
        let by_json = HMAC.replace("{ header = \"X-Id\" }", "{ json = \"/id\" }");
        assert_eq!(
            refused_at(&format!(
                "{by_json}hmac = {{ header = \"X-S\", signed = \"{{id}}.{{body}}\" }}\n"
            )),
            "source `s`.hmac.signed"
        );
    }

    #[test]
    fn every_scheme_takes_id_and_type_overrides_and_a_bad_one_is_refused_by_its_key() {
        let standard =
            "scheme = \"standard\"\nsecrets = [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"]\n";
        let stripe = "scheme = \"stripe\"\nsecrets = [\"secret_12345\"]\n";
        for (text, key) in [
            (
                format!("{standard}id = \"body_sha256\"\ntype = {{ json = \"/kind\" }}"),
                "ok",
            ),
            (
                format!("{stripe}id = {{ header = \"X-Id\" }}\ntype = {{ header = \"X-T\" }}"),
                "ok",
            ),
            (
                format!("{standard}type = {{ json = \"kind\" }}"),
                "source `s`.type.json",
            ),
            (
                format!("{standard}id = {{ json = \"id\" }}"),
                "source `s`.id.json",
            ),
            (
                format!("{stripe}id = {{ header = \"bad header\" }}"),
                "source `s`.id.header",
            ),
            (
                format!("{stripe}type = \"body_sha256\""),
                "source `s`.type.body_sha256",
            ),
            // Without a type, a configured scheme's events get the default type.
            (
                "scheme = \"basic\"\nsecrets = [\"user:secret_12345\"]\nid = \"body_sha256\""
                    .into(),
                "ok",
            ),
        ] {
            assert_eq!(refused_at(&format!("{text}\n")), key, "{text}");
        }
        let source: SourceConfig =
            toml::from_str("name = \"s\"\nscheme = \"stripe\"\nid = \"body_sha256\"").unwrap();
        assert_eq!(source.id, Some(Locator::BodySha256(true)));
        let err = super::super::Config::from_toml(
            "[[source]]\nname = \"s\"\nscheme = \"stripe\"\nid = \"whsec_not_a_place\"",
            Path::new("."),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("the text body_sha256, or a table"), "{err}");
        assert!(!err.contains("whsec_"), "{err}");
    }

    #[test]
    fn twilio_needs_its_public_url_without_a_query() {
        let twilio = "scheme = \"twilio\"\nsecrets = [\"secret_12345\"]\n";
        for (text, key) in [
            ("public_url = \"https://h.example/webhooks/sms\"", "ok"),
            ("", "source `s`.public_url"),
            (
                "public_url = \"https://h.example/w?a=1\"",
                "source `s`.public_url",
            ),
            ("public_url = \"h.example/w\"", "source `s`.public_url"),
            (
                "public_url = \"https://h.example/w\"\ntolerance = \"1m\"",
                "source `s`.tolerance",
            ),
        ] {
            assert_eq!(refused_at(&format!("{twilio}{text}\n")), key, "{text}");
        }
    }

    #[test]
    fn token_basic_and_body_sha256_are_refused_naming_the_key_that_cannot_work() {
        let ids = "id = { header = \"X-Id\" }\ntype = { header = \"X-Type\" }\n";
        for (text, key) in [
            ("scheme = \"token\"\nsecrets = [\"secret_12345\"]\ntoken = { header = \"X-Gitlab-Token\" }\n", "ok"),
            ("scheme = \"token\"\nsecrets = [\"secret_12345\"]\n", "source `s`.token"),
            ("scheme = \"token\"\nsecrets = [\"secret_12345\"]\ntoken = { header = \"bad header\" }\n", "source `s`.token.header"),
            ("scheme = \"basic\"\nsecrets = [\"user:secret_12345\"]\n", "ok"),
            ("scheme = \"basic\"\nsecrets = [\"secret_12345\"]\n", "source `s`.secrets"),
            ("scheme = \"basic\"\nsecrets = [\"u:p\"]\n", "source `s`.secrets"),
            ("scheme = \"github\"\nsecrets = [\"secret_12345\"]\n", "ok"),
        ] {
            assert_eq!(refused_at(&format!("{text}{ids}")), key, "{text}");
        }
        let basic = "scheme = \"basic\"\nsecrets = [\"user:secret_12345\"]\n";
        assert_eq!(
            refused_at(&format!("{basic}type = {{ json = \"/t\" }}\n")),
            "source `s`.id"
        );
        for (id, key) in [
            (
                "id = { body_sha256 = true }\ntype = { json = \"/t\" }",
                "ok",
            ),
            (
                "id = { body_sha256 = false }\ntype = { json = \"/t\" }",
                "source `s`.id.body_sha256",
            ),
            (
                "id = { json = \"/id\" }\ntype = { body_sha256 = true }",
                "source `s`.type.body_sha256",
            ),
        ] {
            assert_eq!(refused_at(&format!("{basic}{id}\n")), key, "{id}");
        }
    }
}
