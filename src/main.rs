//! The `hookledger` binary: parse the command line, set up logging, call the library, turn the
//! result into an exit code (0 ok, 1 the command's result is a failure, 2 it could not run).

use std::process::ExitCode;

use clap::Parser;
use hookledger::{init_logging, run_cli, Cli, CliCommand, Exit, LogFormat};

/// The binary allocates with mimalloc: the request path allocates a few dozen small buffers a
/// request on two threads at once, where glibc's malloc and free were 8.7 % of the server's CPU
/// (`perf record`, C = 64). The library leaves the allocator to the program that embeds it.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The demo prints its own table; its server's log shows only warnings and errors, and not
    // the request lines (its table has every reply, the injected failure's 500 too).
    let default_level = match cli.command {
        CliCommand::Demo => "warn,hookledger::http::ingest=off",
        _ => "info",
    };
    let log = init_logging(cli.log_format, default_level);
    let json = cli.log_format == LogFormat::Json;
    let result = run_cli(cli);
    // The lines still waiting are written; a line from here on (the error) is written at once.
    drop(log);
    match result {
        Ok(Exit::Ok) => ExitCode::SUCCESS,
        Ok(Exit::Failed) => ExitCode::from(1),
        // With `--log-format json` the error is a log line too: every line is JSON.
        Err(e) if json => {
            tracing::error!("{e:#}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
