//! `[[source]]`: a named sender, its signature scheme, its secrets and its handlers.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::{
    check_secret, decode_standard_key, parse_secret_file, refuse, source_key, ConfigError, Secret,
};

/// One sender: `POST /webhooks/{name}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct SourceConfig {
    /// The path segment of its URL and the first half of its events' ledger key.
    pub name: String,
    pub scheme: SchemeName,
    /// Any one may match (rotation). In a config file each is `env:NAME`, `file:PATH` or,
    /// discouraged, the secret itself; once loaded, the secrets themselves.
    #[serde(default)]
    pub secrets: Vec<Secret>,
    /// How far a signed timestamp may be from now (schemes that sign one: `stripe`,
    /// `standard` and `ecdsa`; `0s` turns the check off). Default: 5 minutes; for `ecdsa`,
    /// off (SendGrid's SDKs check no age, and SendGrid retries for up to 24 hours).
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
    /// Scheme `hmac` only: where the event id is.
    #[serde(default)]
    pub id: Option<Locator>,
    /// Scheme `hmac` only: where the event type is.
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
    /// The provider's API, with an `api_key` and a handler that keeps a snapshot of an
    /// object: when the object's current state is fetched after commit. Default: on ties.
    #[serde(default)]
    pub refresh: Refresh,
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
    /// SendGrid's signed Event Webhook: ECDSA P-256, verified with SendGrid's public key.
    Ecdsa,
}

impl ReconcileConfig {
    /// Every `every`, looking back `since`.
    pub fn new(every: Duration, since: Duration) -> ReconcileConfig {
        ReconcileConfig { every, since }
    }
}

impl SchemeName {
    /// Whether the scheme signs a timestamp (and so has a tolerance).
    pub(crate) fn signs_time(self) -> bool {
        matches!(
            self,
            SchemeName::Stripe | SchemeName::Standard | SchemeName::Ecdsa
        )
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SchemeName::Stripe => "stripe",
            SchemeName::Standard => "standard",
            SchemeName::Github => "github",
            SchemeName::Shopify => "shopify",
            SchemeName::Hmac => "hmac",
            SchemeName::Ecdsa => "ecdsa",
        }
    }
}

/// A plain HMAC over the body, as in-house senders make it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct HmacConfig {
    /// The request header that carries the signature.
    pub header: String,
    #[serde(default)]
    pub algorithm: HmacAlgorithm,
    #[serde(default)]
    pub encoding: HmacEncoding,
    /// Text before the encoded signature in the header (`sha256=`), if any.
    #[serde(default)]
    pub prefix: String,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum HmacAlgorithm {
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
/// into the body).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
#[non_exhaustive]
pub enum Locator {
    Header(String),
    Json(String),
}

impl HmacConfig {
    /// The signature in header `header`: HMAC-SHA256 in hex, with no prefix.
    pub fn new(header: impl Into<String>) -> HmacConfig {
        HmacConfig {
            header: header.into(),
            algorithm: HmacAlgorithm::default(),
            encoding: HmacEncoding::default(),
            prefix: String::new(),
        }
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
            id: None,
            kind: None,
            api_key: None,
            api_base: None,
            reconcile: None,
            refresh: Refresh::default(),
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

    /// Replaces each `env:NAME` and `file:PATH` secret with what it names (`file:` paths
    /// relative to `folder`).
    pub(crate) fn resolve_secrets(&mut self, folder: &Path) -> Result<(), ConfigError> {
        self.secrets = resolve_secrets(&source_key(&self.name, "secrets"), &self.secrets, folder)?;
        if let Some(api_key) = &self.api_key {
            let key = source_key(&self.name, "api_key");
            self.api_key = Some(one_secret(&key, api_key, folder)?);
        }
        Ok(())
    }

    /// Refuses what cannot work, naming the source and the key.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let name = &self.name;
        let key = |field: &str| source_key(name, field);
        let valid_name = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !valid_name {
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
                // A public key: its form is checked when the source is built (start-up).
                SchemeName::Ecdsa => Ok(()),
                _ => check_secret(secret.expose()),
            };
            checked.map_err(|why| ConfigError::new(key("secrets"), format!("refused: {why}")))?;
        }
        if self.tolerance.is_some() && !self.scheme.signs_time() {
            refuse!(
                key("tolerance"),
                "does not apply: scheme {scheme} signs no timestamp (the ledger is its only \
                 replay protection; see retention.claim_days)"
            );
        }
        if self.scheme == SchemeName::Hmac {
            let Some(hmac) = &self.hmac else {
                refuse!(
                    key("hmac"),
                    "missing: scheme hmac needs \
                     hmac = {{ header = \"X-Signature\", algorithm = \"sha256\", encoding = \"hex\" }}"
                );
            };
            check_header_name(&key("hmac.header"), &hmac.header)?;
            for (field, locator) in [("id", &self.id), ("type", &self.kind)] {
                match locator {
                    None => refuse!(
                        key(field),
                        "missing: scheme hmac needs {field} = {{ header = \"X-...\" }} or \
                         {{ json = \"/field\" }}"
                    ),
                    Some(Locator::Header(header)) => {
                        check_header_name(&key(&format!("{field}.header")), header)?
                    }
                    Some(Locator::Json(pointer)) if !pointer.starts_with('/') => refuse!(
                        key(&format!("{field}.json")),
                        "must be a JSON pointer such as \"/id\""
                    ),
                    Some(Locator::Json(_)) => {}
                }
            }
        } else {
            for (field, set) in [
                ("hmac", self.hmac.is_some()),
                ("id", self.id.is_some()),
                ("type", self.kind.is_some()),
            ] {
                if set {
                    refuse!(key(field), "applies to scheme hmac only, not {scheme}");
                }
            }
        }
        self.validate_api()
    }
}

impl SourceConfig {
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
            if self.api_key.is_none() {
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

/// Each `env:NAME` and `file:PATH` of `secrets` replaced with what it names (a file may hold
/// several, one per line); a literal stays. `key` names them in errors.
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
            let path = folder.join(path);
            let content = std::fs::read_to_string(&path).map_err(|e| {
                ConfigError::new(key, format!("cannot read {}: {e}", path.display()))
            })?;
            let secrets = parse_secret_file(&content);
            if secrets.is_empty() {
                refuse!(key, "{} holds no secret", path.display());
            }
            resolved.extend(secrets);
        } else {
            resolved.push(secret.clone());
        }
    }
    Ok(resolved)
}
