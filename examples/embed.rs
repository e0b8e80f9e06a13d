//! hookledger inside your own axum app: your routes and hookledger's on one server, and a Rust
//! handler that writes your table inside the claim's transaction (so each Stripe event counts
//! once, however often Stripe delivers it).
//!
//! ```sh
//! STRIPE_WEBHOOK_SECRET=whsec_test_secret cargo run --example embed -- app.db 127.0.0.1:3000
//! STRIPE_WEBHOOK_SECRET=whsec_test_secret cargo run -- send \
//!     --url http://127.0.0.1:3000/webhooks/stripe tests/fixtures/stripe/events/invoice.paid.json
//! curl http://127.0.0.1:3000/events-by-type
//! ```

use std::path::PathBuf;

use axum::extract::State;
use axum::routing::get;
use axum::Router;
use hookledger::{Event, Handler, Hookledger, Prepared, Secret, SourceConfig, StoreError, Tx};

/// Counts the app's events by type in its own table, in hookledger's transaction.
struct CountByType;

impl Handler for CountByType {
    fn name(&self) -> &str {
        "count-by-type"
    }

    fn handle(&self, tx: &Tx<'_>, event: &Event, _: Prepared) -> Result<(), StoreError> {
        // `$1` parameters and SQL that SQLite and PostgreSQL both run: the handler works on
        // either store.
        tx.execute(
            "INSERT INTO events_by_type (event_type, n) VALUES ($1, 1)
             ON CONFLICT (event_type) DO UPDATE SET n = events_by_type.n + 1",
            &[&event.kind],
        )?;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let db = PathBuf::from(args.next().unwrap_or_else(|| "embed.db".into()));
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:3000".into());
    let secrets = std::env::var("STRIPE_WEBHOOK_SECRET")
        .map_err(|_| anyhow::anyhow!("set STRIPE_WEBHOOK_SECRET"))?;

    // The app's own table, in the same database file (effects must be, to commit with the claim).
    rusqlite::Connection::open(&db)?.execute_batch(
        "CREATE TABLE IF NOT EXISTS events_by_type (event_type TEXT PRIMARY KEY, n INTEGER NOT NULL)",
    )?;

    let hookledger = Hookledger::builder()
        .database(&db)
        .source(SourceConfig::stripe(vec![Secret::new(secrets)]))
        .handler("stripe", CountByType)
        .build()?;

    let app = Router::new()
        .route("/", get(|| async { "the app's own page\n" }))
        .route("/events-by-type", get(events_by_type))
        .with_state(db.clone())
        .merge(hookledger.router());

    let listener = tokio::net::TcpListener::bind(&listen).await?;
    // The handler exists before the address is announced: a SIGTERM right after it stops us
    // gracefully too.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    println!("embed listening on {}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        })
        .await?;
    // The server and its routes are gone: let hookledger commit what is queued and stop.
    hookledger.shutdown().await?;
    Ok(())
}

/// The app's page over its table: `type count` lines.
async fn events_by_type(State(db): State<PathBuf>) -> String {
    let read = move || -> rusqlite::Result<String> {
        let conn = rusqlite::Connection::open(&db)?;
        let mut stmt = conn.prepare("SELECT event_type, n FROM events_by_type ORDER BY 1")?;
        let lines = stmt
            .query_map([], |r| {
                Ok(format!(
                    "{} {}\n",
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?
                ))
            })?
            .collect::<rusqlite::Result<String>>()?;
        Ok(lines)
    };
    tokio::task::spawn_blocking(read)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default()
}
