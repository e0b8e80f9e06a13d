//! `hookledger-bench batch BIN...`: what one big batch body costs the other sources. A server
//! with a `stripe` source and a HubSpot-shaped `split` source gets Stripe events at a fixed
//! rate (open loop, latency from each request's due time) for `--seconds`, first alone, then
//! while one connection posts `--elements`-element batch bodies back to back: the Stripe
//! events' median, p99 and slowest in both, and each batch's time. Each binary gets a fresh
//! database; with two (the last release and a change) the table has a row pair for each.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use hmac::Mac;
use hookledger::internals::table;
use hookledger::Secret;

use crate::bench::{Server, SECRET};
use crate::compare::toml_string;
use crate::growth::remove_sqlite;
use crate::loadgen::{self, percentile, Ids, Report, Workload};

/// The batch source's signing key (HMAC-SHA256 of the body, hex, in `X-Signature`).
const BATCH_SECRET: &str = "bench_batch_secret_0123456789";

#[derive(Debug, Args)]
pub struct BatchArgs {
    /// The binaries measured, one after the other (e.g. the last release and a change).
    #[arg(value_name = "BIN", required = true)]
    exes: Vec<PathBuf>,
    /// Elements in each batch body (the default is the shipped `max_events`).
    #[arg(long, default_value_t = 5_000)]
    elements: usize,
    /// Stripe events a second, beside the batches.
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    /// Seconds of Stripe events in each phase.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Where the databases go.
    #[arg(long, default_value = "./target/bench-batch")]
    dir: PathBuf,
}

/// One binary's two phases.
struct Measured {
    alone: Report,
    beside: Report,
    /// Each batch body's time from its first byte sent to the end of its answer, sorted.
    batches: Vec<Duration>,
}

pub fn run(args: BatchArgs) -> anyhow::Result<bool> {
    std::fs::create_dir_all(&args.dir)?;
    // Absolute: the config's relative paths are read from the config's folder.
    let dir = args.dir.canonicalize()?;
    println!(
        "Stripe events at {}/s for {} s, alone and beside back-to-back {}-element batch bodies",
        args.rate, args.seconds, args.elements
    );
    let mut rows = Vec::new();
    for (n, exe) in args.exes.iter().enumerate() {
        let m = measure(exe, &dir.join(format!("batch{n}")), &args)
            .with_context(|| format!("measuring {}", exe.display()))?;
        let ms = |d: Duration| format!("{:.1}", d.as_secs_f64() * 1000.0);
        for (phase, report) in [("alone", &m.alone), ("beside batches", &m.beside)] {
            let batches = match phase {
                "alone" => String::new(),
                _ => format!(
                    "{} × median {} / max {} ms",
                    m.batches.len(),
                    ms(percentile(&m.batches, 50.0)),
                    ms(percentile(&m.batches, 100.0))
                ),
            };
            rows.push(vec![
                exe.display().to_string(),
                phase.to_string(),
                ms(report.percentile(50.0)),
                ms(report.percentile(99.0)),
                ms(report.percentile(100.0)),
                report.status_summary(),
                batches,
            ]);
        }
    }
    print!(
        "{}",
        table::render(
            &[
                "binary",
                "Stripe events",
                "median ms",
                "p99 ms",
                "slowest ms",
                "statuses",
                "batch bodies"
            ],
            &rows
        )
    );
    Ok(true)
}

fn measure(exe: &Path, dir: &Path, args: &BatchArgs) -> anyhow::Result<Measured> {
    std::fs::create_dir_all(dir)?;
    let db = dir.join("batch.db");
    remove_sqlite(&db)?;
    let config = dir.join("batch.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndatabase = {}\n\
             [[source]]\nname = \"stripe\"\nscheme = \"stripe\"\nsecrets = [\"{SECRET}\"]\n\
             [[source]]\nname = \"hubspot\"\nscheme = \"hmac\"\nsecrets = [\"{BATCH_SECRET}\"]\n\
             hmac = {{ header = \"X-Signature\" }}\nsplit = \"/\"\nmax_body = {}\n\
             id = {{ json = \"/eventId\" }}\ntype = {{ json = \"/subscriptionType\" }}\n",
            toml_string(&db.display().to_string()),
            // The bodies' own size and room for a longer one.
            4 * hubspot_batch(1, args.elements).len()
        ),
    )?;
    let mut server = Server::start_with_config(exe, &config, &dir.join("serve.log"))?;
    let requests = args.rate as usize * args.seconds as usize;
    let secret = Secret::new(SECRET);
    let stripe = |seed| {
        let workload = Workload {
            requests,
            resend_share: 0.0,
            seed,
            ids: Ids::Ordered,
        };
        loadgen::prepare(&workload, &secret, &server.addr.to_string())
    };
    let (first, second) = (stripe(1), stripe(2));
    let alone = loadgen::run_open(server.addr, &first, args.rate, 16);
    let done = AtomicBool::new(false);
    let (beside, batches) = std::thread::scope(|scope| {
        let sender = scope.spawn(|| send_batches(server.addr, args.elements, &done));
        // The first body is under way before the Stripe events begin.
        std::thread::sleep(Duration::from_millis(200));
        let beside = loadgen::run_open(server.addr, &second, args.rate, 16);
        done.store(true, Ordering::Relaxed);
        (beside, sender.join().expect("batch sender"))
    });
    let mut batches = batches?;
    batches.sort_unstable();
    server.stop()?;
    for (name, report) in [("alone", &alone), ("beside batches", &beside)] {
        if report.statuses.get(&200) != Some(&requests) {
            bail!(
                "{name}: {requests} Stripe events sent, answers {}",
                report.status_summary()
            );
        }
    }
    Ok(Measured {
        alone,
        beside,
        batches,
    })
}

/// Batch bodies of `elements` new events each, one after the other on one connection per
/// body, until `done`: each body's time, from the connect to the end of its answer.
fn send_batches(
    addr: SocketAddr,
    elements: usize,
    done: &AtomicBool,
) -> anyhow::Result<Vec<Duration>> {
    let mut times = Vec::new();
    let mut next_id = 1;
    while !done.load(Ordering::Relaxed) {
        let body = hubspot_batch(next_id, elements);
        next_id += elements;
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(BATCH_SECRET.as_bytes())?;
        mac.update(&body);
        let signature = hex::encode(mac.finalize().into_bytes());
        let mut request = format!(
            "POST /webhooks/hubspot HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             X-Signature: {signature}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(&body);
        let began = Instant::now();
        let mut s = TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(120)))?;
        s.write_all(&request)?;
        let mut answer = Vec::new();
        s.read_to_end(&mut answer)?;
        times.push(began.elapsed());
        if !answer.starts_with(b"HTTP/1.1 200") {
            bail!(
                "a batch body answered {}",
                String::from_utf8_lossy(&answer[..answer.len().min(200)])
            );
        }
    }
    Ok(times)
}

/// A HubSpot-shaped array of `n` contact events, ids from `first` (about 170 bytes each).
fn hubspot_batch(first: usize, n: usize) -> Vec<u8> {
    let events: Vec<String> = (first..first + n)
        .map(|i| {
            format!(
                r#"{{"eventId":{i},"subscriptionId":12,"portalId":62515,"appId":1160452,"occurredAt":1700000000000,"subscriptionType":"contact.propertyChange","attemptNumber":0,"objectId":{i},"propertyName":"email","propertyValue":"u{i}@example.com","changeSource":"CRM"}}"#
            )
        })
        .collect();
    format!("[{}]", events.join(",")).into_bytes()
}
