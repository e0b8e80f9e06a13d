//! `hookledger-bench console BIN`: how long `/status` and `/metrics` take over a large outbox.
//! A fresh SQLite file gets `--due` `forward` rows due now and `--other` rows spread over
//! `--kinds` other kinds (a third of them dead); `serve` forwards to a port that refuses, so the
//! worker fails attempts all along while the pages are read. Then `--requests` GETs of each
//! page, one at a time on a new connection each: median, p99 and the slowest, from the
//! connect to the last byte.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;

use crate::bench::{Server, SECRET};
use crate::compare::toml_string;
use crate::growth::remove_sqlite;
use crate::lanes::DELIVERY_SECRET;
use crate::loadgen::percentile;

#[derive(Debug, Args)]
pub struct ConsoleArgs {
    /// The binary measured.
    #[arg(value_name = "BIN")]
    exe: PathBuf,
    /// `forward` rows due now (the worker attempts them against a port that refuses).
    #[arg(long, default_value_t = 100_000)]
    due: u64,
    /// Rows in the other kinds: two thirds pending, one third dead.
    #[arg(long, default_value_t = 100_000)]
    other: u64,
    /// How many other kinds.
    #[arg(long, default_value_t = 500)]
    kinds: u64,
    /// GETs of each page.
    #[arg(long, default_value_t = 50)]
    requests: usize,
    /// Where the database goes.
    #[arg(long, default_value = "./target/bench-console")]
    dir: PathBuf,
}

pub fn run(args: ConsoleArgs) -> anyhow::Result<bool> {
    std::fs::create_dir_all(&args.dir)?;
    // Absolute: the config's relative paths are read from the config's folder.
    let dir = args.dir.canonicalize()?;
    let db = dir.join("console.db");
    remove_sqlite(&db)?;
    let config = dir.join("console.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndatabase = {}\n\
             [forward]\nurl = \"http://127.0.0.1:1/hooks\"\nsecret = \"{DELIVERY_SECRET}\"\n\
             [[source]]\nname = \"stripe\"\nscheme = \"stripe\"\nsecrets = [\"{SECRET}\"]\n",
            toml_string(&db.display().to_string())
        ),
    )?;
    let log = dir.join("serve.log");
    // A first start makes the schema; the rows go in while no server runs.
    Server::start_with_config(&args.exe, &config, &log)?.stop()?;
    fill(&db, &args).context("filling the outbox")?;
    let mut server = Server::start_with_config(&args.exe, &config, &log)?;
    let admin = server.admin.context("no admin address")?;
    std::thread::sleep(Duration::from_secs(2));
    println!(
        "{}: {} forward rows due, {} rows in {} other kinds; {} GETs of each page",
        args.exe.display(),
        args.due,
        args.other,
        args.kinds,
        args.requests
    );
    let mut all_within = true;
    for page in ["/status", "/metrics"] {
        let mut times = Vec::with_capacity(args.requests);
        for _ in 0..args.requests {
            times.push(get(admin, page)?);
        }
        times.sort();
        println!(
            "{page}: median {:.1} ms, p99 {:.1} ms, slowest {:.1} ms",
            ms(percentile(&times, 50.0)),
            ms(percentile(&times, 99.0)),
            ms(percentile(&times, 100.0))
        );
        all_within &= percentile(&times, 100.0) <= Duration::from_millis(100);
    }
    server.stop()?;
    Ok(all_within)
}

/// The rows, in one transaction, straight into the file.
fn fill(db: &std::path::Path, args: &ConsoleArgs) -> anyhow::Result<()> {
    let mut conn = rusqlite::Connection::open(db)?;
    let tx = conn.transaction()?;
    {
        let mut insert = tx.prepare(
            "INSERT INTO outbox (kind, source, key, event_type, payload, status, next_attempt_at) \
             VALUES (?1, 'stripe', ?2, 'invoice.paid', x'7b7d', ?3, unixepoch())",
        )?;
        for i in 0..args.due {
            insert.execute(rusqlite::params!["forward", format!("evt_{i}"), "pending"])?;
        }
        for i in 0..args.other {
            let kind = format!("kind{}", i % args.kinds.max(1));
            let status = if i % 3 == 0 { "dead" } else { "pending" };
            insert.execute(rusqlite::params![kind, format!("row_{i}"), status])?;
        }
    }
    tx.commit()?;
    Ok(())
}

/// One GET on a new connection, read to its end; the time from the connect.
fn get(admin: SocketAddr, page: &str) -> anyhow::Result<Duration> {
    let began = Instant::now();
    let mut s = TcpStream::connect(admin)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        s,
        "GET {page} HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)?;
    let took = began.elapsed();
    if !answer.starts_with(b"HTTP/1.1 200") {
        bail!(
            "{page} answered {}",
            String::from_utf8_lossy(&answer[..answer.len().min(40)])
        );
    }
    Ok(took)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
