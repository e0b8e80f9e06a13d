//! The admin listener's `/metrics` and `/status`, and the token that guards what changes data.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;

use crate::util::*;

/// The load generator of `hookledger-bench`, as it is: the counts it keeps are what the
/// metrics must equal.
#[allow(dead_code)]
#[path = "../../tools/src/loadgen.rs"]
mod loadgen;

pub(crate) const WAIT: Duration = Duration::from_secs(20);
pub(crate) const TOKEN: &str = "test-admin-token-0123456789";

/// One sample of the OpenMetrics text: name, labels, value.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Every sample of `text`, which must be well-formed: comments, then `name{k="v",…} value`
/// lines, then `# EOF`.
fn samples(text: &str) -> Vec<Sample> {
    assert!(text.ends_with("# EOF\n"), "no EOF marker:\n{text}");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect(line);
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, parse_labels(rest.strip_suffix('}').expect(line))),
                None => (series, BTreeMap::new()),
            };
            Sample {
                name: name.to_string(),
                labels,
                value: value.parse().unwrap_or_else(|_| panic!("value of {line}")),
            }
        })
        .collect()
}

/// `k="v",k2="v2"` with `\"` and `\\` escapes in values.
fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"").expect(text);
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next().expect(text) {
                (_, '\\') => value.push(chars.next().expect(text).1),
                (i, '"') => break i,
                (_, c) => value.push(c),
            }
        };
        labels.insert(key.to_string(), value);
        rest = after[end + 1..].trim_start_matches(',');
    }
    labels
}

/// The sum of `name` over the samples whose labels include `with`.
fn total(samples: &[Sample], name: &str, with: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            with.iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(v))
        })
        .map(|s| s.value)
        .sum()
}

/// `/metrics` as a scraper that asks for OpenMetrics (Prometheus) gets it.
fn metrics(server: &Server) -> Vec<Sample> {
    let accept = [("Accept", "application/openmetrics-text; version=1.0.0")];
    let (status, _, body) = server.admin_request("GET", "/metrics", &accept, b"");
    assert_eq!(status, 200, "{body}");
    samples(&body)
}

/// After a run of the load generator (new events, resends, some of them at the same time),
/// `/metrics` counts exactly what it saw: processed and duplicate events equal its counts and
/// the ledger; every request was timed; the writer's queue is empty again.
#[test]
fn metrics_count_what_the_load_generator_saw_and_what_the_ledger_holds() {
    let server = Server::start(&[]);
    let workload = loadgen::Workload {
        requests: 3000,
        resend_share: 0.2,
        seed: 11,
        ids: loadgen::Ids::Ordered,
    };
    let requests = loadgen::prepare(&workload, &secret(), &server.addr.to_string());
    let report = loadgen::run(server.addr, &requests, 16);
    assert_eq!(report.statuses.get(&200), Some(&3000), "{report:?}");
    assert!(
        report.processed > 2000 && report.duplicates > 400,
        "{report:?}"
    );
    // Two refusals: a forged signature and a source that does not exist.
    let forged = server.post(
        "/webhooks/stripe",
        &paid("evt_forged"),
        &[("Stripe-Signature", &forged_signature())],
    );
    assert_error(&forged, 400, "invalid_signature");
    assert_error(
        &server.post("/webhooks/nope", b"{}", &[]),
        404,
        "unknown_source",
    );

    let m = metrics(&server);
    let events = "hookledger_events_total";
    assert_eq!(
        total(&m, events, &[("outcome", "processed")]) as usize,
        report.processed
    );
    assert_eq!(
        total(&m, events, &[("outcome", "duplicate")]) as usize,
        report.duplicates
    );
    assert_eq!(total(&m, events, &[("outcome", "failed")]), 0.0);
    assert_eq!(
        ledger_count(&server.db()) as usize,
        report.processed,
        "one ledger row per processed event"
    );
    // The load is invoices and subscription updates, all from the one source.
    let by_type: f64 = ["invoice.paid", "customer.subscription.updated"]
        .iter()
        .map(|t| total(&m, events, &[("source", "stripe"), ("type", t)]))
        .sum();
    assert_eq!(by_type as usize, 3000);
    let rejected = "hookledger_rejected_total";
    assert_eq!(
        total(
            &m,
            rejected,
            &[("source", "stripe"), ("reason", "invalid_signature")]
        ),
        1.0
    );
    assert_eq!(
        total(
            &m,
            rejected,
            &[("source", "-"), ("reason", "unknown_source")]
        ),
        1.0
    );
    assert_eq!(total(&m, rejected, &[]), 2.0);
    assert_eq!(
        total(&m, "hookledger_request_duration_seconds_count", &[]),
        3002.0
    );
    // Every event went through a writer batch; so did a few other writes (retention's
    // batches at start).
    let others = total(&m, "hookledger_batch_size_sum", &[]) - 3000.0;
    assert!((0.0..=10.0).contains(&others), "{others} other writes");
    assert!(total(&m, "hookledger_batch_size_count", &[]) >= 1.0);
    assert_eq!(total(&m, "hookledger_writer_queue_depth", &[]), 0.0);
}

/// Forwarding to an app that answers 410: the row is dead at once, and `/metrics` shows it
/// by kind and status with the attempt that killed it; once revived and delivered, the
/// counts follow.
#[test]
fn metrics_show_outbox_rows_by_status_and_delivery_attempts_by_result() {
    let app = FakeApp::start(&[410]);
    let args = forwarding(&app);
    let server = start_with_token(&args);
    assert_outcome(&server.send(&paid("evt_gone")), "evt_gone", "processed");
    let db = server.db();
    wait_outbox_status(&db, "evt_gone", "dead", WAIT);
    let m = metrics(&server);
    let forward = [("kind", "forward")];
    assert_eq!(
        total(
            &m,
            "hookledger_outbox_rows",
            &[forward[0], ("status", "dead")]
        ),
        1.0
    );
    assert_eq!(
        total(
            &m,
            "hookledger_delivery_attempts_total",
            &[forward[0], ("result", "dead")]
        ),
        1.0
    );
    assert_eq!(
        total(&m, "hookledger_outbox_oldest_pending_seconds", &[]),
        0.0
    );

    let (status, head, _) = server.admin_request(
        "POST",
        "/status/retry-dead",
        &[("Authorization", &format!("Bearer {TOKEN}"))],
        b"",
    );
    assert_eq!(status, 303, "{head}");
    app.wait_delivered(1, WAIT);
    wait_outbox_status(&db, "evt_gone", "done", WAIT);
    let m = metrics(&server);
    assert_eq!(
        total(
            &m,
            "hookledger_outbox_rows",
            &[forward[0], ("status", "done")]
        ),
        1.0
    );
    assert_eq!(
        total(
            &m,
            "hookledger_outbox_rows",
            &[forward[0], ("status", "dead")]
        ),
        0.0
    );
    assert_eq!(
        total(
            &m,
            "hookledger_delivery_attempts_total",
            &[forward[0], ("result", "delivered")]
        ),
        1.0
    );
}

/// Serve arguments that forward to `app` with one retry a second, and the admin token from
/// `HOOKLEDGER_TEST_ADMIN_TOKEN`.
pub(crate) fn forwarding(app: &FakeApp) -> Vec<String> {
    [
        "--forward-to",
        &app.url(),
        "--forward-secret",
        FORWARD_SECRET,
        "--forward-schedule",
        "1s",
        "--admin-token",
        "env:HOOKLEDGER_TEST_ADMIN_TOKEN",
    ]
    .map(str::to_string)
    .to_vec()
}

/// A server with `args` and [`TOKEN`] in `HOOKLEDGER_TEST_ADMIN_TOKEN`.
pub(crate) fn start_with_token(args: &[String]) -> Server {
    let dir = test_dir();
    let mut server = Server::start_with_env(
        dir.path(),
        &strs(args),
        &[("HOOKLEDGER_TEST_ADMIN_TOKEN", TOKEN), ("RUST_LOG", "info")],
    );
    server.keep(dir);
    server
}

fn dead_rows(db: &Db) -> i64 {
    db.count("SELECT count(*) FROM outbox WHERE status = 'dead'")
}

/// Reviving dead rows needs the token: without one set it is refused (403), with a wrong one
/// or one sent as basic auth (which a browser attaches by itself) too (401); each time the
/// row stays dead. The form's field and a bearer token work.
#[test]
fn reviving_dead_rows_needs_the_admin_token() {
    let app = FakeApp::start(&[410, 410]);
    let mut args = forwarding(&app);
    args.truncate(6); // no token
    let unset = Server::start(&strs(&args));
    assert_outcome(&unset.send(&paid("evt_d1")), "evt_d1", "processed");
    let db = unset.db();
    wait_outbox_status(&db, "evt_d1", "dead", WAIT);
    let (status, _, body) = unset.admin_request("POST", "/status/retry-dead", &[], b"token=x");
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("--admin-token"), "{body}");
    assert_eq!(dead_rows(&db), 1);
    drop(unset);

    let server = start_with_token(&forwarding(&app));
    assert_outcome(&server.send(&paid("evt_d2")), "evt_d2", "processed");
    let db = server.db();
    wait_outbox_status(&db, "evt_d2", "dead", WAIT);
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("admin:{TOKEN}"));
    let form = "application/x-www-form-urlencoded";
    for (headers, body) in [
        (vec![("Content-Type", form)], "token=wrong".to_string()),
        (vec![("Content-Type", form)], String::new()),
        (
            vec![("Authorization", &*format!("Basic {basic}"))],
            String::new(),
        ),
        (vec![("Authorization", "Bearer wrong")], String::new()),
    ] {
        let (status, _, reply) =
            server.admin_request("POST", "/status/retry-dead", &headers, body.as_bytes());
        assert_eq!(status, 401, "{headers:?} {body}: {reply}");
        assert_eq!(dead_rows(&db), 1, "{headers:?} {body}");
    }
    // GET does not change anything either.
    assert_eq!(server.admin_get("/status/retry-dead").0, 405);
    assert_eq!(dead_rows(&db), 1);

    let (status, head, _) = server.admin_request(
        "POST",
        "/status/retry-dead",
        &[("Content-Type", form)],
        format!("token={TOKEN}").as_bytes(),
    );
    assert_eq!(status, 303, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("location: /status?revived=1"),
        "{head}"
    );
    app.wait_delivered(1, WAIT);
    wait_outbox_status(&db, "evt_d2", "done", WAIT);
}

/// On an address other than loopback, `/metrics` and `/status` need the token too (bearer,
/// or basic auth so that a browser can ask for it); health and readiness never do.
#[test]
fn off_loopback_the_pages_need_the_token_and_probes_do_not() {
    let server = start_with_token(
        &[
            "--admin-listen",
            "0.0.0.0:0",
            "--admin-token",
            "env:HOOKLEDGER_TEST_ADMIN_TOKEN",
        ]
        .map(str::to_string),
    );
    assert_eq!(server.admin_get("/healthz").0, 200);
    assert_eq!(server.admin_get("/readyz").0, 200);
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("any:{TOKEN}"));
    for path in ["/metrics", "/status"] {
        let (status, head, _) = server.admin_request("GET", path, &[], b"");
        assert_eq!(status, 401, "{path}");
        assert!(
            head.to_ascii_lowercase()
                .contains("www-authenticate: basic realm=\"hookledger admin\""),
            "{head}"
        );
        let wrong = [("Authorization", "Bearer not-the-token-at-all")];
        assert_eq!(server.admin_request("GET", path, &wrong, b"").0, 401);
        let bearer = format!("Bearer {TOKEN}");
        assert_eq!(
            server
                .admin_request("GET", path, &[("Authorization", &bearer)], b"")
                .0,
            200,
            "{path}"
        );
        let basic = format!("Basic {basic}");
        assert_eq!(
            server
                .admin_request("GET", path, &[("Authorization", &basic)], b"")
                .0,
            200,
            "{path}"
        );
    }
}

/// `/status` shows a known event with its outcome, the throughput, the outbox counts with a
/// dead row's error, and the retention horizon; what came from outside is escaped.
#[test]
fn the_status_page_shows_events_outbox_and_retention() {
    let app = FakeApp::start(&[410]);
    let server = start_with_token(&forwarding(&app));
    let odd = "evt_<b>odd</b>";
    assert_outcome(&server.send(&paid(odd)), odd, "processed");
    assert_outcome(&server.send(&paid(odd)), odd, "duplicate");
    wait_outbox_status(&server.db(), odd, "dead", WAIT);
    let (status, page) = server.admin_get("/status");
    assert_eq!(status, 200, "{page}");
    assert!(page.starts_with("<!doctype html>"), "{page}");
    assert!(!page.contains("<b>odd</b>"), "not escaped: {page}");
    let escaped = "evt_&lt;b&gt;odd&lt;/b&gt;";
    for needle in [
        "id=\"source-stripe\"",
        &format!(
            "<code>{escaped}</code></td><td>invoice.paid</td><td class=\"duplicate\">duplicate"
        ),
        &format!(
            "<code>{escaped}</code></td><td>invoice.paid</td><td class=\"processed\">processed"
        ),
        "<td>forward</td><td class=n>0</td><td class=n>0</td><td class=n>1</td>",
        "HTTP 410 Gone",
        "Claims are kept 400 days",
        "Payloads are kept 30 days",
        "<button type=submit id=retry-dead>",
    ] {
        assert!(page.contains(needle), "no `{needle}` in {page}");
    }
    assert!(page.contains("<table class=throughput>"), "{page}");
    // A request for another name (a page that rebound its DNS name to this address) must
    // show the token, even on loopback.
    let rebound = [("Host", "rebound.example:9090")];
    for path in ["/status", "/metrics"] {
        assert_eq!(
            server.admin_request("GET", path, &rebound, b"").0,
            401,
            "{path}"
        );
        let bearer = format!("Bearer {TOKEN}");
        let with_token = [rebound[0], ("Authorization", &bearer)];
        assert_eq!(
            server.admin_request("GET", path, &with_token, b"").0,
            200,
            "{path}"
        );
    }
}
