//! `hookledger-bench prune`: what a prune costs the requests served meanwhile.
//!
//! It pre-fills a SQLite ledger with N expired claims (older than the default 400 days) among
//! fresh ones, then in each round serves the same open-loop load (`--rate` events a second,
//! timed from when each was due: a stall counts in full) on two copies of it: one whose
//! server prunes the expired claims (retention runs at start-up), and one whose server keeps
//! everything (`--retention-days never`), alternating which goes first. For each run: the
//! latency of the requests due while the prune ran (the same window on the copy that does not
//! prune), how long the prune took (until the server logs it), the WAL file's peak (its size
//! looked at every 10 ms) and the database file before and after.
//!
//! `--bodies N` adds the disk check: a ledger of N claims with 4 KB bodies, the older half
//! past the payload age (30 days), pruned without a load (whose events would grow the file);
//! the file before and after (the server stopped, its last checkpoint done).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use hookledger::Secret;

use crate::bench::{Server, SECRET};
use crate::loadgen::{self, percentile, Ids, Report, Request, Workload};

#[derive(Debug, Args)]
pub struct PruneArgs {
    /// Expired claims in the ledger (pruned).
    #[arg(long, default_value_t = 1_000_000)]
    claims: u64,
    /// Fresh claims beside them (kept).
    #[arg(long, default_value_t = 200_000)]
    fresh: u64,
    /// The ids' shape: time-ordered (Stripe's) or random (UUIDs: each row deleted is on a page
    /// of the key index of its own).
    #[arg(long, value_enum, default_value = "random")]
    ids: Ids,
    /// Events a second, sent on schedule whatever the answers.
    #[arg(long, default_value_t = 500.0)]
    rate: f64,
    /// Seconds of load per run: long enough to cover the prune.
    #[arg(long, default_value_t = 90)]
    seconds: u64,
    /// Requests in flight at most.
    #[arg(long, short = 'c', default_value_t = 64)]
    connections: usize,
    /// Rounds; each loads the pruning and the control copy once.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Also the disk check: a ledger of this many claims with 4 KB bodies, half of them past
    /// the payload age (0: skip it).
    #[arg(long, default_value_t = 0)]
    bodies: u64,
    /// Only the disk check (with --bodies).
    #[arg(long, requires = "bodies")]
    bodies_only: bool,
    /// Where the databases go.
    #[arg(long, default_value = "./target/prune")]
    dir: PathBuf,
    /// The `hookledger` binary [default: `hookledger` next to this binary].
    #[arg(long)]
    exe: Option<PathBuf>,
    /// Reuse the pre-filled ledgers of an earlier run with --keep, and keep them afterwards.
    #[arg(long)]
    keep: bool,
}

/// The server's log line at the end of a prune that did something.
const PRUNED: &str = "retention: deleted";

/// One run of the load on a copy.
struct Run {
    pruning: bool,
    report: Report,
    /// From the load's start to the prune's log line.
    prune_took: Option<Duration>,
    wal_peak: u64,
    file_before: u64,
    file_after: u64,
    /// Expired claims still in the ledger after the run.
    expired_left: i64,
    lost: usize,
}

pub fn run(args: PruneArgs) -> anyhow::Result<bool> {
    let exe = crate::server_exe(args.exe.clone())?;
    std::fs::create_dir_all(&args.dir)?;
    let secret = Secret::new(SECRET);
    let mut exact = true;
    println!(
        "prune: {} expired claims among {} fresh ({:?} ids), open loop at {}/s for {} s a run, \
         at most {} in flight; {}",
        args.claims,
        args.fresh,
        args.ids,
        args.rate,
        args.seconds,
        args.connections,
        exe.display()
    );
    if !args.bodies_only {
        let ledger = args.dir.join(format!(
            "prune-{:?}-{}-{}.db",
            args.ids, args.claims, args.fresh
        ));
        if !(args.keep && ledger.exists()) {
            let started = Instant::now();
            prefill_claims(&exe, &ledger, &args)?;
            println!(
                "pre-filled {} in {:.0} s ({} MiB)",
                ledger.display(),
                started.elapsed().as_secs_f64(),
                size(&ledger) >> 20
            );
        }
        let mut rounds = Vec::new();
        for round in 1..=args.rounds {
            let order = if round % 2 == 1 {
                [true, false]
            } else {
                [false, true]
            };
            let mut pair = Vec::new();
            for pruning in order {
                // Signed just before the run: a signature older than the server's tolerance
                // (5 minutes) would be refused.
                let requests = requests(&args, &secret, round);
                let run = measure(&exe, &ledger, &args, &requests, pruning)?;
                exact &= run.lost == 0;
                pair.push(run);
            }
            pair.sort_by_key(|r| !r.pruning);
            print_round(round, &pair);
            rounds.push(pair);
        }
        print_summary(&rounds);
        if !args.keep {
            remove_sqlite(&ledger)?;
        }
    }
    if args.bodies > 0 {
        exact &= bodies(&exe, &args)?;
    }
    Ok(exact)
}

/// The workload of a round: the same on both copies.
fn requests(args: &PruneArgs, secret: &Secret, round: usize) -> Vec<Request> {
    let workload = Workload {
        requests: (args.rate * args.seconds as f64) as usize,
        resend_share: 0.2,
        seed: round as u64,
        ids: args.ids,
    };
    loadgen::prepare(&workload, secret, "127.0.0.1")
}

/// Copies `ledger`, serves the load on the copy (pruning or not), and measures.
fn measure(
    exe: &Path,
    ledger: &Path,
    args: &PruneArgs,
    requests: &[Request],
    pruning: bool,
) -> anyhow::Result<Run> {
    let copy = args.dir.join("prune-run.db");
    remove_sqlite(&copy)?;
    std::fs::copy(ledger, &copy).context("copying the pre-filled ledger")?;
    let file_before = size(&copy);
    let keep_all: &[&str] = if pruning {
        &[]
    } else {
        &["--retention-days", "never", "--payload-days", "never"]
    };
    let (report, prune_took, wal_peak) = serve_and_load(exe, &copy, keep_all, args, requests)?;
    let file_after = size(&copy);
    let conn =
        rusqlite::Connection::open_with_flags(&copy, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let expired_left: i64 = conn.query_row(
        "SELECT count(*) FROM webhook_events WHERE received_at < ?1",
        [hookledger::internals::unix_now() - 400 * 86_400],
        |r| r.get(0),
    )?;
    let lost = lost(&conn, &report)?;
    drop(conn);
    remove_sqlite(&copy)?;
    Ok(Run {
        pruning,
        report,
        prune_took,
        wal_peak,
        file_before,
        file_after,
        expired_left,
        lost,
    })
}

/// Starts the server on `db` with `extra` flags, sends `requests` open loop while watching the
/// WAL file and the log, stops the server. The report, when the prune was logged (from the
/// load's start) and the WAL's peak.
fn serve_and_load(
    exe: &Path,
    db: &Path,
    extra: &[&str],
    args: &PruneArgs,
    requests: &[Request],
) -> anyhow::Result<(Report, Option<Duration>, u64)> {
    let log = args.dir.join("prune-serve.log");
    let wal = PathBuf::from(format!("{}-wal", db.display()));
    let done = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let pruned_at = Arc::new(AtomicU64::new(u64::MAX));
    let mut server = Server::start_on(exe, db.as_os_str(), &log, extra)?;
    let started = Instant::now();
    let watcher = {
        let (done, peak, pruned_at, log) = (done.clone(), peak.clone(), pruned_at.clone(), log);
        std::thread::spawn(move || {
            // What was read of the log and not looked at yet (a line may come in two reads).
            let mut tail = Vec::new();
            let mut file = std::fs::File::open(&log).ok();
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(size(&wal), Ordering::Relaxed);
                if let Some(file) = file.as_mut() {
                    let _ = file.read_to_end(&mut tail);
                    if tail.windows(PRUNED.len()).any(|w| w == PRUNED.as_bytes()) {
                        let at = started.elapsed().as_micros() as u64;
                        pruned_at.fetch_min(at, Ordering::Relaxed);
                    }
                    let keep = tail.len().saturating_sub(PRUNED.len());
                    tail.drain(..keep);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let report = loadgen::run_open(server.addr, requests, args.rate, args.connections);
    // The prune may outlast the load: wait for it (the WAL still watched), up to a minute.
    let deadline = Instant::now() + Duration::from_secs(60);
    while extra.is_empty() && pruned_at.load(Ordering::Relaxed) == u64::MAX {
        if Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    server.stop()?;
    done.store(true, Ordering::Relaxed);
    let _ = watcher.join();
    let at = pruned_at.load(Ordering::Relaxed);
    let prune_took = (at != u64::MAX).then(|| Duration::from_micros(at));
    Ok((report, prune_took, peak.load(Ordering::Relaxed)))
}

/// Acknowledged events missing from the ledger: the source's ids read once (a lookup by id
/// alone is no index on SQLite since the key is clustered by blocks of ids).
fn lost(conn: &rusqlite::Connection, report: &Report) -> anyhow::Result<usize> {
    let mut stmt = conn.prepare("SELECT event_id FROM webhook_events WHERE source = 'stripe'")?;
    let in_ledger: std::collections::HashSet<String> = stmt
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    Ok(report
        .acknowledged
        .iter()
        .filter(|id| !in_ledger.contains(*id))
        .count())
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// The latencies of the requests due while the prune ran (`window`).
fn in_window(run: &Run, window: Duration) -> Vec<Duration> {
    run.report.window(Duration::ZERO, window)
}

fn print_round(round: usize, pair: &[Run]) {
    let window = pair[0]
        .prune_took
        .unwrap_or(pair[0].report.elapsed)
        .min(pair[0].report.elapsed);
    for run in pair {
        let w = in_window(run, window);
        println!(
            "  round {round} {:>8}: during the prune ({:.1} s, {} requests) p50 {} p99 {} max \
             {} ms | whole run p99 {} ms | prune {} | WAL peak {} | file {} -> {} | expired \
             left {} | {} | lost {}",
            if run.pruning { "prune" } else { "no prune" },
            window.as_secs_f64(),
            w.len(),
            ms(percentile(&w, 50.0)),
            ms(percentile(&w, 99.0)),
            ms(percentile(&w, 100.0)),
            ms(run.report.percentile(99.0)),
            match (run.pruning, run.prune_took) {
                (false, _) => "-".to_string(),
                (true, Some(t)) => format!("{:.1} s", t.as_secs_f64()),
                (true, None) => "NOT FINISHED".to_string(),
            },
            mib(run.wal_peak),
            mib(run.file_before),
            mib(run.file_after),
            run.expired_left,
            run.report.status_summary(),
            run.lost
        );
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn print_summary(rounds: &[Vec<Run>]) {
    let p99 = |pruning: bool| {
        median(
            rounds
                .iter()
                .map(|pair| {
                    let window = pair[0]
                        .prune_took
                        .unwrap_or(pair[0].report.elapsed)
                        .min(pair[0].report.elapsed);
                    let run = &pair[if pruning { 0 } else { 1 }];
                    percentile(&in_window(run, window), 99.0).as_secs_f64() * 1000.0
                })
                .collect(),
        )
    };
    let took = median(
        rounds
            .iter()
            .filter_map(|pair| pair[0].prune_took)
            .map(|t| t.as_secs_f64())
            .collect(),
    );
    let wal = rounds
        .iter()
        .flat_map(|pair| pair.iter().map(|r| r.wal_peak))
        .max()
        .unwrap_or(0);
    let (with, without) = (p99(true), p99(false));
    println!(
        "\nmedians of {} rounds: p99 during the prune {with:.1} ms, the same window without a \
         prune {without:.1} ms ({:.2}x); prune {took:.1} s; WAL peak (all runs) {}",
        rounds.len(),
        with / without,
        mib(wal)
    );
}

/// The disk check: N claims with 4 KB bodies, the older half past the payload age, pruned
/// without a load; the file before and after.
fn bodies(exe: &Path, args: &PruneArgs) -> anyhow::Result<bool> {
    let ledger = args.dir.join(format!("prune-bodies-{}.db", args.bodies));
    if !(args.keep && ledger.exists()) {
        prefill_bodies(exe, &ledger, args.bodies)?;
    }
    let copy = args.dir.join("prune-bodies-run.db");
    remove_sqlite(&copy)?;
    std::fs::copy(&ledger, &copy)?;
    let before = size(&copy);
    // No load: the file after holds what the ledger held, not the load's events besides.
    let (_, took, wal_peak) = serve_and_load(exe, &copy, &[], args, &[])?;
    let after = size(&copy);
    let conn =
        rusqlite::Connection::open_with_flags(&copy, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let cleared: i64 = conn.query_row(
        "SELECT count(*) FROM webhook_events WHERE payload IS NULL",
        [],
        |r| r.get(0),
    )?;
    drop(conn);
    println!(
        "bodies: {} claims with 4 KB bodies, {cleared} cleared (and the pages given back) in \
         {}; file {} -> {} ({:.1} %); WAL peak {}",
        args.bodies,
        took.map(|t| format!("{:.1} s", t.as_secs_f64()))
            .unwrap_or_else(|| "NOT FINISHED".into()),
        mib(before),
        mib(after),
        100.0 * after as f64 / before as f64,
        mib(wal_peak),
    );
    remove_sqlite(&copy)?;
    if !args.keep {
        remove_sqlite(&ledger)?;
    }
    Ok(true)
}

/// A ledger migrated by the server (so its schema and pragmas are the shipped ones), then
/// filled by one connection.
fn new_ledger(exe: &Path, path: &Path) -> anyhow::Result<rusqlite::Connection> {
    remove_sqlite(path)?;
    Server::start(exe, path, &[])?.stop()?;
    let conn = rusqlite::Connection::open(path)?;
    conn.pragma_update(None, "synchronous", "OFF")?;
    conn.pragma_update(None, "cache_size", -262_144)?;
    Ok(conn)
}

/// `claims` expired claims (401 to 800 days old) among `fresh` ones (up to 399 days old),
/// without payloads (long cleared), inserted in the order they were received, as a ledger
/// grown over time: the table and the age index in time order, and with random ids the key
/// index in random order (its pages about 70 % full, each expired claim on a page of its own).
fn prefill_claims(exe: &Path, path: &Path, args: &PruneArgs) -> anyhow::Result<()> {
    let mut conn = new_ledger(exe, path)?;
    let now = hookledger::internals::unix_now();
    let mut rng = fastrand::Rng::with_seed(0x0070_7275_6e65);
    let mut rows: Vec<(i64, u64)> = (0..args.claims + args.fresh)
        .map(|i| {
            let age = if i < args.claims {
                401 * 86_400 + rng.i64(0..399 * 86_400)
            } else {
                rng.i64(60..399 * 86_400)
            };
            (now - age, i)
        })
        .collect();
    rows.sort_unstable();
    let tx = conn.transaction()?;
    {
        let mut insert = tx.prepare(
            "INSERT INTO webhook_events (source, event_id, event_type, created, received_at)
             VALUES ('stripe', ?1, 'invoice.paid', ?2, ?2)",
        )?;
        for (at, i) in rows {
            let id = match args.ids {
                Ids::Ordered => format!("evt_fill_{at:012}_{i:09}"),
                Ids::Random => format!("evt_{:032x}", rng.u128(..)),
            };
            insert.execute(rusqlite::params![id, at])?;
        }
    }
    tx.commit()?;
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    Ok(())
}

/// `n` claims with 4 KB Stripe-like bodies received over the last 60 days, in id order: the
/// older half past the 30-day payload age.
fn prefill_bodies(exe: &Path, path: &Path, n: u64) -> anyhow::Result<()> {
    let mut conn = new_ledger(exe, path)?;
    let now = hookledger::internals::unix_now();
    let tx = conn.transaction()?;
    {
        let mut insert = tx.prepare(
            "INSERT INTO webhook_events (source, event_id, event_type, created, received_at, payload)
             VALUES ('stripe', ?1, 'invoice.paid', ?2, ?2, ?3)",
        )?;
        for i in 0..n {
            let id = format!("evt_body_{i:012}");
            // The first half 60 to 31 days old, the second 29 to 0.
            let at = if i < n / 2 {
                now - 60 * 86_400 + (i * 29 * 86_400 / (n / 2).max(1)) as i64
            } else {
                now - 29 * 86_400 + ((i - n / 2) * 29 * 86_400 / (n / 2).max(1)) as i64
            };
            let mut body = hookledger::internals::invoice_event(
                &id,
                "invoice.paid",
                at,
                &format!("in_body_{i:012}"),
                &format!("cus_{:05}", i % 10_000),
                "acct_body",
            );
            let close = body.rfind('}').unwrap_or(body.len());
            let fill = 4096usize.saturating_sub(body.len() + 16);
            body.insert_str(close, &format!(",\"x_pad\":\"{}\"", "p".repeat(fill)));
            insert.execute(rusqlite::params![id, at, body.as_bytes()])?;
        }
    }
    tx.commit()?;
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    Ok(())
}

fn size(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// Removes a database file with its WAL, shared-memory and lock files.
fn remove_sqlite(path: &Path) -> anyhow::Result<()> {
    for suffix in ["", "-wal", "-shm", "-serve.lock"] {
        let p = PathBuf::from(format!("{}{suffix}", path.display()));
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
