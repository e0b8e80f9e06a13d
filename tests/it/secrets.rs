//! The log: no secret and no payload at any level, no line forged by an event, no flood from
//! a flood of bad requests; and no escape sequence from the database reaches the terminal.

use std::time::Duration;

use hookledger::internals::invoice_event;

use crate::util::*;

const FORWARD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

#[test]
fn no_secret_and_no_payload_in_the_log_even_at_trace() {
    let app = FakeApp::start(&[500]);
    let dir = test_dir();
    let secret_file = dir.path().join("forward.secret");
    std::fs::write(&secret_file, FORWARD_SECRET).unwrap();
    // Credentials in the forward URL are a secret too.
    let url = app.url().replace("http://", "http://hookuser:pa55w0rd@");
    let server = Server::start_with_env(
        dir.path(),
        &[
            "--forward-to",
            &url,
            "--forward-secret-file",
            secret_file.to_str().unwrap(),
            "--forward-schedule",
            "1s",
        ],
        // Asking for the HTTP client's own debug lines by name does not bring them back.
        &[("RUST_LOG", "trace,ureq=trace,ureq::unit=trace")],
    );
    let body = invoice_event(
        "evt_trace",
        "invoice.paid",
        now(),
        "in_trace",
        "cus_1",
        "acct_1",
    );
    assert_outcome(&server.send(body.as_bytes()), "evt_trace", "processed");
    // Every kind of rejection too.
    server.post(
        "/webhooks/stripe",
        body.as_bytes(),
        &[("Stripe-Signature", "t=1,v1=00")],
    );
    server.send(br#"{"id":"evt_bad","type":"invoice.paid","created":"not-a-number-PAYLOADMARK"}"#);
    server.send(br#"{"id":"evt_bad2","type":"invoice.paid","created":1,"data":{"object":{"id":"PAYLOADMARK2"}}}"#);
    app.wait_delivered(1, Duration::from_secs(20));
    let db = server.db();
    wait_outbox_status(&db, "evt_trace", "done", Duration::from_secs(20));

    let log = server.log();
    assert!(
        log.contains("evt_trace"),
        "the log works at trace: {log:.500}"
    );
    for secret in [
        "pa55w0rd",
        "aG9va3VzZXI6cGE1NXcwcmQ=", // the same, as a basic-auth header
        SECRET,
        FORWARD_SECRET,
        FORWARD_SECRET.trim_start_matches("whsec_"),
    ] {
        assert!(!log.contains(secret), "a secret is in the log");
    }
    // So is the password in a PostgreSQL --db URL.
    if let Some(password) = url::Url::parse(&server.db_arg())
        .ok()
        .and_then(|url| url.password().map(str::to_string))
    {
        assert!(
            !log.contains(&format!(":{password}@")),
            "the database password is in the log"
        );
    }
    // The delivery's signature lets anyone who reads the log replay that delivery.
    let delivered = &app.deliveries()[0];
    let signature = &delivered.headers["webhook-signature"];
    assert!(
        !log.contains(signature.as_str()),
        "a delivery signature is in the log"
    );
    for payload in [
        "jenny.rosen",
        "line_item",
        "PAYLOADMARK",
        "price_1PgafmB7WZ01zgkW6dKueIc5",
    ] {
        assert!(
            !log.contains(payload),
            "payload text `{payload}` is in the log"
        );
    }
}

#[test]
fn help_does_not_show_secret_values_from_the_environment() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_hookledger"))
        .args(["serve", "--help"])
        .env("STRIPE_WEBHOOK_SECRET", "whsec_visible_in_help")
        .env("HOOKLEDGER_FORWARD_SECRET", "whsec_also_visible")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(help.contains("STRIPE_WEBHOOK_SECRET"));
    assert!(
        !help.contains("whsec_visible_in_help") && !help.contains("whsec_also_visible"),
        "{help}"
    );
}

/// An event id or type with a control character could forge a log line (`evt\nINFO fake`);
/// it is refused with a 400 and writes nothing.
#[test]
fn control_characters_or_blank_ids_are_refused_and_forge_no_log_line() {
    let server = Server::start(&[]);
    for (id, kind) in [
        ("evt_1\nINFO  hookledger: forged line", "invoice.paid"),
        ("evt_2\u{1b}[31m", "invoice.paid"),
        ("evt_3", "invoice.paid\r\nINFO forged"),
        ("   ", "invoice.paid"),
    ] {
        let body =
            serde_json::json!({"id": id, "type": kind, "created": now(), "data": {"object": {}}});
        let reply = server.send(body.to_string().as_bytes());
        assert_error(&reply, 400, "invalid_event");
    }
    assert_eq!(ledger_count(&server.db()), 0);
    let log = server.log();
    assert!(!log.contains("forged"), "{log}");
    assert!(!log.contains('\u{1b}'), "{log:?}");
}

/// Rows that reached the database some other way are listed with their control characters
/// escaped, not sent raw to the terminal.
#[test]
fn events_list_escapes_control_characters() {
    let server = Server::start(&[]);
    assert_outcome(&server.send(&paid("evt_plain")), "evt_plain", "processed");
    server.db().execute(
        "UPDATE webhook_events SET event_type = $1",
        &[&"x\u{1b}[2J\ny"],
    );
    let (code, out, err) = cli(&["events", "list", "--db", &server.db_arg()]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains('\u{1b}'), "{out:?}");
    assert!(out.contains(r"x\u{1b}[2J\ny"), "{out}");
}

/// A flood of forged requests writes a bounded number of log lines (ten a second), and says
/// how many it left out.
#[test]
fn a_flood_of_bad_signatures_does_not_flood_the_log() {
    let server = Server::start(&[]);
    let started = std::time::Instant::now();
    let body = paid("evt_flood");
    for _ in 0..1500 {
        let reply = server.post(
            "/webhooks/stripe",
            &body,
            &[("Stripe-Signature", forged_signature().as_str())],
        );
        assert_eq!(reply.status, 400);
    }
    // One more, in a later second, carries the count of those held back.
    std::thread::sleep(Duration::from_millis(1100));
    server.post("/webhooks/stripe", &body, &[]);
    let log = wait_for(Duration::from_secs(5), || {
        let log = server.log();
        log.contains("not logged").then_some(log)
    })
    .expect("the held-back rejections are counted in the log");
    let lines = log.lines().filter(|l| l.contains("rejected")).count() as u64;
    // The requests spanned at most this many distinct wall-clock seconds.
    let seconds = started.elapsed().as_secs() + 2;
    assert!(
        lines <= seconds * 10,
        "{lines} rejection lines for 1501 rejections within {seconds} s"
    );
    assert_eq!(ledger_count(&server.db()), 0);
}
