//! `hookledger check` on SQLite: an fsck for the ledger (DESIGN.md §21). Everything the claim
//! path relies on and cannot see for itself:
//!
//! - no `(source, event_id)` twice (the key index is unique only within a block of 2^16 ids):
//!   the keys in key order, each compared with the one before (SQLite's sorter spills to temp
//!   files: memory stays bounded however large the ledger);
//! - every stored payload decodes, one at a time;
//! - every outbox row that delivers its event's payload (`payload_ref = 1`) has its event;
//! - the saved filter of keys (`claims.rs`), if any: whole (checksum, identity, the ledger
//!   unchanged since its save), and holding every key it claims to cover; the triggers that
//!   guard it are there;
//! - claims whose key is not UTF-8 text (written by other code: the claim path skips them).
//!
//! Read-only: it runs beside `serve`, on one read transaction (one snapshot).

use std::path::Path;

use rusqlite::types::ValueRef;
use rusqlite::Connection;
use serde::Serialize;

use super::claims::{self, key_of};
use crate::store::ledger::SQLITE_CLAIMED_IN;

/// At most this many problems of one kind are listed (all are counted).
const LISTED: usize = 20;

/// What [`check`] found.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Report {
    pub(crate) claims: u64,
    pub(crate) payloads: u64,
    pub(crate) outbox_refs: u64,
    /// The saved filter: "none", "refused: …" (it will be built at the next start), or
    /// "whole: N keys checked".
    pub(crate) saved_filter: String,
    /// Problems by kind, counted; a few of each listed.
    pub(crate) problems: Vec<Problem>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Problem {
    /// `duplicate_key`, `unreadable_key`, `payload`, `outbox_ref`, `filter`, `trigger`.
    pub(crate) kind: &'static str,
    pub(crate) count: u64,
    /// The first few, each one line.
    pub(crate) examples: Vec<String>,
}

impl Report {
    fn found(&mut self, kind: &'static str, example: impl FnOnce() -> String) {
        let at = match self.problems.iter().position(|p| p.kind == kind) {
            Some(at) => at,
            None => {
                self.problems.push(Problem {
                    kind,
                    count: 0,
                    examples: Vec::new(),
                });
                self.problems.len() - 1
            }
        };
        let problem = &mut self.problems[at];
        problem.count += 1;
        if problem.examples.len() < LISTED {
            problem.examples.push(example());
        }
    }

    pub(crate) fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks the database at `path`.
pub(crate) fn check(path: &Path) -> anyhow::Result<Report> {
    let conn = super::open_read(path)?;
    // Sorting a ledger larger than memory: in temp files.
    conn.pragma_update(None, "temp_store", "FILE")?;
    conn.execute_batch("BEGIN")?;
    let report = check_in(&conn);
    let _ = conn.execute_batch("COMMIT");
    Ok(report?)
}

fn check_in(conn: &Connection) -> rusqlite::Result<Report> {
    let mut report = Report::default();
    keys(conn, &mut report)?;
    payloads(conn, &mut report)?;
    outbox_refs(conn, &mut report)?;
    saved_filter(conn, &mut report)?;
    Ok(report)
}

/// Every key in key order, compared with its neighbour: a key twice is in two blocks.
fn keys(conn: &Connection, report: &mut Report) -> rusqlite::Result<()> {
    let mut keys =
        conn.prepare("SELECT source, event_id, id FROM webhook_events ORDER BY source, event_id")?;
    let mut rows = keys.query([])?;
    let mut last: Option<(Vec<u8>, Vec<u8>, i64)> = None;
    while let Some(row) = rows.next()? {
        report.claims += 1;
        let id: i64 = row.get(2)?;
        let (source, event_id) = (row.get_ref(0)?, row.get_ref(1)?);
        if key_of(source, event_id).is_none() {
            report.found("unreadable_key", || {
                format!(
                    "claim {id}: source {}, event_id {} (not UTF-8 text: skipped by the claim \
                     path)",
                    describe(source),
                    describe(event_id)
                )
            });
            continue;
        }
        let (source, event_id) = (source.as_bytes()?, event_id.as_bytes()?);
        if let Some((s, e, first)) = &last {
            if s == source && e == event_id {
                report.found("duplicate_key", || {
                    format!(
                        "source {}, event_id {}: claims {first} and {id}",
                        String::from_utf8_lossy(source),
                        String::from_utf8_lossy(event_id)
                    )
                });
                continue;
            }
        }
        last = Some((source.to_vec(), event_id.to_vec(), id));
    }
    Ok(())
}

/// A value of a column that should be text, for a report line.
fn describe(value: ValueRef<'_>) -> String {
    match value {
        ValueRef::Text(t) => match std::str::from_utf8(t) {
            Ok(t) => format!("{t:?}"),
            Err(_) => format!("text x'{}' (invalid UTF-8)", hex::encode(t)),
        },
        ValueRef::Blob(b) => format!("blob x'{}'", hex::encode(b)),
        ValueRef::Integer(i) => format!("integer {i}"),
        ValueRef::Real(r) => format!("real {r}"),
        ValueRef::Null => "NULL".to_string(),
    }
}

/// Every stored payload, decoded one at a time.
fn payloads(conn: &Connection, report: &mut Report) -> rusqlite::Result<()> {
    let mut stored = conn.prepare(
        "SELECT id, payload, payload_codec, payload_dict FROM webhook_events
         WHERE payload IS NOT NULL",
    )?;
    let mut rows = stored.query([])?;
    while let Some(row) = rows.next()? {
        report.payloads += 1;
        let id: i64 = row.get(0)?;
        let read = (|| -> Result<(), String> {
            let bytes = match row.get_ref(1).map_err(|e| e.to_string())? {
                ValueRef::Blob(b) | ValueRef::Text(b) => b.to_vec(),
                other => return Err(format!("a payload of type {:?}", other.data_type())),
            };
            let codec: Option<i64> = row.get(2).map_err(|e| e.to_string())?;
            let dict: Option<i64> = row.get(3).map_err(|e| e.to_string())?;
            crate::payload::decompress(bytes, codec, dict, |id| {
                crate::store::payload::dictionary(conn, id).map_err(|e| e.to_string())
            })
            .map(drop)
            .map_err(|e| e.to_string())
        })();
        if let Err(why) = read {
            report.found("payload", || format!("claim {id}: {why}"));
        }
    }
    Ok(())
}

/// Every outbox row that delivers its event's payload has its event (one seek a block).
fn outbox_refs(conn: &Connection, report: &mut Report) -> rusqlite::Result<()> {
    let blocks: Vec<i64> = conn
        .prepare(crate::store::ledger::SQLITE_BLOCKS)?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut seek = conn.prepare(SQLITE_CLAIMED_IN)?;
    let mut refs =
        conn.prepare("SELECT id, kind, source, key FROM outbox WHERE payload_ref = 1 ORDER BY id")?;
    let mut rows = refs.query([])?;
    while let Some(row) = rows.next()? {
        report.outbox_refs += 1;
        let (id, kind): (i64, String) = (row.get(0)?, row.get(1)?);
        let (source, key): (String, String) = (row.get(2)?, row.get(3)?);
        let mut found = false;
        for &block in blocks.iter().rev() {
            if seek.exists(rusqlite::params![block, &source, &key])? {
                found = true;
                break;
            }
        }
        if !found {
            report.found("outbox_ref", || {
                format!(
                    "outbox row {id} ({kind}) delivers event {key} of source {source}, which \
                     is not in the ledger"
                )
            });
        }
    }
    Ok(())
}

/// The triggers that guard the saved filter, and the saved filter, if any.
fn saved_filter(conn: &Connection, report: &mut Report) -> rusqlite::Result<()> {
    for name in claims::missing_triggers(conn)? {
        report.found("trigger", || {
            format!(
                "trigger {name} on webhook_events is gone: writes by other code no longer \
                 invalidate a saved filter"
            )
        });
    }
    report.saved_filter = match claims::saved_filter(conn) {
        Ok(None) => "none".to_string(),
        Ok(Some(Err(refusal))) => {
            if refusal.damaged {
                report.found("filter", || {
                    format!("the saved filter is damaged: {}", refusal.why)
                });
            }
            format!("refused, the next start builds it: {}", refusal.why)
        }
        Err(e) => {
            report.found("filter", || format!("the saved filter cannot be read: {e}"));
            "unreadable".to_string()
        }
        Ok(Some(Ok((filter, seen)))) => {
            let mut keys =
                conn.prepare("SELECT id, source, event_id FROM webhook_events WHERE id <= ?1")?;
            let mut rows = keys.query([seen])?;
            let mut checked = 0u64;
            while let Some(row) = rows.next()? {
                let Some(hash) = key_of(row.get_ref(1)?, row.get_ref(2)?) else {
                    continue;
                };
                checked += 1;
                if !filter.may_contain(hash) {
                    let id: i64 = row.get(0)?;
                    report.found("filter", || {
                        format!("the saved filter lacks claim {id}, which it covers")
                    });
                }
            }
            format!("whole: {checked} key(s) found in it")
        }
    };
    Ok(())
}

/// The report as text: one line a kind of problem and its examples, then a summary.
pub(crate) fn render(path: &Path, report: &Report) -> String {
    let mut out = String::new();
    for p in &report.problems {
        out.push_str(&format!("problem: {} ({})\n", p.kind, p.count));
        for e in &p.examples {
            out.push_str(&format!("  {e}\n"));
        }
        if p.count as usize > p.examples.len() {
            out.push_str(&format!(
                "  … and {} more\n",
                p.count as usize - p.examples.len()
            ));
        }
    }
    out.push_str(&format!(
        "{}: {} claim(s), {} payload(s) decoded, {} outbox row(s) referring to events, saved \
         filter {}; {}\n",
        path.display(),
        report.claims,
        report.payloads,
        report.outbox_refs,
        report.saved_filter,
        match report.problems.iter().map(|p| p.count).sum::<u64>() {
            0 => "no problem found".to_string(),
            n => format!("{n} problem(s) found"),
        }
    ));
    out
}
