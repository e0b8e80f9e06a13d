//! A worker fed from JetStream: hookledger publishes each event into a stream (a `[[delivery]]`
//! with `nats = { ... }`), and this worker reads the stream through a durable pull consumer. It
//! records each event in its own SQLite table, keyed by the event id, so a message delivered
//! twice changes nothing. Then it acks the message. A message whose handling fails is not
//! acked: JetStream delivers it again after `ack_wait`.
//!
//! ```sh
//! nats-server -js &                       # Debian: apt-get install nats-server
//! STRIPE_WEBHOOK_SECRET=whsec_test_secret \
//!     cargo run -- serve --config examples/jetstream-worker.toml
//! cargo run --example jetstream_worker -- --db worker.db
//! ```
//!
//! `examples/jetstream-worker.toml` publishes every Stripe event to the stream `HOOKS`, subject
//! `hooks.stripe`, and creates the stream (`create = true`) if it is not there. `--exit-after N`
//! stops the worker after N new events (the tests use it).

use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull, AckKind};
use clap::Parser;
use futures_util::StreamExt;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats: String,
    #[arg(long, default_value = "HOOKS")]
    stream: String,
    /// The durable consumer's name: a restarted worker goes on where it stopped.
    #[arg(long, default_value = "worker")]
    consumer: String,
    /// The worker's own database (its `events` table).
    #[arg(long, default_value = "worker.db")]
    db: String,
    /// Stop after this many new events.
    #[arg(long)]
    exit_after: Option<usize>,
}

/// What the worker keeps of an event: hookledger's headers and the body's size.
fn record(db: &rusqlite::Connection, message: &jetstream::Message) -> anyhow::Result<bool> {
    let header = |name: &str| -> String {
        message
            .headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str().to_string())
            .unwrap_or_default()
    };
    let added = db.execute(
        "INSERT OR IGNORE INTO events (source, event_id, type, bytes) VALUES (?1, ?2, ?3, ?4)",
        (
            header("hookledger-source"),
            header("hookledger-event-id"),
            header("hookledger-event-type"),
            message.payload.len() as i64,
        ),
    )?;
    Ok(added == 1)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let db = rusqlite::Connection::open(&args.db)?;
    db.execute_batch(
        "CREATE TABLE IF NOT EXISTS events (
             source TEXT NOT NULL, event_id TEXT NOT NULL, type TEXT NOT NULL,
             bytes INTEGER NOT NULL, PRIMARY KEY (source, event_id))",
    )?;
    let client = async_nats::connect(&args.nats).await?;
    let jetstream = jetstream::new(client);
    let stream = jetstream.get_stream(&args.stream).await?;
    let consumer: jetstream::consumer::Consumer<pull::Config> = stream
        .get_or_create_consumer(
            &args.consumer,
            pull::Config {
                durable_name: Some(args.consumer.clone()),
                ack_wait: Duration::from_secs(30),
                ..Default::default()
            },
        )
        .await?;
    let mut messages = consumer.messages().await?;
    let mut new = 0;
    while let Some(message) = messages.next().await {
        let message = message?;
        match record(&db, &message) {
            Ok(added) => {
                message.ack().await.map_err(anyhow::Error::msg)?;
                if added {
                    new += 1;
                    println!("{} of {} bytes", message.subject, message.payload.len());
                }
            }
            Err(e) => {
                eprintln!("not handled, delivered again later: {e}");
                let _ = message.ack_with(AckKind::Nak(None)).await;
            }
        }
        if args.exit_after.is_some_and(|n| new >= n) {
            break;
        }
    }
    Ok(())
}
