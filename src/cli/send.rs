//! `hookledger send --source NAME`: sign a file as that source's provider would, headers and
//! all, so the local dev loop works for every scheme.

use anyhow::{bail, Context};

use crate::cli::SendArgs;
use crate::config::{Config, Locator, SchemeName, Secret};
use crate::source::Source;

/// The URL and headers to send `body` as source `name` of the config file at `timestamp`.
pub(crate) fn signed_as_source(
    args: &SendArgs,
    name: &str,
    body: &[u8],
    timestamp: i64,
) -> anyhow::Result<(String, Vec<(String, String)>)> {
    let path = args
        .config
        .as_deref()
        .context("--source needs --config (or HOOKLEDGER_CONFIG)")?;
    // Only the chosen source's secrets are read: the others' variables need not be set.
    let (config, folder) = Config::read(path)?;
    let Some(mut source) = config.sources.iter().find(|s| s.name == name).cloned() else {
        let names: Vec<&str> = config.sources.iter().map(|s| s.name.as_str()).collect();
        bail!(
            "no source `{name}` in {} (it has: {})",
            path.display(),
            names.join(", ")
        );
    };
    let header_type = match source.scheme {
        SchemeName::Github => Some("X-GitHub-Event"),
        SchemeName::Shopify => Some("X-Shopify-Topic"),
        SchemeName::Hmac => match &source.kind {
            Some(Locator::Header(name)) => Some(name.as_str()),
            _ => None,
        },
        SchemeName::Stripe | SchemeName::Standard => None,
    };
    let kind = match (&args.kind, header_type) {
        (Some(kind), _) => kind.clone(),
        (None, Some(header)) => bail!(
            "--type is needed: scheme {} sends the event type in the {header} header",
            source.scheme.as_str()
        ),
        (None, None) => String::new(),
    };
    // `--secret` replaces the source's own secrets; STRIPE_WEBHOOK_SECRET (which also fills
    // it) is for Stripe without a config file, not for the config's sources.
    let from_env = crate::cli::from_environment(&args.secret, "STRIPE_WEBHOOK_SECRET");
    match args.secret.as_ref().filter(|_| !from_env) {
        Some(secret) => source.secrets = vec![Secret::new(secret.trim())],
        None => source.resolve_secrets(&folder)?,
    }
    source.validate()?;
    let id = match &args.id {
        Some(id) => id.clone(),
        None => random_id()?,
    };
    let scheme = Source::from_config(&source, &config.stripe_billing, false, usize::MAX)?.scheme;
    let url = args
        .url
        .clone()
        .unwrap_or_else(|| format!("http://{}/webhooks/{name}", config.listen));
    Ok((url, scheme.sign(body, timestamp, &id, &kind)))
}

/// A fresh delivery id (`hl_` and 16 random hex digits).
fn random_id() -> anyhow::Result<String> {
    Ok(format!("hl_{}", crate::dev::random_hex()?))
}
