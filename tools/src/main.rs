//! `hookledger-bench`: the benchmark and the load generator for hookledger. They drive the
//! real `hookledger` binary over HTTP (the bench starts it as a child process), so what they
//! measure is what ships. Exit code: 0 ok, 1 the ledger check lost events, 2 could not run.

mod batch;
mod bench;
mod brokers;
mod compare;
mod console;
mod growth;
mod lanes;
mod loadgen;
mod plain;
mod pooler;
mod prune;
mod restarts;
mod start;
mod storage;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use hookledger::Secret;

#[derive(Debug, Parser)]
#[command(name = "hookledger-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Measure shipped vs one-event-per-transaction vs the raw SQLite ceiling, in one run.
    Run(RunArgs),
    /// Send pre-signed realistic events to a running hookledger and report throughput and
    /// latency; with --db, check the ledger holds exactly the events that got a 200.
    Loadgen(LoadgenArgs),
    /// Cost as the ledger grows: pre-fills ledgers of N claims (time-ordered and random ids),
    /// then loads a pre-filled and an empty one alternately, optionally in a memory limit.
    Growth(growth::GrowthArgs),
    /// Pruning under load: an open-loop load on a ledger whose expired rows the server prunes,
    /// beside the same load on a copy where nothing is expired; p99, the WAL's peak, the file
    /// before and after.
    Prune(prune::PruneArgs),
    /// Delivery lanes: drain rate per concurrency, a healthy kind's latency beside a dead or
    /// hanging one, the time to deliver an outage's backlog; each comparison in one run.
    Lanes(LanesArgs),
    /// Bytes on disk per event: N signed 3.4–5.2 KB Stripe events with and without
    /// forwarding (outbox drained), on SQLite (file + write-ahead log after a checkpoint) and
    /// with --postgres on PostgreSQL; run it with two binaries for a before/after.
    Storage(StorageArgs),
    /// Two `hookledger` binaries (e.g. the last release and a change) under the same load in
    /// alternating rounds, a fresh database each run: median events/s with its range, p50 and
    /// p99, NEW/OLD; on SQLite or (--store postgres) PostgreSQL.
    Compare(compare::CompareArgs),
    /// How soon `serve` answers after `kill -9` on a large ledger (no saved filter), for two
    /// binaries side by side: the first `processed` and the first `duplicate` from the spawn,
    /// the ledger read from the disk.
    Start(start::StartArgs),
    /// An open-loop load, a new connection per request, while `serve` restarts in place
    /// (SIGUSR2), reloads (SIGHUP) or is stopped and started: refused, cut, non-2xx,
    /// acknowledged and lost.
    Restarts(restarts::RestartsArgs),
    /// How long `/status` and `/metrics` take over a large outbox (100,000 rows due and
    /// 100,000 in 500 other kinds) while the worker fails attempts: median, p99, slowest; the
    /// run fails if one took over 100 ms.
    Console(console::ConsoleArgs),
    /// What one big batch body costs the other sources: Stripe events at a fixed rate, alone
    /// and while 5,000-element HubSpot-shaped bodies are posted back to back, for one or two
    /// binaries: the Stripe events' median, p99 and slowest, and each body's time.
    Batch(batch::BatchArgs),
    /// Delivery into message brokers: a backlog of outbox rows published into a NATS
    /// JetStream stream, a RabbitMQ exchange and a Redis stream, beside the same backlog
    /// posted to a local app: rows/s each and the ratio to HTTP, in one run.
    Brokers(BrokersArgs),
    /// Two instances on one PostgreSQL database, directly and through a PgBouncer of its own
    /// in transaction pooling mode (`pooler=transaction`), in alternating rounds: two loads at
    /// once, summed events/s (median, range), each load's p99, non-200s, the ledger checked;
    /// pooled/direct.
    Pooler(pooler::PoolerArgs),
}

#[derive(Debug, Args)]
struct BrokersArgs {
    /// Where the databases (and the brokers' temp dirs) go.
    #[arg(long, default_value = "./target/bench")]
    dir: PathBuf,
    /// The `hookledger` binary [default: `hookledger` next to this binary].
    #[arg(long)]
    exe: Option<PathBuf>,
    /// Rows in the backlog.
    #[arg(long, default_value_t = 10_000)]
    rows: usize,
    /// The lane's concurrency (8 is the default lane's).
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Runs of each target, alternating; the table has the medians.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// At most this long per run, in s.
    #[arg(long, default_value_t = 300)]
    window: u64,
    /// The RabbitMQ (not started here).
    #[arg(
        long,
        env = "HOOKLEDGER_TEST_AMQP",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f",
        hide_env_values = true
    )]
    amqp: String,
}

#[derive(Debug, Args)]
struct StorageArgs {
    /// Events sent per measurement.
    #[arg(long, default_value_t = 20_000)]
    events: usize,
    /// Where the databases go.
    #[arg(long, default_value = "./target/bench")]
    dir: PathBuf,
    /// The `hookledger` binary [default: `hookledger` next to this binary].
    #[arg(long)]
    exe: Option<PathBuf>,
    /// Also on PostgreSQL: a URL of a database where CREATE DATABASE may run.
    #[arg(long)]
    postgres: Option<String>,
}

#[derive(Debug, Args)]
struct LanesArgs {
    /// Which measurement (default: all three, in this order).
    #[arg(long, value_parser = ["drain", "isolation", "outage"])]
    only: Option<String>,
    /// Where the databases go.
    #[arg(long, default_value = "./target/bench")]
    dir: PathBuf,
    /// The `hookledger` binary [default: `hookledger` next to this binary].
    #[arg(long)]
    exe: Option<PathBuf>,
    /// drain: rows in the backlog.
    #[arg(long, default_value_t = 10_000)]
    rows: usize,
    /// drain: the target's answer time, in ms.
    #[arg(long, default_value_t = 100)]
    delay_ms: u64,
    /// drain: at most this long per concurrency, in s.
    #[arg(long, default_value_t = 60)]
    window: u64,
    /// drain: the concurrencies compared.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    concurrency: Vec<usize>,
    /// isolation: seconds of sending.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// isolation and outage: events per second.
    #[arg(long)]
    rate: Option<f64>,
    /// outage: how long the app is down, in s.
    #[arg(long, default_value_t = 120)]
    outage: u64,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Requests per measurement at C >= 16 (a fifth at C = 1).
    #[arg(long, default_value_t = 60_000)]
    requests: usize,
    /// Where the databases go: the disk being measured.
    #[arg(long, default_value = "./target/bench")]
    dir: PathBuf,
    /// The `hookledger` binary to run as the server [default: `hookledger` next to this
    /// binary, e.g. target/release/hookledger].
    #[arg(long)]
    exe: Option<PathBuf>,
    /// Instead: latency of normal events under 200 idle and 50 slow-body connections, and the
    /// server's memory while 1000 connections send 1 MiB bodies they never finish.
    #[arg(long)]
    hostile: bool,
    /// Also the PostgreSQL column: a URL of a database where CREATE DATABASE may run (each
    /// measurement gets a fresh database beside it).
    #[arg(long)]
    postgres: Option<String>,
    /// With --postgres: only the PostgreSQL table (it has a SQLite row of its own).
    #[arg(long, requires = "postgres")]
    postgres_only: bool,
}

#[derive(Debug, Args)]
struct LoadgenArgs {
    /// The server's address.
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: SocketAddr,
    /// Requests in total (new events plus resends).
    #[arg(long, default_value_t = 20_000)]
    requests: usize,
    /// Keep-alive connections sending at once (with --rate: the most requests in flight).
    #[arg(long, short = 'c', default_value_t = 64)]
    connections: usize,
    /// Open loop: send this many requests a second on a fixed schedule, whatever the answers,
    /// and time each from when it was due (a stall counts for every request due during it).
    /// Without it, each connection sends its next request when it has its answer.
    #[arg(long)]
    rate: Option<f64>,
    /// Share of requests that resend an earlier event, 0.0 to 1.0.
    #[arg(long, default_value_t = 0.2)]
    resend: f64,
    /// The server's signing secret (comma-separated during rotation: the first one signs).
    #[arg(long, env = "STRIPE_WEBHOOK_SECRET", hide_env_values = true)]
    secret: String,
    /// The server's database file, for the ledger check.
    #[arg(long)]
    db: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Time-ordered ids (Stripe's) or random ones (UUIDs).
    #[arg(long, value_enum, default_value = "ordered")]
    ids: loadgen::Ids,
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Run(args) => run(args),
        Command::Loadgen(args) => loadgen(args),
        Command::Growth(args) => growth::run(args),
        Command::Prune(args) => prune::run(args),
        Command::Lanes(args) => lanes(args),
        Command::Storage(args) => storage(args),
        Command::Compare(args) => compare::run(&args),
        Command::Start(args) => start::run(args),
        Command::Console(args) => console::run(args),
        Command::Restarts(args) => restarts::run(args),
        Command::Batch(args) => batch::run(args),
        Command::Brokers(args) => brokers(args),
        Command::Pooler(args) => pooler::run(&args).map(|()| true),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn lanes(args: LanesArgs) -> anyhow::Result<bool> {
    std::fs::create_dir_all(&args.dir)?;
    let config = lanes::LanesConfig {
        dir: args.dir,
        exe: server_exe(args.exe)?,
    };
    let only = args.only.as_deref();
    if only.is_none_or(|o| o == "drain") {
        let delay = std::time::Duration::from_millis(args.delay_ms);
        let window = std::time::Duration::from_secs(args.window);
        lanes::drain(&config, args.rows, delay, window, &args.concurrency)?;
    }
    if only.is_none_or(|o| o == "isolation") {
        lanes::isolation(&config, args.seconds, args.rate.unwrap_or(20.0))?;
    }
    if only.is_none_or(|o| o == "outage") {
        let outage = std::time::Duration::from_secs(args.outage);
        lanes::outage(&config, outage, args.rate.unwrap_or(10.0))?;
    }
    Ok(true)
}

fn brokers(args: BrokersArgs) -> anyhow::Result<bool> {
    std::fs::create_dir_all(&args.dir)?;
    brokers::run(&brokers::BrokersConfig {
        lanes: lanes::LanesConfig {
            dir: args.dir,
            exe: server_exe(args.exe)?,
        },
        rows: args.rows,
        concurrency: args.concurrency,
        rounds: args.rounds,
        window: std::time::Duration::from_secs(args.window),
        amqp_url: args.amqp,
    })?;
    Ok(true)
}

fn storage(args: StorageArgs) -> anyhow::Result<bool> {
    storage::run(&storage::StorageConfig {
        dir: args.dir,
        exe: server_exe(args.exe)?,
        events: args.events,
        postgres: args.postgres,
    })?;
    Ok(true)
}

fn run(args: RunArgs) -> anyhow::Result<bool> {
    let exe = server_exe(args.exe)?;
    let config = bench::BenchConfig {
        requests: args.requests,
        dir: args.dir,
        exe,
    };
    if args.hostile {
        bench::hostile(&config)?;
        return Ok(true);
    }
    if !args.postgres_only {
        bench::run(&config)?;
    }
    if let Some(url) = &args.postgres {
        bench::postgres(&config, url)?;
    }
    Ok(true)
}

/// `exe`, or `hookledger` next to this binary; an error if it is not there.
fn server_exe(exe: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let exe = match exe {
        Some(exe) => exe,
        None => std::env::current_exe()
            .context("finding this binary")?
            .with_file_name("hookledger"),
    };
    anyhow::ensure!(
        exe.is_file(),
        "no hookledger binary at {} (build it with `cargo build --release -p hookledger`, or pass --exe)",
        exe.display()
    );
    Ok(exe)
}

/// Returns false when the ledger check finds acknowledged events missing.
fn loadgen(args: LoadgenArgs) -> anyhow::Result<bool> {
    let secret = args
        .secret
        .split(',')
        .map(str::trim)
        .find(|s| !s.is_empty())
        .map(Secret::new)
        .context("no signing secret")?;
    let workload = loadgen::Workload {
        requests: args.requests,
        resend_share: args.resend.clamp(0.0, 1.0),
        seed: args.seed,
        ids: args.ids,
    };
    let requests = loadgen::prepare(&workload, &secret, &args.addr.to_string());
    let report = match args.rate {
        Some(rate) => {
            anyhow::ensure!(rate > 0.0, "--rate must be more than 0");
            loadgen::run_open(args.addr, &requests, rate, args.connections)
        }
        None => loadgen::run(args.addr, &requests, args.connections),
    };
    let ms = |p: f64| format!("{:.2}", report.percentile(p).as_secs_f64() * 1000.0);
    println!(
        "{} requests over {} connections{} in {:.2} s: {:.0} events/s",
        report.requests(),
        args.connections,
        match args.rate {
            Some(rate) => format!(", open loop at {rate}/s"),
            None => String::new(),
        },
        report.elapsed.as_secs_f64(),
        report.per_second()
    );
    println!(
        "latency ms: p50 {} p90 {} p99 {} max {}",
        ms(50.0),
        ms(90.0),
        ms(99.0),
        ms(100.0)
    );
    println!(
        "statuses: {}; processed {}, duplicate {}",
        report.status_summary(),
        report.processed,
        report.duplicates
    );
    let Some(db) = args.db else {
        return Ok(true);
    };
    let check = loadgen::check_ledger(&db, &report)?;
    println!(
        "ledger: {} events; {} acknowledged; lost {}; in the ledger without a 200: {}",
        check.in_ledger, check.acknowledged, check.lost, check.unacknowledged
    );
    Ok(check.lost == 0)
}
