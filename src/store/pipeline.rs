//! The pipeline, written once for every store: an event's claim, then its handlers, then its
//! outbox row, all in the store's open transaction; and the other writes ([`Write`]).
//!
//! Two forms. [`run_each`]: a savepoint per job, so a job that fails is undone alone (SQLite,
//! where a savepoint costs nothing). [`run_together`]: the batch's claims in one call, the
//! handler the events share on all of them at once, the outbox rows in one call: a few round
//! trips per batch instead of several per event, for a store where each statement is one
//! (PostgreSQL). If the handler fails on the batch, the store runs it again with
//! [`run_each`], so that a bad event fails alone.
//!
//! A store gives the pipeline its open transaction as a [`Batch`]; what differs per store
//! (savepoints, the handler guard, statements that take a batch at once) is there.

use std::sync::Arc;

use crate::event::Event;
use crate::handler::{Handler, Prepared, Submission};
use crate::payload::Stored;
use crate::sql::{Session, StoreError, Tx};
use crate::store::seam::{Done, Outcome, Work, Write};
use crate::store::{ledger, outbox, payload, retention};

/// A store's open transaction, as the pipeline drives it.
pub(crate) trait Batch {
    /// The statements of the transaction.
    fn session(&self) -> &dyn Session;
    fn savepoint(&mut self) -> Result<(), StoreError>;
    /// Ends the job's savepoint; `keep == false` first undoes the job's writes.
    fn release(&mut self, keep: bool) -> Result<(), StoreError>;
    /// Whether the database itself gave up the whole transaction (an I/O error, a full disk, a
    /// broken connection): then no savepoint can be rolled back to, and the batch is lost.
    fn lost(&self) -> bool;

    /// Runs `handler` on a new event, with the store's own checks around it (each store's
    /// own: its time limit, and on SQLite the authorizer's guard).
    fn run_handler(
        &mut self,
        handler: &dyn Handler,
        event: &Event,
        prepared: Prepared,
    ) -> Result<(), StoreError>;

    /// Runs `handler` on several new events at once ([`Handler::handle_all`]), with the
    /// store's own checks around it. (A batch runs together on PostgreSQL only.)
    #[cfg(feature = "postgres")]
    fn run_handler_all(
        &mut self,
        handler: &dyn Handler,
        events: Vec<(&Event, Prepared)>,
    ) -> Result<(), StoreError> {
        handler.handle_all(&Tx::new(self.session()), events)
    }

    /// Runs `write`: the same SQL on every store. A count for the caller.
    fn write(&mut self, write: &Write, now: i64) -> Result<u64, StoreError> {
        write_in(self.session(), write, now)
    }

    /// Claims `event`, with its body as stored: whether it is new. The claim both stores share
    /// ([`ledger::claim`]) unless the store has its own.
    fn claim(&mut self, event: &Event, stored: &Stored, now: i64) -> Result<bool, StoreError> {
        ledger::claim(self.session(), event, stored, now)
    }

    /// Claims each event (with its body as stored), in order; whether each is new (of two
    /// copies of one event, the first). One statement per event unless the store does better.
    #[cfg(feature = "postgres")]
    fn claim_all(
        &mut self,
        events: &[(&Event, &Stored)],
        now: i64,
    ) -> Result<Vec<bool>, StoreError> {
        events
            .iter()
            .map(|(event, stored)| self.claim(event, stored, now))
            .collect()
    }

    /// Queues a `forward` row for each event. One statement per event unless the store does
    /// better.
    #[cfg(feature = "postgres")]
    fn enqueue_all(&mut self, events: &[&Event], now: i64) -> Result<(), StoreError> {
        for event in events {
            outbox::enqueue_forward(self.session(), event, now)?;
        }
        Ok(())
    }
}

/// Runs `work` job by job, each in a savepoint, in the open transaction. `Err` when the
/// transaction is lost (or the database is busy or unreachable, which every other job would
/// wait out again): then nothing of it may be committed, and the handlers' prepared values
/// must be made again ([`prepare_again`]) before `work` runs again.
pub(crate) fn run_each(
    batch: &mut dyn Batch,
    work: &mut [Work<'_>],
    now: i64,
) -> Result<Vec<Done>, StoreError> {
    let mut results = Vec::with_capacity(work.len());
    for job in work {
        batch.savepoint()?;
        let done = match job {
            Work::Event(submission) => Done::Event(apply(batch, submission, now)),
            Work::Write(write) => Done::Write(batch.write(write, now)),
        };
        if let Some(e) = done.error() {
            if batch.lost() || e.is_busy() {
                return Err(e.clone());
            }
        }
        batch.release(done.error().is_none())?;
        results.push(done);
    }
    Ok(results)
}

/// One event: the claim, then (only when it is new) its handlers, then its outbox row. The
/// handlers' prepared values are taken.
fn apply(
    batch: &mut dyn Batch,
    submission: &mut Submission,
    now: i64,
) -> Result<Outcome, StoreError> {
    let Submission {
        event,
        handlers,
        forward,
        routed,
        stored,
        token,
    } = submission;
    let stored = stored.get_or_insert_with(|| crate::payload::compress(&event.body, None));
    if !batch.claim(event, stored, now)? {
        return Ok(Outcome::Duplicate);
    }
    // After the event's own claim: a sender's retry of this event was a duplicate above.
    if let Some(token) = token {
        if !ledger::claim_token(batch.session(), &event.source, token, now)? {
            return Err(StoreError::ReplayedSignature);
        }
    }
    for (handler, prepared) in handlers {
        let prepared = std::mem::replace(prepared, Prepared::none());
        batch.run_handler(&**handler, event, prepared)?;
    }
    if *forward {
        outbox::enqueue_forward(batch.session(), event, now)?;
    }
    for row in routed.iter() {
        outbox::enqueue_routed(batch.session(), event, row, now)?;
    }
    Ok(Outcome::Processed)
}

/// Runs `write` in the open transaction of `tx`: the same SQL on every store. Returns a count
/// for the caller: rows changed or deleted.
pub(crate) fn write_in(tx: &dyn Session, write: &Write, now: i64) -> Result<u64, StoreError> {
    match write {
        Write::Record {
            id,
            queued,
            attempt,
        } => outbox::record(tx, *id, *queued, attempt, now),
        Write::Recover { kind } => outbox::recover(tx, kind, now),
        Write::Coalesce { kind, running } => outbox::coalesce(tx, kind, running, now),
        Write::Coalescing { kinds } => outbox::set_coalescing(tx, kinds),
        Write::Release { id, queued, lease } => outbox::release(tx, *id, *queued, *lease),
        Write::PruneEvents { before } => retention::delete_events_batch(tx, *before),
        Write::PrunePayloads { before } => retention::clear_payloads_batch(tx, *before),
        Write::PruneOutbox { before } => retention::delete_outbox_batch(tx, *before),
        Write::Reclaim => retention::reclaim_batch(tx),
        Write::Revive { id: Some(id) } => Ok(u64::from(outbox::retry(tx, *id, now)?)),
        Write::Revive { id: None } => outbox::retry_all_dead(tx, now),
        Write::ReviveKind { kind } => outbox::retry_dead_of_kind(tx, kind, now),
        Write::Refusals {
            counts,
            messages,
            before,
            messages_kept,
        } => crate::store::refusals::record(tx, counts, messages, *before, *messages_kept),
        Write::Replay { source, event_id } => {
            Ok(u64::from(outbox::replay(tx, source, event_id, now)?))
        }
        Write::Heartbeat { at } => tx.execute(
            "INSERT INTO hookledger_heartbeat (id, at) VALUES (1, $1)
             ON CONFLICT (id) DO UPDATE SET at = excluded.at",
            &[at],
        ),
        Write::Alert(incident) => crate::store::alerts::write(tx, incident, now),
        Write::Dictionary { source, dict } => payload::store_dictionary(tx, source, dict, now),
    }
}

/// The one handler every event of `work` has, if they share one (`Some(None)`: none has a
/// handler); `None` when an event has several, or two events have different ones: then their
/// order across events matters, and they must run job by job.
#[cfg(feature = "postgres")]
pub(crate) fn shared_handler(work: &[Work<'_>]) -> Option<Option<Arc<dyn Handler>>> {
    let mut shared: Option<Arc<dyn Handler>> = None;
    for job in work {
        let Work::Event(submission) = job else {
            continue;
        };
        // A token is claimed event by event, after each event's claim.
        if submission.token.is_some() {
            return None;
        }
        match submission.handlers.as_slice() {
            [] => {}
            [(handler, _)] if shared.as_ref().is_none_or(|h| Arc::ptr_eq(h, handler)) => {
                shared = Some(handler.clone());
            }
            _ => return None,
        }
    }
    Some(shared)
}

/// The batch together, in the open transaction: the other writes, each in a savepoint (they
/// are few: attempt results, retention, the CLI's); the events' claims at once
/// ([`Batch::claim_all`]); `handler`, which they share, on all new events at once
/// ([`Handler::handle_all`]); their outbox rows at once. `Ok(None)` when the handler failed:
/// then the transaction must be rolled back and the batch run again job by job, and each new
/// event's prepared value was made again for that.
#[cfg(feature = "postgres")]
pub(crate) fn run_together(
    batch: &mut dyn Batch,
    work: &mut [Work<'_>],
    handler: Option<&Arc<dyn Handler>>,
    now: i64,
) -> Result<Option<Vec<Done>>, StoreError> {
    let mut results = Vec::with_capacity(work.len());
    let mut events = Vec::new();
    for job in work.iter_mut() {
        match job {
            Work::Write(write) => {
                batch.savepoint()?;
                let done = batch.write(write, now);
                if let Err(e) = &done {
                    if batch.lost() {
                        return Err(e.clone());
                    }
                }
                batch.release(done.is_ok())?;
                results.push(Some(Done::Write(done)));
            }
            Work::Event(submission) => {
                results.push(None);
                events.push(submission);
            }
        }
    }
    for s in events.iter_mut() {
        if s.stored.is_none() {
            s.stored = Some(crate::payload::compress(&s.event.body, None));
        }
    }
    let all: Vec<(&Event, &Stored)> = events
        .iter()
        .filter_map(|s| Some((&s.event, s.stored.as_ref()?)))
        .collect();
    let new = batch.claim_all(&all, now)?;
    let mut fresh: Vec<&mut Submission> = events
        .into_iter()
        .zip(&new)
        .filter_map(|(s, new)| new.then_some(s))
        .collect();
    if let Some(handler) = handler {
        let all = fresh
            .iter_mut()
            .filter_map(|s| {
                let (_, prepared) = s.handlers.first_mut()?;
                Some((&s.event, std::mem::replace(prepared, Prepared::none())))
            })
            .collect();
        if let Err(e) = batch.run_handler_all(&**handler, all) {
            if batch.lost() || e.is_busy() {
                return Err(e);
            }
            log::warn!(
                "writer: {} failed on a batch of {} ({e}); applying them one by one",
                handler.name(),
                fresh.len()
            );
            prepare_again(work);
            return Ok(None);
        }
    }
    let forwards: Vec<&Event> = fresh
        .iter()
        .filter(|s| s.forward)
        .map(|s| &s.event)
        .collect();
    if !forwards.is_empty() {
        batch.enqueue_all(&forwards, now)?;
    }
    // Rows of routes, one statement each: few events have them.
    for s in &fresh {
        for row in &s.routed {
            outbox::enqueue_routed(batch.session(), &s.event, row, now)?;
        }
    }
    let mut new = new.into_iter();
    Ok(Some(
        results
            .into_iter()
            .map(|done| {
                done.unwrap_or_else(|| {
                    Done::Event(Ok(match new.next() {
                        Some(true) => Outcome::Processed,
                        _ => Outcome::Duplicate,
                    }))
                })
            })
            .collect(),
    ))
}

/// Makes again the prepared values a handler's `handle_all` took, for a run job by job.
pub(crate) fn prepare_again(work: &mut [Work<'_>]) {
    for job in work {
        let Work::Event(s) = job else {
            continue;
        };
        for (handler, prepared) in &mut s.handlers {
            match handler.prepare(&s.event) {
                Ok(again) => *prepared = again,
                // It cannot run without its prepared value: the event fails (and is retried).
                Err(e) => {
                    *handler = Arc::new(Unprepared {
                        name: handler.name().to_string(),
                        error: e.to_string(),
                    });
                    *prepared = Prepared::none();
                }
            }
        }
    }
}

/// Makes the events of `work` keyed `(source, id)` (one event, and any copies of it) fail with
/// `error` when they run again, without running their handlers: a run of the batch that one
/// of them lost (by running over its time limit) is not run again; whether there was one.
pub(crate) fn fail_event(
    work: &mut [Work<'_>],
    (source, id): (&str, &str),
    error: &StoreError,
) -> bool {
    let mut found = false;
    for job in work {
        let Work::Event(submission) = job else {
            continue;
        };
        if &*submission.event.source != source || submission.event.id != id {
            continue;
        }
        let name = submission
            .handlers
            .first()
            .map_or("a handler", |(h, _)| h.name())
            .to_string();
        let failed = Failed {
            name,
            error: error.clone(),
        };
        submission.handlers = vec![(Arc::new(failed), Prepared::none())];
        found = true;
    }
    found
}

/// Stands in for the handlers of an event that failed in an earlier run of its batch.
struct Failed {
    name: String,
    error: StoreError,
}

impl Handler for Failed {
    fn name(&self) -> &str {
        &self.name
    }

    fn handle(&self, _: &Tx<'_>, _: &Event, _: Prepared) -> Result<(), StoreError> {
        Err(self.error.clone())
    }
}

/// Stands in for a handler whose `prepare` failed the second time: the event fails.
struct Unprepared {
    name: String,
    error: String,
}

impl Handler for Unprepared {
    fn name(&self) -> &str {
        &self.name
    }

    fn handle(&self, _: &Tx<'_>, event: &Event, _: Prepared) -> Result<(), StoreError> {
        Err(StoreError::Database(format!(
            "{} could not prepare {} again: {}",
            self.name, event.id, self.error
        )))
    }
}
