//! `hookledger-bench lanes`: what the delivery lanes buy, each comparison in one run against
//! the real `hookledger` binary and a local target app served here.
//!
//! - `drain`: a backlog of outbox rows (written into the database before the server starts)
//!   delivered to a target that answers after `--delay`: one lane at concurrency 1, 8 (the
//!   default) and 64. The rate is rows received by the target over the time from its first to
//!   its last receipt, within `--window` (a slow lane is measured on what it drains in that
//!   time).
//! - `isolation`: events at `--rate` for `--seconds`, each forwarded (a healthy target that
//!   answers at once) and queuing a row of a second kind; the time from each event's 200 (sent
//!   after COMMIT) to its forward's arrival, p50/p99/max, with the second kind undelivered
//!   (no delivery configured), delivered to a port that refuses connections, and to one that
//!   accepts and never answers.
//! - `outage`: events at `--rate` while the app is down (connections refused) for `--outage`,
//!   then the app answers again and the sending stops: the time until every row is delivered.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hookledger::Secret;

use crate::bench::{Server, SECRET};
use crate::loadgen::{self, percentile, Workload};

/// The deliveries' signing secret (the target does not check it).
pub(crate) const DELIVERY_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// Settings of one `lanes` run.
#[derive(Debug, Clone)]
pub struct LanesConfig {
    pub dir: PathBuf,
    pub exe: PathBuf,
}

/// A local app: answers every POST with 200 after `delay`, and notes when each `webhook-id`
/// arrived.
pub(crate) struct Target {
    addr: SocketAddr,
    seen: Arc<Mutex<HashMap<String, Instant>>>,
}

impl Target {
    pub(crate) fn start(listener: TcpListener, delay: Duration) -> Target {
        let addr = listener.local_addr().expect("bound");
        let seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
        let record = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let record = record.clone();
                std::thread::spawn(move || {
                    let _ = serve(stream, delay, &record);
                });
            }
        });
        Target { addr, seen }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}/hooks", self.addr)
    }

    pub(crate) fn count(&self) -> usize {
        self.seen.lock().map(|s| s.len()).unwrap_or(0)
    }

    fn times(&self) -> HashMap<String, Instant> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// One keep-alive connection of the target.
fn serve(
    stream: TcpStream,
    delay: Duration,
    seen: &Mutex<HashMap<String, Instant>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut stream = stream;
    loop {
        let (mut length, mut id) = (0usize, None);
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        loop {
            line.clear();
            reader.read_line(&mut line)?;
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                match name.trim().to_ascii_lowercase().as_str() {
                    "content-length" => length = value.trim().parse().unwrap_or(0),
                    "webhook-id" => id = Some(value.trim().to_string()),
                    _ => {}
                }
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        std::thread::sleep(delay);
        if let (Some(id), Ok(mut seen)) = (id, seen.lock()) {
            seen.entry(id).or_insert_with(Instant::now);
        }
        stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")?;
    }
}

/// A port on which connections are refused (nobody listens).
fn closed_port() -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}

/// A listener that accepts connections and never answers; kept open while it lives.
fn hanging() -> anyhow::Result<(SocketAddr, Arc<Mutex<Vec<TcpStream>>>)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let held: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
    let keep = held.clone();
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            if let Ok(mut keep) = keep.lock() {
                keep.push(s);
            }
        }
    });
    Ok((addr, held))
}

/// The config: the stripe source (no handler), `extra` TOML after it.
pub(crate) fn write_config(dir: &Path, extra: &str) -> anyhow::Result<PathBuf> {
    let path = dir.join("hookledger.toml");
    std::fs::write(
        &path,
        format!(
            "[[source]]\nname = \"stripe\"\nscheme = \"stripe\"\n\
             secrets = [\"env:HOOKLEDGER_BENCH_STRIPE\"]\n\n{extra}"
        ),
    )?;
    Ok(path)
}

pub(crate) fn start(config: &LanesConfig, db: &Path, toml: &Path) -> anyhow::Result<Server> {
    Server::start(
        &config.exe,
        db,
        &["--config", toml.to_str().context("path")?],
    )
}

/// Waits until `done` or `limit` passed; whether it is done.
pub(crate) fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    done()
}

/// `backlog.db` in `dir`: `rows` queued rows of `kind` (source `stripe`, 1.5 KB payloads, due
/// at once), written directly into the schema the server made itself; copy it for each run.
/// `HOOKLEDGER_BENCH_STRIPE` must be set (the config's secret).
pub(crate) fn write_backlog(
    config: &LanesConfig,
    dir: &Path,
    kind: &str,
    rows: usize,
) -> anyhow::Result<PathBuf> {
    let backlog = dir.join("backlog.db");
    let toml = write_config(dir, "")?;
    start(config, &backlog, &toml)?.stop()?;
    let conn = rusqlite::Connection::open(&backlog)?;
    conn.execute_batch("BEGIN")?;
    let payload = format!("{{\"pad\":\"{}\"}}", "p".repeat(1500));
    for i in 0..rows {
        conn.execute(
            "INSERT INTO outbox (kind, source, key, payload, next_attempt_at)
             VALUES (?1, 'stripe', ?2, ?3, 0)",
            rusqlite::params![kind, format!("row_{i:06}"), payload.as_bytes()],
        )?;
    }
    conn.execute_batch("COMMIT")?;
    Ok(backlog)
}

/// Drain rate of `rows` queued rows to a target answering after `delay`, per concurrency.
pub fn drain(
    config: &LanesConfig,
    rows: usize,
    delay: Duration,
    window: Duration,
    concurrencies: &[usize],
) -> anyhow::Result<()> {
    std::env::set_var("HOOKLEDGER_BENCH_STRIPE", SECRET);
    let dir = tempfile::tempdir_in(&config.dir)?;
    let backlog = write_backlog(config, dir.path(), "drain", rows)?;
    println!(
        "drain: {rows} queued rows, a target answering after {} ms, one lane; at most {} s \
         each",
        delay.as_millis(),
        window.as_secs()
    );
    let mut rates = Vec::new();
    for &concurrency in concurrencies {
        let db = dir.path().join(format!("c{concurrency}.db"));
        std::fs::copy(&backlog, &db)?;
        let target = Target::start(TcpListener::bind("127.0.0.1:0")?, delay);
        let toml = write_config(
            dir.path(),
            &format!(
                "[[delivery]]\nkind = \"drain\"\nurl = \"{}\"\nsecret = \"{DELIVERY_SECRET}\"\n\
                 concurrency = {concurrency}\n",
                target.url()
            ),
        )?;
        let mut server = start(config, &db, &toml)?;
        wait_until(window, || target.count() >= rows);
        server.stop()?;
        let times: Vec<Instant> = target.times().into_values().collect();
        let (Some(first), Some(last)) = (times.iter().min(), times.iter().max()) else {
            bail!("concurrency {concurrency}: nothing delivered");
        };
        let span = last.duration_since(*first).as_secs_f64().max(0.001);
        let rate = (times.len() - 1) as f64 / span;
        println!(
            "  concurrency {concurrency:>3}: {:>5} rows in {span:6.1} s: {rate:7.1} rows/s",
            times.len()
        );
        rates.push((concurrency, rate));
    }
    if let (Some((c0, r0)), Some((cn, rn))) = (rates.first(), rates.last()) {
        println!(
            "  concurrency {cn} / concurrency {c0}: {:.1}x",
            rn / r0.max(f64::MIN_POSITIVE)
        );
    }
    Ok(())
}

/// Sends `events` new events at `rate` per second; the instant each got its 200, by event id.
fn send_at_rate(
    addr: SocketAddr,
    first: usize,
    events: usize,
    rate: f64,
    stop: Option<&dyn Fn() -> bool>,
) -> anyhow::Result<HashMap<String, Instant>> {
    let workload = Workload {
        requests: first + events,
        resend_share: 0.0,
        seed: 7,
        ids: loadgen::Ids::Ordered,
    };
    let requests = loadgen::prepare(&workload, &Secret::new(SECRET), &addr.to_string());
    let started = Instant::now();
    let mut committed = HashMap::new();
    for (n, request) in requests[first..].iter().enumerate() {
        if stop.is_some_and(|stop| stop()) {
            break;
        }
        let at = started + Duration::from_secs_f64(n as f64 / rate);
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        let report = loadgen::run(addr, std::slice::from_ref(request), 1);
        if report.processed == 1 {
            committed.insert(request.event_id.clone(), Instant::now());
        }
    }
    Ok(committed)
}

/// Commit-to-delivery latency of a healthy kind, alone and beside a dead or hanging one.
pub fn isolation(config: &LanesConfig, seconds: u64, rate: f64) -> anyhow::Result<()> {
    std::env::set_var("HOOKLEDGER_BENCH_STRIPE", SECRET);
    let dir = tempfile::tempdir_in(&config.dir)?;
    let events = (seconds as f64 * rate) as usize;
    let refused = closed_port()?;
    let (hang, _held) = hanging()?;
    println!(
        "isolation: {events} events at {rate}/s; each forwarded (the app answers at once) and \
         queuing a row of a second kind `other`; time from the event's 200 to its forward's \
         arrival"
    );
    let effect = "[[effect]]\nsource = \"stripe\"\non = \"*\"\nsql = \"INSERT INTO outbox \
                  (kind, source, key, payload) VALUES ('other', :source, :event_id, :body)\"\n";
    for (label, other) in [
        ("other kind undelivered (no delivery)", None),
        ("other kind refuses connections", Some(refused)),
        ("other kind accepts, never answers", Some(hang)),
    ] {
        let target = Target::start(TcpListener::bind("127.0.0.1:0")?, Duration::ZERO);
        let mut extra = format!(
            "[forward]\nurl = \"{}\"\nsecret = \"{DELIVERY_SECRET}\"\n\n{effect}",
            target.url()
        );
        if let Some(addr) = other {
            extra.push_str(&format!(
                "\n[[delivery]]\nkind = \"other\"\nurl = \"http://{addr}/hooks\"\n"
            ));
        }
        let toml = write_config(dir.path(), &extra)?;
        let db = dir
            .path()
            .join(format!("iso-{}.db", other.map_or(0, |a| a.port())));
        let mut server = start(config, &db, &toml)?;
        let committed = send_at_rate(server.addr, 0, events, rate, None)?;
        wait_until(Duration::from_secs(30), || {
            target.count() >= committed.len()
        });
        server.stop()?;
        let arrived = target.times();
        let mut latencies: Vec<Duration> = committed
            .iter()
            .filter_map(|(id, at)| Some(arrived.get(id)?.saturating_duration_since(*at)))
            .collect();
        latencies.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "  {label:<38} delivered {:>4}/{:<4} p50 {:7.1} ms  p99 {:7.1} ms  max {:7.1} ms",
            latencies.len(),
            committed.len(),
            ms(percentile(&latencies, 50.0)),
            ms(percentile(&latencies, 99.0)),
            ms(percentile(&latencies, 100.0)),
        );
    }
    Ok(())
}

/// Time to deliver the rows of an outage once the app answers again.
pub fn outage(config: &LanesConfig, outage: Duration, rate: f64) -> anyhow::Result<()> {
    std::env::set_var("HOOKLEDGER_BENCH_STRIPE", SECRET);
    let dir = tempfile::tempdir_in(&config.dir)?;
    let port = closed_port()?;
    let toml = write_config(
        dir.path(),
        &format!("[forward]\nurl = \"http://{port}/hooks\"\nsecret = \"{DELIVERY_SECRET}\"\n"),
    )?;
    let mut server = start(config, &dir.path().join("outage.db"), &toml)?;
    let events = (outage.as_secs_f64() * rate) as usize;
    println!(
        "outage: the app refuses connections for {} s while {events} events arrive at {rate}/s \
         (default lane settings); then it answers again and the sending stops",
        outage.as_secs()
    );
    let committed = send_at_rate(server.addr, 0, events, rate, None)?;
    let back = Instant::now();
    let target = Target::start(
        TcpListener::bind(port).context("the app's port was taken meanwhile")?,
        Duration::ZERO,
    );
    let all = wait_until(Duration::from_secs(600), || {
        let arrived = target.times();
        committed.keys().all(|id| arrived.contains_key(id))
    });
    let took = back.elapsed();
    server.stop()?;
    let arrived = target.times();
    let first = arrived
        .values()
        .min()
        .map(|t| t.saturating_duration_since(back));
    println!(
        "  {} events committed; all delivered: {all}; the first {:.1} s and the last {:.1} s \
         after the app answered again",
        committed.len(),
        first.unwrap_or_default().as_secs_f64(),
        took.as_secs_f64()
    );
    Ok(())
}
