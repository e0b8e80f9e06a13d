//! The load generator: pre-signed, realistic Stripe events sent over keep-alive connections,
//! then a check that the ledger holds exactly the distinct events that got a 200.
//!
//! It speaks HTTP/1.1 over plain `TcpStream`s with pre-built request bytes, so the client
//! spends as little CPU as possible on the machine it shares with the server.

use std::collections::{BTreeMap, HashSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;

use hookledger::internals::{invoice_event, stripe, subscription_event};
use hookledger::Secret;

/// What to send.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Requests in total (new events plus resends).
    pub requests: usize,
    /// Share of requests that resend an earlier event (0.0–1.0).
    pub resend_share: f64,
    /// Seed for the event mix, so a run can be repeated.
    pub seed: u64,
    /// How the event ids are made.
    pub ids: Ids,
}

/// The shape of the event ids: where a new id falls in the ledger's key index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Ids {
    /// `evt_load_<seed>_<counter>`: each new id sorts after every earlier one (as Stripe's,
    /// which begin with a timestamp): claims land on the index's last pages.
    Ordered,
    /// `evt_<32 random hex digits>` (as GitHub's UUIDs, Shopify's or Svix message ids): each
    /// claim lands on a random page of the key index.
    Random,
}

impl Ids {
    /// The `i`-th new event id of a run with `seed`.
    pub fn event_id(self, seed: u64, i: usize, rng: &mut fastrand::Rng) -> String {
        match self {
            Ids::Ordered => format!("evt_load_{seed:04}_{i:08}"),
            Ids::Random => format!("evt_{:032x}", rng.u128(..)),
        }
    }
}

/// One pre-built request.
pub struct Request {
    pub event_id: String,
    pub bytes: Vec<u8>,
}

/// Builds the requests: 80 % `invoice.paid` for unique invoices, 20 % subscription updates;
/// bodies of 1.5–2.5 KB; `resend_share` of them exact resends of an earlier event.
pub fn prepare(workload: &Workload, secret: &Secret, host: &str) -> Vec<Request> {
    let mut rng = fastrand::Rng::with_seed(workload.seed);
    let now = hookledger::internals::unix_now();
    let mut originals: Vec<usize> = Vec::new();
    let mut requests: Vec<Request> = Vec::with_capacity(workload.requests);
    for i in 0..workload.requests {
        if !originals.is_empty() && rng.f64() < workload.resend_share {
            let original = &requests[originals[rng.usize(..originals.len())]];
            requests.push(Request {
                event_id: original.event_id.clone(),
                bytes: original.bytes.clone(),
            });
            continue;
        }
        let event_id = workload.ids.event_id(workload.seed, i, &mut rng);
        let customer = format!("cus_load_{:05}", rng.usize(..10_000));
        let account = format!("acct_{customer}");
        let mut body = if rng.f64() < 0.8 {
            invoice_event(
                &event_id,
                "invoice.paid",
                now,
                &format!("in_load_{i:08}"),
                &customer,
                &account,
            )
        } else {
            subscription_event(
                &event_id,
                "customer.subscription.updated",
                now + i as i64,
                &format!("sub_load_{:04}", rng.usize(..1000)),
                &customer,
                &account,
                ["active", "past_due", "canceled"][rng.usize(..3)],
            )
        };
        pad_to(&mut body, rng.usize(1536..2560));
        originals.push(requests.len());
        requests.push(Request {
            bytes: http_request(host, secret, now, body.as_bytes()),
            event_id,
        });
    }
    requests
}

/// Pads an event body to about `size` bytes with an extra top-level field (ignored by the
/// parser, as unknown Stripe fields are).
fn pad_to(body: &mut String, size: usize) {
    let Some(close) = body.rfind('}') else { return };
    let fill = size.saturating_sub(body.len() + 16);
    body.insert_str(
        close,
        &format!(",\n  \"x_pad\": \"{}\"\n", "p".repeat(fill)),
    );
}

pub(crate) fn http_request(host: &str, secret: &Secret, t: i64, body: &[u8]) -> Vec<u8> {
    let mut bytes = format!(
        "POST /webhooks/stripe HTTP/1.1\r\nHost: {host}\r\nUser-Agent: hookledger-loadgen\r\n\
         Content-Type: application/json; charset=utf-8\r\nStripe-Signature: {}\r\n\
         Content-Length: {}\r\n\r\n",
        stripe::sign(secret, t, body),
        body.len()
    )
    .into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// What a run measured.
#[derive(Debug, Default)]
pub struct Report {
    pub elapsed: Duration,
    pub statuses: BTreeMap<u16, usize>,
    pub processed: usize,
    pub duplicates: usize,
    pub transport_errors: usize,
    /// Sorted.
    pub latencies: Vec<Duration>,
    /// Distinct event ids that got a 200.
    pub acknowledged: HashSet<String>,
    /// Open loop only ([`run_open`]): each request's due time (from the start) and latency,
    /// in due order.
    pub timeline: Vec<(Duration, Duration)>,
}

impl Report {
    pub fn requests(&self) -> usize {
        self.latencies.len()
    }

    /// Requests answered per second (any status).
    pub fn per_second(&self) -> f64 {
        self.requests() as f64 / self.elapsed.as_secs_f64()
    }

    pub fn percentile(&self, p: f64) -> Duration {
        percentile(&self.latencies, p)
    }

    /// The latencies (sorted) of the requests due in `from..to` (open loop).
    pub fn window(&self, from: Duration, to: Duration) -> Vec<Duration> {
        let mut latencies: Vec<Duration> = self
            .timeline
            .iter()
            .filter(|(due, _)| (from..to).contains(due))
            .map(|&(_, latency)| latency)
            .collect();
        latencies.sort_unstable();
        latencies
    }

    pub fn status_summary(&self) -> String {
        let mut parts: Vec<String> = self
            .statuses
            .iter()
            .map(|(s, n)| format!("{s}:{n}"))
            .collect();
        if self.transport_errors > 0 {
            parts.push(format!("conn-err:{}", self.transport_errors));
        }
        parts.join(" ")
    }
}

/// Sends every request once over `connections` keep-alive connections to `addr`.
pub fn run(addr: SocketAddr, requests: &[Request], connections: usize) -> Report {
    run_spread(&[addr], requests, connections)
}

/// Sends every request once over `connections` keep-alive connections, spread evenly over
/// `addrs` (several instances behind one load generator, as a load balancer would).
pub fn run_spread(addrs: &[SocketAddr], requests: &[Request], connections: usize) -> Report {
    let next = AtomicUsize::new(0);
    let merged = Mutex::new(Report::default());
    let started = Instant::now();
    std::thread::scope(|scope| {
        for c in 0..connections.max(1) {
            let addr = addrs[c % addrs.len()];
            let (next, merged) = (&next, &merged);
            scope.spawn(move || {
                let mut local = Report::default();
                let mut conn: Option<Conn> = None;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(request) = requests.get(i) else {
                        break;
                    };
                    let sent = Instant::now();
                    let answer = send_one(&mut conn, addr, &request.bytes);
                    local.latencies.push(sent.elapsed());
                    local.count(request, answer, &mut conn);
                }
                merged.lock().expect("report lock").merge(local);
            });
        }
    });
    let mut report = merged.into_inner().expect("report lock");
    report.elapsed = started.elapsed();
    report.latencies.sort_unstable();
    report
}

/// When the `i`-th request of an open-loop run at `rate` requests a second is due, from the
/// start: a fixed schedule, whatever the server answers.
pub fn due(i: usize, rate: f64) -> Duration {
    Duration::from_secs_f64(i as f64 / rate)
}

/// The `p`-th percentile of sorted `latencies`.
pub fn percentile(latencies: &[Duration], p: f64) -> Duration {
    if latencies.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * latencies.len() as f64).ceil() as usize;
    latencies[rank.clamp(1, latencies.len()) - 1]
}

/// Sends every request once, open loop: the `i`-th at its [`due`] time at `rate` a second,
/// whether or not the earlier ones were answered, over up to `connections` keep-alive
/// connections (each sends its next request once it has its answer, so a request goes out
/// late only when every connection waits for an answer). Its latency is counted from its due
/// time, not from when it went out: a stall of the server counts in full for every request
/// due during it (no coordinated omission, which a closed loop has: its senders stop sending
/// while the server stalls, so the stall is one slow request each).
pub fn run_open(addr: SocketAddr, requests: &[Request], rate: f64, connections: usize) -> Report {
    let next = AtomicUsize::new(0);
    let merged = Mutex::new(Report::default());
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..connections.max(1) {
            let (next, merged) = (&next, &merged);
            scope.spawn(move || {
                let mut local = Report::default();
                let mut conn: Option<Conn> = None;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(request) = requests.get(i) else {
                        break;
                    };
                    let due = due(i, rate);
                    if let Some(wait) = (started + due).checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    let answer = send_one(&mut conn, addr, &request.bytes);
                    let latency = started.elapsed().saturating_sub(due);
                    local.latencies.push(latency);
                    local.timeline.push((due, latency));
                    local.count(request, answer, &mut conn);
                }
                merged.lock().expect("report lock").merge(local);
            });
        }
    });
    let mut report = merged.into_inner().expect("report lock");
    report.elapsed = started.elapsed();
    report.latencies.sort_unstable();
    report.timeline.sort_unstable();
    report
}

impl Report {
    /// Counts one answer (or a failure to get one, which drops the connection).
    fn count(
        &mut self,
        request: &Request,
        answer: std::io::Result<(u16, Outcome)>,
        conn: &mut Option<Conn>,
    ) {
        match answer {
            Ok((status, outcome)) => {
                *self.statuses.entry(status).or_default() += 1;
                if status == 200 {
                    self.acknowledged.insert(request.event_id.clone());
                    match outcome {
                        Outcome::Processed => self.processed += 1,
                        Outcome::Duplicate => self.duplicates += 1,
                        Outcome::Other => {}
                    }
                }
            }
            Err(_) => {
                self.transport_errors += 1;
                *conn = None;
            }
        }
    }

    /// Adds a sender's report to this one.
    fn merge(&mut self, local: Report) {
        self.latencies.extend(local.latencies);
        self.timeline.extend(local.timeline);
        for (s, n) in local.statuses {
            *self.statuses.entry(s).or_default() += n;
        }
        self.processed += local.processed;
        self.duplicates += local.duplicates;
        self.transport_errors += local.transport_errors;
        self.acknowledged.extend(local.acknowledged);
    }
}

enum Outcome {
    Processed,
    Duplicate,
    Other,
}

/// A keep-alive connection with its read buffer.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

fn send_one(
    conn: &mut Option<Conn>,
    addr: SocketAddr,
    request: &[u8],
) -> std::io::Result<(u16, Outcome)> {
    if conn.is_none() {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        *conn = Some(Conn {
            stream,
            buf: Vec::with_capacity(1024),
        });
    }
    let c = conn.as_mut().expect("connected above");
    c.stream.write_all(request)?;
    let (status, body, close) = read_response(c)?;
    if close {
        *conn = None;
    }
    let body = String::from_utf8_lossy(&body);
    let outcome = if body.contains("\"outcome\":\"processed\"") {
        Outcome::Processed
    } else if body.contains("\"outcome\":\"duplicate\"") {
        Outcome::Duplicate
    } else {
        Outcome::Other
    };
    Ok((status, outcome))
}

/// Reads one response: status, body, and whether the server will close the connection.
fn read_response(c: &mut Conn) -> std::io::Result<(u16, Vec<u8>, bool)> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(pos) = c.buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break pos + 4;
        }
        let n = c.stream.read(&mut chunk)?;
        if n == 0 {
            return Err(bad("connection closed"));
        }
        c.buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&c.buf[..head_end]).to_ascii_lowercase();
    let status: u16 = head
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status"))?;
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let close = head.contains("connection: close");
    while c.buf.len() < head_end + length {
        let n = c.stream.read(&mut chunk)?;
        if n == 0 {
            return Err(bad("connection closed in body"));
        }
        c.buf.extend_from_slice(&chunk[..n]);
    }
    let body = c.buf[head_end..head_end + length].to_vec();
    c.buf.drain(..head_end + length);
    Ok((status, body, close))
}

/// The ledger check: the database must hold exactly the distinct events that got a 200.
#[derive(Debug)]
pub struct LedgerCheck {
    pub acknowledged: usize,
    pub in_ledger: usize,
    /// Acknowledged but not in the ledger: lost. Must be 0.
    pub lost: usize,
    /// In the ledger but never acknowledged (e.g. the answer was lost to a client timeout).
    pub unacknowledged: usize,
}

impl LedgerCheck {
    pub fn exact(&self) -> bool {
        self.lost == 0 && self.unacknowledged == 0
    }
}

pub fn check_ledger(db: &Path, report: &Report) -> anyhow::Result<LedgerCheck> {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .with_context(|| format!("opening {}", db.display()))?;
    let mut stmt = conn.prepare("SELECT event_id FROM webhook_events")?;
    let in_ledger: HashSet<String> = stmt
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    Ok(compare(in_ledger, report))
}

/// [`check_ledger`] on a PostgreSQL database.
pub fn check_ledger_postgres(url: &str, report: &Report) -> anyhow::Result<LedgerCheck> {
    let mut client = postgres::Client::connect(url, postgres::NoTls)?;
    let in_ledger: HashSet<String> = client
        .query("SELECT event_id FROM webhook_events", &[])?
        .iter()
        .map(|r| r.get(0))
        .collect();
    Ok(compare(in_ledger, report))
}

fn compare(in_ledger: HashSet<String>, report: &Report) -> LedgerCheck {
    LedgerCheck {
        acknowledged: report.acknowledged.len(),
        in_ledger: in_ledger.len(),
        lost: report.acknowledged.difference(&in_ledger).count(),
        unacknowledged: in_ledger.difference(&report.acknowledged).count(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn the_open_loop_schedule_is_fixed_by_the_rate() {
        assert_eq!(due(0, 500.0), Duration::ZERO);
        assert_eq!(due(1, 500.0), Duration::from_millis(2));
        assert_eq!(due(500, 500.0), Duration::from_secs(1));
        assert_eq!(due(30_000, 500.0), Duration::from_secs(60));
    }

    #[test]
    fn a_window_and_a_percentile_count_the_requests_due_in_it() {
        let ms = Duration::from_millis;
        let report = Report {
            timeline: vec![
                (ms(0), ms(5)),
                (ms(2), ms(1)),
                (ms(4), ms(9)),
                (ms(6), ms(2)),
            ],
            ..Report::default()
        };
        assert_eq!(report.window(ms(2), ms(6)), [ms(1), ms(9)]);
        assert_eq!(report.window(ms(0), ms(100)), [ms(1), ms(2), ms(5), ms(9)]);
        assert_eq!(percentile(&report.window(ms(0), ms(100)), 50.0), ms(2));
        assert_eq!(percentile(&report.window(ms(0), ms(100)), 99.0), ms(9));
        assert_eq!(percentile(&[], 99.0), Duration::ZERO);
    }

    /// Open loop: the second request goes out on schedule while the first is unanswered (a
    /// server that answers neither until it has both would hang a closed loop of one sender
    /// per request in flight), and each is timed from its due time.
    #[test]
    fn the_open_loop_sends_on_schedule_without_waiting_for_answers() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            // Both requests arrive (each on its own connection) before either is answered.
            let mut held = Vec::new();
            for _ in 0..2 {
                let (mut stream, _) = listener.accept().unwrap();
                let mut buf = [0u8; 4096];
                let mut got = Vec::new();
                while !got.ends_with(b"{}") {
                    let n = stream.read(&mut buf).unwrap();
                    assert!(n > 0, "the request arrives whole");
                    got.extend_from_slice(&buf[..n]);
                }
                held.push(stream);
            }
            for mut stream in held {
                let body = r#"{"outcome":"processed"}"#;
                write!(
                    stream,
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                )
                .unwrap();
            }
        });
        let request = |id: &str| Request {
            event_id: id.to_string(),
            bytes: b"POST / HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}".to_vec(),
        };
        let requests = [request("evt_a"), request("evt_b")];
        let report = run_open(addr, &requests, 1000.0, 2);
        server.join().unwrap();
        assert_eq!(report.status_summary(), "200:2");
        assert_eq!(report.processed, 2);
        let due: Vec<Duration> = report.timeline.iter().map(|&(due, _)| due).collect();
        assert_eq!(due, [Duration::ZERO, Duration::from_millis(1)]);
        assert_eq!(report.acknowledged.len(), 2);
    }
}
