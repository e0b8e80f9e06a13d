//! `hookledger demo`: the pattern working, end to end, in one command.
//!
//! It starts a real server in-process on a temporary database and port 0, sends real signed
//! HTTP requests, and prints the outcome and the state after each step.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::Context;
use rusqlite::{Connection, OptionalExtension};

use crate::app::RunningServer;
use crate::config::Config;
use crate::config::Secret;
use crate::dev::client::{Client, Reply};
use crate::stripe::samples::{invoice_event, subscription_event};
use crate::time::unix_now;

const ACCOUNT: &str = "acct_demo";
const CUSTOMER: &str = "cus_demo";
const SUBSCRIPTION: &str = "sub_demo";

/// One printed row.
struct Row {
    step: String,
    replies: String,
    credits: i64,
    ledger_rows: i64,
    subscription: String,
}

/// Runs the demo and prints its table to stdout.
pub(crate) fn run() -> anyhow::Result<()> {
    let dir = DemoDir::create()?;
    let db = dir.0.join("demo.db");
    let secret = Secret::new(crate::source::standard::SigningKey::generate()?);
    let mut config = Config::new(db.clone(), vec![secret.clone()]);
    config.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    let server = RunningServer::start(config)?;
    let url = format!("http://{}/webhooks/stripe", server.addr);
    println!(
        "hookledger demo: server on {} with database {}\n",
        server.addr,
        db.display()
    );

    let client = Client::default();
    let send = |body: &str| -> anyhow::Result<Reply> {
        Ok(client.send(&url, body.as_bytes(), &secret, unix_now())?)
    };
    let now = unix_now();
    let mut rows = Vec::new();
    let mut record = |step: &str, replies: String| -> anyhow::Result<()> {
        rows.push(observe(&db, step, replies)?);
        Ok(())
    };

    // 1. A failure inside the transaction: a real trigger aborts the credit grant.
    let paid_1 = invoice_event(
        "evt_demo_paid_1",
        "invoice.paid",
        now,
        "in_demo_1",
        CUSTOMER,
        ACCOUNT,
    );
    let admin = Connection::open(&db)?;
    admin.execute_batch(
        "CREATE TRIGGER demo_failure BEFORE INSERT ON invoice_payments
         BEGIN SELECT RAISE(ABORT, 'demo: injected failure'); END;",
    )?;
    let reply = send(&paid_1)?;
    record(
        "invoice.paid with a failure injected mid-apply",
        summary(&[reply]),
    )?;

    // 2. The provider retries after the failure is gone.
    admin.execute_batch("DROP TRIGGER demo_failure")?;
    let reply = send(&paid_1)?;
    record("the provider's retry of the same event", summary(&[reply]))?;

    // 3. Ten copies of a new event at the same moment.
    let paid_2 = invoice_event(
        "evt_demo_paid_2",
        "invoice.paid",
        now,
        "in_demo_2",
        CUSTOMER,
        ACCOUNT,
    );
    let replies = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..10).map(|_| scope.spawn(|| send(&paid_2))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("sender thread"))
            .collect::<anyhow::Result<Vec<_>>>()
    })?;
    record(
        "10 concurrent copies of a new invoice.paid",
        summary(&replies),
    )?;

    // 4. The same invoice reported again under another event id.
    let succeeded = invoice_event(
        "evt_demo_succeeded_2",
        "invoice.payment_succeeded",
        now,
        "in_demo_2",
        CUSTOMER,
        ACCOUNT,
    );
    let reply = send(&succeeded)?;
    record(
        "invoice.payment_succeeded for the same invoice",
        summary(&[reply]),
    )?;

    // 5. Out of order: the update (T+10, canceled) arrives before the creation (T, active).
    let updated = subscription_event(
        "evt_demo_sub_updated",
        "customer.subscription.updated",
        now + 10,
        SUBSCRIPTION,
        CUSTOMER,
        ACCOUNT,
        "canceled",
    );
    let reply = send(&updated)?;
    record("subscription.updated (T+10, canceled)", summary(&[reply]))?;
    let created = subscription_event(
        "evt_demo_sub_created",
        "customer.subscription.created",
        now,
        SUBSCRIPTION,
        CUSTOMER,
        ACCOUNT,
        "active",
    );
    let reply = send(&created)?;
    record(
        "subscription.created (T, active) arrives late",
        summary(&[reply]),
    )?;

    server.stop()?;
    print_table(&rows);
    println!(
        "\nEvery 200 was sent after COMMIT; the 500 left no ledger row, so the retry applied it.\n\
         Credits are 100 per distinct invoice, whatever the number of deliveries or event ids."
    );
    Ok(())
}

/// `200 processed` or `1×200 processed, 9×200 duplicate`.
fn summary(replies: &[Reply]) -> String {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for reply in replies {
        let outcome = serde_json::from_str::<serde_json::Value>(&reply.body)
            .ok()
            .and_then(|v| {
                v.get("outcome")
                    .or_else(|| v.get("error"))
                    .and_then(|o| o.as_str().map(str::to_string))
            })
            .unwrap_or_default();
        let label = format!("{} {outcome}", reply.status);
        match counts.iter_mut().find(|(l, _)| *l == label) {
            Some((_, n)) => *n += 1,
            None => counts.push((label, 1)),
        }
    }
    if replies.len() == 1 {
        return counts.remove(0).0;
    }
    counts
        .iter()
        .map(|(label, n)| format!("{n}×{label}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn observe(db: &Path, step: &str, replies: String) -> anyhow::Result<Row> {
    let conn = Connection::open(db)?;
    let credits = conn
        .query_row(
            "SELECT credits FROM accounts WHERE id = ?1",
            [ACCOUNT],
            |r| r.get(0),
        )
        .optional()?
        .unwrap_or(0);
    let ledger_rows = conn.query_row("SELECT count(*) FROM webhook_events", [], |r| r.get(0))?;
    let subscription = conn
        .query_row(
            "SELECT status FROM subscriptions WHERE id = ?1",
            [SUBSCRIPTION],
            |r| r.get(0),
        )
        .optional()?
        .unwrap_or_else(|| "-".to_string());
    Ok(Row {
        step: step.to_string(),
        replies,
        credits,
        ledger_rows,
        subscription,
    })
}

fn print_table(rows: &[Row]) {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.step.clone(),
                r.replies.clone(),
                r.credits.to_string(),
                r.ledger_rows.to_string(),
                r.subscription.clone(),
            ]
        })
        .collect();
    let headers = ["step", "replies", "credits", "ledger rows", "subscription"];
    print!("{}", crate::cli::table::render(&headers, &cells));
}

/// The demo's own directory under the system's temp directory: a fresh name, created (not
/// reused) with access for this user only, removed when the demo ends.
struct DemoDir(std::path::PathBuf);

impl DemoDir {
    fn create() -> anyhow::Result<DemoDir> {
        let path =
            std::env::temp_dir().join(format!("hookledger-demo-{}", crate::dev::random_hex()?));
        let mut builder = std::fs::DirBuilder::new();
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder
            .create(&path)
            .with_context(|| format!("creating the demo directory {}", path.display()))?;
        Ok(DemoDir(path))
    }
}

impl Drop for DemoDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
