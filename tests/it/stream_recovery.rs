//! Recovering Paddle events that never arrived (issue 34). A fake of Paddle's event stream,
//! written from Paddle's API reference (`GET /events` with `order_by=id[DESC]`, `per_page`
//! and `after`, answered `{"data": [...], "meta": {"request_id", "pagination": {"per_page",
//! "next", "has_more", "estimated_total"}}}`; a bad key refused with 403 `invalid_token`),
//! holds 30 events of the last hours; 20 of them reached hookledger as signed notifications.
//! `reconcile` applies the other 10 once, a second run none; `serve` recovers them at its
//! start.

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hmac::Mac;
use serde_json::{json, Value};

use crate::util::*;

const KEY: &str = "pdl_live_apikey_01recovery_test_key_0123456789";
const KEY_VAR: &str = "HOOKLEDGER_TEST_PADDLE_KEY";
const SECRET: &str = "pdl_ntfset_01recovery_secret_key";
const WAIT: Duration = Duration::from_secs(30);
/// The fake's page: smaller than the 200 asked for (Paddle answers at most its maximum), so
/// that 30 events take several pages.
const FAKE_PAGE: usize = 7;

const MIGRATION: &str = "CREATE TABLE paid (event TEXT NOT NULL, kind TEXT NOT NULL);";

#[derive(Default)]
struct Fake {
    /// The event entities, newest first.
    events: Vec<Value>,
    calls: Vec<String>,
}

struct FakePaddle {
    url: String,
    fake: Arc<Mutex<Fake>>,
}

impl FakePaddle {
    fn start() -> FakePaddle {
        let fake = Arc::new(Mutex::new(Fake::default()));
        let addr = serve_fake(Router::new().fallback(answer).with_state(fake.clone()));
        FakePaddle {
            url: format!("http://{addr}"),
            fake,
        }
    }
}

async fn answer(State(fake): State<Arc<Mutex<Fake>>>, request: Request) -> Response {
    let mut fake = fake.lock().unwrap();
    let query = request.uri().query().unwrap_or("").to_string();
    fake.calls.push(format!(
        "{} {}?{query}",
        request.method(),
        request.uri().path()
    ));
    let json = |status: StatusCode, body: Value| {
        (
            status,
            [("content-type", "application/json")],
            body.to_string(),
        )
            .into_response()
    };
    let authorized = request
        .headers()
        .get("authorization")
        .is_some_and(|v| v == format!("Bearer {KEY}").as_str());
    if !authorized {
        return json(
            StatusCode::FORBIDDEN,
            json!({"error": {"type": "request_error", "code": "invalid_token",
                             "detail": "Authentication token passed is invalid.",
                             "documentation_url": "https://developer.paddle.com/errors/shared/invalid_token"},
                   "meta": {"request_id": "req_fake"}}),
        );
    }
    if request.uri().path() != "/events" {
        return json(
            StatusCode::NOT_FOUND,
            json!({"error": {"code": "not_found"}}),
        );
    }
    let pairs: Vec<(String, String)> = url::form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect();
    let param = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(param("order_by").as_deref(), Some("id[DESC]"), "{query}");
    let asked: usize = param("per_page").and_then(|n| n.parse().ok()).unwrap_or(50);
    let per_page = asked.min(FAKE_PAGE);
    // Newest first: `after` is the last id of the page before; the next page begins below it.
    let start = match param("after") {
        Some(after) => fake
            .events
            .iter()
            .position(|e| e["event_id"].as_str().is_some_and(|id| id < after.as_str()))
            .unwrap_or(fake.events.len()),
        None => 0,
    };
    let page: Vec<Value> = fake
        .events
        .iter()
        .skip(start)
        .take(per_page)
        .cloned()
        .collect();
    let has_more = start + page.len() < fake.events.len();
    let last = page
        .last()
        .and_then(|e| e["event_id"].as_str())
        .unwrap_or("");
    json(
        StatusCode::OK,
        json!({"data": page, "meta": {"request_id": "req_fake", "pagination": {
            "per_page": per_page,
            "next": format!("https://api.paddle.com/events?order_by=id%5BDESC%5D&per_page={asked}&after={last}"),
            "has_more": has_more,
            "estimated_total": fake.events.len()}}}),
    )
}

/// An event of three days ago.
const OLD: &str = "evt_01hu0000000000000000000099";

fn event_id(i: usize) -> String {
    format!("evt_01hv{i:022}")
}

/// Event `id`, as the event stream lists it.
fn entity(id: &str, i: usize, at: i64) -> Value {
    json!({
        "event_id": id,
        "event_type": "transaction.completed",
        "occurred_at": rfc3339(at).replace('Z', ".621022Z"),
        "data": {"id": format!("txn_01hv{i:022}"), "status": "completed",
                 "customer_id": "ctm_01hv8wt8nffez4p2t6typn4a5j", "currency_code": "USD"}
    })
}

/// POSTs event `i` to `url` as a Paddle notification: the entity and its notification id,
/// signed `ts=…;h1=…` over `{ts}:{body}`.
fn notify(url: &str, entity: &Value, i: usize) -> u16 {
    let mut body = entity.clone();
    body["notification_id"] = json!(format!("ntf_01hv{i:022}"));
    let body = serde_json::to_vec(&body).unwrap();
    let ts = now();
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(format!("{ts}:").as_bytes());
    mac.update(&body);
    let signature = format!("ts={ts};h1={}", hex::encode(mac.finalize().into_bytes()));
    match ureq::post(url)
        .set("Paddle-Signature", &signature)
        .set("Content-Type", "application/json")
        .send_bytes(&body)
    {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(s, _)) => s,
        Err(e) => panic!("posting a notification: {e}"),
    }
}

fn config(dir: &std::path::Path, fake: &FakePaddle, extra: &str) -> std::path::PathBuf {
    std::fs::create_dir_all(dir.join("migrations")).unwrap();
    std::fs::write(dir.join("migrations/001_paid.sql"), MIGRATION).unwrap();
    let path = dir.join("hookledger.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[schema]
migrations = "migrations/"

[[source]]
name = "pdl"
preset = "paddle"
secrets = ["{SECRET}"]
api_key = "env:{KEY_VAR}"
api_base = "{}"
{extra}

[[effect]]
source = "pdl"
on = "transaction.completed"
sql = "INSERT INTO paid VALUES (:event_id, :event_type)"
"#,
            fake.url
        ),
    )
    .unwrap();
    path
}

/// A fake with 30 events of the last hours, and a server that received all but 10
/// (`i % 3 == 1`).
fn thirty_twenty_received(extra: &str) -> (FakePaddle, Server, std::path::PathBuf) {
    let fake = FakePaddle::start();
    let dir = test_dir();
    let path = config(dir.path(), &fake, extra);
    let mut server = Server::start_with_env(
        dir.path(),
        &["--config", path.to_str().unwrap()],
        &[(KEY_VAR, KEY), ("RUST_LOG", "info")],
    );
    let url = format!("http://{}/webhooks/pdl", server.addr);
    let mut events = Vec::new();
    for i in 0..30 {
        let e = entity(&event_id(i), i, now() - 3600 * 3 + i as i64 * 60);
        if i % 3 != 1 {
            assert_eq!(notify(&url, &e, i), 200);
        }
        events.push(e);
    }
    // An event from before the horizon of a `since = "1d"` run (an id below the others': ids
    // are in time order): listed on the last page, never counted.
    events.insert(0, entity(OLD, 99, now() - 3 * 86_400));
    events.sort_by(|a, b| b["event_id"].as_str().cmp(&a["event_id"].as_str()));
    fake.fake.lock().unwrap().events = events;
    assert_eq!(ledger_count(&server.db()), 20);
    server.keep(dir);
    (fake, server, path)
}

fn reconcile(
    server: &Server,
    config: &std::path::Path,
    key: &str,
    extra: &[&str],
) -> (i32, Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_hookledger"))
        .args([
            "reconcile",
            "--source",
            "pdl",
            "--since",
            "1d",
            "--json",
            "--config",
        ])
        .arg(config)
        .args(["--db", &server.db_arg()])
        .args(extra)
        .env(KEY_VAR, key)
        .env_remove("HOOKLEDGER_CONFIG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let counts = serde_json::from_str(stdout.trim()).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), counts, stderr)
}

fn assert_each_of_thirty_once(db: &Db) {
    assert_eq!(ledger_count(db), 30);
    let rows: Vec<(String, i64)> = db.all(
        "SELECT event, COUNT(*) FROM paid GROUP BY event ORDER BY event",
        &[],
    );
    assert_eq!(rows.len(), 30, "{rows:?}");
    assert!(rows.iter().all(|(_, n)| *n == 1), "{rows:?}");
    let ids: Vec<String> = (0..30).map(event_id).collect();
    let missing = missing_from_ledger(db, &ids);
    assert!(missing.is_empty(), "{missing:?}");
}

#[test]
fn reconcile_applies_the_ten_missed_events_once_and_a_second_run_none() {
    let (fake, server, path) = thirty_twenty_received("");
    let (code, counts, stderr) = reconcile(&server, &path, KEY, &["--dry-run"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        (&counts["found"], &counts["applied"]),
        (&json!(30), &json!(10)),
        "{counts}"
    );
    assert_eq!(ledger_count(&server.db()), 20, "a dry run claims nothing");

    let (code, counts, stderr) = reconcile(&server, &path, KEY, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        (
            &counts["found"],
            &counts["applied"],
            &counts["already_present"],
            &counts["failed"]
        ),
        (&json!(30), &json!(10), &json!(20), &json!(0)),
        "{counts}"
    );
    let db = server.db();
    assert_each_of_thirty_once(&db);
    // Applied as the notification would have been: its type and body the entity's.
    let kind: String = db.one("SELECT kind FROM paid WHERE event = $1", &[&event_id(4)]);
    assert_eq!(kind, "transaction.completed");
    let body: Value = serde_json::from_slice(&stored_body(&db, &event_id(4))).unwrap();
    assert_eq!(body["data"]["id"], json!(format!("txn_01hv{:022}", 4)));
    let old = [OLD.to_string()];
    assert_eq!(
        missing_from_ledger(&db, &old).len(),
        1,
        "an event before the horizon is not applied"
    );
    let calls = fake.fake.lock().unwrap().calls.clone();
    assert!(calls.len() >= 30 / FAKE_PAGE, "paged: {calls:?}");
    assert!(calls.iter().all(|c| !c.contains(KEY)), "{calls:?}");

    let (code, counts, stderr) = reconcile(&server, &path, KEY, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        (&counts["applied"], &counts["already_present"]),
        (&json!(0), &json!(30)),
        "{counts}"
    );
    assert_each_of_thirty_once(&server.db());
}

#[test]
fn serve_recovers_at_its_start_what_was_missed_while_it_was_down() {
    let (fake, mut server, _) = thirty_twenty_received("");
    let db_arg = server.db_arg();
    server.terminate();
    let dir = test_dir();
    let path = config(
        dir.path(),
        &fake,
        "reconcile = { every = \"1h\", since = \"1d\" }",
    );
    let restarted = Server::start_on_with_env(
        &db_arg,
        &["--config", path.to_str().unwrap()],
        &[(KEY_VAR, KEY), ("RUST_LOG", "info")],
    );
    let db = restarted.db();
    wait_for(WAIT, || (ledger_count(&db) == 30).then_some(()))
        .unwrap_or_else(|| panic!("not recovered: {}", restarted.log()));
    assert_each_of_thirty_once(&db);
    wait_for(WAIT, || {
        restarted
            .log()
            .contains("reconcile pdl: found 30, applied 10")
            .then_some(())
    })
    .unwrap_or_else(|| panic!("{}", restarted.log()));
    let (status, _, metrics) = restarted.admin_request("GET", "/metrics", &[], b"");
    assert_eq!(status, 200, "{metrics}");
    assert!(
        metrics
            .lines()
            .any(|l| l == "hookledger_recovered_events_total{source=\"pdl\"} 10"),
        "{metrics}"
    );
}

#[test]
fn a_refused_key_stops_the_run_with_paddle_s_reason_and_not_the_key() {
    let (_fake, server, path) = thirty_twenty_received("");
    let revoked = "pdl_live_apikey_01revoked_000000000000";
    let (code, _, stderr) = reconcile(&server, &path, revoked, &[]);
    assert_ne!(code, 0, "{stderr}");
    assert!(
        stderr.contains("Paddle refused the API key (HTTP 403: invalid_token"),
        "{stderr}"
    );
    assert!(
        !stderr.contains(revoked) && !stderr.contains(KEY),
        "{stderr}"
    );
    assert_eq!(ledger_count(&server.db()), 20, "nothing applied");
}

#[test]
fn paddle_recovery_settings_are_checked_at_start_up_naming_the_key() {
    let source =
        format!("[[source]]\nname = \"pdl\"\npreset = \"paddle\"\nsecrets = [\"{SECRET}\"]\n");
    let key = format!("api_key = \"env:{KEY_VAR}\"\n");
    let cases = [
        (
            format!("{source}{key}reconcile = {{ every = \"1h\", since = \"91d\" }}\n"),
            "source `pdl`.reconcile.since: must be at most 90d",
        ),
        (
            format!("{source}reconcile = {{ every = \"1h\", since = \"1d\" }}\n"),
            "source `pdl`.reconcile: needs api_key",
        ),
        (
            format!("{source}{key}api_base = \"http://paddle.example\"\n"),
            "source `pdl`.api_base: must be an https:// URL",
        ),
        (
            format!("{source}hook = \"repos/o/r/1\"\n"),
            "source `pdl`.hook: applies to scheme github only",
        ),
    ];
    for (text, expected) in cases {
        let dir = test_dir();
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, &text).unwrap();
        let out = serve_command(dir.path().join("db.sqlite"))
            .args(["--config", path.to_str().unwrap()])
            .env(KEY_VAR, KEY)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text}\n{stderr}");
        assert!(
            stderr.contains(expected),
            "{text}\nexpected {expected:?} in:\n{stderr}"
        );
        assert!(
            !dir.path().join("db.sqlite").exists(),
            "nothing created: {text}"
        );
    }
}
