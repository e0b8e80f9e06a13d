//! The command target: a `[[delivery]]` with `command` runs a local program for each row of
//! its kind (a deploy script on GitHub's push), after commit, at least once.
//!
//! # The process
//! - argv as configured, never through a shell; in `workdir` when set.
//! - The payload on stdin. The environment is empty but for the variables the delivery names
//!   in `env` (passed through from hookledger's, when set there; `PATH` only if named: a
//!   shell run without one falls back to its own default) and the
//!   row's: `HOOKLEDGER_SOURCE`, `HOOKLEDGER_EVENT_ID` (the row's key, the event id for the
//!   rows of an event), `HOOKLEDGER_EVENT_TYPE` (empty when the row has none),
//!   `HOOKLEDGER_KIND`, `HOOKLEDGER_KEY` and `HOOKLEDGER_ATTEMPT` (1 on the first).
//! - Its own process group, so that past `timeout` the whole group (the script and what it
//!   started) is killed with SIGKILL.
//!
//! # Results
//! Exit 0 → done. An exit in `give_up_exit` → dead at once. Any other exit, a signal, a
//! timeout or a failure to start → retried on the delivery's schedule.
//!
//! # Output
//! The last [`OUTPUT_TAIL`] bytes of stdout and stderr, interleaved as read, are kept on the
//! row (`outbox.output`) after each run: delivered, failed or timed out (the newest run's).
//! They are never logged: a deploy's output may hold
//! what the logs must not.

use std::io::{Read, Write as _};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command as Process, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::orphans::{RunTag, RUN_VAR};
use crate::config::CommandTarget;
use crate::outbox::{Failure, FollowUp, PendingRow, Target};
use crate::sql::{StoreError, Tx};

/// Bytes of a command's output kept on its row: the end of a failed build or deploy, where its
/// error is, without letting a chatty script grow the outbox.
pub(crate) const OUTPUT_TAIL: usize = 4096;

/// How often a running command is checked for its exit or its timeout.
const WAIT_POLL: Duration = Duration::from_millis(20);

/// How long the output is still read after the command exited: a background child that keeps
/// the pipes open does not hold the worker.
const DRAIN: Duration = Duration::from_secs(1);

/// Runs the delivery's command for each row.
pub(crate) struct Command {
    config: CommandTarget,
    /// Names its runs, and finds those an earlier server left running.
    tag: RunTag,
}

impl Command {
    pub(crate) fn new(config: CommandTarget, tag: RunTag) -> Command {
        Command { config, tag }
    }

    /// The delivery's schedule (the worker retries on it).
    pub(crate) fn schedule(&self) -> Vec<Duration> {
        self.config.schedule.clone()
    }

    fn process(&self, row: &PendingRow) -> Process {
        let c = &self.config;
        let mut process = Process::new(&c.program);
        process.args(&c.args).env_clear();
        for name in &c.env {
            if let Some(value) = std::env::var_os(name) {
                process.env(name, value);
            }
        }
        process
            .env("HOOKLEDGER_SOURCE", &row.source)
            .env("HOOKLEDGER_EVENT_ID", &row.key)
            .env(
                "HOOKLEDGER_EVENT_TYPE",
                row.event_type.as_deref().unwrap_or(""),
            )
            .env("HOOKLEDGER_KIND", &row.kind)
            .env("HOOKLEDGER_KEY", &row.key)
            .env("HOOKLEDGER_ATTEMPT", (row.attempts + 1).to_string())
            .env(RUN_VAR, self.tag.value(row.id))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        if let Some(dir) = &c.workdir {
            process.current_dir(dir);
        }
        process
    }
}

/// The outcome of one run: how it ended and its output's tail.
struct Run {
    end: End,
    output: Vec<u8>,
}

enum End {
    Exited(ExitStatus),
    TimedOut,
}

impl Target for Command {
    fn attempt(
        &self,
        row: &PendingRow,
        payload: &[u8],
    ) -> Result<Option<Arc<dyn FollowUp>>, Failure> {
        // Removed since the start (or before it): said as such, retried on the schedule.
        let program = &self.config.program;
        if !program.exists() {
            return Err(Failure::Transport(format!(
                "the program `{}` does not exist",
                program.display()
            )));
        }
        // Never beside a run that an earlier server (killed during it) left running.
        self.tag.wait_for_orphans(&row.kind, self.config.timeout);
        let run = run(self.process(row), payload, self.config.timeout)?;
        let output = text(&run.output);
        let failed = |error: String, give_up: bool| {
            Err(Failure::Ran {
                error,
                output: output.clone(),
                give_up,
            })
        };
        match run.end {
            End::Exited(status) if status.success() => {
                Ok(Some(Arc::new(Output { id: row.id, output })))
            }
            End::Exited(status) => match status.code() {
                Some(code) if self.config.give_up_exit.contains(&code) => {
                    failed(format!("exit {code} (in give_up_exit)"), true)
                }
                Some(code) => failed(format!("exit {code}"), false),
                None => failed(format!("ended by {status}"), false),
            },
            End::TimedOut => failed(
                format!(
                    "timed out after {:?}; its process group was killed",
                    self.config.timeout
                ),
                false,
            ),
        }
    }
}

/// Runs `process` with `payload` on its stdin, for at most `timeout`.
fn run(mut process: Process, payload: &[u8], timeout: Duration) -> Result<Run, Failure> {
    let mut child = process
        .spawn()
        .map_err(|e| Failure::Transport(format!("cannot start the command: {e}")))?;
    let tail = Arc::new(Mutex::new(Vec::new()));
    let (done, drained) = mpsc::channel();
    if let Some(stdout) = child.stdout.take() {
        read_into(stdout, tail.clone(), done.clone());
    }
    if let Some(stderr) = child.stderr.take() {
        read_into(stderr, tail.clone(), done.clone());
    }
    drop(done);
    if let Some(mut stdin) = child.stdin.take() {
        let payload = payload.to_vec();
        // Its own thread: a command that does not read its stdin must not block the worker.
        std::thread::spawn(move || {
            let _ = stdin.write_all(&payload);
        });
    }
    let end = wait(&mut child, timeout)?;
    // Both readers end when the pipes close; a background child holding them is not waited.
    let until = Instant::now() + DRAIN;
    for _ in 0..2 {
        let left = until.saturating_duration_since(Instant::now());
        if drained.recv_timeout(left).is_err() {
            break;
        }
    }
    let output = tail.lock().map(|t| t.clone()).unwrap_or_default();
    Ok(Run { end, output })
}

/// Waits for `child` to exit; past `timeout`, kills its process group.
fn wait(child: &mut Child, timeout: Duration) -> Result<End, Failure> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(End::Exited(status)),
            Ok(None) if Instant::now() >= deadline => {
                let group = rustix::process::Pid::from_child(child);
                if let Err(e) =
                    rustix::process::kill_process_group(group, rustix::process::Signal::KILL)
                {
                    log::error!("outbox: cannot kill a timed-out command's process group: {e}");
                    let _ = child.kill();
                }
                let _ = child.wait();
                return Ok(End::TimedOut);
            }
            Ok(None) => std::thread::sleep(WAIT_POLL),
            Err(e) => {
                return Err(Failure::Transport(format!(
                    "cannot wait for the command: {e}"
                )))
            }
        }
    }
}

/// Reads `pipe` to its end, keeping the last [`OUTPUT_TAIL`] bytes of everything read into
/// `tail`; says so on `done`.
fn read_into(
    mut pipe: impl Read + Send + 'static,
    tail: Arc<Mutex<Vec<u8>>>,
    done: mpsc::Sender<()>,
) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = pipe.read(&mut buf) {
            if let Ok(mut tail) = tail.lock() {
                tail.extend_from_slice(&buf[..n]);
                let over = tail.len().saturating_sub(OUTPUT_TAIL);
                tail.drain(..over);
            }
        }
        let _ = done.send(());
    });
}

/// The output as text a TEXT column takes on every store: invalid UTF-8 (a character cut by
/// the tail too) and NUL (PostgreSQL refuses it) as U+FFFD.
fn text(output: &[u8]) -> String {
    String::from_utf8_lossy(output).replace('\0', "\u{FFFD}")
}

/// Writes a delivered command's output on its row, in the transaction that marks it done.
#[derive(Debug)]
struct Output {
    id: i64,
    output: String,
}

impl FollowUp for Output {
    fn apply(&self, tx: &Tx<'_>) -> Result<(), StoreError> {
        tx.execute(
            "UPDATE outbox SET output = $2 WHERE id = $1",
            &[&self.id, &self.output],
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_text_without_nul() {
        assert_eq!(text(b"a\0b\xffc"), "a\u{FFFD}b\u{FFFD}c");
    }

    #[test]
    fn keeps_the_tail_of_the_output_and_kills_the_group_past_the_timeout() {
        let mut p = Process::new("/bin/sh");
        p.args(["-c", "cat; head -c 10000 /dev/zero | tr '\\0' x; echo end"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let done = run(p, b"payload", Duration::from_secs(10)).unwrap();
        assert!(matches!(done.end, End::Exited(s) if s.success()));
        assert_eq!(done.output.len(), OUTPUT_TAIL);
        assert!(done.output.ends_with(b"xend\n"));

        // stderr is kept too. (Not in the run above: stdout and stderr are two pipes, read
        // side by side, so how their last lines interleave is not fixed.)
        let mut p = Process::new("/bin/sh");
        p.args(["-c", "echo oops >&2; exit 1"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let failed = run(p, b"", Duration::from_secs(10)).unwrap();
        assert!(matches!(failed.end, End::Exited(s) if s.code() == Some(1)));
        assert_eq!(failed.output, b"oops\n");

        let mut p = Process::new("/bin/sh");
        p.args(["-c", "sleep 60 & sleep 60"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let started = Instant::now();
        let killed = run(p, b"", Duration::from_millis(300)).unwrap();
        assert!(matches!(killed.end, End::TimedOut));
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
