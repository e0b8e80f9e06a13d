//! NATS JetStream: each row published to the subject with `Nats-Msg-Id` (the row's
//! [`message_id`]) and `Nats-Expected-Stream`, done on the stream's ack. The stream drops a
//! second message with the same id within its duplicate window, so a retry after a crash is
//! stored once.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::context::{GetStreamErrorKind, PublishErrorKind};
use async_nats::jetstream::{self, stream};
use async_nats::HeaderMap;

use super::{message_id, metadata, Io};
use crate::config::NatsConfig;
use crate::delivery::shown_url;
use crate::outbox::{Failure, FollowUp, PendingRow, Target};

/// The duplicate window of a stream hookledger creates (`create = true`), and the least one
/// it does not warn of: a row published, then attempted again by a server restarted within
/// 2 hours (a crash before the row was marked done), is stored once.
const CREATED_WINDOW: Duration = Duration::from_secs(2 * 3600);

pub(crate) struct Nats {
    /// Dropped after `jetstream`, whose connection it drives.
    io: Io,
    /// Its connection's state: an attempt while it is down fails at once.
    client: async_nats::Client,
    jetstream: jetstream::Context,
    subject: String,
    stream: String,
    /// The server, for messages (no credentials).
    shown: String,
}

impl Nats {
    /// Connects (in the background when the server does not answer: the client reconnects by
    /// itself) and checks, when the server answers within `check`, that the stream exists (or
    /// creates it) and that it holds the subject.
    pub(crate) fn open(
        config: &NatsConfig,
        at: &str,
        timeout: Duration,
        check: Duration,
    ) -> anyhow::Result<Nats> {
        let io = Io::new("hookledger-nats")?;
        let shown = shown_url(config.url.expose());
        let told = format!("{at}: NATS at {shown}");
        let client = io
            .block_on(
                async_nats::ConnectOptions::new()
                    .retry_on_initial_connect()
                    .connection_timeout(timeout)
                    // Tried again after 0.1 s, doubling up to 5 s, while it is down.
                    .reconnect_delay_callback(|attempts| {
                        Duration::from_millis(100 << attempts.min(6)).min(RECONNECT_MAX)
                    })
                    .event_callback(move |event| {
                        tell(&told, &event);
                        async {}
                    })
                    .name(concat!("hookledger/", env!("CARGO_PKG_VERSION")))
                    .connect(config.url.expose()),
            )
            .map_err(|e| anyhow::anyhow!("{at}.url: cannot connect to {shown}: {e}"))?;
        // Its acker is a task of the runtime's.
        let jetstream = io.block_on(async {
            let mut jetstream = jetstream::new(client);
            jetstream.set_timeout(timeout);
            jetstream
        });
        let nats = Nats {
            io,
            client: jetstream.client(),
            jetstream,
            subject: config.subject.clone(),
            stream: config.stream.clone(),
            shown,
        };
        match nats.io.within(check, nats.check(config, at)) {
            Some(checked) => checked?,
            None => log::warn!(
                "{at}: NATS at {} did not answer within {check:?}, so the stream `{}` is not \
                 checked; its rows are attempted, and retried, until it answers",
                nats.shown,
                nats.stream
            ),
        }
        Ok(nats)
    }

    async fn check(&self, config: &NatsConfig, at: &str) -> anyhow::Result<()> {
        let info = match self.jetstream.get_stream(&self.stream).await {
            Ok(stream) => stream.cached_info().config.clone(),
            Err(e) if stream_not_found(&e) && config.create => {
                let created = self
                    .jetstream
                    .create_stream(stream::Config {
                        name: self.stream.clone(),
                        subjects: vec![self.subject.clone()],
                        storage: stream::StorageType::File,
                        duplicate_window: CREATED_WINDOW,
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| anyhow::anyhow!("{at}.stream: cannot create it: {e}"))?;
                log::info!("{at}: created the JetStream stream `{}`", self.stream);
                created.cached_info().config.clone()
            }
            Err(e) if stream_not_found(&e) => anyhow::bail!(
                "{at}.stream: there is no JetStream stream `{}` at {} (make it, e.g. `nats \
                 stream add {} --subjects '{}' --dupe-window 2h`, or set `create = true`)",
                self.stream,
                self.shown,
                self.stream,
                self.subject
            ),
            Err(e) => anyhow::bail!(
                "{at}.stream: cannot read the stream `{}` at {}: {e}",
                self.stream,
                self.shown
            ),
        };
        if !info
            .subjects
            .iter()
            .any(|s| subject_matches(s, &self.subject))
        {
            anyhow::bail!(
                "{at}.subject: the stream `{}` does not take `{}` (its subjects: {})",
                self.stream,
                self.subject,
                info.subjects.join(", ")
            );
        }
        if info.duplicate_window < CREATED_WINDOW {
            log::warn!(
                "{at}: the stream `{}` drops duplicates within {:?} only: a row published just \
                 before a crash and attempted again later than that may be stored twice (set \
                 its duplicate window to 2h or more)",
                self.stream,
                info.duplicate_window
            );
        }
        Ok(())
    }
}

/// The longest wait between two tries to reach a server that is down.
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// The client's events in hookledger's log: a connection made or lost once each, the tries
/// to reach a server that is down at debug level only (the rows' errors say it).
fn tell(who: &str, event: &async_nats::Event) {
    match event {
        async_nats::Event::Connected => log::info!("{who}: connected"),
        async_nats::Event::Disconnected => log::warn!("{who}: disconnected, reconnecting"),
        async_nats::Event::ClientError(e) => log::debug!("{who}: {e}"),
        other => log::info!("{who}: {other}"),
    }
}

fn stream_not_found(e: &jetstream::context::GetStreamError) -> bool {
    matches!(e.kind(), GetStreamErrorKind::JetStream(e)
        if e.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND)
}

/// Whether the stream refused the message for its size (its `max_msg_size`, or its headers'):
/// a retry would change nothing.
fn too_large(e: &jetstream::context::PublishError) -> bool {
    if e.kind() == PublishErrorKind::MaxPayloadExceeded {
        return true;
    }
    let code = std::error::Error::source(e)
        .and_then(|source| source.downcast_ref::<jetstream::Error>())
        .map(jetstream::Error::error_code);
    matches!(
        code,
        Some(
            jetstream::ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM
                | jetstream::ErrorCode::STREAM_HEADER_EXCEEDS_MAXIMUM
        )
    )
}

/// Whether the stream's subject `filter` (with `*` for one token and `>` for the rest) takes
/// `subject`.
fn subject_matches(filter: &str, subject: &str) -> bool {
    let mut tokens = subject.split('.');
    for want in filter.split('.') {
        match (want, tokens.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (want, Some(token)) if want == token => {}
            _ => return false,
        }
    }
    tokens.next().is_none()
}

impl Nats {
    /// Whether the client is connected, or connects within [`CONNECTED_WITHIN`] (just after
    /// the start, or a server's restart): while it is down, an attempt fails at once rather
    /// than wait out its timeout.
    fn connected(&self) -> bool {
        let is_connected =
            || self.client.connection_state() == async_nats::connection::State::Connected;
        is_connected()
            || self
                .io
                .within(CONNECTED_WITHIN, async {
                    while !is_connected() {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                })
                .is_some()
    }
}

/// How long an attempt waits for a connection being made.
const CONNECTED_WITHIN: Duration = Duration::from_secs(2);

impl Target for Nats {
    fn attempt(
        &self,
        row: &PendingRow,
        payload: &[u8],
    ) -> Result<Option<Arc<dyn FollowUp>>, Failure> {
        if !self.connected() {
            return Err(Failure::Transport(format!(
                "NATS at {}: not connected (reconnecting)",
                self.shown
            )));
        }
        let mut headers = HeaderMap::new();
        for (name, value) in metadata(row) {
            headers.insert(name, value);
        }
        let message = jetstream::message::PublishMessage::build()
            .payload(payload.to_vec().into())
            .headers(headers)
            .message_id(message_id(row))
            .expected_stream(&self.stream);
        let published = self.io.block_on(async {
            self.jetstream
                .send_publish(self.subject.clone(), message)
                .await?
                .await
        });
        match published {
            Ok(_) => Ok(None),
            Err(e) if too_large(&e) => Err(Failure::Refused(format!(
                "NATS at {} refused the message: {e}",
                self.shown
            ))),
            Err(e) if e.kind() == PublishErrorKind::StreamNotFound => {
                Err(Failure::Transport(format!(
                    "NATS at {}: no stream takes `{}` (is the stream `{}` there?): {e}",
                    self.shown, self.subject, self.stream
                )))
            }
            Err(e) => Err(Failure::Transport(format!("NATS at {}: {e}", self.shown))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::subject_matches;

    #[test]
    fn a_stream_subject_with_wildcards_takes_the_subjects_it_names() {
        for (filter, subject, takes) in [
            ("events", "events", true),
            ("events", "events.gh", false),
            ("events.*", "events.gh", true),
            ("events.*", "events.gh.push", false),
            ("events.>", "events.gh.push", true),
            ("events.>", "events", false),
            (">", "anything.at.all", true),
            ("events.*.push", "events.gh.push", true),
            ("events.*.push", "events.gh.pull", false),
        ] {
            assert_eq!(
                subject_matches(filter, subject),
                takes,
                "{filter} / {subject}"
            );
        }
    }
}
