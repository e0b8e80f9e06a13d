//! The writer without HTTP, on stripe-billing: what the bench's writer ceiling drives (its loop
//! and its clock are the bench's, in `tools/`).

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use tokio::sync::oneshot;

use crate::config::{WriterConfig, DEFAULT_BUSY_TIMEOUT};
use crate::event::Event;
use crate::handler::{Handler, Submission};
use crate::source::stripe;
use crate::sql::StoreError;
use crate::store::sqlite::SqliteStore;
use crate::store::{Outcome, Store};
use crate::stripe::billing::{StripeBilling, DEFAULT_CREDITS_PER_INVOICE, SCHEMA};
use crate::writer::{self, Writer, WriterHandle};

/// The real writer and SQLite store, and the stripe-billing handler, on a fresh database.
pub struct BillingWriter {
    handle: WriterHandle,
    writer: Writer,
    billing: Arc<dyn Handler>,
}

/// An event submitted: its outcome arrives after COMMIT.
pub struct Pending(oneshot::Receiver<Result<Outcome, StoreError>>);

/// A Stripe event decoded for the writer, before the clock starts.
pub struct Prepared(Submission);

impl BillingWriter {
    /// Opens `db` (created) with a queue of `queue_depth` jobs.
    pub fn open(db: &Path, queue_depth: usize) -> anyhow::Result<BillingWriter> {
        let mut store = SqliteStore::open(db, DEFAULT_BUSY_TIMEOUT)?;
        store.migrate_handler(&SCHEMA)?;
        let config = WriterConfig {
            queue_depth: queue_depth.max(1),
            ..WriterConfig::default()
        };
        let (handle, writer) = writer::spawn(Box::new(store), config, None, Default::default())?;
        Ok(BillingWriter {
            handle,
            writer,
            billing: Arc::new(StripeBilling {
                credits_per_invoice: DEFAULT_CREDITS_PER_INVOICE,
                refresh: None,
            }),
        })
    }

    /// Reads and prepares the Stripe event `body` as the request path does.
    pub fn prepare(&self, body: &[u8]) -> anyhow::Result<Prepared> {
        let envelope = stripe::envelope(body)?;
        let event = Event {
            source: Arc::from("stripe"),
            id: envelope.id,
            kind: envelope.kind,
            created: envelope.created,
            body: bytes::Bytes::copy_from_slice(body),
        };
        let prepared = self.billing.prepare(&event)?;
        let stored = Some(crate::payload::compress(&event.body, None));
        Ok(Prepared(Submission {
            token: None,
            event,
            handlers: vec![(self.billing.clone(), prepared)],
            forward: false,
            routed: Vec::new(),
            stored,
        }))
    }

    /// Queues `event` without waiting (a full queue is an error).
    pub fn submit(&self, event: Prepared) -> anyhow::Result<Pending> {
        Ok(Pending(self.handle.try_submit(event.0)?))
    }

    /// Lets the writer commit what is queued and stop.
    pub fn close(self) {
        drop(self.handle);
        self.writer.join();
    }
}

impl Pending {
    /// Waits for the outcome.
    pub fn wait(self) -> anyhow::Result<Outcome> {
        Ok(self.0.blocking_recv().context("the writer stopped")??)
    }
}
