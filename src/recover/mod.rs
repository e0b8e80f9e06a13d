//! Recovery of events a provider will not resend, shared by each provider's run (Stripe's
//! `reconcile` in the Stripe wing): what a run counts, the lookup that skips the events the
//! ledger has, and the apply that claims the rest through the writer, as webhooks are.

use crate::event::Event;
use crate::source::Source;
use crate::store::ledger::by_key;
use crate::store::{Outcome, Reader};
use crate::writer::WriterHandle;

/// What a run found and did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Counts {
    /// Events Stripe listed.
    pub(crate) found: u64,
    /// Claimed and applied now (with `--dry-run`: would be).
    pub(crate) applied: u64,
    /// Claimed already (by a webhook or an earlier run).
    pub(crate) already_present: u64,
    /// Not applied: unreadable, refused by a handler, or the database failed.
    pub(crate) failed: u64,
}

/// Claims and applies `events` through `writer`, as webhooks are: counted applied, already
/// present (a webhook or another run came first) or failed (logged).
pub(crate) fn apply(
    source: &Source,
    events: Vec<Event>,
    writer: &WriterHandle,
    counts: &mut Counts,
) {
    let mut waiting = Vec::with_capacity(events.len());
    for event in events {
        let id = event.id.clone();
        match source.submission(event) {
            Ok(submission) => match writer.submit_blocking(submission) {
                Ok(reply) => waiting.push((id, reply)),
                Err(e) => {
                    log::error!("reconcile {} {id}: {e}", source.name);
                    counts.failed += 1;
                }
            },
            Err(e) => {
                log::error!("reconcile {} {id}: refused: {}", source.name, e.summary());
                counts.failed += 1;
            }
        }
    }
    for (id, reply) in waiting {
        match reply.blocking_recv() {
            Ok(Ok(Outcome::Processed)) => {
                log::info!("reconcile {} {id}: applied", source.name);
                counts.applied += 1;
            }
            Ok(Ok(Outcome::Duplicate)) => counts.already_present += 1,
            Ok(Err(e)) => {
                log::error!("reconcile {} {id}: {e}", source.name);
                counts.failed += 1;
            }
            Err(_) => {
                log::error!("reconcile {} {id}: the writer stopped", source.name);
                counts.failed += 1;
            }
        }
    }
}

/// `events` without those the ledger has (counted as present); a failed read counts failed.
pub(crate) fn without_present(
    source: &Source,
    events: Vec<Event>,
    reader: &Reader,
    counts: &mut Counts,
) -> Vec<Event> {
    let mut missing = Vec::with_capacity(events.len());
    for event in events {
        let present = reader.read(|ledger| {
            Ok(ledger.query(
                &by_key(ledger.dialect(), "1", "$1", "$2"),
                &[&&*source.name, &event.id],
            )?)
        });
        match present {
            Ok(rows) if rows.is_empty() => missing.push(event),
            Ok(_) => counts.already_present += 1,
            Err(e) => {
                log::error!("reconcile {} {}: {e}", source.name, event.id);
                counts.failed += 1;
            }
        }
    }
    missing
}
