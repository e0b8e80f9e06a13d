//! Every scheme over real HTTP, from the example config file `examples/hookledger.toml`:
//! each request is signed here by an implementation of its own (the `hmac` crate, or Python's
//! `hmac` for GitHub), not by hookledger's signers.

use std::path::{Path, PathBuf};

use base64::Engine;
use hmac::Mac;

use crate::util::*;

const GITHUB_SECRET: &str = "It's a Secret to Everybody";
const SHOPIFY_SECRET: &str = "shopify_client_secret_1";
/// The Standard Webhooks vector's secret.
const CLERK_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const ACME_SECRET: &str = "acme_secret_for_tests";

/// The environment the example config reads its sources' secrets from.
const SECRETS: [(&str, &str); 4] = [
    ("GITHUB_WEBHOOK_SECRET", GITHUB_SECRET),
    ("SHOPIFY_CLIENT_SECRET", SHOPIFY_SECRET),
    ("CLERK_WEBHOOK_SECRET", CLERK_SECRET),
    ("ACME_WEBHOOK_SECRET", ACME_SECRET),
];

/// A server on `dir` with `args`, the sources' secrets and `env` in its environment.
fn start_in(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
    let mut all = vec![("RUST_LOG", "info")];
    all.extend(SECRETS);
    all.extend(env);
    Server::start_with_env(dir, args, &all)
}

fn example_config() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/hookledger.toml")
}

/// A server on the example config, with every source's secret in its environment.
fn start() -> Server {
    let dir = test_dir();
    let config = example_config();
    let mut server = start_in(dir.path(), &["--config", config.to_str().unwrap()], &[]);
    server.keep(dir);
    server
}

fn hmac256(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).unwrap();
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().to_vec()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

type Headers = Vec<(String, String)>;

fn github_headers(secret: &str, id: &str, event: &str, body: &[u8]) -> Headers {
    vec![
        (
            "X-Hub-Signature-256".into(),
            format!(
                "sha256={}",
                hex::encode(hmac256(secret.as_bytes(), &[body]))
            ),
        ),
        ("X-GitHub-Delivery".into(), id.into()),
        ("X-GitHub-Event".into(), event.into()),
    ]
}

fn shopify_headers(secret: &str, id: &str, topic: &str, body: &[u8]) -> Headers {
    vec![
        (
            "X-Shopify-Hmac-Sha256".into(),
            b64(&hmac256(secret.as_bytes(), &[body])),
        ),
        ("X-Shopify-Webhook-Id".into(), id.into()),
        ("X-Shopify-Topic".into(), topic.into()),
        (
            "X-Shopify-Triggered-At".into(),
            "2026-11-30T07:00:00Z".into(),
        ),
    ]
}

fn standard_headers(secret: &str, id: &str, t: i64, body: &[u8]) -> Headers {
    let key = base64::engine::general_purpose::STANDARD
        .decode(secret.trim_start_matches("whsec_"))
        .unwrap();
    let signed = hmac256(
        &key,
        &[id.as_bytes(), b".", t.to_string().as_bytes(), b".", body],
    );
    vec![
        ("webhook-id".into(), id.into()),
        ("webhook-timestamp".into(), t.to_string()),
        ("webhook-signature".into(), format!("v1,{}", b64(&signed))),
    ]
}

fn acme_headers(secret: &str, id: &str, body: &[u8]) -> Headers {
    vec![
        (
            "X-Acme-Signature".into(),
            format!(
                "sha256={}",
                hex::encode(hmac256(secret.as_bytes(), &[body]))
            ),
        ),
        ("X-Acme-Delivery".into(), id.into()),
    ]
}

fn post(
    server: &Server,
    source: &str,
    body: &[u8],
    headers: &Headers,
) -> hookledger::internals::Reply {
    let headers: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    server.post(&format!("/webhooks/{source}"), body, &headers)
}

fn without(headers: &Headers, name: &str) -> Headers {
    headers.iter().filter(|(k, _)| k != name).cloned().collect()
}

/// One ledger row of `source` with `id`: its type and event time.
fn claimed(server: &Server, source: &str, id: &str) -> Option<(String, Option<i64>)> {
    server.db().opt(
        "SELECT event_type, created FROM webhook_events WHERE source = $1 AND event_id = $2",
        &[&source, &id],
    )
}

/// The checks every scheme passes: valid → processed, again → duplicate, wrong secret and a
/// missing signature header → 400, nothing written by the refusals.
fn the_common_cases(
    server: &Server,
    source: &str,
    id: &str,
    body: &[u8],
    good: &Headers,
    forged: &Headers,
    signature_header: &str,
) {
    assert_outcome(&post(server, source, body, good), id, "processed");
    assert_outcome(&post(server, source, body, good), id, "duplicate");
    let rows = ledger_count(&server.db());
    assert_error(
        &post(server, source, body, forged),
        400,
        "invalid_signature",
    );
    let reply = post(server, source, body, &without(good, signature_header));
    assert_error(&reply, 400, "invalid_signature");
    assert!(reply.body.contains("missing"), "{}", reply.body);
    assert_eq!(ledger_count(&server.db()), rows, "refusals write nothing");
}

#[test]
fn github_deliveries_are_claimed_once_per_delivery_id() {
    let server = start();
    let body = br#"{"action":"opened","issue":{"number":1}}"#;
    let id = "72d3162e-cc78-11e3-81ab-4c9367dc0958";
    let good = github_headers(GITHUB_SECRET, id, "issues", body);
    let forged = github_headers("not the secret at all", id, "issues", body);
    the_common_cases(
        &server,
        "gh",
        id,
        body,
        &good,
        &forged,
        "X-Hub-Signature-256",
    );
    assert_eq!(
        claimed(&server, "gh", id),
        Some(("issues.opened".into(), None))
    );
    // Without its delivery id the event cannot be claimed: 400, saying what is missing.
    let other = github_headers(GITHUB_SECRET, "x", "push", b"{}");
    let reply = post(&server, "gh", b"{}", &without(&other, "X-GitHub-Delivery"));
    assert_error(&reply, 400, "invalid_event");
    assert!(reply.body.contains("X-GitHub-Delivery"), "{}", reply.body);
}

/// GitHub's signature made by Python's standard library: hookledger accepts it, and refuses
/// the same signature with one byte of the body changed.
#[test]
fn a_github_delivery_signed_by_python_is_accepted_and_one_changed_byte_is_not() {
    if !prerequisite(
        installed("python3"),
        "HOOKLEDGER_REQUIRE_PYTHON_SWH",
        "no python3",
    ) {
        return;
    }
    let server = start();
    let body = br#"{"ref":"refs/heads/main","commits":[]}"#.to_vec();
    let script = "import hmac, hashlib, sys; print('sha256=' + hmac.new(sys.argv[1].encode(), sys.stdin.buffer.read(), hashlib.sha256).hexdigest())";
    let mut child = std::process::Command::new("python3")
        .args(["-c", script, GITHUB_SECRET])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(&body).unwrap();
    let output = child.wait_with_output().unwrap();
    let signature = String::from_utf8(output.stdout).unwrap().trim().to_string();
    let headers: Headers = vec![
        ("X-Hub-Signature-256".into(), signature),
        ("X-GitHub-Delivery".into(), "d-python".into()),
        ("X-GitHub-Event".into(), "push".into()),
    ];
    assert_outcome(
        &post(&server, "gh", &body, &headers),
        "d-python",
        "processed",
    );
    let mut changed = body.clone();
    changed[10] ^= 1;
    let headers: Headers = headers
        .into_iter()
        .map(|(k, v)| {
            if k == "X-GitHub-Delivery" {
                (k, "d-changed".into())
            } else {
                (k, v)
            }
        })
        .collect();
    assert_error(
        &post(&server, "gh", &changed, &headers),
        400,
        "invalid_signature",
    );
    assert_eq!(claimed(&server, "gh", "d-changed"), None);
}

#[test]
fn shopify_webhooks_are_claimed_once_per_webhook_id() {
    let server = start();
    let body = br#"{"id":820982911946154508,"email":"jon@example.com"}"#;
    let id = "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043";
    let good = shopify_headers(SHOPIFY_SECRET, id, "orders/create", body);
    let forged = shopify_headers("another_client_secret", id, "orders/create", body);
    the_common_cases(
        &server,
        "shop",
        id,
        body,
        &good,
        &forged,
        "X-Shopify-Hmac-Sha256",
    );
    assert_eq!(
        claimed(&server, "shop", id),
        Some(("orders/create".into(), Some(1_796_022_000)))
    );
}

#[test]
fn standard_webhooks_are_claimed_once_and_checked_for_time_both_ways() {
    let server = start();
    let body =
        br#"{"type":"user.created","timestamp":"2026-11-30T07:00:00Z","data":{"id":"user_1"}}"#;
    let id = "msg_2Lzo5yn5wQ6qyB1D5XWqfmR3";
    let good = standard_headers(CLERK_SECRET, id, now(), body);
    let forged = standard_headers(
        "whsec_dGhpcyBpcyBub3QgdGhlIHNlY3JldCBhdCBhbGw=",
        id,
        now(),
        body,
    );
    the_common_cases(
        &server,
        "clerk",
        id,
        body,
        &good,
        &forged,
        "webhook-signature",
    );
    assert_eq!(
        claimed(&server, "clerk", id),
        Some(("user.created".into(), Some(1_796_022_000)))
    );
    // Past 300 s by a margin: the server reads its clock a moment later,
    // and a second boundary between the two reads would make +301 look +300.
    for t in [now() - 310, now() + 310] {
        let reply = post(
            &server,
            "clerk",
            body,
            &standard_headers(CLERK_SECRET, "msg_time", t, body),
        );
        assert_error(&reply, 400, "timestamp_out_of_tolerance");
    }
    assert_eq!(claimed(&server, "clerk", "msg_time"), None);
}

#[test]
fn stripe_from_the_config_file_keeps_its_handler_and_tolerance() {
    let server = start();
    let body = paid("evt_cfg");
    let good = vec![("Stripe-Signature".to_string(), signature(&body))];
    let forged = vec![(
        "Stripe-Signature".to_string(),
        hookledger::internals::stripe::sign(
            &hookledger::Secret::new("whsec_some_other_secret"),
            now(),
            &body,
        ),
    )];
    the_common_cases(
        &server,
        "stripe",
        "evt_cfg",
        &body,
        &good,
        &forged,
        "Stripe-Signature",
    );
    assert_eq!(
        credits(&server.db(), "acct_1"),
        100,
        "stripe-billing runs for it"
    );
    // Past 300 s by a margin: the server reads its clock a moment later,
    // and a second boundary between the two reads would make +301 look +300.
    for t in [now() - 310, now() + 310] {
        assert_error(
            &server.send_at(&paid("evt_cfg_time"), t),
            400,
            "timestamp_out_of_tolerance",
        );
    }
}

#[test]
fn a_configured_hmac_source_reads_its_id_header_and_its_type_from_the_body() {
    let server = start();
    let body = br#"{"event":"order.paid","order":{"id":7}}"#;
    let good = acme_headers(ACME_SECRET, "acme-1", body);
    let forged = acme_headers("not_the_acme_secret", "acme-1", body);
    the_common_cases(
        &server,
        "acme",
        "acme-1",
        body,
        &good,
        &forged,
        "X-Acme-Signature",
    );
    assert_eq!(
        claimed(&server, "acme", "acme-1"),
        Some(("order.paid".into(), None))
    );
    // No type where the source reads it: the source's name is the type (issue 32, item 11).
    let no_type = br#"{"order":{"id":8}}"#;
    let reply = post(
        &server,
        "acme",
        no_type,
        &acme_headers(ACME_SECRET, "acme-2", no_type),
    );
    assert_outcome(&reply, "acme-2", "processed");
    assert_eq!(
        claimed(&server, "acme", "acme-2"),
        Some(("acme".into(), None))
    );
}

/// The ledger key is (source, event id): the same id from two sources is two events.
#[test]
fn two_sources_sending_the_same_event_id_are_both_processed() {
    let server = start();
    let body = br#"{"event":"push","action":"x"}"#;
    let id = "same-delivery-id";
    assert_outcome(
        &post(
            &server,
            "gh",
            body,
            &github_headers(GITHUB_SECRET, id, "push", body),
        ),
        id,
        "processed",
    );
    assert_outcome(
        &post(&server, "acme", body, &acme_headers(ACME_SECRET, id, body)),
        id,
        "processed",
    );
    assert_eq!(
        server.db().strings(
            "SELECT source FROM webhook_events WHERE event_id = 'same-delivery-id' ORDER BY source"
        ),
        ["acme", "gh"]
    );
    // Showing it needs the source, and says so.
    let db = server.db_arg();
    let db = db.as_str();
    let (code, _, err) = cli(&["events", "show", id, "--db", db]);
    assert_eq!(code, 2);
    assert!(
        err.contains("several sources (acme, gh)") && err.contains("--source"),
        "{err}"
    );
    let (code, out, err) = cli(&["events", "show", id, "--source", "gh", "--db", db]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"source\": \"gh\""), "{out}");
}

/// `hookledger send --source` signs as each scheme, headers included.
#[test]
fn send_signs_as_each_source_of_the_config_file() {
    let server = start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("event.json");
    let config = example_config();
    let config = config.to_str().unwrap();
    for (source, body, kind) in [
        (
            "gh",
            r#"{"zen":"Keep it logically awesome."}"#,
            Some("ping"),
        ),
        ("shop", r#"{"id":1}"#, Some("orders/paid")),
        ("clerk", r#"{"type":"user.updated","data":{}}"#, None),
        ("acme", r#"{"event":"order.shipped"}"#, None),
    ] {
        std::fs::write(&file, body).unwrap();
        let url = format!("http://{}/webhooks/{source}", server.addr);
        let mut args = vec![
            "send", "--config", config, "--source", source, "--url", &url, "--id", "sent-1",
        ];
        if let Some(kind) = kind {
            args.extend(["--type", kind]);
        }
        args.push(file.to_str().unwrap());
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_hookledger"))
            .args(&args)
            .envs(SECRETS)
            .env("STRIPE_WEBHOOK_SECRET", SECRET)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&output.stdout);
        assert!(
            out.starts_with("200") && out.contains("processed"),
            "{source}: {out} {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(claimed(&server, source, "sent-1").is_some(), "{source}");
    }
    // A scheme that sends its type in a header needs --type.
    let (code, _, err) = cli(&[
        "send",
        "--config",
        config,
        "--source",
        "gh",
        file.to_str().unwrap(),
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--type is needed") && err.contains("X-GitHub-Event"),
        "{err}"
    );
}

/// A database made by the release before sources (schema 2, Stripe only) is migrated in place:
/// every row kept, its events still duplicates, the same ids from another source new.
#[test]
fn a_database_from_the_release_before_sources_keeps_every_row() {
    if skipped_on_postgres("a SQLite file from the release before sources") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/db/v2-stripe-only.db"),
        dir.path().join("hookledger.db"),
    )
    .unwrap();
    let config = example_config();
    let server = start_in(dir.path(), &["--config", config.to_str().unwrap()], &[]);
    let db = server.db();
    let version: i64 = db.one("PRAGMA user_version", &[]);
    // schema.sql, then one version per file of migrations/.
    let newest = std::fs::read_dir(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/store/sqlite/migrations"),
    )
    .unwrap()
    .count() as i64
        + 1;
    assert_eq!(version, newest, "the newest schema");
    assert_eq!(
        db.strings("SELECT source || '/' || event_id || '/' || length(payload) FROM webhook_events ORDER BY event_id"),
        [
            "stripe/evt_1Pgci1B7WZ01zgkWrMGF0FaA/5228",
            "stripe/evt_1PgcrTB7WZ01zgkWcMx8mdhS/4844"
        ]
    );
    assert_eq!(
        db.strings("SELECT source || '/' || key || '/' || status FROM outbox ORDER BY key"),
        [
            "stripe/evt_1Pgci1B7WZ01zgkWrMGF0FaA/pending",
            "stripe/evt_1PgcrTB7WZ01zgkWcMx8mdhS/pending"
        ]
    );
    let body = fixture("invoice.paid");
    assert_outcome(
        &server.send(&body),
        "evt_1Pgci1B7WZ01zgkWrMGF0FaA",
        "duplicate",
    );
    let id = "evt_1Pgci1B7WZ01zgkWrMGF0FaA";
    assert_outcome(
        &post(
            &server,
            "gh",
            &body,
            &github_headers(GITHUB_SECRET, id, "push", &body),
        ),
        id,
        "processed",
    );
}

/// GitHub signs no timestamp: the claim is the only replay guard. A captured delivery resent a
/// year later, after retention ran, is still a duplicate (its payload is gone, its claim not).
#[test]
fn a_github_delivery_resent_a_year_later_is_still_a_duplicate() {
    let server = start();
    let body = br#"{"ref":"refs/heads/main"}"#;
    let headers = github_headers(GITHUB_SECRET, "d-captured", "push", body);
    assert_outcome(
        &post(&server, "gh", body, &headers),
        "d-captured",
        "processed",
    );
    server.db().execute(
        "UPDATE webhook_events SET received_at = received_at - 365 * 86400",
        &[],
    );
    // A delivery of today: ages are counted from the newest claim.
    let today = br#"{"ref":"refs/heads/today"}"#;
    let today_headers = github_headers(GITHUB_SECRET, "d-today", "push", today);
    assert_outcome(
        &post(&server, "gh", today, &today_headers),
        "d-today",
        "processed",
    );
    // The server's own start-up prune may run after the UPDATE too (it is a thread of its
    // own): whichever clears the old payload, the end state below is the same.
    let (code, out, err) = cli(&["prune", "--db", &server.db_arg()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("deleted 0 ledger rows"), "{out}");
    assert_outcome(
        &post(&server, "gh", body, &headers),
        "d-captured",
        "duplicate",
    );
    assert_eq!(
        server.db().strings(
            "SELECT source || '/' || event_id || '/' || CASE WHEN payload IS NULL THEN 'cleared' ELSE 'kept' END FROM webhook_events ORDER BY event_id"
        ),
        ["gh/d-captured/cleared", "gh/d-today/kept"]
    );
}

/// `X-GitHub-Event` is not signed: one delivery resent with 150 made-up event types makes at
/// most 100 `type` series (and `other`), not one per request.
#[test]
fn made_up_github_event_types_make_at_most_100_metric_series() {
    let server = start();
    let body = br#"{"ref":"refs/heads/main"}"#;
    for i in 0..150 {
        let headers = github_headers(GITHUB_SECRET, "d-types", &format!("made-up-{i}"), body);
        let outcome = if i == 0 { "processed" } else { "duplicate" };
        assert_outcome(&post(&server, "gh", body, &headers), "d-types", outcome);
    }
    let (status, metrics) = server.admin_get("/metrics");
    assert_eq!(status, 200, "{metrics}");
    let series: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with(r#"hookledger_events_total{source="gh","#))
        .collect();
    assert_eq!(series.len(), 101, "{series:#?}");
    assert!(
        series.contains(
            &r#"hookledger_events_total{source="gh",type="other",outcome="duplicate"} 50"#
        ),
        "{series:#?}"
    );
    assert_eq!(ledger_count(&server.db()), 1);
}

#[test]
fn the_config_file_may_come_from_hookledger_config_and_send_help_shows_each_scheme() {
    let dir = test_dir();
    let config = example_config();
    let server = start_in(
        dir.path(),
        &[],
        &[("HOOKLEDGER_CONFIG", config.to_str().unwrap())],
    );
    let body = br#"{"zen":"x"}"#;
    let headers = github_headers(GITHUB_SECRET, "d-env", "ping", body);
    assert_outcome(&post(&server, "gh", body, &headers), "d-env", "processed");

    let (code, help, _) = cli(&["send", "--help"]);
    assert_eq!(code, 0);
    for example in [
        "--source gh --type push",
        "--source shop",
        "--source clerk",
        "--source acme",
    ] {
        assert!(help.contains(example), "{example}: {help}");
    }
}

/// Body limits are per source: GitHub's payloads may reach 25 MB (its default), while the
/// Stripe source keeps the listener's 1 MiB.
#[test]
fn a_github_source_takes_bodies_beyond_the_default_limit_and_stripe_does_not() {
    let server = start();
    let big = format!(
        r#"{{"ref":"refs/heads/main","padding":"{}"}}"#,
        "x".repeat(2 * 1024 * 1024)
    )
    .into_bytes();
    let headers = github_headers(GITHUB_SECRET, "d-big", "push", &big);
    assert_outcome(&post(&server, "gh", &big, &headers), "d-big", "processed");
    // The same size declared to the Stripe source is refused before a byte of it is read.
    let request = format!(
        "POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nStripe-Signature: {}\r\n\
         Content-Length: {}\r\n\r\n",
        forged_signature(),
        big.len()
    );
    let answer = server.raw(request.as_bytes(), std::time::Duration::from_secs(5));
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("body_too_large"), "{answer}");
}

const SLACK_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
const GITLAB_TOKEN: &str = "gitlab_shared_token_1";
const POSTMARK_CREDENTIALS: &str = "postmark:basic_password_1";
const LEMON_SECRET: &str = "lemon_squeezy_signing_1";

/// The building blocks of issue 21 as four sources: a Slack-style `v0:` HMAC with a signed
/// timestamp, a GitLab token, Postmark's Basic credentials, and an HMAC over the body with
/// the body's SHA-256 as the event id.
const BLOCKS: &str = r#"
[[source]]
name = "slack"
scheme = "hmac"
secrets = ["env:TEST_SLACK_SECRET"]
hmac = { header = "X-Slack-Signature", prefix = "v0=", signed = "v0:{timestamp}:{body}", timestamp = { header = "X-Slack-Request-Timestamp", unit = "s" } }
id = { json = "/event_id" }
type = { json = "/event/type" }

[[source]]
name = "gitlab"
scheme = "token"
secrets = ["env:TEST_GITLAB_TOKEN"]
token = { header = "X-Gitlab-Token" }
id = { header = "X-Gitlab-Event-UUID" }
type = { header = "X-Gitlab-Event" }

[[source]]
name = "postmark"
scheme = "basic"
secrets = ["env:TEST_POSTMARK_CREDENTIALS"]
id = { json = "/MessageID" }
type = { json = "/RecordType" }

[[source]]
name = "lemon"
scheme = "hmac"
secrets = ["env:TEST_LEMON_SECRET"]
hmac = { header = "X-Signature" }
id = { body_sha256 = true }
type = { json = "/meta/event_name" }
"#;

fn start_blocks() -> Server {
    let dir = test_dir();
    let path = dir.path().join("blocks.toml");
    std::fs::write(&path, BLOCKS).unwrap();
    let mut server = start_in(
        dir.path(),
        &["--config", path.to_str().unwrap()],
        &[
            ("TEST_SLACK_SECRET", SLACK_SECRET),
            ("TEST_GITLAB_TOKEN", GITLAB_TOKEN),
            ("TEST_POSTMARK_CREDENTIALS", POSTMARK_CREDENTIALS),
            ("TEST_LEMON_SECRET", LEMON_SECRET),
        ],
    );
    server.keep(dir);
    server
}

fn slack_headers(secret: &str, t: i64, body: &[u8]) -> Headers {
    let t = t.to_string();
    let mac = hmac256(secret.as_bytes(), &[b"v0:", t.as_bytes(), b":", body]);
    vec![
        (
            "X-Slack-Signature".into(),
            format!("v0={}", hex::encode(mac)),
        ),
        ("X-Slack-Request-Timestamp".into(), t),
    ]
}

/// Accepted → processed with a ledger row; the same again → duplicate; one changed byte of
/// the body → 400 and nothing claimed.
fn once_then_duplicate_then_a_changed_byte_is_refused(
    server: &Server,
    source: &str,
    id: &str,
    kind: &str,
    body: &[u8],
    headers: &Headers,
) {
    assert_outcome(&post(server, source, body, headers), id, "processed");
    assert_eq!(claimed(server, source, id), Some((kind.into(), None)));
    assert_outcome(&post(server, source, body, headers), id, "duplicate");
    let rows = ledger_count(&server.db());
    let mut changed = body.to_vec();
    changed[2] ^= 1;
    assert_error(
        &post(server, source, &changed, headers),
        400,
        "invalid_signature",
    );
    assert_eq!(ledger_count(&server.db()), rows, "refusals write nothing");
}

#[test]
fn a_slack_style_source_checks_its_signed_timestamp_both_ways() {
    let server = start_blocks();
    let now = hookledger::internals::unix_now();
    let body = br#"{"event_id":"Ev0PV52K25","event":{"type":"app_mention"}}"#;
    let good = slack_headers(SLACK_SECRET, now, body);
    once_then_duplicate_then_a_changed_byte_is_refused(
        &server,
        "slack",
        "Ev0PV52K25",
        "app_mention",
        body,
        &good,
    );
    let rows = ledger_count(&server.db());
    let other = br#"{"event_id":"Ev0PV52K26","event":{"type":"app_mention"}}"#;
    for (t, says) in [(now - 600, "old"), (now + 600, "future")] {
        let reply = post(
            &server,
            "slack",
            other,
            &slack_headers(SLACK_SECRET, t, other),
        );
        assert_error(&reply, 400, "timestamp_out_of_tolerance");
        assert!(reply.body.contains(says), "{}", reply.body);
    }
    let forged = slack_headers("not_the_slack_secret", now, other);
    assert_error(
        &post(&server, "slack", other, &forged),
        400,
        "invalid_signature",
    );
    let reply = post(
        &server,
        "slack",
        other,
        &without(&good, "X-Slack-Request-Timestamp"),
    );
    assert_error(&reply, 400, "invalid_signature");
    assert!(reply.body.contains("missing"), "{}", reply.body);
    assert_eq!(ledger_count(&server.db()), rows, "refusals write nothing");
}

#[test]
fn a_gitlab_token_source_takes_the_token_and_refuses_another() {
    let server = start_blocks();
    let body = br#"{"object_kind":"push","ref":"refs/heads/main"}"#;
    let id = "b1a4b5a8-4a4e-4d8f-9f2c-0d5d7c6f3e21";
    let headers: Headers = vec![
        ("X-Gitlab-Token".into(), GITLAB_TOKEN.into()),
        ("X-Gitlab-Event-UUID".into(), id.into()),
        ("X-Gitlab-Event".into(), "Push Hook".into()),
    ];
    assert_outcome(&post(&server, "gitlab", body, &headers), id, "processed");
    assert_eq!(
        claimed(&server, "gitlab", id),
        Some(("Push Hook".into(), None))
    );
    assert_outcome(&post(&server, "gitlab", body, &headers), id, "duplicate");
    // The token signs no body: what it refuses is another token (one changed byte) or none.
    let rows = ledger_count(&server.db());
    let other: Headers = headers
        .iter()
        .map(|(k, v)| match k.as_str() {
            "X-Gitlab-Token" => (k.clone(), "gitlab_shared_token_2".into()),
            "X-Gitlab-Event-UUID" => (k.clone(), "uuid-forged".into()),
            _ => (k.clone(), v.clone()),
        })
        .collect();
    assert_error(
        &post(&server, "gitlab", body, &other),
        400,
        "invalid_signature",
    );
    let reply = post(&server, "gitlab", body, &without(&other, "X-Gitlab-Token"));
    assert_error(&reply, 400, "invalid_signature");
    assert!(reply.body.contains("missing"), "{}", reply.body);
    assert_eq!(ledger_count(&server.db()), rows, "refusals write nothing");
    assert_eq!(claimed(&server, "gitlab", "uuid-forged"), None);
}

/// A `file:` secret is the file's line as written, commas and all (a secret a provider made
/// may hold one): only a list in the config or in an environment variable is split at commas.
#[test]
fn a_file_secret_with_a_comma_is_one_secret() {
    let secret = "gh,secret-with-a-comma_0123456789";
    let dir = test_dir();
    std::fs::write(dir.path().join("gh.secret"), format!("{secret}\n")).unwrap();
    let path = dir.path().join("comma.toml");
    std::fs::write(
        &path,
        "[[source]]\nname = \"gh\"\nscheme = \"github\"\nsecrets = [\"file:gh.secret\"]\n",
    )
    .unwrap();
    let mut server = start_in(dir.path(), &["--config", path.to_str().unwrap()], &[]);
    server.keep(dir);
    let body = br#"{"zen":"Design for failure."}"#;
    let id = "0b8f6c1e-comma-secret-1";
    let good = github_headers(secret, id, "ping", body);
    assert_outcome(&post(&server, "gh", body, &good), id, "processed");
    assert_eq!(claimed(&server, "gh", id), Some(("ping".into(), None)));
    // Neither half of the secret verifies on its own.
    for half in secret.split(',') {
        let forged = github_headers(half, "0b8f6c1e-comma-half", "ping", body);
        assert_error(
            &post(&server, "gh", body, &forged),
            400,
            "invalid_signature",
        );
    }
    assert_eq!(ledger_count(&server.db()), 1, "refusals write nothing");
}

#[test]
fn a_postmark_basic_source_takes_its_credentials_and_refuses_others() {
    let server = start_blocks();
    let id = "883953f4-6105-42a2-a16a-77a8eac79483";
    let body = format!(r#"{{"RecordType":"Delivery","MessageID":"{id}"}}"#).into_bytes();
    let basic = |credentials: &str| -> Headers {
        vec![(
            "Authorization".into(),
            format!("Basic {}", b64(credentials.as_bytes())),
        )]
    };
    let headers = basic(POSTMARK_CREDENTIALS);
    assert_outcome(&post(&server, "postmark", &body, &headers), id, "processed");
    assert_eq!(
        claimed(&server, "postmark", id),
        Some(("Delivery".into(), None))
    );
    assert_outcome(&post(&server, "postmark", &body, &headers), id, "duplicate");
    let rows = ledger_count(&server.db());
    let other = br#"{"RecordType":"Bounce","MessageID":"m-2"}"#;
    for credentials in ["postmark:basic_password_2", "postmarc:basic_password_1"] {
        assert_error(
            &post(&server, "postmark", other, &basic(credentials)),
            400,
            "invalid_signature",
        );
    }
    let reply = post(&server, "postmark", other, &Vec::new());
    assert_error(&reply, 400, "invalid_signature");
    assert!(reply.body.contains("missing"), "{}", reply.body);
    assert_eq!(ledger_count(&server.db()), rows, "refusals write nothing");
}

/// The event id is the body's SHA-256: the same bytes again are a duplicate; one changed
/// byte (re-signed) is another event.
#[test]
fn a_body_sha256_source_keys_events_by_their_bytes() {
    let server = start_blocks();
    let body = br#"{"meta":{"event_name":"order_created"},"data":{"id":"1"}}"#;
    let sign = |body: &[u8]| -> Headers {
        vec![(
            "X-Signature".into(),
            hex::encode(hmac256(LEMON_SECRET.as_bytes(), &[body])),
        )]
    };
    let id = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(body));
    once_then_duplicate_then_a_changed_byte_is_refused(
        &server,
        "lemon",
        &id,
        "order_created",
        body,
        &sign(body),
    );
    let other = br#"{"meta":{"event_name":"order_created"},"data":{"id":"2"}}"#;
    let other_id = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(other));
    assert_outcome(
        &post(&server, "lemon", other, &sign(other)),
        &other_id,
        "processed",
    );
}

/// `hookledger send --source` signs as each building block, and the server accepts it.
#[test]
fn send_signs_as_each_building_block() {
    let server = start_blocks();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("blocks.toml");
    std::fs::write(&config, BLOCKS).unwrap();
    let file = dir.path().join("event.json");
    for (source, body, kind) in [
        (
            "slack",
            r#"{"event_id":"Ev-sent","event":{"type":"message"}}"#,
            None,
        ),
        (
            "gitlab",
            r#"{"object_kind":"tag_push"}"#,
            Some("Tag Push Hook"),
        ),
        (
            "postmark",
            r#"{"RecordType":"Open","MessageID":"m-sent"}"#,
            None,
        ),
        ("lemon", r#"{"meta":{"event_name":"order_refunded"}}"#, None),
    ] {
        std::fs::write(&file, body).unwrap();
        let url = format!("http://{}/webhooks/{source}", server.addr);
        let mut args = vec![
            "send",
            "--config",
            config.to_str().unwrap(),
            "--source",
            source,
            "--url",
            &url,
            "--id",
            "sent-1",
        ];
        if let Some(kind) = kind {
            args.extend(["--type", kind]);
        }
        args.push(file.to_str().unwrap());
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_hookledger"))
            .args(&args)
            .env("TEST_SLACK_SECRET", SLACK_SECRET)
            .env("TEST_GITLAB_TOKEN", GITLAB_TOKEN)
            .env("TEST_POSTMARK_CREDENTIALS", POSTMARK_CREDENTIALS)
            .env("TEST_LEMON_SECRET", LEMON_SECRET)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&output.stdout);
        assert!(
            out.starts_with("200") && out.contains("processed"),
            "{source}: {out} {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    assert_eq!(ledger_count(&server.db()), 4);
}
