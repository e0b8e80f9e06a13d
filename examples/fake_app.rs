//! A stand-in for your app: receives hookledger's deliveries, verifies their Standard Webhooks
//! signature, and prints them.
//!
//! ```sh
//! SECRET=$(cargo run -q -- gen-secret)
//! cargo run --example fake_app -- --listen 127.0.0.1:9000 --secret "$SECRET" --fail-first 2
//! STRIPE_WEBHOOK_SECRET=whsec_test_secret cargo run -- serve \
//!     --forward-to http://127.0.0.1:9000/hooks --forward-secret "$SECRET"
//! ```
//!
//! `--fail-first N` answers 500 to the first N deliveries, to watch hookledger retry.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use clap::Parser;
use hookledger::internals::SigningKey;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "127.0.0.1:9000")]
    listen: SocketAddr,
    /// The forwarding secret hookledger signs with.
    #[arg(long, env = "HOOKLEDGER_FORWARD_SECRET", hide_env_values = true)]
    secret: String,
    /// Answer 500 to this many deliveries first.
    #[arg(long, default_value_t = 0)]
    fail_first: u64,
}

struct App {
    key: SigningKey,
    fail_first: u64,
    received: AtomicU64,
}

async fn receive(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let id = header("webhook-id");
    let verified = app.key.verify(
        &id,
        &header("webhook-timestamp"),
        &header("webhook-signature"),
        &body,
        hookledger::internals::unix_now(),
        300,
    );
    if let Err(e) = verified {
        println!("REJECTED {id}: {e}");
        return StatusCode::BAD_REQUEST;
    }
    let n = app.received.fetch_add(1, Ordering::SeqCst) + 1;
    let event: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    if n <= app.fail_first {
        println!("#{n} {id} {} -> 500 (failing on purpose)", event["type"]);
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    println!(
        "#{n} {id} {} verified, Idempotency-Key {} -> 200",
        event["type"],
        header("idempotency-key")
    );
    StatusCode::OK
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let app = Arc::new(App {
        key: SigningKey::from_secret(&args.secret).map_err(anyhow::Error::msg)?,
        fail_first: args.fail_first,
        received: AtomicU64::new(0),
    });
    let router = Router::new().fallback(post(receive)).with_state(app);
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!("fake app listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router).await?;
    Ok(())
}
