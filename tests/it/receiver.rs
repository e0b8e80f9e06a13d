//! Every row of the response contract (docs/src/guarantees.md, "Responses") and the
//! exactly-once semantics, each asserting the database state, not only the status.

use std::time::Duration;

use crate::util::*;

#[test]
fn new_event_is_processed_with_its_effects() {
    let server = Server::start(&[]);
    let body = paid_invoice("evt_new", "in_new");
    assert_outcome(&server.send(&body), "evt_new", "processed");
    let db = server.db();
    let (kind, source): (String, String) = db.one(
        "SELECT event_type, source FROM webhook_events WHERE event_id = 'evt_new'",
        &[],
    );
    assert_eq!((kind.as_str(), source.as_str()), ("invoice.paid", "stripe"));
    assert_eq!(
        stored_body(&db, "evt_new"),
        body,
        "the ledger keeps the exact verified bytes"
    );
    assert_eq!(credits(&db, "acct_1"), 100);
    assert_eq!(
        db.count("SELECT count(*) FROM invoice_payments WHERE stripe_invoice_id = 'in_new'"),
        1
    );
}

#[test]
fn duplicate_after_success_changes_nothing() {
    let server = Server::start(&[]);
    let body = paid_invoice("evt_dup", "in_dup");
    assert_outcome(&server.send(&body), "evt_dup", "processed");
    let before = snapshot(&server.db());
    assert_outcome(&server.send(&body), "evt_dup", "duplicate");
    assert_eq!(snapshot(&server.db()), before);
}

#[test]
fn unknown_type_is_recorded_and_acknowledged() {
    let server = Server::start(&[]);
    let body = br#"{"id":"evt_unknown","object":"event","type":"thing.we_never_heard_of","created":1700000000,"data":{"object":{"weird":[1,2]}}}"#;
    assert_outcome(&server.send(body), "evt_unknown", "processed");
    let db = server.db();
    assert_eq!(
        db.count(
            "SELECT count(*) FROM webhook_events WHERE event_type = 'thing.we_never_heard_of'"
        ),
        1
    );
    assert_eq!(db.count("SELECT count(*) FROM accounts"), 0);
    assert_eq!(db.count("SELECT count(*) FROM subscriptions"), 0);
    assert_outcome(&server.send(body), "evt_unknown", "duplicate");
}

#[test]
fn missing_and_invalid_signatures_are_rejected_and_write_nothing() {
    let server = Server::start(&[]);
    let body = paid_invoice("evt_sig", "in_sig");
    let before = snapshot(&server.db());
    let t = now();
    let wrong_secret =
        hookledger::internals::stripe::sign(&hookledger::Secret::new("whsec_other"), t, &body);
    let cases: Vec<(&str, Option<String>)> = vec![
        ("missing header", None),
        ("garbage", Some("bad_header".into())),
        ("no v1", Some(format!("t={t},v0=abcd"))),
        ("wrong secret", Some(wrong_secret)),
        ("v1 of another body", Some(signature(b"{}"))),
    ];
    for (case, header) in cases {
        let headers: Vec<(&str, &str)> = header
            .as_deref()
            .map(|h| vec![("Stripe-Signature", h)])
            .unwrap_or_default();
        let reply = server.post("/webhooks/stripe", &body, &headers);
        assert_error(&reply, 400, "invalid_signature");
        assert!(!reply.body.contains(SECRET), "{case}: the secret leaked");
    }
    // A body changed after signing (e.g. re-encoded by a proxy): the message says so.
    let header = signature(&body);
    let mut reencoded = body.clone();
    reencoded.retain(|b| *b != b'\n');
    let reply = server.post(
        "/webhooks/stripe",
        &reencoded,
        &[("Stripe-Signature", &header)],
    );
    assert_error(&reply, 400, "invalid_signature");
    assert!(json(&reply)["message"]
        .as_str()
        .unwrap()
        .contains("raw request body"));
    assert_eq!(snapshot(&server.db()), before);
}

#[test]
fn timestamps_outside_tolerance_are_rejected_both_ways() {
    let server = Server::start(&["--tolerance", "300"]);
    let body = paid_invoice("evt_time", "in_time");
    let before = snapshot(&server.db());
    for t in [now() - 301 - 5, now() + 301 + 5] {
        assert_error(&server.send_at(&body, t), 400, "timestamp_out_of_tolerance");
    }
    assert_eq!(snapshot(&server.db()), before);
    // Within tolerance on both sides it is fine.
    assert_outcome(&server.send_at(&body, now() - 250), "evt_time", "processed");
    assert_outcome(&server.send_at(&body, now() + 250), "evt_time", "duplicate");
}

#[test]
fn bodies_that_are_not_events_are_rejected_and_write_nothing() {
    let server = Server::start(&[]);
    let before = snapshot(&server.db());
    let bad: &[&[u8]] = &[
        b"",
        b"not json",
        b"[1,2,3]",
        br#"{"type":"invoice.paid","created":1}"#,
        br#"{"id":42,"type":"invoice.paid","created":1}"#,
        br#"{"id":"evt_1","created":1}"#,
        br#"{"id":"evt_1","type":"x"}"#,
        br#"{"id":"evt_1","type":"x","created":"1700000000"}"#,
        br#"{"id":"","type":"x","created":1}"#,
        br#"{"id":"evt_1","type":"invoice.paid","created":1,"data":{"object":{"id":"in_1"}}}"#,
    ];
    for body in bad {
        let reply = server.send(body);
        assert_eq!(
            reply.status,
            400,
            "{}: {}",
            String::from_utf8_lossy(body),
            reply.body
        );
        assert_eq!(json(&reply)["error"], "invalid_event");
    }
    assert_eq!(snapshot(&server.db()), before);
}

#[test]
fn body_over_limit_is_413_by_content_length_and_while_chunked() {
    let server = Server::start(&["--max-body", "2048"]);
    let before = snapshot(&server.db());
    // Declared too large: refused before the body is read (none is sent at all).
    let request = format!(
        "POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Stripe-Signature: {}\r\nContent-Length: 100000000000\r\n\r\n",
        forged_signature()
    );
    let answer = server.raw(request.as_bytes(), Duration::from_secs(5));
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("\"error\":\"body_too_large\""), "{answer}");
    // Chunked without a length: cut off once past the limit.
    let chunk = "a".repeat(1000);
    let mut request = format!(
        "POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nStripe-Signature: {}\r\n\
         Transfer-Encoding: chunked\r\n\r\n",
        forged_signature()
    )
    .into_bytes();
    for _ in 0..5 {
        request.extend_from_slice(format!("{:x}\r\n{chunk}\r\n", chunk.len()).as_bytes());
    }
    request.extend_from_slice(b"0\r\n\r\n");
    let answer = server.raw(&request, Duration::from_secs(5));
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    // A signed event over the limit is refused too, and nothing is written.
    let mut big = paid_invoice("evt_big", "in_big");
    big.truncate(big.len() - 2);
    big.extend_from_slice(format!(",\"pad\":\"{}\"}}\n", "x".repeat(3000)).as_bytes());
    assert_error(&server.send(&big), 413, "body_too_large");
    assert_eq!(snapshot(&server.db()), before);
    // The limit is inclusive of exactly max-body bytes: a small event still works.
    assert_outcome(
        &server.send(br#"{"id":"evt_small","type":"x","created":1}"#),
        "evt_small",
        "processed",
    );
}

#[test]
fn unknown_source_is_404_and_wrong_method_is_405() {
    let server = Server::start(&[]);
    let body = paid_invoice("evt_route", "in_route");
    let header = signature(&body);
    let reply = server.post("/webhooks/github", &body, &[("Stripe-Signature", &header)]);
    assert_error(&reply, 404, "unknown_source");
    // Its body is not read: the connection is closed, not left for a next request to find
    // dropped.
    let answer = server.raw(
        b"POST /webhooks/github HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
        Duration::from_secs(5),
    );
    assert!(
        answer.starts_with("HTTP/1.1 404")
            && answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
    let reply = server.post("/nope", &body, &[]);
    assert_error(&reply, 404, "not_found");
    let answer = server.raw(
        b"GET /webhooks/stripe HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(answer.starts_with("HTTP/1.1 405"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("allow: post"),
        "{answer}"
    );
    assert!(
        answer.contains("\"error\":\"method_not_allowed\""),
        "{answer}"
    );
    assert_eq!(ledger_count(&server.db()), 0);
}

#[test]
fn failure_mid_apply_is_500_with_no_ledger_row_and_the_retry_applies() {
    let server = Server::start(&[]);
    let db = server.db();
    db.inject_failure("fail_credit", "UPDATE", "accounts", "true", "injected");
    // The first invoice creates the account (INSERT, not UPDATE): it succeeds.
    assert_outcome(
        &server.send(&paid_invoice("evt_first", "in_first")),
        "evt_first",
        "processed",
    );
    // The second needs an UPDATE of the account: the trigger aborts it mid-apply, after the
    // claim and the invoice_payments row were written.
    let body = paid_invoice("evt_fail", "in_fail");
    let reply = server.send(&body);
    assert_error(&reply, 500, "internal");
    assert!(
        !reply.body.contains("injected"),
        "internal detail leaked: {}",
        reply.body
    );
    assert_eq!(
        db.count("SELECT count(*) FROM webhook_events WHERE event_id = 'evt_fail'"),
        0
    );
    assert_eq!(
        db.count("SELECT count(*) FROM invoice_payments WHERE stripe_invoice_id = 'in_fail'"),
        0
    );
    assert_eq!(credits(&db, "acct_1"), 100);
    wait_for(Duration::from_secs(5), || {
        server.log().contains("injected").then_some(())
    })
    .expect("the detail is logged");

    db.remove_failure("fail_credit", "accounts");
    assert_outcome(&server.send(&body), "evt_fail", "processed");
    assert_eq!(credits(&db, "acct_1"), 200);
}

#[test]
fn ten_parallel_copies_give_one_ledger_row_and_one_grant() {
    let server = Server::start(&[]);
    let body = paid_invoice("evt_par", "in_par");
    let replies: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..10).map(|_| s.spawn(|| server.send(&body))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let outcomes: Vec<String> = replies
        .iter()
        .map(|r| {
            assert_eq!(r.status, 200, "{}", r.body);
            json(r)["outcome"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(
        outcomes.iter().filter(|o| *o == "processed").count(),
        1,
        "{outcomes:?}"
    );
    assert_eq!(
        outcomes.iter().filter(|o| *o == "duplicate").count(),
        9,
        "{outcomes:?}"
    );
    let db = server.db();
    assert_eq!(ledger_count(&db), 1);
    assert_eq!(db.count("SELECT count(*) FROM invoice_payments"), 1);
    assert_eq!(credits(&db, "acct_1"), 100);
}

#[test]
fn either_of_two_rotating_secrets_verifies() {
    let server = Server::start(&["--stripe-secret", "whsec_old_secret_1,whsec_new_secret_2"]);
    for (i, secret) in ["whsec_old_secret_1", "whsec_new_secret_2"]
        .iter()
        .enumerate()
    {
        let body = paid_invoice(&format!("evt_rot{i}"), &format!("in_rot{i}"));
        let header =
            hookledger::internals::stripe::sign(&hookledger::Secret::new(*secret), now(), &body);
        let reply = server.post("/webhooks/stripe", &body, &[("Stripe-Signature", &header)]);
        assert_outcome(&reply, &format!("evt_rot{i}"), "processed");
    }
    // The test default secret is not configured here.
    assert_error(
        &server.send(&paid_invoice("evt_rot_x", "in_rot_x")),
        400,
        "invalid_signature",
    );
    assert_eq!(credits(&server.db(), "acct_1"), 200);
}

#[test]
fn secret_file_keeps_the_secret_out_of_argv_and_env() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secret");
    std::fs::write(&file, format!("{SECRET}\n")).unwrap();
    let server = Server::start(&["--stripe-secret-file", file.to_str().unwrap()]);
    assert_outcome(
        &server.send(&paid_invoice("evt_file", "in_file")),
        "evt_file",
        "processed",
    );
}

#[test]
fn without_a_secret_serve_refuses_to_start_with_exit_code_2() {
    let dir = test_dir();
    let output = serve_command(db_arg_in(dir.path()))
        .env_remove("STRIPE_WEBHOOK_SECRET")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("STRIPE_WEBHOOK_SECRET"), "{stderr}");
    assert!(
        !database_created(dir.path()),
        "nothing is created before the config is valid"
    );
}

#[test]
fn queue_full_is_503_with_retry_after_and_writes_nothing() {
    if skipped_on_postgres(
        "the writer is stalled by SQLite's write lock, held by another connection",
    ) {
        return;
    }
    // One event at a time, a queue of one, and another connection holding the write lock:
    // the writer is stuck in its busy wait, so the queue fills.
    let server = Server::start(&[
        "--batch-max",
        "1",
        "--queue-depth",
        "1",
        "--busy-timeout-ms",
        "3000",
    ]);
    wait_for_first_heartbeat(&server);
    let lock = server.db();
    lock.batch("BEGIN IMMEDIATE");
    let replies: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let server = &server;
                s.spawn(move || {
                    server.send(&paid_invoice(&format!("evt_q{i}"), &format!("in_q{i}")))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    lock.batch("ROLLBACK");
    let overloaded: Vec<_> = replies
        .iter()
        .filter(|r| r.status == 503 && json(r)["error"] == "overloaded")
        .collect();
    assert!(
        !overloaded.is_empty(),
        "{:?}",
        replies.iter().map(|r| &r.body).collect::<Vec<_>>()
    );
    for reply in &replies {
        assert_eq!(reply.status, 503, "{}", reply.body);
        assert_eq!(reply.retry_after.as_deref(), Some("1"));
    }
    assert!(
        replies.iter().any(|r| json(r)["error"] == "database_busy"),
        "the job that waited on the lock gets a busy 503"
    );
    assert_eq!(ledger_count(&server.db()), 0);
    // After the lock is released everything works again, once the writer has worked off
    // what waited (the queue of one may still hold a background write, such as the refusal
    // recorder's count of the 503s just sent).
    let reply = wait_for(Duration::from_secs(10), || {
        let reply = server.send(&paid_invoice("evt_q0", "in_q0"));
        (reply.status != 503).then_some(reply)
    })
    .expect("the writer takes events again");
    assert_outcome(&reply, "evt_q0", "processed");
}

#[test]
fn log_has_one_line_per_event_and_no_secret_or_body() {
    let server = Server::start(&[]);
    let body = paid_invoice("evt_log", "in_log");
    assert_outcome(&server.send(&body), "evt_log", "processed");
    assert_outcome(&server.send(&body), "evt_log", "duplicate");
    server.send(b"{\"id\":\"evt_secretish\",\"type\":\"x\"}");
    // The server writes its lines before it answers, but the harness reads them from a pipe
    // on a thread of its own, in chunks: wait until both lines arrived whole (or fail on what
    // did), not only the start of the second.
    let log = wait_for(Duration::from_secs(10), || {
        let log = server.log();
        let whole = log
            .split_inclusive('\n')
            .filter(|l| l.ends_with('\n') && l.contains("evt_log"))
            .count();
        (whole >= 2).then_some(log)
    })
    .unwrap_or_else(|| server.log());
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("evt_log")).collect();
    assert_eq!(lines.len(), 2, "{log}");
    assert!(
        lines[0].contains("invoice.paid")
            && lines[0].contains("processed")
            && lines[0].contains("ms")
    );
    assert!(lines[1].contains("duplicate"));
    assert!(!log.contains(SECRET), "secret in log:\n{log}");
    assert!(!log.contains("jenny.rosen"), "body in log:\n{log}");
    assert!(
        !log.contains("evt_secretish"),
        "rejected body content in log:\n{log}"
    );
}

/// A correct signature after sixteen others is not checked; the answer says why instead of
/// "no signature matches".
#[test]
fn a_header_with_too_many_signatures_says_so() {
    let server = Server::start(&[]);
    let body = paid("evt_crowded");
    let real = signature(&body);
    let junk = format!(",v1={}", "00".repeat(32)).repeat(16);
    let (t, v1) = real.split_once(',').unwrap();
    let header = format!("{t}{junk},{v1}");
    let reply = server.post("/webhooks/stripe", &body, &[("Stripe-Signature", &header)]);
    assert_error(&reply, 400, "invalid_signature");
    assert!(
        reply.body.contains("more than 16 signatures"),
        "{}",
        reply.body
    );
    assert_eq!(ledger_count(&server.db()), 0);
    // Sixteen in all, the real one among them, is fine.
    let header = format!("{t}{},{v1}", format!(",v1={}", "00".repeat(32)).repeat(15));
    let reply = server.post("/webhooks/stripe", &body, &[("Stripe-Signature", &header)]);
    assert_outcome(&reply, "evt_crowded", "processed");
}
