//! The `hookledger` binary: parse the command line, set up logging, call the library, turn the
//! result into an exit code (0 ok, 1 the command's result is a failure, 2 it could not run).

use std::process::ExitCode;

use clap::Parser;
use hookledger::{run_cli, Cli, CliCommand, Exit};

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The demo prints its own table; its server's log shows only warnings and errors.
    let default_level = match cli.command {
        CliCommand::Demo => "warn",
        _ => "info",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default_level))
        // The HTTP client logs whole requests at debug: the delivery signature and any
        // `user:password@` of the forward URL. Its info and above are enough, whatever RUST_LOG.
        .filter_module("ureq", log::LevelFilter::Info)
        // Plain lines, no colour handling: one line per event must stay cheap at 10k events/s.
        .write_style(env_logger::WriteStyle::Never)
        .format(|buf, record| {
            use std::io::Write;
            writeln!(
                buf,
                "{} {:<5} {}: {}",
                buf.timestamp_millis(),
                record.level(),
                record.target(),
                record.args()
            )
        })
        .init();
    match run_cli(cli) {
        Ok(Exit::Ok) => ExitCode::SUCCESS,
        Ok(Exit::Failed) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
