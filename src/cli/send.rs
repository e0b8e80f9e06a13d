//! `hookledger send --source NAME`: sign a file as that source's provider would, headers and
//! all, so the local dev loop works for every scheme.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;

use crate::cli::common::{from_environment, Exit};
use crate::config::{self, Config, Locator, SchemeName, Secret};
use crate::dev::client::Client;
use crate::source::Source;

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  Stripe (no config file):  STRIPE_WEBHOOK_SECRET=whsec_... hookledger send event.json
  any source of a config:   hookledger send --config hookledger.toml --source stripe event.json
  GitHub:    hookledger send --config hookledger.toml --source gh --type push push.json
  Shopify:   hookledger send --config hookledger.toml --source shop --type orders/create order.json
  Standard:  hookledger send --config hookledger.toml --source clerk user.json
  hmac:      hookledger send --config hookledger.toml --source acme --type order.paid order.json
  token:     hookledger send --config hookledger.toml --source gitlab --type \"Push Hook\" push.json
  basic:     hookledger send --config hookledger.toml --source postmark delivery.json
  twilio:    hookledger send --config hookledger.toml --source twilio status.txt (a form body)

With --source, the request is signed as that source's scheme with its first secret, with the
headers the provider sends (the event id is made from the file's bytes unless --id or
--new-id is given: the same file again is a duplicate), and goes to
http://<listen>/webhooks/<source> unless --url says otherwise.")]
pub struct SendArgs {
    /// The event file; its bytes are sent exactly as stored (for a mailgun source, with the
    /// `signature` object written into it, as Mailgun signs).
    pub file: PathBuf,
    /// Sign as this source of the config file (its scheme, its first secret) instead of as
    /// Stripe with --secret.
    #[arg(long, requires = "config")]
    pub source: Option<String>,
    /// The config file that names the source.
    #[arg(long, env = "HOOKLEDGER_CONFIG")]
    pub config: Option<PathBuf>,
    /// Where to send it [default: http://127.0.0.1:8080/webhooks/stripe, or the source's URL].
    #[arg(long)]
    pub url: Option<String>,
    /// Signing secret (default: the first of STRIPE_WEBHOOK_SECRET, or the source's first).
    #[arg(long, env = "STRIPE_WEBHOOK_SECRET", hide_env_values = true)]
    pub secret: Option<String>,
    /// Signature timestamp (default: now).
    #[arg(long)]
    pub timestamp: Option<i64>,
    /// The event id, for schemes that send it in a header (default: one made from the file's
    /// bytes, so sending the same file again is a duplicate; see --new-id).
    #[arg(long, conflicts_with = "new_id")]
    pub id: Option<String>,
    /// Make up a fresh event id (schemes that send it in a header), so the same file is a
    /// new event each time.
    #[arg(long)]
    pub new_id: bool,
    /// The event type, for schemes that send it in a header (github, shopify, some hmac,
    /// token and basic sources).
    #[arg(long = "type")]
    pub kind: Option<String>,
}

/// Sends the file of `args`, signed, and prints the answer.
pub(crate) fn run(args: SendArgs) -> anyhow::Result<Exit> {
    let body = std::fs::read(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let timestamp = args.timestamp.unwrap_or_else(crate::time::unix_now);
    let (url, headers, body) = match &args.source {
        Some(name) => signed_as_source(&args, name, body, timestamp)?,
        None => {
            let secret = args
                .secret
                .as_deref()
                .map(config::parse_secret_list)
                .and_then(|list| list.into_iter().next())
                .context(
                    "no signing secret: pass --secret whsec_... or set STRIPE_WEBHOOK_SECRET \
                     (or --config and --source to sign as another source)",
                )?;
            let header = crate::source::stripe::sign(&secret, timestamp, &body);
            let url = args
                .url
                .clone()
                .unwrap_or_else(|| "http://127.0.0.1:8080/webhooks/stripe".into());
            (
                url,
                vec![(crate::source::stripe::HEADER.to_string(), header)],
                body,
            )
        }
    };
    let headers: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let reply = Client::default()
        .post(&url, &body, &headers)
        .with_context(|| format!("cannot reach {url}"))?;
    println!("{}", reply.status);
    println!("{}", reply.body.trim_end());
    Ok(if (200..300).contains(&reply.status) {
        Exit::Ok
    } else {
        Exit::Failed
    })
}

/// A request to send: its URL, headers and body.
type Request = (String, Vec<(String, String)>, Vec<u8>);

/// The URL, headers and body to send `body` as source `name` of the config file at
/// `timestamp`: the body as it is, or signed where the scheme writes its signature into it
/// (Mailgun's `signature` object; the rest of the body's bytes are kept).
pub(crate) fn signed_as_source(
    args: &SendArgs,
    name: &str,
    body: Vec<u8>,
    timestamp: i64,
) -> anyhow::Result<Request> {
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
    let header_type = match (
        source.kind.as_ref().and_then(Locator::header),
        source.scheme,
    ) {
        (Some(name), _) => Some(name),
        (_, SchemeName::Github) => Some("X-GitHub-Event"),
        (_, SchemeName::Shopify) => Some("X-Shopify-Topic"),
        _ => None,
    };
    let kind = match (&args.kind, header_type) {
        (Some(kind), _) => kind.clone(),
        (None, Some(header)) => {
            bail!("--type is needed: source `{name}` reads the event type from the {header} header")
        }
        (None, None) => String::new(),
    };
    // `--secret` replaces the source's own secrets; STRIPE_WEBHOOK_SECRET (which also fills
    // it) is for Stripe without a config file, not for the config's sources.
    let from_env = from_environment(&args.secret, "STRIPE_WEBHOOK_SECRET");
    match args.secret.as_ref().filter(|_| !from_env) {
        Some(secret) => source.secrets = vec![Secret::new(secret.trim())],
        None => source.resolve_secrets(&folder)?,
    }
    source.validate()?;
    let id = match &args.id {
        Some(id) => id.clone(),
        None if args.new_id => random_id()?,
        None => stable_id(&body),
    };
    let built = Source::from_config(&source, false, usize::MAX, Default::default())?;
    let scheme = &built.scheme;
    if let Some(why) = scheme.cannot_sign() {
        bail!("source `{name}`: {why}");
    }
    let url = args
        .url
        .clone()
        .unwrap_or_else(|| format!("http://{}/webhooks/{name}", config.listen));
    let body = match scheme.sign_body(&body, timestamp) {
        Some(signed) => signed,
        None if source.scheme == SchemeName::Mailgun => bail!(
            "source `{name}`: the file is not a JSON object, so Mailgun's `signature` object \
             cannot be written into it"
        ),
        None => body,
    };
    let mut headers = scheme.sign(&body, timestamp, &id, &kind);
    headers.extend(built.override_headers(&id, &kind));
    Ok((url, headers, body))
}

/// The id of a file's event: `hl_` and the first 16 hex digits of the SHA-256 of its bytes, the
/// same each time the file is sent.
fn stable_id(body: &[u8]) -> String {
    use sha2::Digest;
    format!("hl_{}", &hex::encode(sha2::Sha256::digest(body))[..16])
}

/// A fresh delivery id (`hl_` and 16 random hex digits).
fn random_id() -> anyhow::Result<String> {
    Ok(format!("hl_{}", crate::dev::random_hex()?))
}
