//! `hookledger-bench brokers`: the publish rate into each message broker beside the HTTP
//! lane's, in one run against the real `hookledger` binary.
//!
//! - The targets: `http` (the local app of `lanes`, answering at once), `nats` (a JetStream
//!   stream the delivery creates, on a `nats-server` started here), `amqp` (an exchange and a
//!   durable queue bound to it, made here on the RabbitMQ at `HOOKLEDGER_TEST_AMQP`) and `redis`
//!   (a stream the delivery creates, on a `redis-server` started here). A broker that cannot
//!   be had is left out of the table, with a message.
//! - Each run: a copy of one backlog of `--rows` outbox rows of one kind (written into the
//!   database before the server starts, as `lanes drain` does), a config with one
//!   `[[delivery]]` of that kind into the target at `--concurrency`; the time from the
//!   server's spawn until every row is `done`, read in the database every 50 ms (`done_at` is
//!   in whole seconds), so it counts the server's start-up and its connection to the broker.
//!   rows/s is the rows over that time; `first row` is when a row was first seen done.
//! - After each run the target must hold exactly the rows: the ids the app received, the
//!   stream's message count (NATS), the queue's (RabbitMQ, from a passive declare; then the
//!   queue and the exchange are deleted) or the stream's length (Redis; then its keys are
//!   flushed, the guards too, so the next round's rows are new to it). A difference is an
//!   error, after the table.
//! - `--rounds` alternates the four that many times; the table has each target's median time,
//!   and with more than one round the range of its rates.

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::bench::SECRET;
use crate::lanes::{self, wait_until, LanesConfig, Target, DELIVERY_SECRET};

/// The kind of the backlog's rows.
const KIND: &str = "bench";
/// How often the outbox is read while the backlog drains.
const POLL: Duration = Duration::from_millis(50);
/// The routing key the RabbitMQ queue is bound with.
const ROUTING_KEY: &str = "events";

/// Settings of one `brokers` run.
#[derive(Debug, Clone)]
pub struct BrokersConfig {
    pub lanes: LanesConfig,
    pub rows: usize,
    pub concurrency: usize,
    pub rounds: usize,
    /// At most this long per run.
    pub window: Duration,
    pub amqp_url: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Http,
    Nats,
    Amqp,
    Redis,
}

const WAYS: [Way; 4] = [Way::Http, Way::Nats, Way::Amqp, Way::Redis];

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::Http => "http",
            Way::Nats => "nats",
            Way::Amqp => "amqp",
            Way::Redis => "redis",
        }
    }
}

/// A broker process of the bench's own, on a free port with its files in a temp dir; killed
/// when dropped.
struct Process {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Process {
    /// `nats-server` with JetStream.
    fn nats(within: &Path) -> anyhow::Result<Process> {
        Process::spawn("nats-server", within, |port, dir| {
            ["-js", "-a", "127.0.0.1", "-p", port, "-sd", dir].map(String::from)
        })
    }

    /// `redis-server` keeping nothing on disk.
    fn redis(within: &Path) -> anyhow::Result<Process> {
        Process::spawn("redis-server", within, |port, dir| {
            let args = ["--port", port, "--bind", "127.0.0.1", "--save", ""];
            let args = args.into_iter().chain(["--appendonly", "no", "--dir", dir]);
            args.map(String::from).collect::<Vec<_>>()
        })
    }

    /// `program` with the `args` for a port and a dir; returns once the port takes connections
    /// (at most 10 s).
    fn spawn<A: IntoIterator<Item = String>>(
        program: &str,
        within: &Path,
        args: impl FnOnce(&str, &str) -> A,
    ) -> anyhow::Result<Process> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let dir = tempfile::tempdir_in(within)?;
        let store = dir.path().to_str().context("path")?;
        let child = Command::new(program)
            .args(args(&port.to_string(), store))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {program}"))?;
        let mut process = Process {
            child,
            port,
            _dir: dir,
        };
        let listening = wait_until(Duration::from_secs(10), || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        if let Some(status) = process.child.try_wait()? {
            bail!("{program} exited ({status})");
        }
        anyhow::ensure!(listening, "{program} did not listen on {port} within 10 s");
        Ok(process)
    }

    fn url(&self, scheme: &str) -> String {
        format!("{scheme}://127.0.0.1:{}", self.port)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a broker client's future.
fn block_on<F: std::future::Future>(future: F) -> anyhow::Result<F::Output> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    Ok(runtime.block_on(future))
}

async fn amqp_channel(url: &str) -> anyhow::Result<(lapin::Connection, lapin::Channel)> {
    let connection = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
        .await
        .context("connecting to RabbitMQ")?;
    let channel = connection.create_channel().await?;
    Ok((connection, channel))
}

/// Where one run publishes, and how to count what it holds.
enum Sink {
    Http(Target),
    Nats {
        url: String,
        stream: String,
        subject: String,
    },
    Amqp {
        url: String,
        exchange: String,
        queue: String,
    },
    Redis {
        url: String,
        stream: String,
    },
}

impl Sink {
    /// The RabbitMQ exchange and a durable queue bound to it with [`ROUTING_KEY`], named after
    /// `round`.
    fn amqp(url: &str, round: usize) -> anyhow::Result<Sink> {
        use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
        let exchange = format!("hl-bench-{}-r{round}", std::process::id());
        let queue = format!("{exchange}-q");
        block_on(async {
            let (connection, channel) = amqp_channel(url).await?;
            let exchange_options = ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            };
            let kind = lapin::ExchangeKind::Direct;
            let name = exchange.as_str().into();
            channel
                .exchange_declare(name, kind, exchange_options, Default::default())
                .await?;
            let queue_options = QueueDeclareOptions {
                durable: true,
                ..Default::default()
            };
            let name = queue.as_str().into();
            channel
                .queue_declare(name, queue_options, Default::default())
                .await?;
            let bind = QueueBindOptions::default();
            let (q, x) = (queue.as_str().into(), exchange.as_str().into());
            channel
                .queue_bind(q, x, ROUTING_KEY.into(), bind, Default::default())
                .await?;
            let _ = connection.close(200, "done".into()).await;
            anyhow::Ok(())
        })??;
        Ok(Sink::Amqp {
            url: url.to_string(),
            exchange,
            queue,
        })
    }

    /// The delivery's target, as TOML lines.
    fn toml(&self) -> String {
        match self {
            Sink::Http(target) => {
                format!("url = \"{}\"\nsecret = \"{DELIVERY_SECRET}\"", target.url())
            }
            Sink::Nats {
                url,
                stream,
                subject,
            } => format!(
                "nats = {{ url = \"{url}\", subject = \"{subject}\", stream = \"{stream}\", \
                 create = true }}"
            ),
            Sink::Amqp { url, exchange, .. } => format!(
                "amqp = {{ url = \"{url}\", exchange = \"{exchange}\", \
                 routing_key = \"{ROUTING_KEY}\" }}"
            ),
            Sink::Redis { url, stream } => {
                format!("redis = {{ url = \"{url}\", stream = \"{stream}\", create = true }}")
            }
        }
    }

    /// How many messages the target holds; then what was made for the run is removed.
    fn count_and_remove(&self) -> anyhow::Result<u64> {
        match self {
            Sink::Http(target) => Ok(target.count() as u64),
            Sink::Nats { url, stream, .. } => block_on(async {
                let client = async_nats::connect(url.as_str()).await?;
                let jetstream = async_nats::jetstream::new(client);
                let mut held = jetstream
                    .get_stream(stream.as_str())
                    .await
                    .with_context(|| format!("the stream {stream}"))?;
                let messages = held.info().await?.state.messages;
                jetstream.delete_stream(stream.as_str()).await?;
                anyhow::Ok(messages)
            })?,
            Sink::Amqp {
                url,
                exchange,
                queue,
            } => block_on(async {
                use lapin::options::{ExchangeDeleteOptions, QueueDeclareOptions};
                let (connection, channel) = amqp_channel(url).await?;
                let passive = QueueDeclareOptions {
                    passive: true,
                    durable: true,
                    ..Default::default()
                };
                let name = queue.as_str().into();
                let declared = channel
                    .queue_declare(name, passive, Default::default())
                    .await?;
                let name = queue.as_str().into();
                channel.queue_delete(name, Default::default()).await?;
                let name = exchange.as_str().into();
                let options = ExchangeDeleteOptions::default();
                channel.exchange_delete(name, options).await?;
                let _ = connection.close(200, "done".into()).await;
                anyhow::Ok(u64::from(declared.message_count()))
            })?,
            Sink::Redis { url, stream } => {
                let mut connection = redis::Client::open(url.as_str())?.get_connection()?;
                let length: u64 = redis::cmd("XLEN").arg(stream).query(&mut connection)?;
                redis::cmd("FLUSHALL").query::<()>(&mut connection)?;
                Ok(length)
            }
        }
    }
}

/// One run's times from the server's spawn, in s.
#[derive(Debug, Clone, Copy)]
struct Measured {
    all_done: f64,
    first_done: f64,
}

/// The brokers this run has, each with why not when it has not.
struct Brokers {
    nats: Result<Process, String>,
    redis: Result<Process, String>,
    amqp: Result<String, String>,
}

impl Brokers {
    fn start(within: &Path, amqp_url: &str) -> Brokers {
        let why = |e: anyhow::Error| format!("{e:#}");
        let amqp = block_on(async {
            let (connection, _) = amqp_channel(amqp_url).await?;
            let _ = connection.close(200, "done".into()).await;
            anyhow::Ok(amqp_url.to_string())
        });
        Brokers {
            nats: Process::nats(within).map_err(why),
            redis: Process::redis(within).map_err(why),
            amqp: amqp
                .and_then(|r| r)
                .map_err(|e| format!("{}: {e:#}", shown_url(amqp_url))),
        }
    }

    /// Why `way` cannot run here, if it cannot.
    fn missing(&self, way: Way) -> Option<&str> {
        match way {
            Way::Http => None,
            Way::Nats => self.nats.as_ref().err(),
            Way::Amqp => self.amqp.as_ref().err(),
            Way::Redis => self.redis.as_ref().err(),
        }
        .map(String::as_str)
    }

    fn sink(&self, way: Way, round: usize) -> anyhow::Result<Sink> {
        Ok(match way {
            Way::Http => Sink::Http(Target::start(
                TcpListener::bind("127.0.0.1:0")?,
                Duration::ZERO,
            )),
            Way::Nats => Sink::Nats {
                url: have(&self.nats)?.url("nats"),
                stream: format!("BENCH_R{round}"),
                subject: format!("bench.r{round}"),
            },
            Way::Amqp => Sink::amqp(have(&self.amqp)?, round)?,
            Way::Redis => Sink::Redis {
                url: have(&self.redis)?.url("redis"),
                stream: format!("bench:r{round}"),
            },
        })
    }
}

/// What a broker of [`Brokers`] is, or why it is not there, as an error.
fn have<T>(broker: &Result<T, String>) -> anyhow::Result<&T> {
    broker.as_ref().map_err(|why| anyhow::anyhow!("{why}"))
}

/// `url` without its password, for a message.
fn shown_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}

/// The publish rate of a backlog into each broker and over HTTP, side by side.
pub fn run(config: &BrokersConfig) -> anyhow::Result<()> {
    anyhow::ensure!(config.rows > 0, "--rows must be more than 0");
    anyhow::ensure!(config.rounds > 0, "--rounds must be more than 0");
    std::env::set_var("HOOKLEDGER_BENCH_STRIPE", SECRET);
    let dir = tempfile::tempdir_in(&config.lanes.dir)?;
    let backlog = lanes::write_backlog(&config.lanes, dir.path(), KIND, config.rows)?;
    let brokers = Brokers::start(dir.path(), &config.amqp_url);
    println!(
        "brokers: {} queued rows of one kind, one lane at concurrency {}, into each target; \
         the time from the server's spawn until every row is done; {} round(s)",
        config.rows, config.concurrency, config.rounds
    );
    for way in WAYS {
        if let Some(why) = brokers.missing(way) {
            println!("  {}: skipped: {why}", way.name());
        }
    }
    let mut measured: Vec<(Way, Vec<Measured>)> = WAYS.iter().map(|&w| (w, vec![])).collect();
    let mut errors = Vec::new();
    for round in 0..config.rounds {
        for (way, runs) in &mut measured {
            if brokers.missing(*way).is_some() {
                continue;
            }
            match one(config, dir.path(), &backlog, &brokers, *way, round) {
                Ok(m) => {
                    println!(
                        "  round {} {:<5} all done in {:6.2} s (first row {:5.2} s)",
                        round + 1,
                        way.name(),
                        m.all_done,
                        m.first_done
                    );
                    runs.push(m);
                }
                Err(e) => {
                    println!("  round {} {:<5} failed: {e:#}", round + 1, way.name());
                    errors.push(format!("{} (round {}): {e:#}", way.name(), round + 1));
                }
            }
        }
    }
    print_table(config, &measured);
    if !errors.is_empty() {
        bail!("{}", errors.join("; "));
    }
    Ok(())
}

/// One run of `way`: its times, once its target holds exactly the rows.
fn one(
    config: &BrokersConfig,
    dir: &Path,
    backlog: &Path,
    brokers: &Brokers,
    way: Way,
    round: usize,
) -> anyhow::Result<Measured> {
    let sink = brokers.sink(way, round)?;
    let timed = drain(
        config,
        dir,
        backlog,
        &sink,
        &format!("{}-r{round}", way.name()),
    );
    let held = sink.count_and_remove();
    let (timed, held) = (timed?, held.context("counting what the target holds")?);
    let rows = config.rows as u64;
    anyhow::ensure!(
        held == rows,
        "the target holds {held} messages, not the {rows} rows delivered"
    );
    Ok(timed)
}

/// Serves a copy of the backlog, named `name`, delivering into `sink` until every row is done.
fn drain(
    config: &BrokersConfig,
    dir: &Path,
    backlog: &Path,
    sink: &Sink,
    name: &str,
) -> anyhow::Result<Measured> {
    let db = dir.join(format!("{name}.db"));
    std::fs::copy(backlog, &db)?;
    let toml = lanes::write_config(
        dir,
        &format!(
            "[[delivery]]\nkind = \"{KIND}\"\n{}\nconcurrency = {}\n",
            sink.toml(),
            config.concurrency
        ),
    )?;
    let spawned = Instant::now();
    let mut server = lanes::start(&config.lanes, &db, &toml)?;
    let outbox = rusqlite::Connection::open_with_flags(
        &db,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    outbox.busy_timeout(Duration::from_secs(1))?;
    let mut first_done = None;
    let rows = config.rows as i64;
    loop {
        let (done, dead): (i64, i64) = outbox.query_row(
            "SELECT count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status = \
             'dead') FROM outbox WHERE kind = ?1",
            [KIND],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let at = spawned.elapsed();
        if done > 0 && first_done.is_none() {
            first_done = Some(at);
        }
        if done >= rows {
            server.stop()?;
            return Ok(Measured {
                all_done: at.as_secs_f64(),
                first_done: first_done.unwrap_or(at).as_secs_f64(),
            });
        }
        anyhow::ensure!(
            dead == 0,
            "{dead} rows dead (see {})",
            db.with_extension("log").display()
        );
        if at > config.window {
            bail!(
                "{done} of {rows} rows done after {} s (see {})",
                config.window.as_secs(),
                db.with_extension("log").display()
            );
        }
        std::thread::sleep(POLL);
    }
}

/// The median of `values` (not empty).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n % 2 {
        1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

fn print_table(config: &BrokersConfig, measured: &[(Way, Vec<Measured>)]) {
    let rows = config.rows as f64;
    let ranged = config.rounds > 1;
    println!(
        "\n  {:<6} {:>7} {:>9} {:>10} {:>8} {:>10}{}",
        "target",
        "rows",
        "seconds",
        "rows/s",
        "vs http",
        "first row",
        if ranged { "  rows/s range" } else { "" }
    );
    let rate_of = |runs: &[Measured]| {
        let mut all: Vec<f64> = runs.iter().map(|m| m.all_done).collect();
        rows / median(&mut all)
    };
    let http = measured
        .iter()
        .find(|(w, runs)| *w == Way::Http && !runs.is_empty())
        .map(|(_, runs)| rate_of(runs));
    for (way, runs) in measured {
        if runs.is_empty() {
            continue;
        }
        let mut all: Vec<f64> = runs.iter().map(|m| m.all_done).collect();
        let mut first: Vec<f64> = runs.iter().map(|m| m.first_done).collect();
        let seconds = median(&mut all);
        let rate = rows / seconds;
        let ratio = http.map_or("-".to_string(), |h| format!("{:.2}x", rate / h));
        let range = match ranged {
            true => format!("  {:.0}–{:.0}", rows / all[all.len() - 1], rows / all[0]),
            false => String::new(),
        };
        println!(
            "  {:<6} {:>7} {seconds:>9.2} {rate:>10.0} {ratio:>8} {:>9.2}s{range}",
            way.name(),
            config.rows,
            median(&mut first),
        );
    }
}
