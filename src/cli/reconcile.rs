//! `hookledger reconcile`: one run of [`crate::stripe::reconcile`] from the command line, on the
//! database `serve` uses (it may run meanwhile).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use clap::Args;

use crate::app::Hookledger;
use crate::config::{self, Config, Database, SchemeName, Secret, SourceConfig};
use crate::stripe::api::StripeApi;
use crate::stripe::reconcile::{Counts, Run};
use crate::stripe::settings::{check_api_base, MAX_RECONCILE_SINCE, STRIPE_API_BASE};

use super::common::Exit;

#[derive(Debug, Args)]
pub struct ReconcileArgs {
    /// The stripe source to reconcile (a `[[source]]` of --config; without one, the quick
    /// start's `stripe`).
    #[arg(long, default_value = "stripe")]
    source: String,
    /// How far back to look (e.g. 3d, 12h); Stripe keeps events for 30 days.
    #[arg(long, value_parser = config::parse_duration, default_value = "3d")]
    since: Duration,
    /// Count what would be applied; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Stripe's API [default: the source's api_base, else https://api.stripe.com].
    #[arg(long)]
    api_base: Option<String>,
    /// The secret API key, as env:NAME or file:PATH [default: the source's api_key, else
    /// env:STRIPE_API_KEY]. A restricted key that may read Events (and Subscriptions).
    #[arg(long, value_name = "env:NAME|file:PATH")]
    api_key: Option<String>,
    /// Print the counts as one JSON object.
    #[arg(long)]
    json: bool,
    /// Queue each applied event for delivery to the app, as `serve --forward-to` does (with
    /// a config file that forwards, it is on already).
    #[arg(long)]
    forward: bool,
    /// Credits per paid invoice, as `serve` was given them. [default: the config's, else 100]
    #[arg(long)]
    credits_per_invoice: Option<i64>,
    /// A TOML config file: the source, its handlers and effects, and the database.
    #[arg(long, env = "HOOKLEDGER_CONFIG")]
    config: Option<PathBuf>,
    /// SQLite database file, or a PostgreSQL URL [default: the config's, else
    /// ./hookledger.db].
    #[arg(long, env = "HOOKLEDGER_DATABASE", hide_env_values = true)]
    db: Option<Database>,
}

pub(crate) fn run(args: ReconcileArgs) -> anyhow::Result<Exit> {
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config {
            sources: vec![SourceConfig::stripe(Vec::new())],
            ..Config::default()
        },
    };
    if let Some(db) = args.db.clone() {
        config.database = db;
    }
    if let Some(credits) = args.credits_per_invoice {
        config.stripe_billing.set("credits_per_invoice", credits)?;
    }
    if args.since.is_zero() || args.since > MAX_RECONCILE_SINCE {
        bail!("--since must be more than 0 and at most 30d (Stripe keeps events for 30 days)");
    }
    let Some(source_config) = config.sources.iter().find(|s| s.name == args.source) else {
        bail!("--source {}: there is no such source", args.source);
    };
    if source_config.scheme != SchemeName::Stripe {
        bail!(
            "--source {}: reconcile reads Stripe's API; this source's scheme is {}",
            args.source,
            source_config.scheme.as_str()
        );
    }
    let run = Run {
        api: api(&args, source_config)?,
        since: crate::time::unix_now() - args.since.as_secs() as i64,
        dry_run: args.dry_run,
    };
    // Queued for delivery as `serve --forward-to` would, by the serve that delivers them.
    let hookledger = Hookledger::open_for_command(config, args.forward)?;
    let counts = hookledger.reconcile(&args.source, &run);
    hookledger.close();
    let counts = counts?;
    print(&counts, args.json, args.dry_run)?;
    Ok(if counts.failed == 0 {
        Exit::Ok
    } else {
        Exit::Failed
    })
}

/// The API client: `--api-base`/`--api-key` over the source's, the key else from
/// `STRIPE_API_KEY`.
fn api(args: &ReconcileArgs, source: &SourceConfig) -> anyhow::Result<StripeApi> {
    let key = match &args.api_key {
        Some(reference) => super::common::secret_flag("--api-key", reference)?,
        None => match &source.api_key {
            Some(key) => key.clone(),
            None => Secret::new(std::env::var("STRIPE_API_KEY").map_err(|_| {
                anyhow::anyhow!(
                    "no Stripe API key: set STRIPE_API_KEY, pass --api-key env:NAME, or give the \
                     source api_key = \"env:NAME\" in the config file"
                )
            })?),
        },
    };
    if let Some(base) = &args.api_base {
        check_api_base("--api-base", base)?;
    }
    let base = args
        .api_base
        .as_deref()
        .or(source.api_base.as_deref())
        .unwrap_or(STRIPE_API_BASE);
    Ok(StripeApi::new(base, key))
}

fn print(counts: &Counts, json: bool, dry_run: bool) -> anyhow::Result<()> {
    if json {
        let mut value = serde_json::to_value(counts)?;
        value["dry_run"] = dry_run.into();
        println!("{value}");
    } else {
        let applied = if dry_run { "would apply" } else { "applied" };
        println!(
            "found {}, {applied} {}, already present {}, failed {}",
            counts.found, counts.applied, counts.already_present, counts.failed
        );
    }
    Ok(())
}
