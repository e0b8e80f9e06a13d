//! `hookledger-bench run`: one command that measures, in one run and on one disk,
//! (a) hookledger as shipped, (b) hookledger with one event per transaction
//! (`--batch-max 1`), and (c) the raw SQLite ceiling: the store's own writer, handler and
//! batch loop fed the same events in process, no HTTP; at C = 1, 16, 64 connections with
//! 0 % and 20 % resends.
//! Then peak memory at C = 256 and an overload run. It prints one table with a/b and a/c.
//!
//! Mode (b) is measured on a quarter of the requests (it is slow; the rate is what counts).
//! (c) keeps at most C events in flight: with C connections at most C events can wait for
//! the writer, so that bounds the group commit hookledger itself could form.
//!
//! The server is the real `hookledger` binary (`--exe`), started as a child process.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use hookledger::Secret;

use crate::loadgen::{self, Report, Request, Workload};
use hookledger::internals::table;

pub(crate) const SECRET: &str = "whsec_bench_secret";

/// Settings of one bench run.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Requests per measurement at C >= 16 (a fifth of it at C = 1).
    pub requests: usize,
    /// Directory for the databases (the disk being measured).
    pub dir: PathBuf,
    /// The `hookledger` binary to run as the server.
    pub exe: PathBuf,
}

struct Row {
    connections: usize,
    resend: f64,
    mode: &'static str,
    per_second: f64,
    report: Option<Report>,
    ledger: String,
}

/// Runs everything and prints the tables.
pub fn run(config: &BenchConfig) -> anyhow::Result<()> {
    std::fs::create_dir_all(&config.dir)?;
    print_machine(&config.dir)?;
    let secret = Secret::new(SECRET);
    let mut rows = Vec::new();
    for connections in [1, 16, 64] {
        for resend in [0.0, 0.2] {
            let requests = if connections == 1 {
                config.requests / 5
            } else {
                config.requests
            };
            let workload = Workload {
                requests,
                resend_share: resend,
                seed: (connections * 100 + (resend * 100.0) as usize) as u64,
                ids: loadgen::Ids::Ordered,
            };
            // Mode b does one fsync per event: a quarter of the requests measure it as well.
            let short = Workload {
                requests: requests / 4,
                ..workload.clone()
            };
            let modes = [
                ("a shipped", &[][..], &workload),
                ("b batch-max 1", &["--batch-max", "1"][..], &short),
            ];
            for (mode, args, workload) in modes {
                let (report, ledger, _) =
                    serve_and_load(config, &secret, workload, connections, args)?;
                rows.push(Row {
                    connections,
                    resend,
                    mode,
                    per_second: report.per_second(),
                    report: Some(report),
                    ledger,
                });
                eprint!(".");
            }
            let per_second = sqlite_ceiling(config, &secret, &workload, connections)?;
            rows.push(Row {
                connections,
                resend,
                mode: "c sqlite ceiling",
                per_second,
                report: None,
                ledger: String::new(),
            });
            eprint!(".");
        }
    }
    eprintln!();
    print_rows(&rows);
    print_ratios(&rows);

    println!("\nmemory and overload (hookledger as shipped unless noted, 20 % resends):");
    let workload = Workload {
        requests: config.requests,
        resend_share: 0.2,
        seed: 256,
        ids: loadgen::Ids::Ordered,
    };
    let mut extra = Vec::new();
    for (mode, args) in [
        ("a shipped, C=256", &[][..]),
        (
            "overload: --queue-depth 8, C=256",
            &["--queue-depth", "8"][..],
        ),
    ] {
        let (report, ledger, peak) = serve_and_load(config, &secret, &workload, 256, args)?;
        extra.push(vec![
            mode.to_string(),
            format!("{:.0}", report.per_second()),
            ms(report.percentile(99.0)),
            report.status_summary(),
            ledger,
            peak.map(|kb| format!("{:.1} MB", kb as f64 / 1024.0))
                .unwrap_or_default(),
        ]);
    }
    print!(
        "{}",
        table::render(
            &[
                "run",
                "events/s",
                "p99",
                "statuses",
                "ledger check",
                "peak RSS"
            ],
            &extra
        )
    );
    Ok(())
}

/// `hookledger-bench run --hostile`: latency of normal events while 200 connections send nothing
/// and 50 send a body one byte per second; memory and threads of the server meanwhile.
pub fn hostile(config: &BenchConfig) -> anyhow::Result<()> {
    use std::io::Write;
    use std::net::TcpStream;
    use std::sync::atomic::{AtomicBool, Ordering};

    std::fs::create_dir_all(&config.dir)?;
    let secret = Secret::new(SECRET);
    let dir = tempfile::tempdir_in(&config.dir)?;
    let mut server = Server::start(&config.exe, &dir.path().join("hostile.db"), &[])?;
    let workload = Workload {
        requests: 800,
        resend_share: 0.0,
        seed: 7,
        ids: loadgen::Ids::Ordered,
    };
    let requests = loadgen::prepare(&workload, &secret, &server.addr.to_string());
    let (calm, attacked) = requests.split_at(400);
    let paced = |requests: &[Request]| {
        // 50 events per second for 8 s, each on a new connection (as Stripe sends them).
        requests
            .chunks(1)
            .map(|one| {
                std::thread::sleep(Duration::from_millis(20));
                loadgen::run(server.addr, one, 1)
            })
            .fold(Report::default(), |mut all, r| {
                all.latencies.extend(r.latencies);
                for (s, n) in r.statuses {
                    *all.statuses.entry(s).or_default() += n;
                }
                all.transport_errors += r.transport_errors;
                all
            })
    };
    let mut baseline = paced(calm);
    baseline.latencies.sort_unstable();
    let (before_rss, before_threads) = server.rss_and_threads();

    let idle: Vec<TcpStream> = (0..200)
        .map(|_| TcpStream::connect(server.addr))
        .collect::<Result<_, _>>()?;
    let stop = AtomicBool::new(false);
    let (mut under, rss, threads) = std::thread::scope(|scope| -> anyhow::Result<_> {
        let mut slow: Vec<TcpStream> = Vec::new();
        for _ in 0..50 {
            let mut s = TcpStream::connect(server.addr)?;
            // A fresh, well-formed (forged) header: the server reads the body, one byte a second.
            s.write_all(&attack_head(Some(&forged_signature()), 1000))?;
            slow.push(s);
        }
        let stop = &stop;
        scope.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for s in &mut slow {
                    let _ = s.write_all(b"x");
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        });
        std::thread::sleep(Duration::from_millis(500));
        let under = paced(attacked);
        let (rss, threads) = server.rss_and_threads();
        stop.store(true, Ordering::Relaxed);
        Ok((under, rss, threads))
    })?;
    drop(idle);
    under.latencies.sort_unstable();
    server.stop()?;
    let row = |name: &str, r: &Report, rss: Option<u64>, threads: Option<u64>| {
        vec![
            name.to_string(),
            r.requests().to_string(),
            ms(r.percentile(50.0)),
            ms(r.percentile(99.0)),
            ms(r.percentile(100.0)),
            r.status_summary(),
            rss.map(|kb| format!("{:.1} MB", kb as f64 / 1024.0))
                .unwrap_or_default(),
            threads.map(|t| t.to_string()).unwrap_or_default(),
        ]
    };
    print!(
        "{}",
        table::render(
            &[
                "normal events",
                "n",
                "p50 ms",
                "p99 ms",
                "max ms",
                "statuses",
                "server RSS",
                "threads"
            ],
            &[
                row(
                    "no other connections",
                    &baseline,
                    before_rss,
                    before_threads
                ),
                row("200 idle + 50 at 1 byte/s", &under, rss, threads),
            ]
        )
    );

    let forged = forged_signature();
    let attacks = [
        ("1000 x 1 MiB, no Stripe-Signature", Attack::Bulk(None)),
        (
            "1000 x 1 MiB, forged fresh header",
            Attack::Bulk(Some(&forged)),
        ),
        ("400 x 60 KB at 1 byte/ms, forged", Attack::Trickle(&forged)),
    ];
    let mut rows = Vec::new();
    for (name, attack) in attacks {
        let db = dir.path().join(format!("memory-{}.db", rows.len()));
        rows.push(memory_attack(config, &db, name, attack)?);
    }
    print!(
        "{}",
        table::render(
            &[
                "unfinished bodies from one client",
                "answers",
                "peak RSS",
                "RSS after they close",
                "valid event after"
            ],
            &rows
        )
    );
    Ok(())
}

/// Bodies each attacking connection sends (and never finishes).
const ATTACK_BODY: usize = 1024 * 1024;

/// The request head of an attacking connection: `Content-Length` of `len`, and a
/// `Stripe-Signature` if one is given.
fn attack_head(signature: Option<&str>, len: usize) -> Vec<u8> {
    let signature = signature
        .map(|s| format!("Stripe-Signature: {s}\r\n"))
        .unwrap_or_default();
    format!("POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\n{signature}Content-Length: {len}\r\n\r\n")
        .into_bytes()
}

/// A `Stripe-Signature` that is fresh and well formed but matches nothing.
fn forged_signature() -> String {
    format!(
        "t={},v1={}",
        hookledger::internals::unix_now(),
        "ab".repeat(32)
    )
}

/// How the attacking connections send their bodies.
#[derive(Clone, Copy)]
enum Attack<'a> {
    /// 1000 connections, each declaring a 1 MiB body and sending all of it but the last byte
    /// at once, with this `Stripe-Signature` (or none).
    Bulk(Option<&'a str>),
    /// 400 connections, each declaring a 60 KB body under this (forged, fresh) signature and
    /// sending it one byte per packet, a byte a millisecond, for 8 s.
    Trickle(&'a str),
}

/// One client attacks (see [`Attack`]) and holds its connections open; then closes them all
/// and sends one valid event. Reports the server's answers to the attack, its peak and final
/// RSS, and the status of the valid event.
fn memory_attack(
    config: &BenchConfig,
    db: &Path,
    name: &str,
    attack: Attack,
) -> anyhow::Result<Vec<String>> {
    use std::io::{Read, Write};
    use std::net::TcpStream;

    let mut server = Server::start(&config.exe, db, &[])?;
    let mut held = Vec::new();
    let mut answers = std::collections::BTreeMap::<String, usize>::new();
    match attack {
        Attack::Bulk(signature) => {
            let chunk = vec![b'x'; 64 * 1024];
            for _ in 0..1000 {
                let mut s = TcpStream::connect(server.addr)?;
                s.set_write_timeout(Some(Duration::from_millis(200)))?;
                if s.write_all(&attack_head(signature, ATTACK_BODY)).is_ok() {
                    // All but the last byte, so the body never finishes.
                    let mut left = ATTACK_BODY - 1;
                    while left > 0 {
                        let n = left.min(chunk.len());
                        if s.write_all(&chunk[..n]).is_err() {
                            break; // refused (the server closed) or its buffers are full
                        }
                        left -= n;
                    }
                }
                held.push(s);
            }
        }
        Attack::Trickle(signature) => {
            for _ in 0..400 {
                let mut s = TcpStream::connect(server.addr)?;
                s.set_nodelay(true)?;
                s.set_write_timeout(Some(Duration::from_millis(50)))?;
                s.write_all(&attack_head(Some(signature), 60_000))?;
                held.push(s);
            }
            let until = Instant::now() + Duration::from_secs(8);
            while Instant::now() < until {
                for s in &mut held {
                    let _ = s.write(b"x");
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    for s in &mut held {
        s.set_read_timeout(Some(Duration::from_millis(5)))?;
        let mut head = [0u8; 12];
        let answer = match s.read(&mut head) {
            Ok(n) if n >= 12 => String::from_utf8_lossy(&head[9..12]).into_owned(),
            _ => "none".to_string(),
        };
        *answers.entry(answer).or_default() += 1;
    }
    let peak = server.peak_rss_kib();
    drop(held);
    std::thread::sleep(Duration::from_millis(500));
    let (after, _) = server.rss_and_threads();
    let workload = Workload {
        requests: 1,
        resend_share: 0.0,
        seed: 11,
        ids: loadgen::Ids::Ordered,
    };
    let valid = loadgen::prepare(&workload, &Secret::new(SECRET), &server.addr.to_string());
    let report = loadgen::run(server.addr, &valid, 1);
    server.stop()?;
    let mb = |kb: Option<u64>| {
        kb.map(|kb| format!("{:.1} MB", kb as f64 / 1024.0))
            .unwrap_or_default()
    };
    let answers = answers
        .iter()
        .map(|(status, n)| format!("{n}x {status}"))
        .collect::<Vec<_>>()
        .join(", ");
    Ok(vec![
        name.to_string(),
        answers,
        mb(peak),
        mb(after),
        report.status_summary(),
    ])
}

/// `--postgres URL`: the PostgreSQL column, at C = 64 with 20 % resends, next to SQLite in
/// the same run: hookledger on one instance and on three instances sharing one database
/// behind one load generator, and the plain transaction-per-request handler
/// ([`crate::plain`]) with a pool of 16 and of 64 connections. `admin_url` is a database
/// where `CREATE DATABASE` may run; each measurement gets a fresh database.
pub fn postgres(config: &BenchConfig, admin_url: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(&config.dir)?;
    let secret = Secret::new(SECRET);
    let workload = Workload {
        requests: config.requests,
        resend_share: 0.2,
        seed: 6420,
        ids: loadgen::Ids::Ordered,
    };
    let mut admin = postgres::Client::connect(admin_url, postgres::NoTls)
        .context("connecting to --postgres")?;
    let mut fresh = |name: &str| -> anyhow::Result<String> {
        admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))?;
        admin.batch_execute(&format!("CREATE DATABASE {name}"))?;
        Ok(with_database(admin_url, name))
    };
    let mut rows: Vec<(String, Report, String)> = Vec::new();
    let (report, ledger, _) = serve_and_load(config, &secret, &workload, 64, &[])?;
    rows.push(("sqlite, hookledger".into(), report, ledger));
    eprint!(".");
    for instances in [1, 3] {
        let url = fresh("hl_bench_hookledger")?;
        let dir = tempfile::tempdir_in(&config.dir)?;
        let mut servers = (0..instances)
            .map(|i| {
                let log = dir.path().join(format!("instance{i}.log"));
                Server::start_on(&config.exe, url.as_ref(), &log, &[])
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr).collect();
        let requests = loadgen::prepare(&workload, &secret, &addrs[0].to_string());
        let report = loadgen::run_spread(&addrs, &requests, 64);
        for server in &mut servers {
            server.stop()?;
        }
        let ledger = describe(&loadgen::check_ledger_postgres(&url, &report)?);
        let name = match instances {
            1 => "postgres, hookledger, 1 instance".to_string(),
            n => format!("postgres, hookledger, {n} instances"),
        };
        rows.push((name, report, ledger));
        eprint!(".");
    }
    for pool in [16, 64] {
        let url = fresh(&format!("hl_bench_plain_{pool}"))?;
        let addr = crate::plain::start(&url, secret.clone(), pool)?;
        let requests = loadgen::prepare(&workload, &secret, &addr.to_string());
        let report = loadgen::run(addr, &requests, 64);
        let ledger = describe(&loadgen::check_ledger_postgres(&url, &report)?);
        rows.push((
            format!("postgres, plain transaction per request, pool {pool}"),
            report,
            ledger,
        ));
        eprint!(".");
    }
    eprintln!();
    let plain_best = rows
        .iter()
        .filter(|(name, ..)| name.contains("plain"))
        .map(|(_, r, _)| r.per_second())
        .fold(0.0, f64::max);
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|(name, report, ledger)| {
            vec![
                name.clone(),
                format!("{:.0}", report.per_second()),
                format!("{:.1}x", report.per_second() / plain_best),
                ms(report.percentile(50.0)),
                ms(report.percentile(99.0)),
                report.status_summary(),
                ledger.clone(),
            ]
        })
        .collect();
    println!(
        "\nPostgreSQL, C=64, 20 % resends, {} requests each:",
        config.requests
    );
    print!(
        "{}",
        table::render(
            &[
                "run",
                "events/s",
                "vs best plain",
                "p50",
                "p99",
                "statuses",
                "ledger check"
            ],
            &cells
        )
    );
    Ok(())
}

/// `url` with its database name replaced by `name`.
pub(crate) fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let host = match base.rsplit_once('/') {
        Some((host, _)) if host.contains("//") && !host.ends_with('/') => host,
        _ => base,
    };
    if query.is_empty() {
        format!("{host}/{name}")
    } else {
        format!("{host}/{name}?{query}")
    }
}

pub(crate) fn describe(check: &loadgen::LedgerCheck) -> String {
    if check.exact() {
        format!("exact ({} events)", check.in_ledger)
    } else {
        format!(
            "LOST {} / unacknowledged {} of {}",
            check.lost, check.unacknowledged, check.acknowledged
        )
    }
}

/// Starts a fresh server, sends the workload, checks the ledger. Returns the report, the
/// ledger check as text, and the server's peak RSS in KiB.
fn serve_and_load(
    config: &BenchConfig,
    secret: &Secret,
    workload: &Workload,
    connections: usize,
    args: &[&str],
) -> anyhow::Result<(Report, String, Option<u64>)> {
    let dir = tempfile::tempdir_in(&config.dir)?;
    let db_path = dir.path().join("bench.db");
    let mut server = Server::start(&config.exe, &db_path, args)?;
    let requests = loadgen::prepare(workload, secret, &server.addr.to_string());
    let report = loadgen::run(server.addr, &requests, connections);
    let peak = server.peak_rss_kib();
    server.stop()?;
    let ledger = describe(&loadgen::check_ledger(&db_path, &report)?);
    Ok((report, ledger, peak))
}

/// The raw SQLite ceiling for this workload: the real writer, store and stripe-billing
/// handler on the same bodies the load generator sends, at most `connections` events in
/// flight (as that many HTTP connections would keep), no HTTP. The events are decoded before
/// the clock starts: this measures the writer and the store only.
fn sqlite_ceiling(
    config: &BenchConfig,
    secret: &Secret,
    workload: &Workload,
    connections: usize,
) -> anyhow::Result<f64> {
    use hookledger::internals::BillingWriter;
    let dir = tempfile::tempdir_in(&config.dir)?;
    let requests = loadgen::prepare(workload, secret, "bench");
    let in_flight = connections.max(1);
    let writer = BillingWriter::open(&dir.path().join("ceiling.db"), in_flight)?;
    let mut events = requests
        .iter()
        .map(|r| writer.prepare(body_of(r)))
        .collect::<anyhow::Result<std::collections::VecDeque<_>>>()?;
    let total = events.len();
    let started = std::time::Instant::now();
    let mut waiting = std::collections::VecDeque::new();
    while !events.is_empty() || !waiting.is_empty() {
        while waiting.len() < in_flight {
            let Some(event) = events.pop_front() else {
                break;
            };
            waiting.push_back(writer.submit(event)?);
        }
        if let Some(pending) = waiting.pop_front() {
            pending.wait()?;
        }
    }
    let elapsed = started.elapsed();
    writer.close();
    Ok(total as f64 / elapsed.as_secs_f64())
}

fn body_of(request: &Request) -> &[u8] {
    let at = request
        .bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(0, |p| p + 4);
    &request.bytes[at..]
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

fn print_rows(rows: &[Row]) {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut cells = vec![
                r.connections.to_string(),
                format!("{:.0}%", r.resend * 100.0),
                r.mode.to_string(),
                format!("{:.0}", r.per_second),
            ];
            match &r.report {
                Some(rep) => cells.extend([
                    ms(rep.percentile(50.0)),
                    ms(rep.percentile(90.0)),
                    ms(rep.percentile(99.0)),
                    ms(rep.percentile(100.0)),
                    rep.status_summary(),
                    r.ledger.clone(),
                ]),
                None => cells.extend(["-", "-", "-", "-", "-", "-"].map(String::from)),
            }
            cells
        })
        .collect();
    print!(
        "{}",
        table::render(
            &[
                "C",
                "resend",
                "mode",
                "events/s",
                "p50 ms",
                "p90 ms",
                "p99 ms",
                "max ms",
                "statuses",
                "ledger check"
            ],
            &cells
        )
    );
}

fn print_ratios(rows: &[Row]) {
    let mut cells = Vec::new();
    for group in rows.chunks(3) {
        let [a, b, c] = group else { continue };
        cells.push(vec![
            a.connections.to_string(),
            format!("{:.0}%", a.resend * 100.0),
            format!("{:.1}x", a.per_second / b.per_second),
            format!("{:.0}%", 100.0 * a.per_second / c.per_second),
        ]);
    }
    println!();
    print!("{}", table::render(&["C", "resend", "a/b", "a/c"], &cells));
}

/// CPU, kernel, filesystem and fsync time of the disk under `dir`.
pub(crate) fn print_machine(dir: &Path) -> anyhow::Result<()> {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!("machine: {cpu}, {cores} cores, Linux {}", kernel.trim());
    println!(
        "disk: {} ; fsync of a 4 KiB write: median {}",
        dir.display(),
        fsync_probe(dir)?
    );
    println!("load generator on the same machine; synchronous=FULL; WAL\n");
    Ok(())
}

fn fsync_probe(dir: &Path) -> anyhow::Result<String> {
    use std::io::Write;
    let path = dir.join("fsync-probe");
    let mut file = std::fs::File::create(&path)?;
    let mut times = Vec::new();
    for _ in 0..100 {
        file.write_all(&[0u8; 4096])?;
        let t = Instant::now();
        file.sync_data()?;
        times.push(t.elapsed());
    }
    drop(file);
    std::fs::remove_file(&path)?;
    times.sort();
    Ok(format!("{} ms", ms(times[times.len() / 2])))
}

/// A `hookledger serve` child process for one measurement.
pub(crate) struct Server {
    child: Child,
    pub(crate) addr: SocketAddr,
    /// The admin listener's address, for a server started from a config that sets one.
    pub(crate) admin: Option<SocketAddr>,
}

impl Server {
    pub(crate) fn start(exe: &Path, db: &Path, args: &[&str]) -> anyhow::Result<Server> {
        Server::start_on(exe, db.as_os_str(), &db.with_extension("log"), args)
    }

    /// A server on `db` (a file or a PostgreSQL URL), logging to `log`.
    pub(crate) fn start_on(
        exe: &Path,
        db: &std::ffi::OsStr,
        log_path: &Path,
        args: &[&str],
    ) -> anyhow::Result<Server> {
        Server::start_in(exe, db, log_path, args, None)
    }

    /// [`Server::start_on`], inside the control group `cgroup` (a directory of the cgroup file
    /// system) when given: a shell joins it, then becomes the server, so the server's every
    /// page (heap and the page cache it reads) is charged to the group from its first one.
    pub(crate) fn start_in(
        exe: &Path,
        db: &std::ffi::OsStr,
        log_path: &Path,
        args: &[&str],
        cgroup: Option<&Path>,
    ) -> anyhow::Result<Server> {
        let mut command = match cgroup {
            None => Command::new(exe),
            Some(group) => {
                let mut sh = Command::new("sh");
                sh.args(["-c", r#"echo $$ > "$0/cgroup.procs" && exec "$@""#])
                    .arg(group)
                    .arg(exe);
                sh
            }
        };
        command
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "off"])
            .args(["--stripe-secret", SECRET, "--db"])
            .arg(db)
            .args(args)
            .env_remove("RUST_LOG");
        Server::spawn(command, exe, log_path, false)
    }

    /// `exe serve --config config` and nothing else: no other flag and nothing from this
    /// process's environment (only `PATH`), so two releases read the same settings from the
    /// same file. The config must set `listen` and `admin_listen` to `127.0.0.1:0`; returns
    /// once the admin listener's `/readyz` answers 200 (at most 60 s).
    pub(crate) fn start_with_config(
        exe: &Path,
        config: &Path,
        log_path: &Path,
    ) -> anyhow::Result<Server> {
        let mut command = Command::new(exe);
        command.env_clear().arg("serve").arg("--config").arg(config);
        if let Some(path) = std::env::var_os("PATH") {
            command.env("PATH", path);
        }
        let server = Server::spawn(command, exe, log_path, true)?;
        let admin = server.admin.context("no admin address")?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while !ready(admin) {
            if Instant::now() > deadline {
                bail!(
                    "{} did not answer 200 on /readyz within 60 s; its log:\n{}",
                    exe.display(),
                    log_tail(log_path)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }

    /// Starts `command` (a `serve`) and reads the address it announces on stdout, and with
    /// `admin` the admin address on the line after it.
    fn spawn(
        mut command: Command,
        exe: &Path,
        log_path: &Path,
        admin: bool,
    ) -> anyhow::Result<Server> {
        let log = std::fs::File::create(log_path)?;
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let mut out = BufReader::new(child.stdout.take().context("server stdout")?);
        let mut announced = |prefix: &str| -> Option<SocketAddr> {
            let mut line = String::new();
            out.read_line(&mut line).ok()?;
            line.trim().strip_prefix(prefix)?.parse().ok()
        };
        let addr = announced("hookledger listening on ");
        let admin = if admin {
            announced("hookledger admin on ").map(Some)
        } else {
            Some(None)
        };
        let (Some(addr), Some(admin)) = (addr, admin) else {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "the server did not start (see {}):\n{}",
                log_path.display(),
                log_tail(log_path)
            );
        };
        Ok(Server { addr, admin, child })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A number field of `/proc/<pid>/status` (Linux), e.g. `VmHWM` in KiB.
    fn status_field(&self, field: &str) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// Peak resident memory of the server so far, in KiB.
    pub(crate) fn peak_rss_kib(&self) -> Option<u64> {
        self.status_field("VmHWM")
    }

    /// Resident memory now (KiB) and the number of threads.
    fn rss_and_threads(&self) -> (Option<u64>, Option<u64>) {
        (self.status_field("VmRSS"), self.status_field("Threads"))
    }

    /// SIGTERM and wait, so the database is closed cleanly before it is checked: how long the
    /// server took. A large ledger in a memory limit may take a while (its last checkpoint,
    /// the filter saved): five minutes before it is killed.
    pub(crate) fn stop(&mut self) -> anyhow::Result<Duration> {
        let started = Instant::now();
        Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()?;
        let deadline = started + Duration::from_secs(300);
        while self.child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                self.child.kill()?;
                let _ = self.child.wait();
                bail!("the server did not stop within 300 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(started.elapsed())
    }
}

impl Drop for Server {
    /// A server left running by an error (a failed check, a lost connection) is killed.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Whether `GET /readyz` on `admin` answers 200.
fn ready(admin: SocketAddr) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&admin, Duration::from_secs(1)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    if s.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1 200")
}

/// The last 20 lines of a server's log, for an error that says why it did not start.
fn log_tail(log_path: &Path) -> String {
    let text = std::fs::read_to_string(log_path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
