//! `hookledger-bench growth`: what a claim costs once the ledger is large.
//!
//! For each id shape (time-ordered as Stripe's, random as GitHub's UUIDs or Svix ids) it
//! pre-fills one ledger with N claims, then alternates in each round between a fresh empty
//! ledger and the pre-filled one (odd rounds empty first, even rounds pre-filled first), the
//! same load generator workload on both, and prints every run and the ratios of the medians.
//!
//! The pre-fill writes straight into the real schema (the server migrates the file first,
//! then one connection inserts in bulk): the ids are generated in key order, so the key index
//! is written once, page after page, as after a VACUUM (a ledger grown by random inserts has
//! pages about 70 % full, so it is somewhat larger than this one). The claims are between 400
//! and 1 days old and have no payload (retention cleared it), as most of a ledger's rows; with
//! `--received now` all of them were received at the moment of the fill, as a tool filling a
//! ledger may write them.
//!
//! Every SQLite run starts cold: the database file's pages are dropped from the page cache
//! first (`dd iflag=nocache count=0`), so a run reads from the disk what it needs.
//! With `--memory` the server runs in a memory control group of that size: its heap and the
//! page cache it reads are charged to the group, as on a small VPS. PostgreSQL (`--postgres`)
//! runs as it is configured: neither its memory nor its caches are limited here.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use hookledger::Secret;
use rusqlite::OptionalExtension;

use crate::bench::{describe, with_database, Server, SECRET};
use crate::loadgen::{self, Ids, LedgerCheck, Report, Workload};

#[derive(Debug, Args)]
pub struct GrowthArgs {
    /// Claims in each pre-filled ledger.
    #[arg(long, default_value_t = 1_000_000)]
    claims: u64,
    /// The id shapes to measure, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "ordered,random"
    )]
    ids: Vec<Ids>,
    /// Rounds; each loads an empty and the pre-filled ledger once.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Requests per run.
    #[arg(long, default_value_t = 30_000)]
    requests: usize,
    /// Keep-alive connections sending at once.
    #[arg(long, short = 'c', default_value_t = 64)]
    connections: usize,
    /// Share of requests that resend an earlier event of the same run.
    #[arg(long, default_value_t = 0.2)]
    resend: f64,
    /// When the pre-filled claims were received: `spread` from 400 days to 1 day ago, or all
    /// `now` (as a tool filling a ledger may write them: today's claims, all of them).
    #[arg(long, value_enum, default_value = "spread")]
    received: Received,
    /// Run the server in a memory control group of this size (e.g. 512M, 2G): heap and the page
    /// cache it reads. Needs root and a cgroup file system (v2 or v1's memory controller).
    #[arg(long, value_parser = parse_size)]
    memory: Option<u64>,
    /// Where the databases go (the pre-filled ones take ~150 bytes a claim).
    #[arg(long, default_value = "./target/growth")]
    dir: PathBuf,
    /// The `hookledger` binary [default: `hookledger` next to this binary].
    #[arg(long)]
    exe: Option<PathBuf>,
    /// Keep the pre-filled SQLite ledgers afterwards, and reuse one left by an earlier run
    /// (`ledger-<ids>-<claims>.db` in --dir) instead of filling it again.
    #[arg(long)]
    keep: bool,
    /// Measure PostgreSQL instead: a URL of a database where CREATE DATABASE may run.
    #[arg(long)]
    postgres: Option<String>,
}

/// When the pre-filled claims were received.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Received {
    Spread,
    Now,
}

/// `512M`, `2G`, `1048576`: bytes.
fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => s.split_at(i),
        None => (s, ""),
    };
    let n: u64 = digits.parse().map_err(|_| format!("not a size: {s:?}"))?;
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        _ => return Err(format!("unknown unit in {s:?} (K, M or G)")),
    };
    Ok(n << shift)
}

/// One measured run.
struct Run {
    ids: Ids,
    filled: bool,
    round: usize,
    report: Report,
    ledger: String,
    peak_rss_kib: Option<u64>,
    /// The memory group's peak (heap and page cache), bytes.
    group_peak: Option<u64>,
    /// From the server's start until it listened (its filter loaded or built).
    started_in: std::time::Duration,
    /// From SIGTERM until it exited (its last checkpoint, its filter saved).
    stopped_in: std::time::Duration,
}

pub fn run(args: GrowthArgs) -> anyhow::Result<bool> {
    let exe = crate::server_exe(args.exe.clone())?;
    std::fs::create_dir_all(&args.dir)?;
    let cgroup = match args.memory {
        Some(bytes) => Some(Cgroup::create(bytes)?),
        None => None,
    };
    let secret = Secret::new(SECRET);
    let store: Box<dyn Ledgers> = match &args.postgres {
        Some(url) => Box::new(PgLedgers::connect(url)?),
        None => Box::new(SqliteLedgers {
            dir: args.dir.clone(),
            keep: args.keep,
        }),
    };
    println!(
        "growth: {} store, {} claims pre-filled, {} requests a run at C={} with {:.0} % resends, \
         server memory {}",
        store.name(),
        args.claims,
        args.requests,
        args.connections,
        args.resend * 100.0,
        match args.memory {
            Some(b) => format!("limited to {} MiB ({})", b >> 20, cgroup_kind(&cgroup)),
            None => "not limited".into(),
        }
    );
    let mut runs = Vec::new();
    let mut exact = true;
    for &ids in &args.ids {
        let started = std::time::Instant::now();
        let filled = store.prefill(&exe, ids, args.claims, args.received)?;
        println!(
            "{ids:?} ids: pre-filled {} claims received {:?} in {:.0} s ({})",
            args.claims,
            args.received,
            started.elapsed().as_secs_f64(),
            filled.describe()
        );
        for round in 1..=args.rounds {
            let order = if round % 2 == 1 {
                [false, true]
            } else {
                [true, false]
            };
            for is_filled in order {
                let workload = Workload {
                    requests: args.requests,
                    resend_share: args.resend.clamp(0.0, 1.0),
                    seed: round as u64,
                    ids,
                };
                let target = if is_filled {
                    filled.clone()
                } else {
                    store.empty(&exe, round)?
                };
                let run = measure(&exe, &target, &workload, &args, cgroup.as_ref(), &secret)?;
                let run = Run {
                    ids,
                    filled: is_filled,
                    round,
                    ..run
                };
                exact &= !run.ledger.contains("LOST");
                print_run(&run, args.claims);
                runs.push(run);
                if !is_filled {
                    store.discard(&target)?;
                }
            }
        }
        if !args.keep {
            store.discard(&filled)?;
        }
    }
    print_summary(&runs, &args);
    Ok(exact)
}

fn cgroup_kind(cgroup: &Option<Cgroup>) -> String {
    match cgroup {
        Some(c) => format!("cgroup {}", c.dir.display()),
        None => String::new(),
    }
}

/// Starts the server on `target`, sends the workload, stops it and checks the ledger.
fn measure(
    exe: &Path,
    target: &Target,
    workload: &Workload,
    args: &GrowthArgs,
    cgroup: Option<&Cgroup>,
    secret: &Secret,
) -> anyhow::Result<Run> {
    let since = hookledger::internals::unix_now() - 1;
    // Claims of the previous run may share its last second: counted before, left out after.
    let before = target.received_since(since)?;
    if let Target::Sqlite(path) = target {
        drop_from_page_cache(path)?;
    }
    if let Some(group) = cgroup {
        group.reclaim();
    }
    let log = args.dir.join("growth-serve.log");
    let starting = std::time::Instant::now();
    let mut server = Server::start_in(
        exe,
        target.db_arg().as_ref(),
        &log,
        &[],
        cgroup.map(|c| c.dir.as_path()),
    )?;
    let started_in = starting.elapsed();
    let requests = loadgen::prepare(workload, secret, &server.addr.to_string());
    let report = loadgen::run(server.addr, &requests, args.connections);
    let peak_rss_kib = server.peak_rss_kib();
    let stopped_in = server.stop()?;
    let group_peak = cgroup.and_then(Cgroup::peak);
    let check = target.check(&report, since, before)?;
    Ok(Run {
        ids: workload.ids,
        filled: false,
        round: 0,
        ledger: describe(&check),
        report,
        peak_rss_kib,
        group_peak,
        started_in,
        stopped_in,
    })
}

fn ms(d: std::time::Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

fn print_run(run: &Run, claims: u64) {
    println!(
        "  round {} {:?} {:>15}: {:>7.0} events/s  p50 {:>6} ms  p99 {:>6} ms  peak RSS {}{} | \
         start {:.1} s, stop {:.1} s | {} | {}",
        run.round,
        run.ids,
        if run.filled {
            format!("{claims} claims")
        } else {
            "empty".to_string()
        },
        run.report.per_second(),
        ms(run.report.percentile(50.0)),
        ms(run.report.percentile(99.0)),
        run.peak_rss_kib
            .map(|k| format!("{} MiB", k / 1024))
            .unwrap_or_else(|| "?".into()),
        run.group_peak
            .map(|b| format!(", group peak {} MiB", b >> 20))
            .unwrap_or_default(),
        run.started_in.as_secs_f64(),
        run.stopped_in.as_secs_f64(),
        run.report.status_summary(),
        run.ledger
    );
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn print_summary(runs: &[Run], args: &GrowthArgs) {
    println!("\nmedians of {} rounds (pre-filled / empty):", args.rounds);
    for &ids in &args.ids {
        let pick = |filled: bool, f: &dyn Fn(&Run) -> f64| {
            median(
                runs.iter()
                    .filter(|r| r.ids == ids && r.filled == filled)
                    .map(f)
                    .collect(),
            )
        };
        let rate = |r: &Run| r.report.per_second();
        let p99 = |r: &Run| r.report.percentile(99.0).as_secs_f64() * 1000.0;
        let (e_rate, f_rate) = (pick(false, &rate), pick(true, &rate));
        let (e_p99, f_p99) = (pick(false, &p99), pick(true, &p99));
        println!(
            "  {ids:?} ids: empty {e_rate:.0}/s p99 {e_p99:.1} ms; {} claims {f_rate:.0}/s p99 \
             {f_p99:.1} ms; throughput {:.0} %, p99 {:.2}x",
            args.claims,
            100.0 * f_rate / e_rate,
            f_p99 / e_p99
        );
    }
}

/// Asks the kernel to drop `path`'s (and its WAL's) clean pages from the page cache, so the
/// next run reads them from the disk. GNU dd does it (posix_fadvise DONTNEED) without unsafe
/// code here.
pub(crate) fn drop_from_page_cache(path: &Path) -> anyhow::Result<()> {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    for file in [path.to_path_buf(), PathBuf::from(wal)] {
        if !file.exists() {
            continue;
        }
        let status = std::process::Command::new("sync").arg(&file).status()?;
        anyhow::ensure!(status.success(), "sync {} failed", file.display());
        let mut input = std::ffi::OsString::from("if=");
        input.push(&file);
        let status = std::process::Command::new("dd")
            .arg(input)
            .args(["iflag=nocache", "count=0", "status=none"])
            .status()
            .context("running dd to drop the file from the page cache")?;
        anyhow::ensure!(
            status.success(),
            "dd iflag=nocache {} failed",
            file.display()
        );
    }
    Ok(())
}

/// A memory control group for the server, removed on drop.
struct Cgroup {
    dir: PathBuf,
    /// cgroup v1: `memory.force_empty` reclaims the group's page cache between runs.
    v1: bool,
}

impl Cgroup {
    fn create(bytes: u64) -> anyhow::Result<Cgroup> {
        let name = format!("hookledger-growth-{}", std::process::id());
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers");
        let v1 = Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes");
        let (dir, file, v1) = if v2.exists() {
            (Path::new("/sys/fs/cgroup").join(name), "memory.max", false)
        } else if v1.exists() {
            (
                Path::new("/sys/fs/cgroup/memory").join(name),
                "memory.limit_in_bytes",
                true,
            )
        } else {
            bail!("--memory: no cgroup file system with a memory controller at /sys/fs/cgroup");
        };
        std::fs::create_dir(&dir).with_context(|| {
            format!(
                "--memory: creating {} (needs root; on cgroup v2 the parent must delegate the \
                 memory controller)",
                dir.display()
            )
        })?;
        let group = Cgroup { dir, v1 };
        std::fs::write(group.dir.join(file), bytes.to_string())
            .with_context(|| format!("--memory: writing {file}"))?;
        Ok(group)
    }

    /// The group's peak memory since the last [`Cgroup::reclaim`], bytes.
    fn peak(&self) -> Option<u64> {
        let file = if self.v1 {
            "memory.max_usage_in_bytes"
        } else {
            "memory.peak"
        };
        std::fs::read_to_string(self.dir.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Drops what the previous run left charged to the group (v1 keeps a stopped server's page
    /// cache charged to it), so each run starts from nothing.
    fn reclaim(&self) {
        if self.v1 {
            let _ = std::fs::write(self.dir.join("memory.force_empty"), "0");
            let _ = std::fs::write(self.dir.join("memory.max_usage_in_bytes"), "0");
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            eprintln!("could not remove {}: {e}", self.dir.display());
        }
    }
}

/// A ledger a run loads.
#[derive(Debug, Clone)]
enum Target {
    Sqlite(PathBuf),
    Postgres { url: String, name: String },
}

impl Target {
    fn db_arg(&self) -> std::ffi::OsString {
        match self {
            Target::Sqlite(path) => path.as_os_str().to_owned(),
            Target::Postgres { url, .. } => url.into(),
        }
    }

    fn describe(&self) -> String {
        match self {
            Target::Sqlite(path) => {
                let bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
                format!("{}, {} MiB", path.display(), bytes >> 20)
            }
            Target::Postgres { name, .. } => format!("database {name}"),
        }
    }

    /// Claims received at or after `since` (0 if the ledger is not created yet).
    fn received_since(&self, since: i64) -> anyhow::Result<usize> {
        const SQL: &str = "SELECT count(*) FROM webhook_events WHERE received_at >= ";
        let n: i64 = match self {
            Target::Sqlite(path) if !path.exists() => 0,
            Target::Sqlite(path) => rusqlite::Connection::open_with_flags(
                path,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
            )?
            .query_row(&format!("{SQL}?1"), [since], |r| r.get(0))?,
            Target::Postgres { url, .. } => {
                let mut client = postgres::Client::connect(url, postgres::NoTls)?;
                let migrated: bool = client
                    .query_one("SELECT to_regclass('webhook_events') IS NOT NULL", &[])?
                    .get(0);
                if !migrated {
                    return Ok(0);
                }
                client.query_one(&format!("{SQL}$1"), &[&since])?.get(0)
            }
        };
        Ok(n as usize)
    }

    /// The ledger check without reading every claim: each acknowledged id must be there, and
    /// the claims received since the run began (`before` of them were there already) must be
    /// exactly those.
    fn check(&self, report: &Report, since: i64, before: usize) -> anyhow::Result<LedgerCheck> {
        let acknowledged: Vec<&String> = report.acknowledged.iter().collect();
        let found = match self {
            Target::Sqlite(path) => {
                let conn = rusqlite::Connection::open_with_flags(
                    path,
                    rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
                )?;
                // The claims of the run are in the key index's newest blocks (of ids) since
                // migration 11: one seek a block; on an older ledger the primary key's.
                let key: Option<String> = conn
                    .query_row(
                        "SELECT sql FROM sqlite_master WHERE name = 'webhook_events_key'",
                        [],
                        |r| r.get(0),
                    )
                    .optional()?;
                let key = key.unwrap_or_default();
                let sql = if key.contains("id >> 16") {
                    let (low, high): (Option<i64>, Option<i64>) = conn.query_row(
                        "SELECT (SELECT min(id) FROM webhook_events
                                 INDEXED BY webhook_events_received_at
                                 WHERE received_at >= ?1) >> 16,
                                (SELECT max(id) FROM webhook_events) >> 16",
                        [since],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )?;
                    let blocks: Vec<String> = match (low, high) {
                        (Some(low), Some(high)) => (low..=high).map(|b| b.to_string()).collect(),
                        _ => Vec::new(),
                    };
                    format!(
                        "SELECT count(*) FROM webhook_events INDEXED BY webhook_events_key
                         WHERE id >> 16 IN ({}) AND source = 'stripe' AND event_id = ?1",
                        blocks.join(", ")
                    )
                } else {
                    "SELECT count(*) FROM webhook_events
                     WHERE source = 'stripe' AND event_id = ?1"
                        .to_string()
                };
                let mut stmt = conn.prepare(&sql)?;
                let mut found = 0usize;
                for id in &acknowledged {
                    found += stmt.query_row([id], |r| r.get::<_, i64>(0))? as usize;
                }
                found
            }
            Target::Postgres { url, .. } => {
                let mut client = postgres::Client::connect(url, postgres::NoTls)?;
                let ids: Vec<&str> = acknowledged.iter().map(|s| s.as_str()).collect();
                let found: i64 = client
                    .query_one(
                        "SELECT count(*) FROM webhook_events
                         WHERE source = 'stripe' AND event_id = ANY($1)",
                        &[&ids],
                    )?
                    .get(0);
                found as usize
            }
        };
        let new_rows = self.received_since(since)?.saturating_sub(before);
        Ok(LedgerCheck {
            acknowledged: acknowledged.len(),
            in_ledger: new_rows,
            lost: acknowledged.len() - found,
            unacknowledged: new_rows.saturating_sub(found),
        })
    }
}

/// Where the ledgers of a growth run live.
trait Ledgers {
    fn name(&self) -> &'static str;
    /// A ledger of `claims` claims with ids of shape `ids`, migrated by `exe`.
    fn prefill(
        &self,
        exe: &Path,
        ids: Ids,
        claims: u64,
        received: Received,
    ) -> anyhow::Result<Target>;
    /// A fresh empty ledger (created by the server when it starts).
    fn empty(&self, exe: &Path, round: usize) -> anyhow::Result<Target>;
    fn discard(&self, target: &Target) -> anyhow::Result<()>;
}

/// The claims' ages: from 400 days to 1 day ago, in generation order; or all now.
fn received_at(i: u64, claims: u64, now: i64, received: Received) -> i64 {
    if received == Received::Now {
        return now;
    }
    let span = 399 * 86_400;
    now - 400 * 86_400 + (i as i128 * span as i128 / claims.max(1) as i128) as i64
}

/// The `i`-th of `claims` pre-filled ids, in key order. Time-ordered ones sort before every
/// id the load generator sends (`evt_fill_` < `evt_load_`); random ones are a uniform sample of
/// the load generator's `evt_<32 hex digits>`, one in each of `claims` equal strata.
fn prefill_id(ids: Ids, i: u64, claims: u64, rng: &mut fastrand::Rng) -> String {
    match ids {
        Ids::Ordered => format!("evt_fill_{i:012}"),
        Ids::Random => {
            let stratum = u128::MAX / claims.max(1) as u128;
            format!("evt_{:032x}", i as u128 * stratum + rng.u128(..stratum))
        }
    }
}

struct SqliteLedgers {
    dir: PathBuf,
    keep: bool,
}

impl Ledgers for SqliteLedgers {
    fn name(&self) -> &'static str {
        "SQLite"
    }

    fn prefill(
        &self,
        exe: &Path,
        ids: Ids,
        claims: u64,
        received: Received,
    ) -> anyhow::Result<Target> {
        let ids_name = format!("{ids:?}").to_lowercase();
        let name = match received {
            Received::Spread => format!("ledger-{ids_name}-{claims}.db"),
            Received::Now => format!("ledger-{ids_name}-{claims}-now.db"),
        };
        let path = self.dir.join(name);
        if self.keep && path.exists() {
            return Ok(Target::Sqlite(path));
        }
        fill_sqlite(exe, &path, ids, claims, received)?;
        Ok(Target::Sqlite(path))
    }

    fn empty(&self, _exe: &Path, round: usize) -> anyhow::Result<Target> {
        let path = self.dir.join(format!("empty-{round}.db"));
        remove_sqlite(&path)?;
        Ok(Target::Sqlite(path))
    }

    fn discard(&self, target: &Target) -> anyhow::Result<()> {
        if let Target::Sqlite(path) = target {
            remove_sqlite(path)?;
        }
        Ok(())
    }
}

/// A SQLite ledger at `path` made by `exe` (its schema) and filled with `claims` claims of
/// Stripe with ids of shape `ids`, on the disk when it returns.
pub(crate) fn fill_sqlite(
    exe: &Path,
    path: &Path,
    ids: Ids,
    claims: u64,
    received: Received,
) -> anyhow::Result<()> {
    remove_sqlite(path)?;
    // The server creates and migrates the file: the schema is the shipped one.
    Server::start(exe, path, &[])?.stop()?;
    let mut conn = rusqlite::Connection::open(path)?;
    conn.pragma_update(None, "synchronous", "OFF")?;
    conn.pragma_update(None, "cache_size", -262_144)?;
    let now = hookledger::internals::unix_now();
    let mut rng = fastrand::Rng::with_seed(0x6c65_6467_6572);
    const CHUNK: u64 = 200_000;
    let mut i = 0;
    while i < claims {
        let tx = conn.transaction()?;
        {
            let mut insert = tx.prepare(
                "INSERT INTO webhook_events (source, event_id, event_type, created, received_at)
                 VALUES ('stripe', ?1, 'invoice.paid', ?2, ?2)",
            )?;
            for j in i..(i + CHUNK).min(claims) {
                let at = received_at(j, claims, now, received);
                insert.execute(rusqlite::params![prefill_id(ids, j, claims, &mut rng), at])?;
            }
        }
        tx.commit()?;
        i += CHUNK;
    }
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    drop(conn);
    // Written with synchronous = OFF: on the disk before the runs, or the kernel writes
    // gigabytes back during them (a 20 M fill made a server's stop wait 80 s on it).
    std::fs::File::open(path)?.sync_all()?;
    Ok(())
}

/// Removes a database file with its WAL, shared-memory and lock files.
pub(crate) fn remove_sqlite(path: &Path) -> anyhow::Result<()> {
    for suffix in ["", "-wal", "-shm", "-serve.lock"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        match std::fs::remove_file(PathBuf::from(p)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

struct PgLedgers {
    admin_url: String,
    admin: std::cell::RefCell<postgres::Client>,
}

impl PgLedgers {
    fn connect(url: &str) -> anyhow::Result<PgLedgers> {
        let admin =
            postgres::Client::connect(url, postgres::NoTls).context("connecting to --postgres")?;
        Ok(PgLedgers {
            admin_url: url.to_string(),
            admin: std::cell::RefCell::new(admin),
        })
    }

    fn fresh(&self, name: &str) -> anyhow::Result<Target> {
        let mut admin = self.admin.borrow_mut();
        admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))?;
        admin.batch_execute(&format!("CREATE DATABASE {name}"))?;
        Ok(Target::Postgres {
            url: with_database(&self.admin_url, name),
            name: name.to_string(),
        })
    }
}

impl Ledgers for PgLedgers {
    fn name(&self) -> &'static str {
        "PostgreSQL"
    }

    fn prefill(
        &self,
        exe: &Path,
        ids: Ids,
        claims: u64,
        received: Received,
    ) -> anyhow::Result<Target> {
        let name = format!("hl_growth_{}", format!("{ids:?}").to_lowercase());
        let target = self.fresh(&name)?;
        let Target::Postgres { url, .. } = &target else {
            unreachable!("fresh makes a PostgreSQL target")
        };
        let log = std::env::temp_dir().join(format!("{name}.log"));
        Server::start_on(exe, url.as_ref(), &log, &[])?.stop()?;
        let mut client = postgres::Client::connect(url, postgres::NoTls)?;
        let now = hookledger::internals::unix_now();
        // Generated in the server, inserted in key order; md5 of a random number gives the
        // load generator's shape (`evt_` and 32 hex digits).
        let id = match ids {
            Ids::Ordered => "'evt_fill_' || lpad(g::text, 12, '0')",
            Ids::Random => "'evt_' || md5(random()::text || g::text)",
        };
        client.batch_execute(&format!(
            "INSERT INTO webhook_events (source, event_id, event_type, created, received_at)
             SELECT 'stripe', id, 'invoice.paid', at, at FROM (
                 SELECT id, {start} + (row_number() OVER (ORDER BY id)) * {span} / {claims} AS at
                 FROM (SELECT {id} AS id FROM generate_series(1, {claims}) g) ids
             ) rows ORDER BY id",
            start = match received {
                Received::Spread => now - 400 * 86_400,
                Received::Now => now,
            },
            span = match received {
                Received::Spread => 399 * 86_400,
                Received::Now => 0,
            },
        ))?;
        // On its own: VACUUM cannot run in the multi-statement string's transaction.
        client.batch_execute("VACUUM ANALYZE webhook_events")?;
        Ok(target)
    }

    fn empty(&self, _exe: &Path, round: usize) -> anyhow::Result<Target> {
        self.fresh(&format!("hl_growth_empty_{round}"))
    }

    fn discard(&self, target: &Target) -> anyhow::Result<()> {
        if let Target::Postgres { name, .. } = target {
            self.admin
                .borrow_mut()
                .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units_and_refuse_others() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12T").is_err());
        assert!(parse_size("M").is_err());
    }

    #[test]
    fn prefilled_ids_come_in_key_order_and_sort_as_the_load_generators() {
        let mut rng = fastrand::Rng::with_seed(1);
        for ids in [Ids::Ordered, Ids::Random] {
            let all: Vec<String> = (0..1000)
                .map(|i| prefill_id(ids, i, 1000, &mut rng))
                .collect();
            assert!(all.windows(2).all(|w| w[0] < w[1]), "{ids:?} in key order");
            let new = ids.event_id(1, 0, &mut rng);
            if ids == Ids::Ordered {
                assert!(
                    all.iter().all(|old| old < &new),
                    "time-ordered: new ids last"
                );
            }
        }
        // Random ids: the load generator's land everywhere among the pre-filled ones.
        let filled: Vec<String> = (0..1000)
            .map(|i| prefill_id(Ids::Random, i, 1000, &mut rng))
            .collect();
        let ranks: Vec<usize> = (0..200)
            .map(|_| filled.partition_point(|old| old < &Ids::Random.event_id(1, 0, &mut rng)))
            .collect();
        assert!(ranks.iter().any(|&r| r < 250) && ranks.iter().any(|&r| r > 750));
    }
}
