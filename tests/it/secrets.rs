//! Secrets and payloads never reach the log, at any level.

use std::time::Duration;

use hookledger::internals::invoice_event;

use crate::util::*;

const FORWARD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

#[test]
fn no_secret_and_no_payload_in_the_log_even_at_trace() {
    let app = FakeApp::start(&[500]);
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("forward.secret");
    std::fs::write(&secret_file, FORWARD_SECRET).unwrap();
    let url = app.url();
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
        &[("RUST_LOG", "trace")],
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
        SECRET,
        FORWARD_SECRET,
        FORWARD_SECRET.trim_start_matches("whsec_"),
    ] {
        assert!(!log.contains(secret), "a secret is in the log");
    }
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
