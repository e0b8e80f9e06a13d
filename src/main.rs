//! The `hookledger` binary: parse the command line, set up logging, call the library, turn the
//! result into an exit code (0 ok, 1 the command's result is a failure, 2 it could not run).

use std::process::ExitCode;

use clap::Parser;
use hookledger::{run_cli, Cli, CliCommand, Exit, LogFormat};

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The demo prints its own table; its server's log shows only warnings and errors.
    let default_level = match cli.command {
        CliCommand::Demo => "warn",
        _ => "info",
    };
    let json = cli.log_format == LogFormat::Json;
    let logger =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default_level))
            // Plain lines, no colour handling: one line per event must stay cheap at 10k events/s.
            .write_style(env_logger::WriteStyle::Never)
            .format(move |buf, record| {
                use std::io::Write;
                if json {
                    // One object per line: serde_json escapes whatever a message holds.
                    let line = serde_json::json!({
                        "ts": buf.timestamp_millis().to_string(),
                        "level": record.level().as_str(),
                        "target": record.target(),
                        "message": record.args().to_string(),
                    });
                    return writeln!(buf, "{line}");
                }
                writeln!(
                    buf,
                    "{} {:<5} {}: {}",
                    buf.timestamp_millis(),
                    record.level(),
                    record.target(),
                    record.args()
                )
            })
            .build();
    let level = logger.filter();
    if log::set_boxed_logger(Box::new(QuietDependencies(logger))).is_ok() {
        log::set_max_level(level);
    }
    match run_cli(cli) {
        Ok(Exit::Ok) => ExitCode::SUCCESS,
        Ok(Exit::Failed) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// The logger, minus the HTTP client's and the PostgreSQL client's lines below info, whatever
/// `RUST_LOG` says (even `ureq::unit=debug`): at debug ureq logs whole requests, with the
/// delivery signature and any `user:password@` of the forward URL, and tokio-postgres logs
/// every statement's parameters, webhook bodies included.
struct QuietDependencies(env_logger::Logger);

impl log::Log for QuietDependencies {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        let target = metadata.target();
        let noisy = ["ureq", "tokio_postgres", "postgres"]
            .iter()
            .any(|c| target == *c || target.strip_prefix(c).is_some_and(|t| t.starts_with("::")));
        !(noisy && metadata.level() > log::Level::Info) && self.0.enabled(metadata)
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            self.0.log(record);
        }
    }

    fn flush(&self) {
        self.0.flush();
    }
}
