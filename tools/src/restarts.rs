//! `hookledger-bench restarts`: what an open-loop load sees while `serve` restarts or reloads
//! `--times` times: each request on a connection of its own (as providers send), at `--rate`
//! a second; counted as refused (no connection), cut (connected, no answer), non-2xx, and
//! acknowledged; after the run, the acknowledged events the ledger lacks (lost).
//!
//! `--signal usr2`: the restart in place; `hup`: a reload, the config alternating between one
//! and two Stripe secrets (a rotation); `term`: a stop and a new process on the same port (what
//! a plain restart without a held socket does), for comparison.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use hookledger::internals::invoice_event;
use hookledger::Secret;

use crate::bench::{Server, SECRET};
use crate::compare::config_text;
use crate::loadgen::http_request;

#[derive(Debug, Args)]
pub struct RestartsArgs {
    /// How each restart is made.
    #[arg(long, value_enum, default_value = "usr2")]
    signal: Signal,
    /// Restarts (or reloads) during the run, evenly spaced.
    #[arg(long, default_value_t = 5)]
    times: u32,
    /// Requests a second, each on a new connection.
    #[arg(long, default_value_t = 200)]
    rate: u32,
    /// Length of the run.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// The `hookledger` binary [default: `hookledger` next to this binary].
    #[arg(long)]
    exe: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Signal {
    Usr2,
    Hup,
    Term,
}

/// What the load saw.
#[derive(Debug, Default)]
struct Seen {
    sent: usize,
    refused: usize,
    cut: usize,
    not_2xx: usize,
    acknowledged: Vec<String>,
    /// The first few causes of refusals and cuts, with the time since the run began.
    causes: Vec<String>,
}

pub fn run(args: RestartsArgs) -> anyhow::Result<bool> {
    let exe = match &args.exe {
        Some(exe) => exe.clone(),
        None => std::env::current_exe()?.with_file_name("hookledger"),
    };
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("hookledger.db");
    let config = dir.path().join("hookledger.toml");
    let log = dir.path().join("serve.log");
    // A fixed port, so that `term`'s new process listens where the old one did.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let text = |rotating: bool| {
        let text = config_text(db.to_str().unwrap(), SECRET).replacen(
            "listen = \"127.0.0.1:0\"",
            &format!("listen = \"127.0.0.1:{port}\""),
            1,
        );
        match rotating {
            true => text.replace(
                &format!("secrets = [\"{SECRET}\"]"),
                &format!("secrets = [\"{SECRET}\", \"whsec_bench_rotated_0123456789\"]"),
            ),
            false => text,
        }
    };
    std::fs::write(&config, text(false))?;
    let mut server = Server::start_with_config(&exe, &config, &log)?;
    let addr = server.addr;

    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let threads = 8;
    let load: Vec<_> = (0..threads)
        .map(|thread| {
            let (stop, seen) = (stop.clone(), seen.clone());
            let every = Duration::from_secs(1) * threads / args.rate.max(1);
            std::thread::spawn(move || send_steadily(addr, thread, every, &stop, &seen))
        })
        .collect();
    let started = Instant::now();
    let gap = Duration::from_secs(args.seconds) / (args.times + 1);
    let mut made = Vec::new();
    for n in 1..=args.times {
        if let Some(wait) = (started + gap * n).checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let began = Instant::now();
        match args.signal {
            Signal::Usr2 => {
                kill("-USR2", server.pid())?;
                wait_log(&log, "restarting in place", n as usize)?;
            }
            Signal::Hup => {
                // A rotation's two halves in turn: two secrets, then one.
                std::fs::write(&config, text(n % 2 == 1))?;
                kill("-HUP", server.pid())?;
                wait_log(&log, "reload: sources swapped", n as usize)?;
            }
            Signal::Term => {
                server.stop()?;
                let log = dir.path().join(format!("serve-{n}.log"));
                server = Server::start_with_config(&exe, &config, &log)?;
            }
        }
        made.push(began.elapsed());
    }
    if let Some(wait) =
        (started + Duration::from_secs(args.seconds)).checked_duration_since(Instant::now())
    {
        std::thread::sleep(wait);
    }
    stop.store(true, Ordering::SeqCst);
    for thread in load {
        thread.join().expect("a load thread panicked");
    }
    server.stop()?;
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let conn = rusqlite::Connection::open(&db)?;
    let mut query = conn.prepare("SELECT event_id FROM webhook_events WHERE source = 'stripe'")?;
    let claimed: HashSet<String> = query
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let lost = seen
        .acknowledged
        .iter()
        .filter(|id| !claimed.contains(*id))
        .count();
    let took: Vec<String> = made
        .iter()
        .map(|d| format!("{:.2}", d.as_secs_f64()))
        .collect();
    println!(
        "{} × {:?} over {} s at {}/s (a new connection each), {}: each took [{}] s until done",
        args.times,
        args.signal,
        args.seconds,
        args.rate,
        exe.display(),
        took.join(", ")
    );
    println!(
        "sent {}, refused {}, cut {}, non-2xx {}, acknowledged {}, acknowledged and lost {lost}",
        seen.sent,
        seen.refused,
        seen.cut,
        seen.not_2xx,
        seen.acknowledged.len()
    );
    for cause in &seen.causes {
        println!("  {cause}");
    }
    Ok(lost == 0)
}

fn send_steadily(
    addr: SocketAddr,
    thread: u32,
    every: Duration,
    stop: &AtomicBool,
    seen: &Mutex<Seen>,
) {
    let secret = Secret::new(SECRET);
    let host = addr.to_string();
    let mut next = Instant::now();
    let begun = next;
    for n in 0.. {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let id = format!("evt_restarts_{thread}_{n}");
        let now = hookledger::internals::unix_now();
        let body = invoice_event(
            &id,
            "invoice.paid",
            now,
            &format!("in_{id}"),
            "cus_r",
            "acct_r",
        );
        let request = http_request(&host, &secret, now, body.as_bytes());
        let answer = match connect(addr) {
            Err(e) => Err((true, anyhow::Error::from(e))),
            Ok(stream) => crate::start::exchange(stream, &request).map_err(|e| (false, e)),
        }
        .map_err(|(refused, e)| {
            let at = begun.elapsed().as_secs_f64();
            (refused, format!("{id} at {at:.3} s: {e:#}"))
        });
        let mut seen = seen.lock().unwrap();
        seen.sent += 1;
        if let Err((_, cause)) = &answer {
            if seen.causes.len() < 5 {
                seen.causes.push(cause.clone());
            }
        }
        match answer {
            Err((true, _)) => seen.refused += 1,
            Err((false, _)) => seen.cut += 1,
            Ok(a) if a.starts_with("HTTP/1.1 200") => seen.acknowledged.push(id),
            Ok(_) => seen.not_2xx += 1,
        }
        drop(seen);
        next += every;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
}

/// A connection to `addr`, tried again when a signal to this process interrupted it.
fn connect(addr: SocketAddr) -> std::io::Result<std::net::TcpStream> {
    loop {
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            connected => return connected,
        }
    }
}

fn kill(signal: &str, pid: u32) -> anyhow::Result<()> {
    let status = std::process::Command::new("kill")
        .arg(signal)
        .arg(pid.to_string())
        .status()?;
    anyhow::ensure!(status.success(), "kill {signal} {pid} failed");
    Ok(())
}

/// Waits (at most 60 s) until `log` has `line` `count` times.
fn wait_log(log: &Path, line: &str, count: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(log).context("reading the server's log")?;
        if text.matches(line).count() >= count {
            return Ok(());
        }
        if Instant::now() > deadline {
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!(
                "no {count}×{line:?} in the log within 60 s; its last lines:\n{}",
                tail.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
