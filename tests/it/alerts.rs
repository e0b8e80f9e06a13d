//! What an operator is told when deliveries fail: a dead row's error names its cause (refused,
//! timeout, DNS, HTTP status with the start of the body) and its target; `[[alert]]` sends one
//! message per incident through hookledger's own outbox, and one when it clears.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::util::*;

const WAIT: Duration = Duration::from_secs(30);

/// A tiny HTTP server on port 0: answers every request with `status` and `body`, and keeps
/// each request's body (a Slack-shaped receiver, or an app that fails with a message).
struct Receiver {
    addr: SocketAddr,
    status: Arc<AtomicU16>,
    bodies: Arc<Mutex<Vec<Vec<u8>>>>,
    headers: Arc<Mutex<Vec<Vec<(String, String)>>>>,
}

impl Receiver {
    fn start(status: u16, body: &'static str) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let receiver = Receiver {
            addr: listener.local_addr().unwrap(),
            status: Arc::new(AtomicU16::new(status)),
            bodies: Default::default(),
            headers: Default::default(),
        };
        let (status, bodies, headers) = (
            receiver.status.clone(),
            receiver.bodies.clone(),
            receiver.headers.clone(),
        );
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (status, bodies, headers) = (status.clone(), bodies.clone(), headers.clone());
                std::thread::spawn(move || {
                    let _ = answer(stream, &status, body, &bodies, &headers);
                });
            }
        });
        receiver
    }

    fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    fn bodies(&self) -> Vec<serde_json::Value> {
        let bodies = self.bodies.lock().unwrap();
        bodies
            .iter()
            .map(|b| serde_json::from_slice(b).expect("a JSON body"))
            .collect()
    }

    /// Waits until `n` requests arrived; then returns all of them.
    fn wait(&self, n: usize) -> Vec<serde_json::Value> {
        wait_for(WAIT, || {
            (self.bodies.lock().unwrap().len() >= n).then_some(())
        })
        .unwrap_or_else(|| panic!("fewer than {n} requests: {:?}", self.bodies()));
        self.bodies()
    }
}

fn answer(
    mut stream: TcpStream,
    status: &AtomicU16,
    body: &str,
    bodies: &Mutex<Vec<Vec<u8>>>,
    headers: &Mutex<Vec<Vec<(String, String)>>>,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut seen = Vec::new();
    let mut len = 0;
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let Some((k, v)) = line.trim_end().split_once(':') else {
            break;
        };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_string());
        if k == "content-length" {
            len = v.parse().unwrap_or(0);
        }
        seen.push((k, v));
    }
    let mut request = vec![0; len];
    reader.read_exact(&mut request)?;
    let status = status.load(Ordering::SeqCst);
    if (200..300).contains(&status) {
        bodies.lock().unwrap().push(request);
        headers.lock().unwrap().push(seen);
    }
    write!(
        stream,
        "HTTP/1.1 {status} X\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}

/// Forwarding to `url`: two attempts one second apart, then dead.
fn forward_to(url: &str) -> Vec<String> {
    [
        "--forward-to",
        url,
        "--forward-secret",
        FORWARD_SECRET,
        "--forward-schedule",
        "1s",
        "--forward-timeout",
        "1s",
    ]
    .map(str::to_string)
    .to_vec()
}

/// The dead row's error after an event forwarded to `url`.
fn dead_error(url: &str) -> String {
    let server = Server::start(&strs(&forward_to(url)));
    assert_outcome(&server.send(&paid("evt_cause")), "evt_cause", "processed");
    let (_, attempts, error) = wait_outbox_status(&server.db(), "evt_cause", "dead", WAIT);
    assert_eq!(attempts, 2);
    error.expect("a dead row has its error")
}

#[test]
fn a_dead_rows_error_names_refused_timeout_dns_and_http_500_with_the_target() {
    // Refused: a port nobody listens on.
    let (down, _) = down_app();
    let refused = std::thread::spawn(move || dead_error(&format!("http://{down}/hooks")));
    // Timeout: a listener that takes the connection and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in silent.incoming() {
            held.push(stream);
        }
    });
    let timeout =
        std::thread::spawn(move || dead_error(&format!("http://{silent_addr}/hooks?token=s3")));
    // DNS: a name that cannot resolve (RFC 6761 reserves .invalid).
    let dns = std::thread::spawn(|| dead_error("http://nonexistent.invalid/hooks"));
    // HTTP 500 with a body, whose start is kept.
    let failing = Receiver::start(500, "database is locked\n(SQLITE_BUSY)");
    let status = dead_error(&failing.url());

    let refused = refused.join().unwrap();
    assert_eq!(
        refused,
        format!("connection refused (http://{down}/hooks)"),
        "refused"
    );
    let timeout = timeout.join().unwrap();
    assert_eq!(
        timeout,
        format!("timeout: no answer within 1s (http://{silent_addr}/hooks)"),
        "timeout; the query (which may hold a credential) is not shown"
    );
    let dns = dns.join().unwrap();
    assert_eq!(
        dns,
        "DNS: cannot resolve nonexistent.invalid (http://nonexistent.invalid/hooks)"
    );
    assert_eq!(
        status,
        format!(
            "HTTP 500 from {}: database is locked (SQLITE_BUSY)",
            failing.url()
        )
    );
}
