//! The CLI's commands on the database file: listing and showing events and outbox rows,
//! reviving dead rows, replaying events, pruning.
//!
//! These run in their own process, next to a running `serve` or without one. Reads use a
//! read-only connection; writes run one short `BEGIN IMMEDIATE` transaction each on this
//! process's own connection, so SQLite serialises them with the server's writer (which waits
//! up to its busy timeout). The server's outbox worker polls and picks revived rows up within
//! a second.

use anyhow::bail;

use crate::cli::table;
use crate::config::RetentionConfig;
use crate::retention::{self, Pruned};
use crate::sql::Session;
use std::collections::HashMap;

use crate::store::listings::{self, EventRow, OutboxRow};
use crate::store::{Reader, Store, Write};
use crate::time::format_time;
use crate::time::unix_now;

/// Revives one dead row; errors if it is not dead.
pub(crate) fn outbox_retry(store: &mut dyn Store, id: i64) -> anyhow::Result<()> {
    if store.write_now(&Write::Revive { id: Some(id) }, unix_now())? == 0 {
        bail!("outbox row {id} does not exist or is not dead (see: hookledger outbox list)");
    }
    Ok(())
}

pub(crate) fn outbox_retry_all_dead(store: &mut dyn Store) -> anyhow::Result<u64> {
    Ok(store.write_now(&Write::Revive { id: None }, unix_now())?)
}

pub(crate) fn replay(store: &mut dyn Store, source: &str, event_id: &str) -> anyhow::Result<()> {
    let write = Write::Replay {
        source: source.to_string(),
        event_id: event_id.to_string(),
    };
    if store.write_now(&write, unix_now())? == 0 {
        bail!(
            "no event {event_id} of source {source} with a payload in the ledger (never \
             received, or its payload was cleared after the retention age)"
        );
    }
    Ok(())
}

/// One prune, each batch its own short transaction; `ledger` is read for the newest claim.
pub(crate) fn prune(
    store: &mut dyn Store,
    ledger: &dyn Session,
    retention: &RetentionConfig,
) -> anyhow::Result<Pruned> {
    crate::config::check_retention(retention.claim_days)?;
    let now = unix_now();
    let newest = retention::newest_claim(ledger)?;
    Ok(retention::prune(
        now,
        newest,
        retention,
        &mut retention::Flat,
        |write| store.write_now(&write, now),
    )?)
}

/// How often `events list --follow` looks for new events: soon enough to watch a test
/// delivery arrive, and one small indexed query a look.
const FOLLOW_POLL: std::time::Duration = std::time::Duration::from_millis(500);

/// `events list --follow`: the last `limit` events, oldest first, then each new one as it is
/// received, a line each, until interrupted (or stdout is closed).
pub(crate) fn follow(
    reader: &Reader,
    since: Option<i64>,
    kind: Option<&str>,
    source: Option<&str>,
    limit: usize,
    json: bool,
) -> anyhow::Result<crate::cli::Exit> {
    use std::io::Write as _;
    // Each look reads from a little before the newest event printed, skipping those printed:
    // an event committed late (another instance's, a batch that waited) with an earlier
    // `received_at` is still shown.
    let mut newest: Option<i64> = None;
    let mut printed: HashMap<(String, String), i64> = HashMap::new();
    let mut batch = limit;
    let mut out = std::io::stdout();
    loop {
        let from = newest.map(|n| n - FOLLOW_LOOKBACK).or(since);
        let mut rows =
            reader.read(|ledger| listings::events_list(ledger, from, kind, source, batch))?;
        rows.reverse();
        for row in rows {
            let key = (row.source.clone(), row.event_id.clone());
            if printed.contains_key(&key) {
                continue;
            }
            newest = newest.max(Some(row.received_at));
            printed.insert(key, row.received_at);
            let line = match json {
                true => serde_json::to_string(&row)?,
                false => format!(
                    "{}  {}  {}  {}  {} bytes",
                    format_time(row.received_at),
                    row.source,
                    row.event_id,
                    row.event_type,
                    row.payload_bytes
                ),
            };
            // A closed pipe (`| head`) ends the command, quietly.
            if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
                return Ok(crate::cli::Exit::Ok);
            }
        }
        if let Some(n) = newest {
            printed.retain(|_, at| *at >= n - FOLLOW_LOOKBACK);
        }
        // After the first look, everything since (a burst of more than this between two
        // looks shows its newest).
        batch = FOLLOW_BATCH;
        std::thread::sleep(FOLLOW_POLL);
    }
}

/// Events one look of `--follow` reads at most.
const FOLLOW_BATCH: usize = 10_000;

/// Seconds before the newest event printed that each look reads again: a commit that took
/// longer than this to land after a later one is not shown.
const FOLLOW_LOOKBACK: i64 = 5;

/// One outbox row, then the output of its command (if any).
pub(crate) fn render_outbox_row(row: &OutboxRow) -> String {
    let mut text = render_outbox(std::slice::from_ref(row));
    if let Some(output) = &row.output {
        text.push_str("\noutput (the last 4 KiB of stdout and stderr):\n");
        text.push_str(output);
        if !output.ends_with('\n') {
            text.push('\n');
        }
    }
    text
}

pub(crate) fn render_outbox(rows: &[OutboxRow]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.id.to_string(),
                r.kind.clone(),
                r.source.clone(),
                r.key.clone(),
                r.status.clone(),
                r.attempts.to_string(),
                match r.status.as_str() {
                    "pending" => format_time(r.next_attempt_at),
                    "done" | "superseded" => r.done_at.map(format_time).unwrap_or_default(),
                    _ => String::new(),
                },
                r.last_error.clone().unwrap_or_default(),
            ]
        })
        .collect();
    table::render(
        &[
            "id",
            "kind",
            "source",
            "key",
            "status",
            "attempts",
            "next/done (UTC)",
            "last error",
        ],
        &cells,
    )
}

pub(crate) fn render_events(rows: &[EventRow]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.event_id.clone(),
                r.event_type.clone(),
                r.source.clone(),
                r.created.map(format_time).unwrap_or_default(),
                format_time(r.received_at),
                r.payload_bytes.to_string(),
            ]
        })
        .collect();
    table::render(
        &[
            "event id",
            "type",
            "source",
            "created (UTC)",
            "received (UTC)",
            "bytes",
        ],
        &cells,
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_utc_times() {
        assert_eq!(crate::time::format_time(0), "1970-01-01 00:00:00");
        assert_eq!(crate::time::format_time(1721954054), "2024-07-26 00:34:14");
        assert_eq!(crate::time::format_time(1724632454), "2024-08-26 00:34:14");
    }
}
