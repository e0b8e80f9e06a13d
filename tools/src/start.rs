//! `hookledger-bench start OLD_BIN NEW_BIN`: how soon a `serve` answers after `kill -9` on a
//! large ledger. Each binary gets a SQLite ledger of `--claims` random-id claims made with its
//! own schema; each run copies it afresh (so no saved filter: as after a crash), drops it from
//! the page cache, starts the binary and times, from the spawn, the first `processed` for a new
//! event and the first `duplicate` for a resend of the ledger's oldest claim (the first block),
//! with the filter's build time from the server's log. Rounds alternate which binary starts
//! first.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use hookledger::internals::invoice_event;
use hookledger::Secret;

use crate::bench::{Server, SECRET};
use crate::growth::{drop_from_page_cache, fill_sqlite, median, remove_sqlite, Received};
use crate::loadgen::{http_request, Ids};

#[derive(Debug, Args)]
pub struct StartArgs {
    /// The binary compared against (e.g. the last release).
    #[arg(value_name = "OLD_BIN")]
    old: PathBuf,
    /// The binary measured.
    #[arg(value_name = "NEW_BIN")]
    new: PathBuf,
    /// Claims in each ledger (random ids, received over the last 400 days).
    #[arg(long, default_value_t = 5_000_000)]
    claims: u64,
    /// Rounds; each starts both binaries once.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Leave the ledger in the page cache (a start right after the crash, on a machine with
    /// memory to spare) instead of reading it from the disk.
    #[arg(long)]
    warm: bool,
    /// Where the ledgers go (~150 bytes a claim, three copies).
    #[arg(long, default_value = "./target/bench-start")]
    dir: PathBuf,
}

/// What one start measured, from the spawn.
struct Start {
    processed: Duration,
    duplicate: Duration,
    /// The filter's build, as the server logged it.
    filter: Option<f64>,
}

pub fn run(args: StartArgs) -> anyhow::Result<bool> {
    std::fs::create_dir_all(&args.dir)?;
    let sides = [("OLD", &args.old), ("NEW", &args.new)];
    let mut ledgers = Vec::new();
    for (name, exe) in sides {
        let path = args
            .dir
            .join(format!("{}-{}.db", name.to_lowercase(), args.claims));
        let began = Instant::now();
        fill_sqlite(exe, &path, Ids::Random, args.claims, Received::Spread)
            .with_context(|| format!("filling the {name} ledger"))?;
        println!(
            "{name}: {} ledger of {} claims filled in {:.1} s",
            exe.display(),
            args.claims,
            began.elapsed().as_secs_f64()
        );
        ledgers.push(path);
    }
    let mut starts: [Vec<Start>; 2] = [Vec::new(), Vec::new()];
    for round in 0..args.rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            let (name, exe) = sides[side];
            let start = one_start(exe, &ledgers[side], &args)?;
            println!(
                "round {} {name}: processed {:.2} s, duplicate {:.2} s, filter {}",
                round + 1,
                start.processed.as_secs_f64(),
                start.duplicate.as_secs_f64(),
                start
                    .filter
                    .map_or("not logged".to_string(), |s| format!("{s:.1} s"))
            );
            starts[side].push(start);
        }
    }
    println!(
        "\n{} claims, {} rounds, {}:",
        args.claims,
        args.rounds,
        if args.warm {
            "warm page cache"
        } else {
            "from the disk"
        }
    );
    for (side, (name, _)) in sides.iter().enumerate() {
        let seconds = |f: fn(&Start) -> f64| -> String {
            let v: Vec<f64> = starts[side].iter().map(f).collect();
            let (lo, hi) = v
                .iter()
                .fold((f64::MAX, f64::MIN), |(l, h), x| (l.min(*x), h.max(*x)));
            format!("{:.2} s ({lo:.2}–{hi:.2})", median(v.clone()))
        };
        println!(
            "{name}: first processed {}, first duplicate {}",
            seconds(|s| s.processed.as_secs_f64()),
            seconds(|s| s.duplicate.as_secs_f64())
        );
    }
    for path in &ledgers {
        remove_sqlite(path)?;
    }
    Ok(true)
}

fn one_start(exe: &Path, ledger: &Path, args: &StartArgs) -> anyhow::Result<Start> {
    let run = args.dir.join("run.db");
    remove_sqlite(&run)?;
    std::fs::copy(ledger, &run)?;
    let oldest: String = {
        let conn = rusqlite::Connection::open(&run)?;
        // As after kill -9: no filter saved (the fill's own clean stop saved an empty one).
        let saved: i64 = conn.query_row(
            "SELECT count(*) FROM sqlite_master WHERE name = 'hookledger_claims_filter'",
            [],
            |r| r.get(0),
        )?;
        if saved > 0 {
            conn.execute("DELETE FROM hookledger_claims_filter", [])?;
        }
        conn.query_row(
            "SELECT event_id FROM webhook_events ORDER BY id LIMIT 1",
            [],
            |r| r.get(0),
        )?
    };
    std::fs::File::open(&run)?.sync_all()?;
    if !args.warm {
        drop_from_page_cache(&run)?;
    }
    let secret = Secret::new(SECRET);
    let spawned = Instant::now();
    let mut server = Server::start(exe, &run, &[])?;
    let fresh = format!("evt_start_{}", hookledger::internals::unix_now());
    let processed = until(server.addr, &secret, &fresh, "\"processed\"", spawned)?;
    let duplicate = until(server.addr, &secret, &oldest, "\"duplicate\"", spawned)?;
    // The filter's build time, once it is done (at most a minute more).
    let log_path = run.with_extension("log");
    let deadline = Instant::now() + Duration::from_secs(60);
    let filter = loop {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if let Some(seconds) = built_in(&log) {
            break Some(seconds);
        }
        if Instant::now() > deadline {
            break None;
        }
        // The writer takes a filter built in the background at its next transaction.
        let nudge = format!("evt_nudge_{}", spawned.elapsed().as_nanos());
        let _ = until(
            server.addr,
            &secret,
            &nudge,
            "\"processed\"",
            Instant::now(),
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    server.stop()?;
    remove_sqlite(&run)?;
    Ok(Start {
        processed,
        duplicate,
        filter,
    })
}

/// The seconds of the log's `ledger: filter of N claim(s) built [in the background] in X s`.
fn built_in(log: &str) -> Option<f64> {
    let line = log.lines().find(|l| l.contains("claim(s) built"))?;
    let after = &line[line.find("claim(s) built")?..];
    let after = &after[after.find(" in ")? + 4..];
    let after = after.strip_prefix("the background in ").unwrap_or(after);
    after.split(' ').next()?.parse().ok()
}

/// Sends `event_id` until the answer has `want` (a refused connection is tried again every
/// 5 ms, for at most 5 minutes): the time since `from`.
fn until(
    addr: SocketAddr,
    secret: &Secret,
    event_id: &str,
    want: &str,
    from: Instant,
) -> anyhow::Result<Duration> {
    let now = hookledger::internals::unix_now();
    let body = invoice_event(
        event_id,
        "invoice.paid",
        now,
        &format!("in_{event_id}"),
        "cus_start",
        "acct_start",
    );
    let host = addr.to_string();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let request = http_request(
            &host,
            secret,
            hookledger::internals::unix_now(),
            body.as_bytes(),
        );
        if let Ok(answer) = send(addr, &request) {
            if answer.starts_with("HTTP/1.1 200") && answer.contains(want) {
                return Ok(from.elapsed());
            }
        }
        if Instant::now() > deadline {
            bail!("no {want} for {event_id} within 5 minutes");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// One request on a connection of its own; the whole answer.
fn send(addr: SocketAddr, request: &[u8]) -> anyhow::Result<String> {
    exchange(
        TcpStream::connect_timeout(&addr, Duration::from_secs(1))?,
        request,
    )
}

/// `request` on `stream`, and its answer (head and JSON body).
pub(crate) fn exchange(mut stream: TcpStream, request: &[u8]) -> anyhow::Result<String> {
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    stream.write_all(request)?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    // The answer's head and its short JSON body: read until the body has its closing brace.
    loop {
        // A signal to this process (SIGCHLD of a `kill` the bench ran) interrupts a read: go on.
        let n = match stream.read(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            read => read?,
        };
        if n == 0 {
            anyhow::ensure!(!answer.is_empty(), "the connection closed with no answer");
            break;
        }
        answer.extend_from_slice(&buf[..n]);
        if answer.ends_with(b"}") || answer.ends_with(b"}\n") {
            break;
        }
    }
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_s_build_time_is_read_from_either_release_s_log() {
        let old = "INFO ledger: filter of 5001558 claim(s) built in 5.7 s (17 MiB)";
        let new = "INFO ledger: filter of 5001558 claim(s) built in the background in 6.1 s \
                   (17 MiB), 3 added since";
        assert_eq!(built_in(old), Some(5.7));
        assert_eq!(built_in(new), Some(6.1));
        assert_eq!(built_in("ledger: filter of 5 claim(s) loaded"), None);
    }
}
