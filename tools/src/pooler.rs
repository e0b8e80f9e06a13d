//! `hookledger-bench pooler`: two `hookledger serve` instances sharing one PostgreSQL database,
//! reached directly and through PgBouncer in transaction pooling mode (`pooler=transaction` on
//! the URL), in one run against the real `hookledger` binary.
//!
//! - PgBouncer: Debian's `pgbouncer` (from `PATH`, else `/usr/sbin`), started here on a free
//!   port with its files in a temp dir: `pool_mode = transaction`, `default_pool_size = 20`,
//!   `min_pool_size = 4` and `server_round_robin = 1` (so consecutive transactions land on
//!   different server connections), `max_client_conn = 1000`, its clients trusted, and itself
//!   logging in to the server of `--postgres` as that URL's role with its password (from its
//!   `auth_file`). As root it runs as the `postgres` user. It is killed at the end (its pidfile).
//! - Each run, of one mode: a fresh database of its own name (mode and round: no PgBouncer
//!   pool outlives its database), two instances started on it one after the other (the first
//!   migrates), each with `--admin-listen off`; then two loads at once, one per instance, each
//!   `--requests` pre-signed Stripe events with 20 % resends (as `loadgen`'s default; seeds
//!   11 and 12, so the loads' events differ) over `-c` keep-alive connections, each connection
//!   sending its next request when it has its answer; then both servers stopped, and the
//!   ledger read directly from the server: its row count must equal the `processed` answers of
//!   both loads, and its event ids the ids that got a 200.
//! - A run's events/s is the sum of the two loads' (each its requests over its own time, from
//!   the first request sent to the last answer; the servers' start is not in it).
//! - `--rounds` rounds each run both modes, direct first in odd rounds and pooled first in even
//!   ones. Printed: every run, then per mode the median of the summed events/s with its range,
//!   the median over the rounds of each instance's p99, the answers that were not 200 (and
//!   failed connections) and the ledger checks; and pooled/direct.
//! - An answer that is not 200 or a ledger that does not match is an error, after the table.
//!   The databases are dropped at the end, after PgBouncer is stopped.

use std::collections::HashSet;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use clap::Args;
use hookledger::internals::table;
use hookledger::Secret;

use crate::bench::{self, Server, SECRET};
use crate::compare::Spread;
use crate::lanes::wait_until;
use crate::loadgen::{self, LedgerCheck, Report, Workload};

#[derive(Debug, Args)]
pub struct PoolerArgs {
    /// A URL of a role that may CREATE DATABASE on the server (each run gets a fresh database
    /// beside its database; PgBouncer logs in to the server with its role and password).
    #[arg(
        long,
        default_value = "postgres://hookledger:hookledger@127.0.0.1:5432/postgres"
    )]
    pub postgres: String,
    /// The `hookledger` binary [default: `hookledger` next to this binary].
    #[arg(long)]
    pub exe: Option<PathBuf>,
    /// Rounds; each runs both modes once.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    pub rounds: u64,
    /// Requests per instance and run (new events plus resends).
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub requests: u64,
    /// Keep-alive connections of each of the two loads.
    #[arg(long, short = 'c', default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..))]
    pub connections: u64,
}

/// The load generator's seeds, one per instance.
const SEEDS: [u64; 2] = [11, 12];
/// Share of each load's requests that resend an earlier event (`loadgen`'s default).
const RESEND: f64 = 0.2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Direct,
    Pooled,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Direct => "direct",
            Mode::Pooled => "pooled",
        }
    }
}

/// What one run of one mode measured.
#[derive(Debug)]
struct Run {
    /// Both loads' events/s, added.
    per_second: f64,
    /// Each load's own events/s and p99 (ms), in the order of [`SEEDS`].
    each_per_second: [f64; 2],
    p99_ms: [f64; 2],
    statuses: [String; 2],
    /// Answers other than 200, and requests that got no answer.
    not_200: usize,
    processed: usize,
    /// The ledger's rows.
    rows: i64,
    ledger: LedgerCheck,
}

impl Run {
    fn ledger_matches(&self) -> bool {
        self.rows == self.processed as i64 && self.ledger.exact()
    }
}

/// The server of `--postgres`, as PgBouncer is to reach it.
#[derive(Debug, PartialEq)]
struct Upstream {
    host: String,
    port: u16,
    user: String,
    password: String,
}

impl Upstream {
    fn of(url: &str) -> anyhow::Result<Upstream> {
        let config: postgres::Config = url.parse().context("--postgres is not a PostgreSQL URL")?;
        let host = match config.get_hosts() {
            [postgres::config::Host::Tcp(host)] => host.clone(),
            _ => bail!("--postgres must name one server by a TCP host"),
        };
        let port = match config.get_ports() {
            [] => 5432,
            [port] => *port,
            _ => bail!("--postgres must name one port"),
        };
        let user = config.get_user().context("--postgres names no role")?;
        let password = config.get_password().unwrap_or_default();
        Ok(Upstream {
            host,
            port,
            user: user.to_string(),
            password: String::from_utf8(password.to_vec()).context("the password is not UTF-8")?,
        })
    }
}

/// `url` (a PostgreSQL URL) going to PgBouncer on `127.0.0.1:port` instead of its server, with
/// hookledger's `pooler=transaction`.
fn through_pooler(url: &str, port: u16) -> anyhow::Result<String> {
    let (scheme, rest) = url.split_once("://").context("not a URL")?;
    let (authority, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let user = authority
        .rsplit_once('@')
        .map_or(String::new(), |(user, _)| format!("{user}@"));
    let separator = if tail.contains('?') { '&' } else { '?' };
    Ok(format!(
        "{scheme}://{user}127.0.0.1:{port}{tail}{separator}pooler=transaction"
    ))
}

/// PgBouncer's settings, its files in `dir`.
fn pgbouncer_ini(upstream: &Upstream, port: u16, dir: &Path) -> String {
    let dir = dir.display();
    format!(
        "[databases]\n\
         * = host={} port={}\n\
         \n\
         [pgbouncer]\n\
         listen_addr = 127.0.0.1\n\
         listen_port = {port}\n\
         unix_socket_dir =\n\
         auth_type = trust\n\
         auth_file = {dir}/users.txt\n\
         pool_mode = transaction\n\
         max_client_conn = 1000\n\
         default_pool_size = 20\n\
         min_pool_size = 4\n\
         server_round_robin = 1\n\
         ignore_startup_parameters = extra_float_digits\n\
         logfile = {dir}/pgbouncer.log\n\
         pidfile = {dir}/pgbouncer.pid\n",
        upstream.host, upstream.port
    )
}

/// PgBouncer's `auth_file`: the role and the password it logs in to the server with.
fn auth_file(upstream: &Upstream) -> String {
    let quoted = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
    format!(
        "{} {}\n",
        quoted(&upstream.user),
        quoted(&upstream.password)
    )
}

/// A PgBouncer of the bench's own, daemonized; killed (by its pidfile) when dropped.
struct PgBouncer {
    port: u16,
    dir: tempfile::TempDir,
}

impl PgBouncer {
    fn start(upstream: &Upstream) -> anyhow::Result<PgBouncer> {
        let program = find_pgbouncer()?;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let dir = tempfile::tempdir()?;
        let ini = dir.path().join("pgbouncer.ini");
        std::fs::write(&ini, pgbouncer_ini(upstream, port, dir.path()))?;
        std::fs::write(dir.path().join("users.txt"), auth_file(upstream))?;
        let bouncer = PgBouncer { port, dir };
        // PgBouncer will not run as root.
        let mut command = if is_root()? {
            let owned = Command::new("chown")
                .arg("-R")
                .arg("postgres:")
                .arg(bouncer.dir.path())
                .status()?;
            ensure!(
                owned.success(),
                "chown -R postgres: of PgBouncer's temp dir failed"
            );
            let mut runuser = Command::new("runuser");
            runuser.args(["-u", "postgres", "--"]).arg(&program);
            runuser
        } else {
            Command::new(&program)
        };
        let out = command
            .arg("-d")
            .arg(&ini)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("starting {}", program.display()))?;
        ensure!(
            out.status.success(),
            "{} -d exited ({}): {}{}",
            program.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            bouncer.log_tail()
        );
        let listening = wait_until(Duration::from_secs(10), || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        ensure!(
            listening,
            "PgBouncer did not listen on {port} within 10 s{}",
            bouncer.log_tail()
        );
        Ok(bouncer)
    }

    /// The last lines of PgBouncer's log, for an error.
    fn log_tail(&self) -> String {
        let log =
            std::fs::read_to_string(self.dir.path().join("pgbouncer.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(10)..].join("\n");
        match tail.is_empty() {
            true => String::new(),
            false => format!("; its log:\n{tail}"),
        }
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let pidfile = self.dir.path().join("pgbouncer.pid");
        let Some(pid) = std::fs::read_to_string(pidfile)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
        else {
            return;
        };
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status();
        wait_until(Duration::from_secs(10), || {
            !Path::new(&format!("/proc/{pid}")).exists()
        });
    }
}

/// `pgbouncer` on `PATH`, else Debian's `/usr/sbin/pgbouncer` (`/usr/sbin` is not on every
/// user's `PATH`).
fn find_pgbouncer() -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("pgbouncer"))
        .find(|p| p.is_file())
        .context(
            "no pgbouncer on PATH or in /usr/sbin: the pooler bench starts its own \
             (Debian: apt-get install pgbouncer)",
        )
}

/// Whether this process runs as root (the owner of `/proc/self` is its user).
fn is_root() -> anyhow::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::metadata("/proc/self")?.uid() == 0)
}

/// Both modes in alternating rounds; the table; the databases dropped.
pub fn run(args: &PoolerArgs) -> anyhow::Result<()> {
    let exe = crate::server_exe(args.exe.clone())?;
    let upstream = Upstream::of(&args.postgres)?;
    let mut admin = postgres::Client::connect(&args.postgres, postgres::NoTls)
        .context("connecting to --postgres")?;
    let version: String = admin.query_one("SHOW server_version", &[])?.get(0);
    let bouncer = PgBouncer::start(&upstream)?;
    println!(
        "pooler: two instances on one PostgreSQL {version} database ({}:{}), directly and \
         through PgBouncer (transaction pooling, 127.0.0.1:{}); per run two loads at once, \
         one per instance, {} requests each over {} connections, {:.0} % resends; {} round(s), \
         a fresh database each run\n",
        upstream.host,
        upstream.port,
        bouncer.port,
        args.requests,
        args.connections,
        RESEND * 100.0,
        args.rounds
    );
    let mut made = Vec::new();
    let measured = rounds(args, &exe, &mut admin, bouncer.port, &mut made);
    drop(bouncer);
    let dropped: anyhow::Result<()> = made.iter().try_for_each(|name| {
        admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))?;
        Ok(())
    });
    let [direct, pooled] = measured?;
    dropped.context("dropping the bench's databases")?;
    println!();
    print!("{}", summary(&direct, &pooled));
    let mut errors = Vec::new();
    for (mode, runs) in [(Mode::Direct, &direct), (Mode::Pooled, &pooled)] {
        let not_200: usize = runs.iter().map(|r| r.not_200).sum();
        if not_200 > 0 {
            errors.push(format!(
                "{not_200} answers not 200 in the {} runs",
                mode.name()
            ));
        }
        let mismatched = runs.iter().filter(|r| !r.ledger_matches()).count();
        if mismatched > 0 {
            errors.push(format!(
                "{mismatched} {} run(s) whose ledger does not match the answers",
                mode.name()
            ));
        }
    }
    ensure!(errors.is_empty(), "{}", errors.join("; "));
    Ok(())
}

/// Every round's runs, per mode (direct, pooled); the databases made go into `made`.
fn rounds(
    args: &PoolerArgs,
    exe: &Path,
    admin: &mut postgres::Client,
    bouncer_port: u16,
    made: &mut Vec<String>,
) -> anyhow::Result<[Vec<Run>; 2]> {
    let mut runs = [Vec::new(), Vec::new()];
    for round in 1..=args.rounds {
        let order = match round % 2 {
            1 => [Mode::Direct, Mode::Pooled],
            _ => [Mode::Pooled, Mode::Direct],
        };
        for mode in order {
            let name = format!("hl_pooler_{}_r{round}", mode.name());
            admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))?;
            admin.batch_execute(&format!("CREATE DATABASE {name}"))?;
            made.push(name.clone());
            let direct = bench::with_database(&args.postgres, &name);
            let url = match mode {
                Mode::Direct => direct.clone(),
                Mode::Pooled => through_pooler(&direct, bouncer_port)?,
            };
            let run = one_run(args, exe, &url, &direct)
                .with_context(|| format!("round {round}, {}", mode.name()))?;
            println!(
                "round {round} {}: {:.0} events/s ({:.0} + {:.0}), p99 {:.2} / {:.2} ms, {} / {}, \
                 ledger {} rows for {} processed, {}",
                mode.name(),
                run.per_second,
                run.each_per_second[0],
                run.each_per_second[1],
                run.p99_ms[0],
                run.p99_ms[1],
                run.statuses[0],
                run.statuses[1],
                run.rows,
                run.processed,
                bench::describe(&run.ledger)
            );
            runs[mode as usize].push(run);
        }
    }
    Ok(runs)
}

/// Two instances on `url`, a load on each at once, the ledger read at `direct`.
fn one_run(args: &PoolerArgs, exe: &Path, url: &str, direct: &str) -> anyhow::Result<Run> {
    let logs = tempfile::tempdir()?;
    let mut servers = (0..SEEDS.len())
        .map(|i| {
            let log = logs.path().join(format!("instance{}.log", i + 1));
            Server::start_on(exe, url.as_ref(), &log, &[])
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let secret = Secret::new(SECRET);
    let loads: Vec<_> = servers
        .iter()
        .zip(SEEDS)
        .map(|(server, seed)| {
            let workload = Workload {
                requests: args.requests as usize,
                resend_share: RESEND,
                seed,
                ids: loadgen::Ids::Ordered,
            };
            (
                server.addr,
                loadgen::prepare(&workload, &secret, &server.addr.to_string()),
            )
        })
        .collect();
    let connections = args.connections as usize;
    let reports: Vec<Report> = std::thread::scope(|scope| {
        let loads: Vec<_> = loads
            .iter()
            .map(|(addr, requests)| scope.spawn(move || loadgen::run(*addr, requests, connections)))
            .collect();
        loads
            .into_iter()
            .map(|load| load.join().expect("a load thread panicked"))
            .collect()
    });
    for server in &mut servers {
        server.stop()?;
    }
    let mut client = postgres::Client::connect(direct, postgres::NoTls)?;
    let rows: i64 = client
        .query_one("SELECT count(*) FROM webhook_events", &[])?
        .get(0);
    drop(client);
    let both = Report {
        acknowledged: reports
            .iter()
            .flat_map(|r| r.acknowledged.iter().cloned())
            .collect::<HashSet<_>>(),
        ..Report::default()
    };
    let ledger = loadgen::check_ledger_postgres(direct, &both)?;
    let ms = |r: &Report| r.percentile(99.0).as_secs_f64() * 1000.0;
    Ok(Run {
        per_second: reports.iter().map(Report::per_second).sum(),
        each_per_second: [reports[0].per_second(), reports[1].per_second()],
        p99_ms: [ms(&reports[0]), ms(&reports[1])],
        statuses: [reports[0].status_summary(), reports[1].status_summary()],
        not_200: reports
            .iter()
            .map(|r| {
                let others: usize = r
                    .statuses
                    .iter()
                    .filter(|(s, _)| **s != 200)
                    .map(|(_, n)| n)
                    .sum();
                others + r.transport_errors
            })
            .sum(),
        processed: reports.iter().map(|r| r.processed).sum(),
        rows,
        ledger,
    })
}

/// The table of both modes' runs and pooled/direct.
fn summary(direct: &[Run], pooled: &[Run]) -> String {
    let median = |runs: &[Run], f: &dyn Fn(&Run) -> f64| {
        Spread::of(&runs.iter().map(f).collect::<Vec<_>>()).expect("at least one run")
    };
    let row = |mode: Mode, runs: &[Run]| {
        let rate = median(runs, &|r| r.per_second);
        let matched = runs.iter().filter(|r| r.ledger_matches()).count();
        vec![
            mode.name().to_string(),
            runs.len().to_string(),
            format!("{:.0}", rate.median),
            format!("{:.0}–{:.0}", rate.min, rate.max),
            format!("{:.2}", median(runs, &|r| r.p99_ms[0]).median),
            format!("{:.2}", median(runs, &|r| r.p99_ms[1]).median),
            runs.iter().map(|r| r.not_200).sum::<usize>().to_string(),
            format!("{matched} of {} exact", runs.len()),
        ]
    };
    let ratio = |f: &dyn Fn(&Run) -> f64| {
        format!(
            "{:.2}x",
            median(pooled, f).median / median(direct, f).median
        )
    };
    let rows = vec![
        row(Mode::Direct, direct),
        row(Mode::Pooled, pooled),
        vec![
            "pooled/direct".to_string(),
            String::new(),
            ratio(&|r| r.per_second),
            String::new(),
            ratio(&|r| r.p99_ms[0]),
            ratio(&|r| r.p99_ms[1]),
            String::new(),
            String::new(),
        ],
    ];
    table::render(
        &[
            "mode",
            "runs",
            "events/s (2 instances) median",
            "range",
            "p99 ms instance 1",
            "p99 ms instance 2",
            "non-200",
            "ledger = processed",
        ],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pooled_url_goes_to_pgbouncer_with_hookledgers_parameter() {
        let url = "postgres://hookledger:hook%40ledger@db.example:5432/hl_pooler_pooled_r1";
        assert_eq!(
            through_pooler(url, 6500).unwrap(),
            "postgres://hookledger:hook%40ledger@127.0.0.1:6500/hl_pooler_pooled_r1\
             ?pooler=transaction"
        );
        assert_eq!(
            through_pooler("postgresql://u@h/d?sslmode=disable", 7).unwrap(),
            "postgresql://u@127.0.0.1:7/d?sslmode=disable&pooler=transaction"
        );
        assert!(through_pooler("nonsense", 7).is_err());
    }

    #[test]
    fn pgbouncer_gets_the_server_and_the_role_of_the_url() {
        let upstream = Upstream::of("postgres://hl:se%22cret@10.0.0.5:5433/postgres").unwrap();
        assert_eq!(
            upstream,
            Upstream {
                host: "10.0.0.5".into(),
                port: 5433,
                user: "hl".into(),
                password: "se\"cret".into(),
            }
        );
        assert_eq!(auth_file(&upstream), "\"hl\" \"se\"\"cret\"\n");
        let ini = pgbouncer_ini(&upstream, 6999, Path::new("/tmp/x"));
        for line in [
            "* = host=10.0.0.5 port=5433\n",
            "listen_port = 6999\n",
            "unix_socket_dir =\n",
            "pool_mode = transaction\n",
            "min_pool_size = 4\n",
            "server_round_robin = 1\n",
            "auth_file = /tmp/x/users.txt\n",
            "pidfile = /tmp/x/pgbouncer.pid\n",
        ] {
            assert!(ini.contains(line), "{line:?} not in\n{ini}");
        }
        let default = Upstream::of("postgres://hl@localhost/postgres").unwrap();
        assert_eq!((default.port, default.password.as_str()), (5432, ""));
        assert!(Upstream::of("postgres://localhost/postgres").is_err());
    }
}
