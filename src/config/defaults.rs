//! Every default of a setting, each with its reason. The parts that use one (the stores, the
//! schemes, the outbox) import it from here: config is a leaf of the crate and knows them all.

use std::time::Duration;

/// Webhook payloads are a few KB; 1 MiB leaves room for the largest real events while a
/// hostile sender cannot make us buffer more than that per request.
pub(crate) const DEFAULT_MAX_BODY: usize = 1024 * 1024;

/// Request bodies held in memory at once, across all requests: 32 bodies of the largest size,
/// thousands of real events (a few KB each). Bounds memory under a flood of large bodies with
/// forged signatures; over it a request gets a 503 before its body is read.
pub(crate) const DEFAULT_BODY_BUDGET: usize = 32 * 1024 * 1024;

/// A client that has not sent its headers or body within this time is cut off, so slow
/// senders cannot hold connections (the providers' own senders give up after ~10 s).
pub(crate) const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Open connections beyond this are refused with a 503 at once. Each idle connection costs a
/// few KB; the cap bounds memory and file descriptors under a flood.
pub(crate) const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// Where `serve` listens unless told otherwise: loopback, behind a TLS proxy.
pub(crate) const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// The database file unless told otherwise, in the working directory.
pub(crate) const DEFAULT_DB: &str = "./hookledger.db";

/// Default maximum jobs per transaction. Past a few hundred the batch's fsync is already
/// amortised, and a bounded batch keeps the latency of its first job bounded.
pub(crate) const DEFAULT_BATCH_MAX: usize = 256;

/// Default payload bytes in flight across every delivery lane (`storage.outbox_payload_budget`):
/// 33 pending 10 MiB forwards attempted side by side held 494 MB; 64 MiB is six 10 MiB payloads
/// (two of GitHub's 25 MiB) at a time, and hundreds of ordinary ones.
pub(crate) const DEFAULT_OUTBOX_PAYLOAD_BUDGET: usize = 64 << 20;

/// Default most events in one batch body (`split`): HubSpot sends at most 100 per request,
/// SendGrid caps its batches by size, not count (a few thousand small events). A body past it
/// is refused (413) before anything is claimed; 100,000 elements held the writer 8.4 s.
pub(crate) const DEFAULT_MAX_EVENTS: usize = 5_000;

/// Events of one batch body written per writer job (each job its own transaction): other
/// sources' jobs run between a big batch's chunks, so one request holds the writer for a
/// chunk's time, not its whole array's.
pub(crate) const BATCH_CHUNK: usize = 256;

/// Default queue depth: about two full batches. A deeper queue only adds latency under
/// overload; the provider retries a 503 anyway.
pub(crate) const DEFAULT_QUEUE_DEPTH: usize = 512;

/// How long one event's handlers (its SQL effects above all) may run in the writer's
/// transaction. Effects are a few statements on indexed rows: milliseconds. Past this one is
/// stuck (a runaway recursive query, a sleep, a lock held elsewhere), and it holds the one
/// writer, so every source's events wait behind it: 2 s is hundreds of times a real effect,
/// and short enough that the events queued behind it still get their answer well within the
/// providers' own timeout (~10 s). That event fails alone (500) and its sender retries it.
pub(crate) const DEFAULT_EFFECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a write waits for another process's lock on the database (SQLite: the write lock
/// an `sqlite3` shell or a CLI command holds, before `SQLITE_BUSY`; PostgreSQL: a row lock,
/// and a connection) before the request gets a 503: long enough to ride out a CLI command,
/// short enough that the provider gets its answer long before its own timeout (~10 s).
pub(crate) const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The SQLite write-ahead log's bound (MiB): a few seconds of the heaviest load, a fraction
/// of a second to copy back into the database file while the writer waits.
pub(crate) const DEFAULT_WAL_LIMIT_MB: usize = 64;

/// How far a signed timestamp may be from now: the providers' own SDKs default to 300 s; it
/// bounds how long a captured request can be replayed.
pub const DEFAULT_TOLERANCE_SECS: u64 = 300;

/// Claims (the ledger rows, without their payloads) are kept this long. For schemes without a
/// signed timestamp (github, shopify, hmac) the claim is the only replay protection: a
/// captured delivery resent within this time is still a duplicate.
pub(crate) const DEFAULT_CLAIM_DAYS: u64 = 400;

/// Payloads (the stored bodies, for inspection and replay) are kept this long: providers let
/// people resend events up to 30 days old.
pub(crate) const DEFAULT_PAYLOAD_DAYS: u64 = 30;

/// Providers retry a failed delivery for up to 3 days; a ledger that forgets sooner would
/// apply a retried event twice.
pub(crate) const MIN_RETENTION_DAYS: u64 = 3;

/// Default timeout of one delivery request: an app that takes longer is treated as failed.
pub(crate) const DEFAULT_FORWARD_TIMEOUT: Duration = Duration::from_secs(10);

/// Default timeout of one run of a `[[delivery]]` `command`: a deploy script builds, pulls
/// images and restarts services, minutes rather than the seconds of a POST; 10 minutes is
/// several times a slow deploy, and a hung one is killed (its process group) and retried
/// before the next push piles up behind it.
pub(crate) const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(600);

/// Default attempts in flight at once per delivery kind: enough that a slow app (hundreds of
/// ms an answer) keeps up with a burst, few enough that the worker holds few payloads.
pub(crate) const DEFAULT_CONCURRENCY: usize = 8;

/// Default runs of one `command` kind at once: one, so two deploys never overlap (a command
/// that can run side by side says so with `concurrency`).
pub(crate) const DEFAULT_COMMAND_CONCURRENCY: usize = 1;

/// Default consecutive failures that open a kind's circuit breaker: a few blips pass, an
/// outage stops the attempts.
pub(crate) const DEFAULT_BREAKER_FAILURES: u32 = 5;

/// Default pause of a kind whose breaker opened, before one probe attempt: a dead target costs
/// one attempt per 10 s, and once it answers again its backlog starts going out within 10 s
/// (an outage's rows delivered within 30 s of the app's return, the drain included).
pub(crate) const DEFAULT_BREAKER_COOLDOWN: Duration = Duration::from_secs(10);

/// The default delivery schedule: quick retries for blips, then hourly doubling for outages,
/// then every 8 h until 3 days after the first attempt (as long as the providers themselves
/// retry).
pub(crate) fn default_schedule() -> Vec<Duration> {
    let mut schedule: Vec<Duration> = [5, 30, 120, 600, 1800, 3600, 7200, 14_400, 28_800]
        .into_iter()
        .map(Duration::from_secs)
        .collect();
    let three_days = Duration::from_secs(3 * 86_400);
    while schedule.iter().sum::<Duration>() + Duration::from_secs(28_800) <= three_days {
        schedule.push(Duration::from_secs(28_800));
    }
    schedule
}

/// Loopback: the admin routes need no token there (nothing on them changes data).
pub(crate) const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9090";

/// How long a dead instance's leased rows wait before another instance takes them: within
/// minutes. A live instance renews the leases of its rows in flight every second, so an
/// attempt (a long command) may run longer; a few minutes ride out a stalled connection.
pub(crate) const DEFAULT_OUTBOX_LEASE: Duration = Duration::from_secs(300);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_schedule_spans_three_days() {
        let s = default_schedule();
        assert_eq!(s[0], Duration::from_secs(5));
        assert_eq!(s[8], Duration::from_secs(8 * 3600));
        let total: Duration = s.iter().sum();
        assert!(total <= Duration::from_secs(3 * 86_400), "{total:?}");
        assert!(
            total > Duration::from_secs(3 * 86_400 - 8 * 3600),
            "{total:?}"
        );
    }
}
