//! RabbitMQ (AMQP 0-9-1): each row published persistent (`delivery_mode` 2) and mandatory, with
//! `message_id` = the row's [`message_id`], on a channel in confirm mode; done when the broker
//! confirms it. A message no queue takes comes back (mandatory) and is retried, not lost. The
//! broker has no dedupe of its own: after a crash between the confirm and the row's write the
//! message is there twice, with one `message_id`.

use std::sync::Arc;
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable};
use lapin::Confirmation;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};

use super::{message_id, metadata, Io};
use crate::config::AmqpConfig;
use crate::delivery::shown_url;
use crate::outbox::{Failure, FollowUp, PendingRow, Target};

pub(crate) struct Amqp {
    io: Io,
    config: AmqpConfig,
    /// The connection and its confirm-mode channel, each opened again after it closes (one
    /// attempt at a time opens them, the others wait for it).
    open: tokio::sync::Mutex<(Option<Connection>, Option<Channel>)>,
    timeout: Duration,
    shown: String,
}

impl Amqp {
    /// Connects and checks, when the broker answers within `check`, that the exchange exists
    /// (declared passive: nothing is created or changed). A broker that does not answer, or
    /// refuses the credentials, is warned of: the rows wait in the lane's retries.
    pub(crate) fn open(
        config: &AmqpConfig,
        at: &str,
        timeout: Duration,
        check: Duration,
    ) -> anyhow::Result<Amqp> {
        let amqp = Amqp {
            io: Io::new("hookledger-amqp")?,
            config: config.clone(),
            open: tokio::sync::Mutex::new((None, None)),
            timeout,
            shown: shown_url(config.url.expose()),
        };
        let checked = amqp.io.within(check, async {
            let channel = amqp.channel().await?;
            if amqp.config.exchange.is_empty() {
                return Ok(Ok(()));
            }
            let passive = ExchangeDeclareOptions {
                passive: true,
                ..ExchangeDeclareOptions::default()
            };
            let declared = channel
                .exchange_declare(
                    amqp.config.exchange.as_str().into(),
                    ExchangeKind::Direct,
                    passive,
                    FieldTable::default(),
                )
                .await;
            Ok::<_, lapin::Error>(declared)
        });
        match checked {
            Some(Ok(Ok(()))) => {}
            Some(Ok(Err(e))) if soft(&e) == Some(AMQPSoftError::NOTFOUND) => anyhow::bail!(
                "{at}.exchange: there is no exchange `{}` at {} (hookledger declares none: make \
                 it, with the queues bound to it)",
                config.exchange,
                amqp.shown
            ),
            Some(Ok(Err(e)) | Err(e)) => log::warn!(
                "{at}: RabbitMQ at {} cannot be checked at start-up ({e}); its rows are \
                 attempted, and retried, until it takes them",
                amqp.shown
            ),
            None => log::warn!(
                "{at}: RabbitMQ at {} did not answer within {check:?}; its rows are attempted, \
                 and retried, until it takes them",
                amqp.shown
            ),
        }
        Ok(amqp)
    }

    /// The open channel in confirm mode, or a new one (on a new connection if need be). A
    /// channel the broker closed (after a refused message, a failed declare) is not reused.
    async fn channel(&self) -> Result<Channel, lapin::Error> {
        let mut open = self.open.lock().await;
        let (connection, channel) = &mut *open;
        if let Some(channel) = channel.as_ref().filter(|c| c.status().connected()) {
            return Ok(channel.clone());
        }
        let connection = match connection.take().filter(|c| c.status().connected()) {
            Some(connection) => connection,
            None => {
                let properties = ConnectionProperties::default()
                    .with_connection_name(concat!("hookledger/", env!("CARGO_PKG_VERSION")).into());
                Connection::connect(self.config.url.expose(), properties).await?
            }
        };
        let opened = connection.create_channel().await;
        open.0 = Some(connection);
        let opened = opened?;
        opened
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        open.1 = Some(opened.clone());
        Ok(opened)
    }

    async fn publish(&self, row: &PendingRow, payload: &[u8]) -> Result<(), Failure> {
        let transport = |e: lapin::Error| match soft(&e) {
            // The broker's `max_message_size`, and what else it refuses in a message.
            Some(AMQPSoftError::PRECONDITIONFAILED) => Failure::Refused(format!(
                "RabbitMQ at {} refused the message: {e}",
                self.shown
            )),
            _ => Failure::Transport(format!("RabbitMQ at {}: {e}", self.shown)),
        };
        let channel = self.channel().await.map_err(transport)?;
        let mut headers = FieldTable::default();
        for (name, value) in metadata(row) {
            headers.insert(name.into(), AMQPValue::LongString(value.into()));
        }
        let properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_message_id(message_id(row).into())
            .with_content_type("application/json".into())
            .with_headers(headers);
        let mandatory = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let confirm = channel
            .basic_publish(
                self.config.exchange.as_str().into(),
                self.config.routing_key.as_str().into(),
                mandatory,
                payload,
                properties,
            )
            .await
            .map_err(transport)?;
        match confirm.await.map_err(transport)? {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(returned)) => Err(Failure::Transport(format!(
                "RabbitMQ at {}: no queue takes routing key `{}` on {} ({} {})",
                self.shown,
                self.config.routing_key,
                exchange_named(&self.config.exchange),
                returned.reply_code,
                returned.reply_text
            ))),
            Confirmation::Nack(_) => Err(Failure::Transport(format!(
                "RabbitMQ at {} did not take the message (nack)",
                self.shown
            ))),
            Confirmation::NotRequested => unreachable!("the channel is in confirm mode"),
        }
    }
}

/// The AMQP soft error (a channel's) of `e`, if it is one.
fn soft(e: &lapin::Error) -> Option<AMQPSoftError> {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(e) => match e.kind() {
            AMQPErrorKind::Soft(soft) => Some(soft.clone()),
            AMQPErrorKind::Hard(_) => None,
        },
        _ => None,
    }
}

fn exchange_named(exchange: &str) -> String {
    if exchange.is_empty() {
        "the default exchange".to_string()
    } else {
        format!("the exchange `{exchange}`")
    }
}

impl Target for Amqp {
    fn attempt(
        &self,
        row: &PendingRow,
        payload: &[u8],
    ) -> Result<Option<Arc<dyn FollowUp>>, Failure> {
        match self.io.within(self.timeout, self.publish(row, payload)) {
            Some(result) => result.map(|()| None),
            None => {
                // No confirm in time: this connection is not to be trusted with the next one.
                *self.open.blocking_lock() = (None, None);
                Err(Failure::Transport(format!(
                    "RabbitMQ at {}: no confirm within {:?}",
                    self.shown, self.timeout
                )))
            }
        }
    }
}
