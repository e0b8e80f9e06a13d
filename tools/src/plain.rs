//! The baseline of the PostgreSQL column: a plain transaction-per-request webhook handler, as
//! a careful app would write it without hookledger. A thread per connection and a pool of
//! PostgreSQL connections, each with its statements prepared once; per request: verify the
//! signature, `BEGIN`, claim the event id with `INSERT … ON CONFLICT DO NOTHING`, apply the
//! same billing effects as `stripe-billing` (the same SQL), `COMMIT`, answer: one round trip
//! per statement. Concurrent requests commit concurrently, on their own connections: what
//! hookledger's one writer with group commit is compared with.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};

use anyhow::Context;
use hookledger::internals::stripe;
use hookledger::internals::stripe_billing::{decode, Change};
use hookledger::Secret;
use postgres::{Client, NoTls, Statement};

type Pool = r2d2::Pool<Prepared>;

/// A pooled connection with the handler's statements prepared on it.
pub struct Connection {
    client: Client,
    claim: Statement,
    subscription: Statement,
    payment: Statement,
    account: Statement,
}

/// Makes [`Connection`]s for the pool.
pub struct Prepared {
    config: postgres::Config,
}

impl r2d2::ManageConnection for Prepared {
    type Connection = Connection;
    type Error = postgres::Error;

    fn connect(&self) -> Result<Connection, postgres::Error> {
        let mut client = self.config.connect(NoTls)?;
        Ok(Connection {
            claim: client.prepare(CLAIM)?,
            subscription: client.prepare(SUBSCRIPTION)?,
            payment: client.prepare(PAYMENT)?,
            account: client.prepare(ACCOUNT)?,
            client,
        })
    }

    fn is_valid(&self, conn: &mut Connection) -> Result<(), postgres::Error> {
        conn.client.simple_query("").map(|_| ())
    }

    fn has_broken(&self, conn: &mut Connection) -> bool {
        conn.client.is_closed()
    }
}

const CLAIM: &str = "INSERT INTO webhook_events
        (source, event_id, event_type, created, received_at, payload)
    VALUES ('stripe', $1, $2, $3, $4, $5) ON CONFLICT (source, event_id) DO NOTHING";

const SUBSCRIPTION: &str = "INSERT INTO subscriptions
        (id, customer_id, account_id, status, provider_updated_at, event_rank, event_id)
    VALUES ($1, $2, $3, $4, $5, $6, $7)
    ON CONFLICT (id) DO UPDATE SET
        customer_id = excluded.customer_id, account_id = excluded.account_id,
        status = excluded.status, provider_updated_at = excluded.provider_updated_at,
        event_rank = excluded.event_rank, event_id = excluded.event_id
    WHERE (excluded.provider_updated_at, excluded.event_rank)
        > (subscriptions.provider_updated_at, subscriptions.event_rank)";

const PAYMENT: &str = "INSERT INTO invoice_payments
        (stripe_invoice_id, account_id, amount_paid, event_id)
    VALUES ($1, $2, $3, $4) ON CONFLICT (stripe_invoice_id) DO NOTHING";

const ACCOUNT: &str = "INSERT INTO accounts (id, credits, plan_until) VALUES ($1, $2, $3)
    ON CONFLICT (id) DO UPDATE SET
        credits = accounts.credits + excluded.credits,
        plan_until = CASE
            WHEN excluded.plan_until > accounts.plan_until OR accounts.plan_until IS NULL
            THEN excluded.plan_until ELSE accounts.plan_until END";

/// The tables it writes (hookledger's own schema, created here for a fresh database).
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS webhook_events (
    source TEXT NOT NULL, event_id TEXT NOT NULL, event_type TEXT NOT NULL, created BIGINT,
    received_at BIGINT NOT NULL, payload BYTEA, PRIMARY KEY (source, event_id));
CREATE TABLE IF NOT EXISTS subscriptions (
    id TEXT PRIMARY KEY, customer_id TEXT NOT NULL, account_id TEXT, status TEXT NOT NULL,
    provider_updated_at BIGINT NOT NULL, event_rank BIGINT NOT NULL, event_id TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS invoice_payments (
    stripe_invoice_id TEXT PRIMARY KEY, account_id TEXT NOT NULL, amount_paid BIGINT NOT NULL,
    event_id TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS accounts (
    id TEXT PRIMARY KEY, credits BIGINT NOT NULL DEFAULT 0, plan_until BIGINT);";

/// Serves on a free port of 127.0.0.1 in background threads; the address.
pub fn start(url: &str, secret: Secret, pool_size: u32) -> anyhow::Result<SocketAddr> {
    Client::connect(url, NoTls)?.batch_execute(SCHEMA)?;
    let pool = r2d2::Pool::builder()
        .max_size(pool_size)
        .build(Prepared {
            config: url.parse()?,
        })
        .context("connecting the plain handler's pool")?;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (pool, secret) = (pool.clone(), secret.clone());
            std::thread::spawn(move || connection(stream, &pool, &secret));
        }
    });
    Ok(addr)
}

/// Requests of one keep-alive connection, until it closes.
fn connection(stream: TcpStream, pool: &Pool, secret: &Secret) {
    let _ = stream.set_nodelay(true);
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let Some((signature, body)) = read_request(&mut reader) else {
            return;
        };
        let (status, answer) = match handle(pool, secret, signature.as_deref(), &body) {
            Ok(answer) => (200, answer),
            Err(e) => (500, format!("{{\"error\":\"{e}\"}}")),
        };
        let response = format!(
            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
            answer.len()
        );
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

fn read_request(reader: &mut BufReader<TcpStream>) -> Option<(Option<String>, Vec<u8>)> {
    let mut line = String::new();
    let mut signature = None;
    let mut length = 0;
    reader.read_line(&mut line).ok().filter(|n| *n > 0)?;
    loop {
        line.clear();
        reader.read_line(&mut line).ok().filter(|n| *n > 0)?;
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':')?;
        match name.to_ascii_lowercase().as_str() {
            "content-length" => length = value.trim().parse().ok()?,
            "stripe-signature" => signature = Some(value.trim().to_string()),
            _ => {}
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((signature, body))
}

/// One request in one transaction of its own.
fn handle(
    pool: &Pool,
    secret: &Secret,
    signature: Option<&str>,
    body: &[u8],
) -> anyhow::Result<String> {
    let now = hookledger::internals::unix_now();
    stripe::verify(
        std::slice::from_ref(secret),
        signature.map(str::as_bytes),
        body,
        now,
        stripe::DEFAULT_TOLERANCE_SECS,
    )?;
    let event = stripe::envelope(body)?;
    let change = decode(&event.kind, body)?;
    let mut conn = pool.get()?;
    let Connection {
        client,
        claim,
        subscription,
        payment,
        account,
    } = &mut *conn;
    let mut tx = client.transaction()?;
    let claimed = tx.execute(
        &*claim,
        &[&event.id, &event.kind, &event.created, &now, &body],
    )?;
    let outcome = if claimed == 1 {
        let created = event.created.unwrap_or_default();
        match change {
            Some(Change::Subscription(s)) => {
                tx.execute(
                    &*subscription,
                    &[
                        &s.id,
                        &s.customer_id,
                        &s.account_id,
                        &s.status,
                        &created,
                        &s.rank,
                        &event.id,
                    ],
                )?;
            }
            Some(Change::InvoicePaid(p)) => {
                let inserted = tx.execute(
                    &*payment,
                    &[&p.invoice_id, &p.account_id, &p.amount_paid, &event.id],
                )?;
                if inserted == 1 {
                    let credits: i64 = if p.amount_paid > 0 { 100 } else { 0 };
                    tx.execute(&*account, &[&p.account_id, &credits, &p.period_end])?;
                }
            }
            None => {}
        }
        "processed"
    } else {
        "duplicate"
    };
    tx.commit()?;
    Ok(format!(
        "{{\"event_id\":\"{}\",\"outcome\":\"{outcome}\"}}",
        event.id
    ))
}
