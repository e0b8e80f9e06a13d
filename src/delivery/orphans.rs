//! The runs of a command kind that an earlier server left running (it was killed, kill -9,
//! during a run): a restart never starts the kind again while one of them lives.
//!
//! Each run carries `HOOKLEDGER_RUN` in its environment: the database, the kind, the server
//! process that started it (pid and start time, so a reused pid is not taken for it) and the
//! row. Before a run, the command target looks through `/proc` for the leaders of such runs
//! (the program hookledger started: the leader of its own process group, in the server's
//! session) of the same database and kind whose server is gone. It waits for each to exit, at
//! most until the kind's `timeout` counted from that run's start; past it, it kills the run's
//! process group, as the server that started it would have. The row is then run again: the
//! old run's result was never recorded (at least once). Only this machine's processes are
//! seen.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The environment variable that names a run.
pub(crate) const RUN_VAR: &str = "HOOKLEDGER_RUN";

/// How often a surviving run is looked at while waiting for it.
const LOOK: Duration = Duration::from_millis(100);

/// Linux's `USER_HZ`: the unit of start times in `/proc/PID/stat`, 100 on every architecture.
const TICKS_PER_SECOND: u64 = 100;

/// What names the runs of one kind of one database, started by this server.
#[derive(Debug, Clone)]
pub(crate) struct RunTag {
    /// `<database>-<kind>-`: the runs of this kind on this database, whichever server.
    prefix: String,
    /// `<pid>-<start>`: this server process.
    server: String,
}

impl RunTag {
    /// The tag of `kind`'s runs on `database` (a SQLite path or PostgreSQL URL; hashed, so a
    /// password in it is never in an environment).
    pub(crate) fn new(database: &str, kind: &str) -> RunTag {
        let pid = std::process::id();
        let start = process_stat(pid).map_or(0, |s| s.start);
        RunTag {
            prefix: format!("{:016x}-{:016x}-", fnv(database), fnv(kind)),
            server: format!("{pid}-{start}"),
        }
    }

    /// The value of [`RUN_VAR`] for a run of row `id`.
    pub(crate) fn value(&self, id: i64) -> String {
        format!("{}{}-{id}", self.prefix, self.server)
    }

    /// Waits until no run of this kind left by an earlier server lives, killing the process
    /// group of one still running `timeout` after its start. Returns how many it waited for.
    pub(crate) fn wait_for_orphans(&self, kind: &str, timeout: Duration) -> usize {
        let orphans = self.orphans();
        for orphan in &orphans {
            log::warn!(
                "outbox: {kind}: a run of row {} started by an earlier server (process {}) still \
                 runs as process {}; waiting for it to end before a new run (its process group \
                 is killed {timeout:.0?} after its start)",
                orphan.row,
                orphan.server,
                orphan.pid
            );
        }
        for orphan in &orphans {
            let deadline = orphan.started + timeout;
            let left = deadline
                .duration_since(SystemTime::now())
                .unwrap_or_default();
            let until = Instant::now() + left;
            while orphan.lives() && Instant::now() < until {
                std::thread::sleep(LOOK);
            }
            if orphan.lives() {
                log::warn!(
                    "outbox: {kind}: the earlier server's run of row {} passed its timeout; its \
                     process group is killed",
                    orphan.row
                );
                if let Some(pid) = rustix::process::Pid::from_raw(orphan.pid as i32) {
                    let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
                }
                let stop = Instant::now() + Duration::from_secs(5);
                while orphan.lives() && Instant::now() < stop {
                    std::thread::sleep(LOOK);
                }
            }
        }
        orphans.len()
    }

    /// The runs of this kind and database whose server is gone, still running.
    fn orphans(&self) -> Vec<Orphan> {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter_map(|pid| self.orphan(pid))
            .collect()
    }

    fn orphan(&self, pid: u32) -> Option<Orphan> {
        // Another user's processes cannot be read: not ours.
        let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        let value = environ
            .split(|b| *b == 0)
            .find_map(|v| v.strip_prefix(format!("{RUN_VAR}=").as_bytes()))?;
        let rest = std::str::from_utf8(value)
            .ok()?
            .strip_prefix(&self.prefix)?;
        let (server, row) = rest.rsplit_once('-')?;
        if server == self.server {
            return None; // this server's own run
        }
        let (server_pid, server_start) = server.split_once('-')?;
        let (server_pid, server_start): (u32, u64) =
            (server_pid.parse().ok()?, server_start.parse().ok()?);
        if process_stat(server_pid).is_some_and(|s| s.start == server_start) {
            return None; // its server lives (another instance on this machine): its run
        }
        let stat = process_stat(pid)?;
        // The program itself, not a child that kept the variable (which would be in its group)
        // or a daemon it started (a session of its own).
        if stat.group != pid || stat.session == pid {
            return None;
        }
        Some(Orphan {
            pid,
            start: stat.start,
            started: started_at(stat.start)?,
            server: server_pid,
            row: row.to_string(),
        })
    }
}

/// A run an earlier server left.
struct Orphan {
    pid: u32,
    /// Its start in clock ticks after boot, as `/proc` gives it: the same process while equal.
    start: u64,
    started: SystemTime,
    server: u32,
    row: String,
}

impl Orphan {
    fn lives(&self) -> bool {
        process_stat(self.pid).is_some_and(|s| s.start == self.start && s.state != 'Z')
    }
}

/// What `/proc/PID/stat` says of a process.
struct Stat {
    state: char,
    group: u32,
    session: u32,
    start: u64,
}

fn process_stat(pid: u32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// `pid (comm) state ppid pgrp session … starttime …`: the name may hold spaces and
/// parentheses, so the fields are counted after its last `)`.
fn parse_stat(stat: &str) -> Option<Stat> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field 3 (state) is fields[0]; 5 (pgrp) [2]; 6 (session) [3]; 22 (starttime) [19].
    Some(Stat {
        state: fields.first()?.chars().next()?,
        group: fields.get(2)?.parse().ok()?,
        session: fields.get(3)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
    })
}

/// When a process started `ticks` after boot.
fn started_at(ticks: u64) -> Option<SystemTime> {
    let stat = std::fs::read_to_string(Path::new("/proc/stat")).ok()?;
    let boot: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    let millis = boot * 1000 + ticks * 1000 / TICKS_PER_SECOND;
    Some(UNIX_EPOCH + Duration::from_millis(millis))
}

/// FNV-1a: stable across builds and versions (a restart after an upgrade finds the runs of
/// the version before).
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_name() {
        let stat = "4242 (a) b (c)) S 1 4242 17 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 \
                    987654 1000 10 18446744073709551615";
        let s = parse_stat(stat).unwrap();
        assert_eq!(
            (s.state, s.group, s.session, s.start),
            ('S', 4242, 17, 987654)
        );
        assert!(parse_stat("12 (x) S 1").is_none());
        let me = process_stat(std::process::id()).unwrap();
        assert!(started_at(me.start).unwrap() <= SystemTime::now());
    }
}
