//! `hookledger reconcile`: one run of a source's recovery (Stripe's [`crate::stripe::reconcile`],
//! GitHub's, GitLab's, Paddle's or WorkOS's in [`crate::recover`]) from the command line, on the database `serve`
//! uses (it may run meanwhile).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::app::{Counts, Hookledger};
use crate::config::{self, Config, Database, SourceConfig};

use super::common::Exit;

#[derive(Debug, Args)]
pub struct ReconcileArgs {
    /// The source to reconcile: a stripe source, a github source with a `hook` (`"app"`: the
    /// App's JWT from its app_id and private_key), a gitlab source with a `hook`, a paddle
    /// or a workos source (a `[[source]]` of --config; without one, the quick start's `stripe`).
    #[arg(long, default_value = "stripe")]
    source: String,
    /// How far back to look (e.g. 3d, 12h); Stripe keeps events for 30 days, GitHub a hook's
    /// deliveries for 3, GitLab a hook's requests for 7, Paddle events for 90, WorkOS
    /// for 30.
    #[arg(long, value_parser = config::parse_duration, default_value = "3d")]
    since: Duration,
    /// Count what would be applied; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// The provider's API [default: the source's api_base, else https://api.stripe.com,
    /// https://api.github.com,
    /// https://gitlab.com/api/v4, https://api.paddle.com or https://api.workos.com].
    #[arg(long)]
    api_base: Option<String>,
    /// The secret API key, as env:NAME, file:PATH or credential:NAME [default: the source's
    /// api_key, else (Stripe) env:STRIPE_API_KEY]. Stripe: a restricted key that may read
    /// Events (and Subscriptions); GitHub: a token that may read the hook's deliveries (and
    /// write them, to redeliver); Paddle, WorkOS: an API key that may read events.
    #[arg(long, value_name = "env:NAME|file:PATH|credential:NAME")]
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
    let api_key = match &args.api_key {
        Some(reference) => Some(super::common::secret_flag("--api-key", reference)?),
        None => None,
    };
    // With --forward, events are queued for delivery as `serve --forward-to` would, by the serve
    // that delivers them.
    let hookledger = Hookledger::open_for_command(config, args.forward)?;
    let counts = hookledger.reconcile(
        &args.source,
        args.since,
        args.dry_run,
        args.api_base.as_deref(),
        api_key,
    );
    hookledger.close();
    let counts = counts?;
    print(&counts, args.json, args.dry_run)?;
    Ok(if counts.failed == 0 {
        Exit::Ok
    } else {
        Exit::Failed
    })
}

fn print(counts: &Counts, json: bool, dry_run: bool) -> anyhow::Result<()> {
    if json {
        let mut value = serde_json::to_value(counts)?;
        value["dry_run"] = dry_run.into();
        println!("{value}");
    } else {
        let applied = if dry_run { "would apply" } else { "applied" };
        // Only a redeliver run asks for redeliveries; the other runs' line stays as it was.
        let redelivered = match counts.redelivered {
            0 => String::new(),
            n => format!(", asked the provider to redeliver {n}"),
        };
        println!(
            "found {}, {applied} {}{redelivered}, already present {}, failed {}",
            counts.found, counts.applied, counts.already_present, counts.failed
        );
    }
    Ok(())
}
