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

/// A request's headers, names in lower case.
type Headers = Vec<(String, String)>;

/// A tiny HTTP server on port 0: answers every request with `status` and `body`, and keeps
/// each request's body (a Slack-shaped receiver, or an app that fails with a message).
struct Receiver {
    addr: SocketAddr,
    status: Arc<AtomicU16>,
    bodies: Arc<Mutex<Vec<Vec<u8>>>>,
    headers: Arc<Mutex<Vec<Headers>>>,
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
    headers: &Mutex<Vec<Headers>>,
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
fn a_dead_rows_error_names_refused_timeout_dns_tls_and_http_500_with_the_target() {
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
    // TLS: https:// to a server that speaks plain HTTP.
    let plain = Receiver::start(500, "not TLS");
    let plain_addr = plain.addr;
    let tls = std::thread::spawn(move || dead_error(&format!("https://{plain_addr}/hook")));
    // HTTP 500 with a body, whose start is kept.
    let failing = Receiver::start(500, "database is locked\n(SQLITE_BUSY)");
    let status = dead_error(&failing.url());

    let refused = refused.join().unwrap();
    assert_eq!(
        refused,
        format!("connection refused (http://{down}/…)"),
        "refused"
    );
    let timeout = timeout.join().unwrap();
    assert_eq!(
        timeout,
        format!("timeout: no answer within 1s (http://{silent_addr}/…?…)"),
        "timeout; the path and query (which may hold a credential) are not shown"
    );
    let dns = dns.join().unwrap();
    assert_eq!(
        dns,
        "DNS: cannot resolve nonexistent.invalid (http://nonexistent.invalid/…)"
    );
    assert_eq!(
        status,
        format!(
            "HTTP 500 from {}: database is locked (SQLITE_BUSY)",
            failing.url().replace("/hook", "/…")
        )
    );
    let tls = tls.join().unwrap();
    assert!(
        tls.starts_with("TLS: ") && tls.ends_with(&format!("(https://{plain_addr}/…)")),
        "{tls}"
    );
}

/// A config with the `stripe` source, forwarding to `forward` (`fwd`: more `[forward]` lines)
/// and one `[[alert]]` of `alert` lines; its path.
fn alert_config(dir: &std::path::Path, forward: &str, fwd: &str, alert: &str) -> String {
    let config = format!(
        r#"
[[source]]
name = "stripe"
scheme = "stripe"
secrets = ["env:STRIPE_WEBHOOK_SECRET"]

[forward]
url = "{forward}"
secret = "{FORWARD_SECRET}"
{fwd}

[[alert]]
{alert}
"#
    );
    let path = dir.join("hookledger.toml");
    std::fs::write(&path, config).unwrap();
    path.to_str().unwrap().to_string()
}

fn texts(bodies: &[serde_json::Value]) -> Vec<String> {
    bodies
        .iter()
        .map(|b| {
            b["text"]
                .as_str()
                .expect("a Slack message has text")
                .to_string()
        })
        .collect()
}

/// Waits `settle`, then says whether more than `n` messages arrived (none should).
fn no_more_than(receiver: &Receiver, n: usize, settle: Duration) -> Vec<serde_json::Value> {
    std::thread::sleep(settle);
    let bodies = receiver.bodies();
    assert_eq!(bodies.len(), n, "one message per incident: {bodies:#?}");
    bodies
}

#[test]
fn a_down_forward_target_makes_one_alert_per_incident_and_one_when_it_recovers() {
    let slack = Receiver::start(200, "ok");
    // Down (503) on a port it keeps until it is back.
    let app = FakeApp::start_down();
    let down = app.addr;
    let dir = test_dir();
    let config = alert_config(
        dir.path(),
        &format!("http://{down}/hooks"),
        "schedule = [\"1s\"]\nbreaker_failures = 100",
        &format!("url = \"{}\"\non = [\"dead\"]", slack.url()),
    );
    let mut server = Server::start_in(dir.path(), &["--config", &config]);
    for id in ["evt_a1", "evt_a2", "evt_a3"] {
        assert_outcome(&server.send(&paid(id)), id, "processed");
    }
    let db = server.db();
    for id in ["evt_a1", "evt_a2", "evt_a3"] {
        wait_outbox_status(&db, id, "dead", WAIT);
    }
    slack.wait(1);
    let first = texts(&no_more_than(&slack, 1, Duration::from_secs(2)));
    assert!(
        first[0].starts_with("hookledger: deliveries of kind \"forward\" are going dead: row ")
            && first[0].ends_with(&format!("after 2 attempts: HTTP 503 from http://{down}/…")),
        "{first:?}"
    );
    let open: Vec<(String, String, String)> = db.all(
        "SELECT alert, cause, subject FROM alert_incidents WHERE cleared_at IS NULL",
        &[],
    );
    assert_eq!(open, [("1".into(), "dead".into(), "forward".into())]);
    assert_eq!(
        db.count("SELECT count(*) FROM outbox WHERE kind = 'alert:1' AND status = 'done'"),
        1
    );

    // A restart remembers the incident: another dead row sends nothing.
    server.terminate();
    let mut server = Server::start_in(dir.path(), &["--config", &config]);
    assert_outcome(&server.send(&paid("evt_a4")), "evt_a4", "processed");
    wait_outbox_status(&db, "evt_a4", "dead", WAIT);
    no_more_than(&slack, 1, Duration::from_secs(2));

    // The app is back: the next row delivered clears the incident, once.
    app.up();
    assert_outcome(&server.send(&paid("evt_a5")), "evt_a5", "processed");
    app.wait_delivered(1, WAIT);
    slack.wait(2);
    assert_outcome(&server.send(&paid("evt_a6")), "evt_a6", "processed");
    app.wait_delivered(2, WAIT);
    let all = texts(&no_more_than(&slack, 2, Duration::from_secs(2)));
    assert_eq!(
        all[1],
        "hookledger: kind \"forward\" delivers again (rows that went dead stay dead until \
         retried: hookledger outbox retry --all-dead)"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM alert_incidents WHERE cleared_at IS NULL"),
        0
    );
    assert_eq!(db.count("SELECT count(*) FROM alert_incidents"), 1);
    assert_eq!(
        db.count("SELECT count(*) FROM outbox WHERE kind = 'alert:1' AND status = 'done'"),
        2
    );
    server.kill();
}

#[test]
fn a_backlog_older_than_its_age_is_told_signed_and_again_when_it_drains() {
    let receiver = Receiver::start(200, "ok");
    // Down (503) on a port it keeps until it is back.
    let app = FakeApp::start_down();
    let down = app.addr;
    let dir = test_dir();
    let schedule = vec!["\"1s\""; 60].join(", ");
    let config = alert_config(
        dir.path(),
        &format!("http://{down}/hooks"),
        &format!("schedule = [{schedule}]\nbreaker_failures = 1000"),
        &format!(
            "name = \"ops\"\nurl = \"{}\"\nformat = \"standard\"\nsecret = \"{FORWARD_SECRET}\"\n\
             on = [\"backlog\"]\nbacklog_age = \"2s\"",
            receiver.url()
        ),
    );
    let server = Server::start_in(dir.path(), &["--config", &config]);
    assert_outcome(&server.send(&paid("evt_b1")), "evt_b1", "processed");
    let opened = receiver.wait(1);
    assert_eq!(opened[0]["type"], "alert.opened");
    assert_eq!(opened[0]["data"]["alert"], "ops");
    assert_eq!(opened[0]["data"]["cause"], "backlog");
    let text = opened[0]["data"]["text"].as_str().unwrap();
    assert!(
        text.starts_with("hookledger: the oldest pending delivery (row ")
            && text.contains("kind \"forward\") has waited ")
            && text.ends_with("(alert at 2s)"),
        "{text}"
    );
    // Signed as Standard Webhooks says, with the alert's secret.
    let headers = receiver.headers.lock().unwrap()[0].clone();
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {name}: {headers:?}"))
    };
    // Verified independently of hookledger's signer: HMAC-SHA256 over `id.timestamp.body`.
    use base64::Engine;
    use hmac::Mac;
    let body = receiver.bodies.lock().unwrap()[0].clone();
    let b64 = base64::engine::general_purpose::STANDARD;
    let key = b64
        .decode(FORWARD_SECRET.trim_start_matches("whsec_"))
        .unwrap();
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{}.{}.", header("webhook-id"), header("webhook-timestamp")).as_bytes());
    mac.update(&body);
    let expected = format!("v1,{}", b64.encode(mac.finalize().into_bytes()));
    assert_eq!(header("webhook-signature"), expected);

    // The app is back: the backlog drains, and that is told once.
    app.up();
    app.wait_delivered(1, WAIT);
    let all = receiver.wait(2);
    assert_eq!(all[1]["type"], "alert.cleared");
    assert_eq!(
        all[1]["data"]["text"],
        "hookledger: the delivery backlog is under 2s again"
    );
    no_more_than(&receiver, 2, Duration::from_secs(2));
    let db = server.db();
    assert_eq!(
        db.count("SELECT count(*) FROM alert_incidents WHERE cause = 'backlog' AND cleared_at IS NOT NULL"),
        1
    );
}

#[test]
fn refusals_over_the_rate_are_told_once_per_source_and_again_when_they_stop() {
    let slack = Receiver::start(200, "ok");
    let app = FakeApp::start(&[]);
    let dir = test_dir();
    let config = alert_config(
        dir.path(),
        &app.url(),
        "",
        &format!(
            "url = \"{}\"\non = [\"refused\"]\nrefused_per_minute = 60\nrefused_window = \"3s\"",
            slack.url()
        ),
    );
    let server = Server::start_in(dir.path(), &["--config", &config]);
    let body = paid("evt_forged");
    for _ in 0..6 {
        let reply = server.post(
            "/webhooks/stripe",
            &body,
            &[("Stripe-Signature", &forged_signature())],
        );
        assert_eq!(reply.status, 400, "{reply:?}");
    }
    let first = texts(&slack.wait(1));
    assert!(
        first[0].starts_with("hookledger: source \"stripe\" refused ")
            && first[0].contains("requests in the last 3s (alert at 60 a minute)"),
        "{first:?}"
    );
    // Nothing more is refused: the rate falls back, and that is told once.
    let all = texts(&slack.wait(2));
    assert_eq!(
        all[1],
        "hookledger: source \"stripe\" is back under 60 refusals a minute"
    );
    no_more_than(&slack, 2, Duration::from_secs(4));
    assert_eq!(ledger_count(&server.db()), 0);
}

#[test]
fn a_bad_alert_is_refused_at_start_up_naming_its_key() {
    let cases = [
        (
            "url = \"http://127.0.0.1:9/a\"\nformat = \"teams\"",
            "alert 1.format",
        ),
        (
            "url = \"http://127.0.0.1:9/a\"\non = [\"dead\", \"late\"]",
            "alert 1.on",
        ),
        ("url = \"not a url\"", "alert 1.url"),
        ("url = \"ftp://example.com/a\"", "alert 1.url"),
        (
            "url = \"http://127.0.0.1:9/a\"\nformat = \"standard\"",
            "alert 1.secret",
        ),
        (
            "url = \"http://127.0.0.1:9/a\"\nformat = \"standard\"\nsecret = \"whsec_%%\"",
            "alert 1.secret",
        ),
        (
            "url = \"http://127.0.0.1:9/a\"\nrefused_per_minute = 0",
            "alert 1.refused_per_minute",
        ),
        (
            "name = \"a b\"\nurl = \"http://127.0.0.1:9/a\"",
            "alert 1.name",
        ),
    ];
    for (alert, key) in cases {
        let dir = test_dir();
        let config = alert_config(dir.path(), "http://127.0.0.1:9/hooks", "", alert);
        let out = serve_command(db_arg_in(dir.path()))
            .args(["--config", &config])
            .env("STRIPE_WEBHOOK_SECRET", SECRET)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{alert}: {err}");
        assert!(
            err.contains(&format!("{key}:")),
            "{alert}: no `{key}` in {err}"
        );
        assert!(
            !err.contains("whsec_%%"),
            "the secret is not repeated: {err}"
        );
        assert!(!database_created(dir.path()), "{alert}: nothing is created");
    }
}

#[test]
fn two_instances_on_one_postgres_database_send_one_message_per_incident() {
    if !postgres_reachable() {
        return;
    }
    let slack = Receiver::start(200, "ok");
    let (down, _) = down_app();
    let dir = test_dir();
    let url = postgres_db_in(dir.path());
    let config = alert_config(
        dir.path(),
        &format!("http://{down}/hooks"),
        "schedule = [\"1s\"]\nbreaker_failures = 100",
        &format!("url = \"{}\"\non = [\"dead\"]", slack.url()),
    );
    let args = ["--config", &config, "--outbox-lease", "3s"];
    let a = Server::start_on(&url, &args);
    let b = Server::start_on(&url, &args);
    for i in 0..4 {
        let id = format!("evt_two_{i}");
        let server = if i % 2 == 0 { &a } else { &b };
        assert_outcome(&server.send(&paid(&id)), &id, "processed");
    }
    let db = Db::open(&url);
    for i in 0..4 {
        wait_outbox_status(&db, &format!("evt_two_{i}"), "dead", WAIT);
    }
    slack.wait(1);
    no_more_than(&slack, 1, Duration::from_secs(3));
    assert_eq!(db.count("SELECT count(*) FROM alert_incidents"), 1);
    assert_eq!(
        db.count("SELECT count(*) FROM outbox WHERE kind = 'alert:1'"),
        1
    );
}
