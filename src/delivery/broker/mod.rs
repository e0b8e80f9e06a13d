//! Delivery into a message broker: a `[[delivery]]` with `nats`, `amqp` or `redis`. One file
//! per broker, each a [`Target`] that publishes a row and returns once the broker has confirmed
//! it (the stream's ack, the publisher confirm, the script's reply), so that a row is done only
//! when the broker has it. Each is deduplicated by the broker on the row's [`message_id`]: a
//! retry after a crash between the publish and the row's write does not publish twice
//! (RabbitMQ has no such dedupe: its consumers see `message_id` twice, at least once).
//!
//! The clients are async (NATS, AMQP): each target owns a small runtime whose thread drives the
//! connection, and an attempt thread blocks on its publish. Redis's client is blocking.
//!
//! Each broker is a cargo feature; a build without some of them compiles what they share
//! without using all of it.
#![cfg_attr(
    not(all(feature = "nats", feature = "amqp", feature = "redis")),
    allow(dead_code, unused_imports, unused_variables)
)]

use std::time::Duration;

use crate::config::{Broker, BrokerTarget};
use crate::outbox::{PendingRow, Target};

#[cfg(feature = "amqp")]
mod amqp;
#[cfg(feature = "nats")]
mod nats;
#[cfg(feature = "redis")]
mod redis;

/// The target that publishes `kind`'s rows to `target`'s broker. What can be checked at
/// start-up is (the stream exists, holds the subject): a mistake stops start-up naming its
/// key; a broker that does not answer is warned of, and its rows wait in the lane's retries.
pub(crate) fn open(kind: &str, target: &BrokerTarget) -> anyhow::Result<Box<dyn Target>> {
    let at = format!("delivery `{kind}`.{}", target.broker.name());
    let check = target.timeout.min(START_CHECK);
    match &target.broker {
        #[cfg(feature = "nats")]
        Broker::Nats(config) => Ok(Box::new(nats::Nats::open(
            config,
            &at,
            target.timeout,
            check,
        )?)),
        #[cfg(feature = "amqp")]
        Broker::Amqp(config) => Ok(Box::new(amqp::Amqp::open(
            config,
            &at,
            target.timeout,
            check,
        )?)),
        #[cfg(feature = "redis")]
        Broker::Redis(config) => {
            // As long as the row may be attempted again, and a day.
            let guard_for = target.schedule.iter().sum::<Duration>() + Duration::from_secs(86_400);
            Ok(Box::new(redis::Redis::open(
                config,
                &at,
                target.timeout,
                check,
                guard_for,
            )?))
        }
        // The config refuses a broker this build lacks (`Broker::check`).
        #[allow(unreachable_patterns)]
        other => anyhow::bail!("{at}: this build cannot publish to {}", other.name()),
    }
}

/// The longest the start-up checks wait for a broker before going on without them.
const START_CHECK: Duration = Duration::from_secs(5);

/// The id the broker deduplicates a row's message by: the same for every attempt of the row as
/// queued (`kind:id:queued`), a new one when the row is queued again (a replay, meant to be
/// delivered again). Row ids are the database's: two hookledger databases publishing to one
/// stream keep their kinds' names apart.
pub(crate) fn message_id(row: &PendingRow) -> String {
    format!("{}:{}:{}", row.kind, row.id, row.queued)
}

/// The metadata each message carries beside the verified body, as headers (NATS, AMQP) or as
/// fields of the entry (Redis): the same names everywhere, those a `command` gets as variables.
pub(crate) fn metadata(row: &PendingRow) -> [(&'static str, &str); 5] {
    [
        ("hookledger-source", row.source.as_str()),
        ("hookledger-event-id", row.key.as_str()),
        (
            "hookledger-event-type",
            row.event_type.as_deref().unwrap_or(""),
        ),
        ("hookledger-kind", row.kind.as_str()),
        ("hookledger-key", row.key.as_str()),
    ]
}

/// A tokio runtime of one thread that drives an async client's connection, shut down without
/// waiting when the target goes (which may be inside another runtime, where a plain drop of a
/// runtime panics).
#[cfg(any(feature = "nats", feature = "amqp"))]
pub(crate) struct Io(Option<tokio::runtime::Runtime>);

#[cfg(any(feature = "nats", feature = "amqp"))]
impl Io {
    pub(crate) fn new(name: &str) -> anyhow::Result<Io> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(name)
            .enable_all()
            .build()?;
        Ok(Io(Some(runtime)))
    }

    /// Runs `future` to its end on this runtime, from a thread outside any runtime.
    pub(crate) fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.0.as_ref().expect("until dropped").block_on(future)
    }

    /// `future`, or `None` once `limit` has passed.
    pub(crate) fn within<F: std::future::Future>(
        &self,
        limit: Duration,
        future: F,
    ) -> Option<F::Output> {
        self.block_on(async { tokio::time::timeout(limit, future).await.ok() })
    }
}

#[cfg(any(feature = "nats", feature = "amqp"))]
impl Drop for Io {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, queued: i64) -> PendingRow {
        PendingRow {
            id,
            kind: "events".into(),
            source: "gh".into(),
            key: "d-1".into(),
            event_type: Some("push".into()),
            attempts: 3,
            queued,
            lease: None,
        }
    }

    #[test]
    fn a_row_keeps_its_message_id_across_attempts_and_a_replay_gets_a_new_one() {
        let first = row(7, 1);
        let retried = PendingRow {
            attempts: 9,
            ..first.clone()
        };
        assert_eq!(message_id(&first), "events:7:1");
        assert_eq!(message_id(&retried), message_id(&first));
        assert_eq!(message_id(&row(7, 2)), "events:7:2");
        assert_ne!(message_id(&row(8, 1)), message_id(&first));
    }

    #[test]
    fn the_metadata_names_the_source_event_type_kind_and_key() {
        let mut untyped = row(1, 1);
        untyped.event_type = None;
        assert_eq!(
            metadata(&row(1, 1)),
            [
                ("hookledger-source", "gh"),
                ("hookledger-event-id", "d-1"),
                ("hookledger-event-type", "push"),
                ("hookledger-kind", "events"),
                ("hookledger-key", "d-1"),
            ]
        );
        assert_eq!(metadata(&untyped)[2], ("hookledger-event-type", ""));
    }
}
