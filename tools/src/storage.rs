//! `hookledger-bench storage`: bytes on disk per event, for the `hookledger` binary given (run
//! it once with this build's and once with another's for a before/after from one machine).
//!
//! N signed Stripe events of 3.4–5.2 KB (the fixtures of `tests/fixtures/stripe/events`, each
//! with fresh random ids and times, as real events of one account differ), sent to a fresh
//! database with and without `[forward]` to a local app that answers 200 at once. With
//! forwarding it waits until every outbox row is delivered. The first [`WARM`] events go
//! first and, when the binary trains payload dictionaries, the run waits for the source's
//! before the rest (as a server that has run a while has one): all N events count in the
//! result, those compressed without the dictionary included.
//!
//! Then the server is stopped and the size is read: on SQLite the database file and its
//! write-ahead log after a `wal_checkpoint(TRUNCATE)` (so the log is empty and everything is
//! in the file); on PostgreSQL the total size (heap, TOAST, indexes) of the tables in the
//! database's `public` schema, after a `CHECKPOINT`. Delivered outbox rows are still there
//! (retention deletes them after a week): they count.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hookledger::Secret;

use crate::bench::{Server, SECRET};
use crate::lanes::Target;
use crate::loadgen::{self, Request};

/// The events sent before the run waits for a dictionary: the server trains one on a
/// source's first 1,000 stored payloads.
const WARM: usize = 1000;

/// The Stripe fixtures of 3 KB and more, as templates.
const TEMPLATES: &[&str] = &[
    include_str!("../../tests/fixtures/stripe/events/charge.refunded.json"),
    include_str!("../../tests/fixtures/stripe/events/checkout.session.completed.json"),
    include_str!("../../tests/fixtures/stripe/events/customer.subscription.created.json"),
    include_str!("../../tests/fixtures/stripe/events/customer.subscription.deleted.json"),
    include_str!("../../tests/fixtures/stripe/events/customer.subscription.updated.json"),
    include_str!("../../tests/fixtures/stripe/events/invoice.paid.json"),
    include_str!("../../tests/fixtures/stripe/events/invoice.payment_failed.json"),
    include_str!("../../tests/fixtures/stripe/events/invoice.payment_succeeded.json"),
];

/// Settings of one `storage` run.
#[derive(Debug, Clone)]
pub struct StorageConfig {
    pub dir: PathBuf,
    pub exe: PathBuf,
    pub events: usize,
    /// Also on PostgreSQL: a URL of a database where CREATE DATABASE may run.
    pub postgres: Option<String>,
}

/// One measurement's result.
struct Measured {
    bytes: u64,
    body_bytes: u64,
    events: usize,
}

pub fn run(config: &StorageConfig) -> anyhow::Result<()> {
    std::fs::create_dir_all(&config.dir)?;
    std::env::set_var("HOOKLEDGER_BENCH_STRIPE", SECRET);
    println!(
        "hookledger-bench storage: {} events, binary {}",
        config.events,
        config.exe.display()
    );
    println!("| store | forwarding | bytes on disk | per event | body per event |");
    println!("| --- | --- | ---: | ---: | ---: |");
    let mut stores = vec![None];
    if let Some(url) = &config.postgres {
        stores.push(Some(url.as_str()));
    }
    for store in stores {
        for forward in [false, true] {
            let m = measure(config, store, forward)?;
            println!(
                "| {} | {} | {} | {:.0} B | {:.0} B |",
                if store.is_some() {
                    "postgres"
                } else {
                    "sqlite"
                },
                if forward { "on" } else { "off" },
                m.bytes,
                m.bytes as f64 / m.events as f64,
                m.body_bytes as f64 / m.events as f64,
            );
        }
    }
    Ok(())
}

fn measure(
    config: &StorageConfig,
    postgres: Option<&str>,
    forward: bool,
) -> anyhow::Result<Measured> {
    let name = format!(
        "storage-{}-{}",
        if postgres.is_some() { "pg" } else { "sqlite" },
        if forward { "forward" } else { "plain" }
    );
    let dir = config.dir.join(&name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let target_listener = TcpListener::bind("127.0.0.1:0")?;
    let target = Target::start(target_listener, Duration::ZERO);
    let toml = dir.join("hookledger.toml");
    let mut text = "[[source]]\nname = \"stripe\"\nscheme = \"stripe\"\n\
                    secrets = [\"env:HOOKLEDGER_BENCH_STRIPE\"]\n"
        .to_string();
    if forward {
        text.push_str(&format!(
            "\n[forward]\nurl = \"{}\"\nsecret = \"{}\"\n",
            target.url(),
            crate::lanes::DELIVERY_SECRET
        ));
    }
    std::fs::write(&toml, text)?;
    let db = match postgres {
        Some(admin_url) => {
            let db_name = name.replace('-', "_");
            let mut admin = postgres::Client::connect(admin_url, postgres::NoTls)
                .context("connecting to --postgres")?;
            admin.batch_execute(&format!("DROP DATABASE IF EXISTS {db_name} WITH (FORCE)"))?;
            admin.batch_execute(&format!("CREATE DATABASE {db_name}"))?;
            Db::Postgres(crate::bench::with_database(admin_url, &db_name))
        }
        None => Db::Sqlite(dir.join("ledger.db")),
    };
    let mut server = Server::start_on(
        &config.exe,
        &db.arg(),
        &dir.join("server.log"),
        &["--config", toml.to_str().context("path")?],
    )?;
    let host = server.addr.to_string();
    let requests = requests(config.events, &host);
    let body_bytes: u64 = requests.iter().map(|(_, body)| *body as u64).sum();
    let requests: Vec<Request> = requests.into_iter().map(|(r, _)| r).collect();
    let warm = WARM.min(requests.len());
    let first = loadgen::run(server.addr, &requests[..warm], 16);
    if db.trains_dictionaries()? {
        let started = Instant::now();
        while !db.has_dictionary()? {
            if started.elapsed() > Duration::from_secs(60) {
                bail!("no payload dictionary within 60 s (see {})", dir.display());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let rest = loadgen::run(server.addr, &requests[warm..], 16);
    let processed = first.processed + rest.processed;
    if processed != requests.len() {
        bail!(
            "{processed} of {} events processed ({}; {})",
            requests.len(),
            first.status_summary(),
            rest.status_summary()
        );
    }
    if forward {
        let started = Instant::now();
        while target.count() < requests.len() || db.undelivered()? > 0 {
            if started.elapsed() > Duration::from_secs(600) {
                bail!("the outbox did not drain within 10 minutes");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    server.stop()?;
    Ok(Measured {
        bytes: db.size()?,
        body_bytes,
        events: requests.len(),
    })
}

/// The measured database.
enum Db {
    Sqlite(PathBuf),
    Postgres(String),
}

impl Db {
    fn arg(&self) -> std::ffi::OsString {
        match self {
            Db::Sqlite(path) => path.clone().into_os_string(),
            Db::Postgres(url) => url.into(),
        }
    }

    fn count(&self, sql: &str) -> anyhow::Result<i64> {
        Ok(match self {
            Db::Sqlite(path) => {
                let conn = rusqlite::Connection::open_with_flags(
                    path,
                    rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
                )?;
                conn.busy_timeout(Duration::from_secs(5))?;
                conn.query_row(sql, [], |r| r.get(0))?
            }
            Db::Postgres(url) => {
                let mut client = postgres::Client::connect(url, postgres::NoTls)?;
                client.query_one(sql, &[])?.get(0)
            }
        })
    }

    /// Whether the binary's schema has payload dictionaries.
    fn trains_dictionaries(&self) -> anyhow::Result<bool> {
        let sql = match self {
            Db::Sqlite(_) => {
                "SELECT count(*) FROM sqlite_master WHERE name = 'hookledger_payload_dicts'"
            }
            Db::Postgres(_) => {
                "SELECT count(*) FROM pg_tables WHERE tablename = 'hookledger_payload_dicts'"
            }
        };
        Ok(self.count(sql)? > 0)
    }

    fn has_dictionary(&self) -> anyhow::Result<bool> {
        Ok(self.count("SELECT count(*) FROM hookledger_payload_dicts")? > 0)
    }

    fn undelivered(&self) -> anyhow::Result<i64> {
        self.count("SELECT count(*) FROM outbox WHERE status <> 'done'")
    }

    /// Bytes on disk (see the module doc).
    fn size(&self) -> anyhow::Result<u64> {
        match self {
            Db::Sqlite(path) => {
                let conn = rusqlite::Connection::open(path)?;
                conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
                drop(conn);
                Ok(file_size(path)? + file_size(&wal_of(path))?)
            }
            Db::Postgres(url) => {
                let mut client = postgres::Client::connect(url, postgres::NoTls)?;
                client.batch_execute("CHECKPOINT")?;
                let size: i64 = client
                    .query_one(
                        "SELECT CAST(coalesce(sum(pg_total_relation_size(c.oid)), 0) AS BIGINT)
                         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                         WHERE n.nspname = 'public' AND c.relkind = 'r'",
                        &[],
                    )?
                    .get(0);
                Ok(size as u64)
            }
        }
    }
}

fn wal_of(path: &Path) -> PathBuf {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    PathBuf::from(wal)
}

fn file_size(path: &Path) -> anyhow::Result<u64> {
    match std::fs::metadata(path) {
        Ok(m) => Ok(m.len()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e.into()),
    }
}

/// `n` signed requests to `host`, each with its body's length.
fn requests(n: usize, host: &str) -> Vec<(Request, usize)> {
    let secret = Secret::new(SECRET);
    let now = hookledger::internals::unix_now();
    let mut rng = fastrand::Rng::with_seed(25);
    (0..n)
        .map(|i| {
            let template = TEMPLATES[rng.usize(..TEMPLATES.len())];
            let (event_id, body) = varied(template, &mut rng, i);
            let len = body.len();
            let bytes = loadgen::http_request(host, &secret, now, body.as_bytes());
            (Request { event_id, bytes }, len)
        })
        .collect()
}

/// `template` with every Stripe id (`prefix_` and 14 or more letters and digits) replaced by
/// a random one of the same length (the same id by the same one throughout the event), and
/// every Unix time of 2024 moved by up to a year; the event id made unique by `i`.
fn varied(template: &str, rng: &mut fastrand::Rng, i: usize) -> (String, String) {
    const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let shift = rng.i64(0..31_536_000);
    let mut ids: std::collections::HashMap<String, String> = Default::default();
    let bytes = template.as_bytes();
    let mut out = String::with_capacity(template.len());
    let mut at = 0;
    while at < bytes.len() {
        let start = at;
        let word_end = |mut j: usize, ok: fn(u8) -> bool| {
            while j < bytes.len() && ok(bytes[j]) {
                j += 1;
            }
            j
        };
        let boundary = start == 0 || !bytes[start - 1].is_ascii_alphanumeric();
        let prefix_end = word_end(start, |b| b.is_ascii_lowercase());
        if boundary && prefix_end > start && bytes.get(prefix_end) == Some(&b'_') {
            let tail_end = word_end(prefix_end + 1, |b| b.is_ascii_alphanumeric());
            // The part after `_` is 14 or more long.
            if tail_end - (prefix_end + 1) >= 14 {
                let word = &template[start..tail_end];
                let fresh = ids.entry(word.to_string()).or_insert_with(|| {
                    let tail: String = (prefix_end + 1..tail_end)
                        .map(|_| ALNUM[rng.usize(..ALNUM.len())] as char)
                        .collect();
                    format!("{}_{tail}", &template[start..prefix_end])
                });
                out.push_str(fresh);
                at = tail_end;
                continue;
            }
        }
        if boundary && bytes[start].is_ascii_digit() {
            let end = word_end(start, |b| b.is_ascii_digit());
            let number = &template[start..end];
            match number.parse::<i64>() {
                Ok(t) if end - start == 10 && (1_700_000_000..1_800_000_000).contains(&t) => {
                    out.push_str(&(t + shift).to_string())
                }
                _ => out.push_str(number),
            }
            at = end;
            continue;
        }
        let next = template[start..]
            .char_indices()
            .nth(1)
            .map_or(bytes.len(), |(n, _)| start + n);
        out.push_str(&template[start..next]);
        at = next;
    }
    // The event id: `evt_` and 24 characters, unique per event.
    let event_id = format!("evt_bench{i:015}");
    let body = match out.find("\"id\": \"evt_") {
        Some(p) => {
            let from = p + "\"id\": \"".len();
            let to = from + out[from..].find('"').unwrap_or(0);
            format!("{}{event_id}{}", &out[..from], &out[to..])
        }
        None => out,
    };
    (event_id, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_varied_event_keeps_its_shape_with_new_ids_and_times() {
        let mut rng = fastrand::Rng::with_seed(1);
        let template = TEMPLATES[5];
        let (id, body) = varied(template, &mut rng, 7);
        assert_eq!(id, "evt_bench000000000000007");
        let event: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(event["id"], id.as_str());
        assert_eq!(event["type"], "invoice.paid");
        let object = &event["data"]["object"];
        assert_ne!(object["id"], "in_1Pgc6tB7WZ01zgkWu9fdqL6I");
        assert_eq!(object["id"].as_str().unwrap().len(), 27);
        assert!(object["id"].as_str().unwrap().starts_with("in_"));
        assert!(!body.contains("cus_QXg1o8vcGmoR32"), "a new customer id");
        // Ids keep their lengths; the event id is 4 characters shorter.
        assert_eq!(body.len(), template.len() - 4);
    }
}
