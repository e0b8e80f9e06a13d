//! `hookledger-bench compare OLD_BIN NEW_BIN`: two `hookledger` binaries (e.g. the last
//! release and a change) under the same load, in alternating rounds on one machine, so a change
//! is compared with the release and not only with the commit before it.
//!
//! Each round runs both binaries once, the old one first in odd rounds and the new one first in
//! even ones (a run that always came second would inherit the first one's warm caches or its
//! leftover writeback). Each run: a fresh database (a new SQLite file, or a new PostgreSQL
//! database beside `--postgres`'s), a generated config file that every release since
//! `baee957` reads (one `stripe` source with the `stripe-billing` handler, `listen` and
//! `admin_listen` on port 0), `serve` started with only `--config`, `/readyz` awaited, the
//! load generator's pre-signed events sent (C connections, a share of them resends), the
//! server stopped, and the ledger checked against the 200s. Printed: every run, then per
//! binary the median events/s with its range, the medians of the runs' p50 and p99, and
//! NEW/OLD.

use std::path::{Path, PathBuf};

use anyhow::{ensure, Context};
use clap::{Args, ValueEnum};
use hookledger::internals::table;
use hookledger::Secret;

use crate::bench::{self, Server, SECRET};
use crate::loadgen::{self, LedgerCheck, Workload};

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// The binary compared against (e.g. the last release).
    #[arg(value_name = "OLD_BIN")]
    pub old: PathBuf,
    /// The binary measured (e.g. target/release/hookledger).
    #[arg(value_name = "NEW_BIN")]
    pub new: PathBuf,
    /// Rounds; each runs both binaries once.
    #[arg(long, default_value_t = 8, value_parser = at_least_one)]
    pub rounds: usize,
    /// Requests per run (new events plus resends).
    #[arg(long, default_value_t = 60_000, value_parser = at_least_one)]
    pub requests: usize,
    /// Keep-alive connections sending at once.
    #[arg(long, short = 'c', default_value_t = 64, value_parser = at_least_one)]
    pub connections: usize,
    /// Share of requests that resend an earlier event, 0.0 to 1.0.
    #[arg(long, default_value_t = 0.2, value_parser = share)]
    pub resend: f64,
    /// The store both binaries run on.
    #[arg(long, value_enum, default_value = "sqlite")]
    pub store: Store,
    /// With --store postgres: a URL of a database where CREATE DATABASE may run (each run gets
    /// a fresh database beside it, dropped after the run).
    #[arg(long, required_if_eq("store", "postgres"))]
    pub postgres: Option<String>,
    /// Where the SQLite files, the configs and the servers' logs go (a temp dir per run).
    #[arg(long, default_value = "./target/bench")]
    pub dir: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Store {
    Sqlite,
    Postgres,
}

fn at_least_one(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("`{value}` is not a whole number of at least 1")),
    }
}

fn share(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(x) if (0.0..=1.0).contains(&x) => Ok(x),
        _ => Err(format!("`{value}` is not a share from 0.0 to 1.0")),
    }
}

impl CompareArgs {
    /// What clap cannot say: both binaries exist, `--postgres` only with `--store postgres`.
    pub fn check(&self) -> anyhow::Result<()> {
        for (name, path) in [("OLD_BIN", &self.old), ("NEW_BIN", &self.new)] {
            ensure!(
                path.is_file(),
                "{name}: no file at {} (a `hookledger` binary)",
                path.display()
            );
        }
        ensure!(
            self.postgres.is_none() || self.store == Store::Postgres,
            "--postgres is for --store postgres (the runs would be on SQLite)"
        );
        Ok(())
    }
}

/// The median and the range of some measurements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// `None` for no values. The median of an even count is the mean of the middle two.
    pub fn of(values: &[f64]) -> Option<Spread> {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = match n {
            0 => return None,
            _ if n % 2 == 1 => sorted[n / 2],
            _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
        };
        Some(Spread {
            median,
            min: sorted[0],
            max: sorted[n - 1],
        })
    }
}

/// What one run of one binary measured.
#[derive(Debug)]
struct Run {
    per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
    statuses: String,
    ledger: LedgerCheck,
}

/// One of the two binaries and its runs.
struct Side<'a> {
    label: &'static str,
    exe: &'a Path,
    runs: Vec<Run>,
}

/// Runs the comparison and prints it. `Ok(false)` when a ledger check found an acknowledged
/// event missing.
pub fn run(args: &CompareArgs) -> anyhow::Result<bool> {
    args.check()?;
    std::fs::create_dir_all(&args.dir).with_context(|| format!("--dir {}", args.dir.display()))?;
    let mut admin = match (&args.store, &args.postgres) {
        (Store::Postgres, Some(url)) => Some(
            postgres::Client::connect(url, postgres::NoTls).context("connecting to --postgres")?,
        ),
        _ => None,
    };
    bench::print_machine(&args.dir)?;
    println!("load average at the start: {}", load_average());
    println!(
        "C={}, {:.0} % resends, {} requests per run, {} rounds, {}; a fresh database each run; \
         the old binary first in odd rounds, the new one first in even rounds",
        args.connections,
        args.resend * 100.0,
        args.requests,
        args.rounds,
        match args.store {
            Store::Sqlite => "SQLite",
            Store::Postgres => "PostgreSQL",
        }
    );
    let mut sides = [
        Side {
            label: "old",
            exe: &args.old,
            runs: Vec::new(),
        },
        Side {
            label: "new",
            exe: &args.new,
            runs: Vec::new(),
        },
    ];
    for side in &sides {
        println!("{}: {}", side.label, side.exe.display());
    }
    println!();
    let secret = Secret::new(SECRET);
    let workload = Workload {
        requests: args.requests,
        resend_share: args.resend,
        seed: 6420,
        ids: loadgen::Ids::Ordered,
    };
    for round in 1..=args.rounds {
        let order = if round % 2 == 1 { [0, 1] } else { [1, 0] };
        for i in order {
            let side = &mut sides[i];
            let run = one_run(args, admin.as_mut(), side, &secret, &workload)
                .with_context(|| format!("round {round}, {} binary", side.label))?;
            println!(
                "round {round} {}: {} events/s, p50 {:.2} ms, p99 {:.2} ms, {}, ledger {}",
                side.label,
                thousands(run.per_second),
                run.p50_ms,
                run.p99_ms,
                run.statuses,
                bench::describe(&run.ledger)
            );
            side.runs.push(run);
        }
    }
    println!("load average at the end: {}\n", load_average());
    print!("{}", summary(&sides[0].runs, &sides[1].runs));
    Ok(sides
        .iter()
        .flat_map(|s| &s.runs)
        .all(|r| r.ledger.lost == 0))
}

/// A fresh database, a config for it, the server, the load, the ledger check.
fn one_run(
    args: &CompareArgs,
    mut admin: Option<&mut postgres::Client>,
    side: &Side,
    secret: &Secret,
    workload: &Workload,
) -> anyhow::Result<Run> {
    let dir = tempfile::tempdir_in(&args.dir)?;
    let pg_name = format!("hl_compare_{}", side.label);
    let database = match (args.store, &admin, &args.postgres) {
        (Store::Postgres, Some(_), Some(url)) => bench::with_database(url, &pg_name),
        _ => dir.path().join("compare.db").display().to_string(),
    };
    let drop = format!("DROP DATABASE IF EXISTS {pg_name} WITH (FORCE)");
    if let Some(admin) = admin.as_deref_mut() {
        admin.batch_execute(&drop)?;
        admin.batch_execute(&format!("CREATE DATABASE {pg_name}"))?;
    }
    let config = dir.path().join("hookledger.toml");
    std::fs::write(&config, config_text(&database, SECRET))?;
    let log = dir.path().join("serve.log");
    let mut server = Server::start_with_config(side.exe, &config, &log)?;
    let requests = loadgen::prepare(workload, secret, &server.addr.to_string());
    let report = loadgen::run(server.addr, &requests, args.connections);
    server.stop()?;
    let ledger = match args.store {
        Store::Sqlite => loadgen::check_ledger(Path::new(&database), &report)?,
        Store::Postgres => loadgen::check_ledger_postgres(&database, &report)?,
    };
    if let Some(admin) = admin {
        admin.batch_execute(&drop)?;
    }
    let ms = |p: f64| report.percentile(p).as_secs_f64() * 1000.0;
    Ok(Run {
        per_second: report.per_second(),
        p50_ms: ms(50.0),
        p99_ms: ms(99.0),
        statuses: report.status_summary(),
        ledger,
    })
}

/// The config file of one run: keys that `baee957`, `c0740cf` and later all read the same way.
pub(crate) fn config_text(database: &str, secret: &str) -> String {
    format!(
        "listen = \"127.0.0.1:0\"\n\
         admin_listen = \"127.0.0.1:0\"\n\
         database = {}\n\
         \n\
         [[source]]\n\
         name = \"stripe\"\n\
         scheme = \"stripe\"\n\
         secrets = [{}]\n\
         handlers = [\"stripe-billing\"]\n",
        toml_string(database),
        toml_string(secret)
    )
}

/// `value` as a TOML basic string.
pub(crate) fn toml_string(value: &str) -> String {
    let mut out = String::from("\"");
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The table of the two binaries' runs and NEW/OLD.
fn summary(old: &[Run], new: &[Run]) -> String {
    let spread = |runs: &[Run], f: fn(&Run) -> f64| {
        Spread::of(&runs.iter().map(f).collect::<Vec<_>>()).expect("at least one run")
    };
    let row = |label: &str, runs: &[Run]| {
        let rate = spread(runs, |r| r.per_second);
        let exact = runs.iter().filter(|r| r.ledger.exact()).count();
        vec![
            label.to_string(),
            runs.len().to_string(),
            thousands(rate.median),
            format!("{}–{}", thousands(rate.min), thousands(rate.max)),
            format!("{:.2}", spread(runs, |r| r.p50_ms).median),
            format!("{:.2}", spread(runs, |r| r.p99_ms).median),
            format!("{exact} of {} exact", runs.len()),
        ]
    };
    let ratio =
        |f: fn(&Run) -> f64| format!("{:.2}x", spread(new, f).median / spread(old, f).median);
    let rows = vec![
        row("old", old),
        row("new", new),
        vec![
            "new/old".to_string(),
            String::new(),
            ratio(|r| r.per_second),
            String::new(),
            ratio(|r| r.p50_ms),
            ratio(|r| r.p99_ms),
            String::new(),
        ],
    ];
    table::render(
        &[
            "binary",
            "runs",
            "events/s median",
            "range",
            "p50 ms",
            "p99 ms",
            "ledger check",
        ],
        &rows,
    )
}

/// `12345.6` as `12,346`.
fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `/proc/loadavg`'s first three figures (Linux), or `unknown`.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<CompareArgs, String> {
        let argv = ["hookledger-bench", "compare"].iter().chain(args);
        match crate::Cli::try_parse_from(argv) {
            Ok(crate::Cli {
                command: crate::Command::Compare(args),
            }) => Ok(args),
            Ok(other) => panic!("not compare: {other:?}"),
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn the_defaults_are_the_issues_load() {
        let args = parse(&["old/hookledger", "new/hookledger"]).unwrap();
        assert_eq!(args.old, Path::new("old/hookledger"));
        assert_eq!(args.new, Path::new("new/hookledger"));
        assert_eq!(
            (args.rounds, args.requests, args.connections, args.resend),
            (8, 60_000, 64, 0.2)
        );
        assert_eq!(args.store, Store::Sqlite);
        assert_eq!(args.postgres, None);
        let args = parse(&[
            "a",
            "b",
            "--rounds",
            "3",
            "--requests",
            "20000",
            "-c",
            "16",
            "--resend",
            "0",
            "--store",
            "postgres",
            "--postgres",
            "postgres://u:p@127.0.0.1/postgres",
        ])
        .unwrap();
        assert_eq!(
            (args.rounds, args.requests, args.connections, args.resend),
            (3, 20_000, 16, 0.0)
        );
        assert_eq!(args.store, Store::Postgres);
        assert_eq!(
            args.postgres.as_deref(),
            Some("postgres://u:p@127.0.0.1/postgres")
        );
    }

    #[test]
    fn bad_arguments_are_refused_naming_the_argument() {
        let refused = |args: &[&str], names: &str| {
            let err = parse(args).unwrap_err();
            assert!(err.contains(names), "{args:?}: {err}");
        };
        refused(&["only-one"], "<NEW_BIN>");
        refused(&["a", "b", "--rounds", "0"], "--rounds");
        refused(&["a", "b", "--requests=-5"], "--requests");
        refused(&["a", "b", "-c", "0"], "--connections");
        refused(&["a", "b", "--resend", "1.5"], "--resend");
        refused(&["a", "b", "--resend", "x"], "--resend");
        refused(&["a", "b", "--store", "mysql"], "--store");
        refused(&["a", "b", "--store", "postgres"], "--postgres");
    }

    #[test]
    fn the_check_names_a_missing_binary_and_a_postgres_url_without_its_store() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("hookledger");
        std::fs::write(&bin, "").unwrap();
        let bin = bin.to_str().unwrap();
        parse(&[bin, bin]).unwrap().check().unwrap();
        let err = parse(&["/nonexistent/hookledger", bin])
            .unwrap()
            .check()
            .unwrap_err();
        assert!(
            format!("{err}").starts_with("OLD_BIN: no file at /nonexistent"),
            "{err}"
        );
        let err = parse(&[bin, "/nonexistent/new"])
            .unwrap()
            .check()
            .unwrap_err();
        assert!(format!("{err}").starts_with("NEW_BIN: "), "{err}");
        let err = parse(&[bin, bin, "--postgres", "postgres://x/y"])
            .unwrap()
            .check()
            .unwrap_err();
        assert!(format!("{err}").contains("--store postgres"), "{err}");
    }

    #[test]
    fn a_spread_is_the_median_and_the_range() {
        assert_eq!(Spread::of(&[]), None);
        let one = Spread::of(&[7.0]).unwrap();
        assert_eq!((one.median, one.min, one.max), (7.0, 7.0, 7.0));
        // Odd: the middle one, whatever the order.
        let odd = Spread::of(&[13_004.0, 9_560.0, 10_967.0]).unwrap();
        assert_eq!(
            (odd.median, odd.min, odd.max),
            (10_967.0, 9_560.0, 13_004.0)
        );
        // Even: the mean of the middle two.
        let even = Spread::of(&[4.0, 1.0, 3.0, 10.0]).unwrap();
        assert_eq!((even.median, even.min, even.max), (3.5, 1.0, 10.0));
    }

    fn run(per_second: f64, p99_ms: f64) -> Run {
        Run {
            per_second,
            p50_ms: 1.0,
            p99_ms,
            statuses: "200:10".into(),
            ledger: LedgerCheck {
                acknowledged: 8,
                in_ledger: 8,
                lost: 0,
                unacknowledged: 0,
            },
        }
    }

    #[test]
    fn the_summary_shows_medians_ranges_and_new_over_old() {
        let old = [
            run(10_000.0, 10.0),
            run(12_000.0, 14.0),
            run(11_000.0, 12.0),
        ];
        let new = [run(14_000.0, 9.0), run(13_000.0, 6.0), run(13_500.0, 8.0)];
        let text = summary(&old, &new);
        let line = |label: &str| {
            text.lines()
                .find(|l| l.starts_with(label))
                .unwrap_or_else(|| panic!("no {label} line in\n{text}"))
                .split_whitespace()
                .collect::<Vec<_>>()
        };
        assert_eq!(
            line("old "),
            [
                "old",
                "3",
                "11,000",
                "10,000–12,000",
                "1.00",
                "12.00",
                "3",
                "of",
                "3",
                "exact"
            ]
        );
        assert_eq!(
            line("new "),
            [
                "new",
                "3",
                "13,500",
                "13,000–14,000",
                "1.00",
                "8.00",
                "3",
                "of",
                "3",
                "exact"
            ]
        );
        // 13,500 / 11,000 and 8 / 12.
        assert_eq!(line("new/old"), ["new/old", "1.23x", "1.00x", "0.67x"]);
    }

    #[test]
    fn numbers_print_with_thousands_separators() {
        assert_eq!(thousands(0.4), "0");
        assert_eq!(thousands(999.5), "1,000");
        assert_eq!(thousands(13_944.2), "13,944");
        assert_eq!(thousands(1_234_567.0), "1,234,567");
    }

    #[test]
    fn the_config_quotes_its_values_as_toml() {
        let text = config_text("/tmp/a \"b\"\\c.db", SECRET);
        assert!(
            text.contains("database = \"/tmp/a \\\"b\\\"\\\\c.db\"\n"),
            "{text}"
        );
        assert!(
            text.contains("secrets = [\"whsec_bench_secret\"]\n"),
            "{text}"
        );
        assert!(text.contains("admin_listen = \"127.0.0.1:0\"\n"), "{text}");
    }

    #[test]
    fn this_crates_config_reader_takes_the_generated_config() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("compare.db");
        let path = dir.path().join("hookledger.toml");
        std::fs::write(&path, config_text(db.to_str().unwrap(), SECRET)).unwrap();
        let config = hookledger::Config::load(&path).unwrap();
        assert_eq!(config.listen, "127.0.0.1:0".parse().unwrap());
        assert_eq!(config.admin_listen, Some("127.0.0.1:0".parse().unwrap()));
        assert_eq!(config.database, hookledger::Database::Sqlite(db));
        let [source] = &config.sources[..] else {
            panic!("one source: {:?}", config.sources)
        };
        assert_eq!(source.name, "stripe");
        assert_eq!(source.scheme, hookledger::SchemeName::Stripe);
        assert_eq!(source.handlers, ["stripe-billing"]);
        assert_eq!(source.secrets.len(), 1);
    }
}
