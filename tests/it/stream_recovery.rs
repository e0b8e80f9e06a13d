//! Recovering events that never arrived from a provider's event stream (issue 34): Paddle's
//! and WorkOS's. A fake of each API, written from the provider's API reference, holds 30
//! events of the last hours; 20 of them reached hookledger as signed webhooks. `reconcile`
//! applies the other 10 once, a second run none; `serve` recovers them at its start.
//!
//! - Paddle: `GET /events` with `order_by=id[DESC]`, `per_page` and `after` (the last id of
//!   the page before), answered `{"data": [...], "meta": {"request_id", "pagination":
//!   {"per_page", "next", "has_more", "estimated_total"}}}`; a bad key refused with 403
//!   `invalid_token`.
//! - WorkOS: `GET /events` with `events` (the types, required: WorkOS's SDKs refuse a call
//!   without), `range_start`, `order`, `limit` and `after`, answered `{"object": "list",
//!   "data": [...], "list_metadata": {"after", "before"}}`, oldest first (as the live API lists
//!   whatever `order` says); a bad key refused with 401.

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

const KEY_VAR: &str = "HOOKLEDGER_TEST_STREAM_KEY";
const WAIT: Duration = Duration::from_secs(30);
/// The fakes' page: smaller than the 100 or 200 asked for (the APIs answer at most their
/// maximum), so that 30 events take several pages.
const FAKE_PAGE: usize = 7;

const MIGRATION: &str = "CREATE TABLE seen (event TEXT NOT NULL, kind TEXT NOT NULL);";

/// A webhook's body and headers.
type Webhook = (Vec<u8>, Vec<(&'static str, String)>);

/// What differs between the two providers.
struct Provider {
    /// The preset, and the source's name.
    preset: &'static str,
    key: &'static str,
    secret: &'static str,
    /// The source's keys besides the preset's and the API's.
    keys: &'static str,
    kind: &'static str,
    /// An event id of the stream; [`Provider::old`] sorts below all of them.
    id: fn(usize) -> String,
    old: &'static str,
    /// Event `id` as the stream lists it.
    entity: fn(&str, usize, i64) -> Value,
    /// The body and headers of event `i`'s webhook.
    webhook: fn(&Value, usize, &str) -> Webhook,
    /// The fake's answer to a list call with `query`, over `events` (oldest first).
    list: fn(&[Value], &str) -> (StatusCode, Value),
    refused: (StatusCode, &'static str),
    /// What a refused run prints.
    says: &'static str,
}

const PADDLE: Provider = Provider {
    preset: "paddle",
    key: "pdl_live_apikey_01recovery_test_key_0123456789",
    secret: "pdl_ntfset_01recovery_secret_key",
    keys: "",
    kind: "transaction.completed",
    id: |i| format!("evt_01hv{i:022}"),
    old: "evt_01hu0000000000000000000099",
    entity: |id, i, at| {
        json!({
            "event_id": id,
            "event_type": "transaction.completed",
            "occurred_at": rfc3339(at).replace('Z', ".621022Z"),
            "data": {"id": format!("txn_01hv{i:022}"), "status": "completed",
                     "customer_id": "ctm_01hv8wt8nffez4p2t6typn4a5j", "currency_code": "USD"}
        })
    },
    webhook: |entity, i, secret| {
        let mut body = entity.clone();
        body["notification_id"] = json!(format!("ntf_01hv{i:022}"));
        let body = serde_json::to_vec(&body).unwrap();
        let ts = now();
        let h1 = hmac_hex(secret, &[format!("{ts}:").as_bytes(), &body]);
        (body, vec![("Paddle-Signature", format!("ts={ts};h1={h1}"))])
    },
    list: paddle_list,
    refused: (
        StatusCode::FORBIDDEN,
        r#"{"error": {"type": "request_error", "code": "invalid_token", "detail": "Authentication token passed is invalid.", "documentation_url": "https://developer.paddle.com/errors/shared/invalid_token"}, "meta": {"request_id": "req_fake"}}"#,
    ),
    says: "Paddle refused the API key (HTTP 403: invalid_token",
};

const WORKOS: Provider = Provider {
    preset: "workos",
    key: "sk_test_a2V5XzAxUkVDT1ZFUllfdGVzdF8wMTIzNDU2Nzg5",
    secret: "workos_webhook_secret_01recovery",
    keys: "event_types = [\"user.created\"]",
    kind: "user.created",
    id: |i| format!("event_01HV{i:022}"),
    old: "event_01HU0000000000000000000099",
    entity: |id, i, at| {
        json!({
            "object": "event",
            "id": id,
            "event": "user.created",
            "data": {"object": "user", "id": format!("user_01HV{i:022}"),
                     "email": format!("user{i}@example.com"), "email_verified": true},
            "created_at": rfc3339(at).replace('Z', ".155Z"),
            "context": {}
        })
    },
    webhook: |entity, _, secret| {
        let mut body = entity.clone();
        body.as_object_mut().unwrap().remove("object");
        let body = serde_json::to_vec(&body).unwrap();
        let t = now() * 1000;
        let v1 = hmac_hex(secret, &[format!("{t}.").as_bytes(), &body]);
        (body, vec![("WorkOS-Signature", format!("t={t}, v1={v1}"))])
    },
    list: workos_list,
    refused: (
        StatusCode::UNAUTHORIZED,
        r#"{"message": "Could not authorize the request. Maybe your API key is invalid?"}"#,
    ),
    says: "WorkOS refused the API key (HTTP 401: Could not authorize the request",
};

fn hmac_hex(secret: &str, parts: &[&[u8]]) -> String {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    for part in parts {
        mac.update(part);
    }
    hex::encode(mac.finalize().into_bytes())
}

fn params(query: &str) -> impl Fn(&str) -> Option<String> {
    let pairs: Vec<(String, String)> = url::form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect();
    move |name| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }
}

/// Paddle's list: newest first; `after` is the last id of the page before.
fn paddle_list(events: &[Value], query: &str) -> (StatusCode, Value) {
    let param = params(query);
    assert_eq!(param("order_by").as_deref(), Some("id[DESC]"), "{query}");
    let asked: usize = param("per_page").and_then(|n| n.parse().ok()).unwrap_or(50);
    let newest_first: Vec<&Value> = events.iter().rev().collect();
    let start = match param("after") {
        Some(after) => newest_first
            .iter()
            .position(|e| e["event_id"].as_str().is_some_and(|id| id < after.as_str()))
            .unwrap_or(newest_first.len()),
        None => 0,
    };
    let page: Vec<&Value> = newest_first
        .iter()
        .skip(start)
        .take(asked.min(FAKE_PAGE))
        .copied()
        .collect();
    let last = page
        .last()
        .and_then(|e| e["event_id"].as_str())
        .unwrap_or("");
    (
        StatusCode::OK,
        json!({"data": page, "meta": {"request_id": "req_fake", "pagination": {
            "per_page": asked.min(FAKE_PAGE),
            "next": format!("https://api.paddle.com/events?order_by=id%5BDESC%5D&per_page={asked}&after={last}"),
            "has_more": start + page.len() < newest_first.len(),
            "estimated_total": events.len()}}}),
    )
}

/// WorkOS's list: oldest first, from `range_start`, or after the cursor `after`.
fn workos_list(events: &[Value], query: &str) -> (StatusCode, Value) {
    let param = params(query);
    if param("events").is_none() {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            json!({"message": "Validation failed", "errors": [{"field": "events", "code": "events must be an array"}]}),
        );
    }
    assert_eq!(param("events").as_deref(), Some("user.created"), "{query}");
    assert!(
        param("range_start").is_none() || param("after").is_none(),
        "range_start and after do not go together: {query}"
    );
    let asked: usize = param("limit").and_then(|n| n.parse().ok()).unwrap_or(10);
    let from: Vec<&Value> = match (param("after"), param("range_start")) {
        (Some(after), _) => events
            .iter()
            .filter(|e| e["id"].as_str().is_some_and(|id| id > after.as_str()))
            .collect(),
        (None, Some(start)) => events
            .iter()
            .filter(|e| {
                e["created_at"]
                    .as_str()
                    .is_some_and(|t| t >= start.as_str())
            })
            .collect(),
        (None, None) => events.iter().collect(),
    };
    let page: Vec<&Value> = from.iter().take(asked.min(FAKE_PAGE)).copied().collect();
    let after = (page.len() < from.len()).then(|| page.last().map(|e| e["id"].clone()));
    (
        StatusCode::OK,
        json!({"object": "list", "data": page, "list_metadata": {"after": after.flatten(), "before": null}}),
    )
}

#[derive(Default)]
struct Fake {
    /// The event entities, oldest first.
    events: Vec<Value>,
    calls: Vec<String>,
}

struct FakeApi {
    url: String,
    fake: Arc<Mutex<Fake>>,
}

impl FakeApi {
    fn start(provider: &'static Provider) -> FakeApi {
        let fake = Arc::new(Mutex::new(Fake::default()));
        let addr = serve_fake(
            Router::new()
                .fallback(answer)
                .with_state((provider, fake.clone())),
        );
        FakeApi {
            url: format!("http://{addr}"),
            fake,
        }
    }
}

async fn answer(
    State((provider, fake)): State<(&'static Provider, Arc<Mutex<Fake>>)>,
    request: Request,
) -> Response {
    let mut fake = fake.lock().unwrap();
    let query = request.uri().query().unwrap_or("").to_string();
    fake.calls.push(format!(
        "{} {}?{query}",
        request.method(),
        request.uri().path()
    ));
    let authorized = request
        .headers()
        .get("authorization")
        .is_some_and(|v| v == format!("Bearer {}", provider.key).as_str());
    let (status, body) = if !authorized {
        (
            provider.refused.0,
            provider.refused.1.parse::<Value>().unwrap(),
        )
    } else if request.uri().path() != "/events" {
        (StatusCode::NOT_FOUND, json!({"message": "Not Found"}))
    } else {
        (provider.list)(&fake.events, &query)
    };
    (
        status,
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn config(dir: &std::path::Path, p: &Provider, fake: &FakeApi, extra: &str) -> std::path::PathBuf {
    std::fs::create_dir_all(dir.join("migrations")).unwrap();
    std::fs::write(dir.join("migrations/001_seen.sql"), MIGRATION).unwrap();
    let path = dir.join("hookledger.toml");
    let text = format!(
        "[schema]\nmigrations = \"migrations/\"\n\n\
         [[source]]\nname = \"{name}\"\npreset = \"{name}\"\nsecrets = [\"{secret}\"]\n\
         api_key = \"env:{KEY_VAR}\"\napi_base = \"{url}\"\n{keys}\n{extra}\n\n\
         [[effect]]\nsource = \"{name}\"\non = \"{kind}\"\n\
         sql = \"INSERT INTO seen VALUES (:event_id, :event_type)\"\n",
        name = p.preset,
        secret = p.secret,
        url = fake.url,
        keys = p.keys,
        kind = p.kind,
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// A fake with 30 events of the last hours and one of three days ago, and a server that
/// received all but 10 (`i % 3 == 1`) of the 30.
fn thirty_twenty_received(
    p: &'static Provider,
    extra: &str,
) -> (FakeApi, Server, std::path::PathBuf) {
    let fake = FakeApi::start(p);
    let dir = test_dir();
    let path = config(dir.path(), p, &fake, extra);
    let mut server = Server::start_with_env(
        dir.path(),
        &["--config", path.to_str().unwrap()],
        &[(KEY_VAR, p.key), ("RUST_LOG", "info")],
    );
    let url = format!("http://{}/webhooks/{}", server.addr, p.preset);
    // Before the horizon of a `since = "1d"` run (its id below the others': ids are in time
    // order): listed, never counted.
    let mut events = vec![(p.entity)(p.old, 99, now() - 3 * 86_400)];
    for i in 0..30 {
        let e = (p.entity)(&(p.id)(i), i, now() - 3600 * 3 + i as i64 * 60);
        if i % 3 != 1 {
            let (body, headers) = (p.webhook)(&e, i, p.secret);
            let mut post = ureq::post(&url).set("Content-Type", "application/json");
            for (name, value) in &headers {
                post = post.set(name, value);
            }
            let status = match post.send_bytes(&body) {
                Ok(r) => r.status(),
                Err(ureq::Error::Status(s, _)) => s,
                Err(e) => panic!("posting a webhook: {e}"),
            };
            assert_eq!(status, 200, "{}", server.log());
        }
        events.push(e);
    }
    fake.fake.lock().unwrap().events = events;
    assert_eq!(ledger_count(&server.db()), 20);
    server.keep(dir);
    (fake, server, path)
}

fn reconcile(
    p: &Provider,
    server: &Server,
    config: &std::path::Path,
    key: &str,
    extra: &[&str],
) -> (i32, Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_hookledger"))
        .args([
            "reconcile",
            "--source",
            p.preset,
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

fn assert_each_of_thirty_once(p: &Provider, db: &Db) {
    assert_eq!(ledger_count(db), 30);
    let rows: Vec<(String, i64)> = db.all(
        "SELECT event, COUNT(*) FROM seen GROUP BY event ORDER BY event",
        &[],
    );
    assert_eq!(rows.len(), 30, "{rows:?}");
    assert!(rows.iter().all(|(_, n)| *n == 1), "{rows:?}");
    let ids: Vec<String> = (0..30).map(p.id).collect();
    let missing = missing_from_ledger(db, &ids);
    assert!(missing.is_empty(), "{missing:?}");
}

fn applies_the_ten_missed_events_once_and_a_second_run_none(p: &'static Provider) {
    let (fake, server, path) = thirty_twenty_received(p, "");
    let (code, counts, stderr) = reconcile(p, &server, &path, p.key, &["--dry-run"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        (&counts["found"], &counts["applied"]),
        (&json!(30), &json!(10)),
        "{counts}"
    );
    assert_eq!(ledger_count(&server.db()), 20, "a dry run claims nothing");

    let (code, counts, stderr) = reconcile(p, &server, &path, p.key, &[]);
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
    assert_each_of_thirty_once(p, &db);
    // Applied as the webhook would have been: its type, and the entity as its body.
    let id = (p.id)(4);
    let kind: String = db.one("SELECT kind FROM seen WHERE event = $1", &[&id]);
    assert_eq!(kind, p.kind);
    let body: Value = serde_json::from_slice(&stored_body(&db, &id)).unwrap();
    assert_eq!(body["data"], (p.entity)(&id, 4, 0)["data"]);
    let old = [p.old.to_string()];
    assert_eq!(
        missing_from_ledger(&db, &old).len(),
        1,
        "an event before the horizon"
    );
    let calls = fake.fake.lock().unwrap().calls.clone();
    assert!(calls.len() >= 31 / FAKE_PAGE, "paged: {calls:?}");
    assert!(calls.iter().all(|c| !c.contains(p.key)), "{calls:?}");

    let (code, counts, stderr) = reconcile(p, &server, &path, p.key, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        (&counts["applied"], &counts["already_present"]),
        (&json!(0), &json!(30)),
        "{counts}"
    );
    assert_each_of_thirty_once(p, &server.db());
}

#[test]
fn paddle_reconcile_applies_the_ten_missed_events_once_and_a_second_run_none() {
    applies_the_ten_missed_events_once_and_a_second_run_none(&PADDLE);
}

#[test]
fn workos_reconcile_applies_the_ten_missed_events_once_and_a_second_run_none() {
    applies_the_ten_missed_events_once_and_a_second_run_none(&WORKOS);
}

fn serve_recovers_at_its_start(p: &'static Provider) {
    let (fake, mut server, _) = thirty_twenty_received(p, "");
    let db_arg = server.db_arg();
    server.terminate();
    let dir = test_dir();
    let path = config(
        dir.path(),
        p,
        &fake,
        "reconcile = { every = \"1h\", since = \"1d\" }",
    );
    let restarted = Server::start_on_with_env(
        &db_arg,
        &["--config", path.to_str().unwrap()],
        &[(KEY_VAR, p.key), ("RUST_LOG", "info")],
    );
    let db = restarted.db();
    wait_for(WAIT, || (ledger_count(&db) == 30).then_some(()))
        .unwrap_or_else(|| panic!("not recovered: {}", restarted.log()));
    assert_each_of_thirty_once(p, &db);
    let line = format!("reconcile {}: found 30, applied 10", p.preset);
    wait_for(WAIT, || restarted.log().contains(&line).then_some(()))
        .unwrap_or_else(|| panic!("{}", restarted.log()));
    let (status, _, metrics) = restarted.admin_request("GET", "/metrics", &[], b"");
    assert_eq!(status, 200, "{metrics}");
    let counted = format!(
        "hookledger_recovered_events_total{{source=\"{}\"}} 10",
        p.preset
    );
    assert!(metrics.lines().any(|l| l == counted), "{metrics}");
}

#[test]
fn serve_recovers_at_its_start_what_paddle_has_and_it_missed() {
    serve_recovers_at_its_start(&PADDLE);
}

#[test]
fn serve_recovers_at_its_start_what_workos_has_and_it_missed() {
    serve_recovers_at_its_start(&WORKOS);
}

#[test]
fn a_refused_key_stops_the_run_with_the_provider_s_reason_and_not_the_key() {
    for p in [&PADDLE, &WORKOS] {
        let (_fake, server, path) = thirty_twenty_received(p, "");
        let revoked = "sk_test_revoked_000000000000000000";
        let (code, _, stderr) = reconcile(p, &server, &path, revoked, &[]);
        assert_ne!(code, 0, "{stderr}");
        assert!(stderr.contains(p.says), "{stderr}");
        assert!(
            !stderr.contains(revoked) && !stderr.contains(p.key),
            "{stderr}"
        );
        assert_eq!(ledger_count(&server.db()), 20, "nothing applied");
    }
}

#[test]
fn stream_recovery_settings_are_checked_at_start_up_naming_the_key() {
    let source = |preset: &str, secret: &str| {
        format!(
            "[[source]]\nname = \"{preset}\"\npreset = \"{preset}\"\nsecrets = [\"{secret}\"]\n"
        )
    };
    let (pdl, wos) = (
        source("paddle", PADDLE.secret),
        source("workos", WORKOS.secret),
    );
    let key = format!("api_key = \"env:{KEY_VAR}\"\n");
    let every = |since: &str| format!("reconcile = {{ every = \"1h\", since = \"{since}\" }}\n");
    let types = "event_types = [\"user.created\"]\n";
    let cases = [
        (
            format!("{pdl}{key}{}", every("91d")),
            "source `paddle`.reconcile.since: must be at most 90d",
        ),
        (
            format!(
                "{pdl}{key}{}\n[retention]\nclaim_days = 5\npayload_days = 5\n",
                every("30d")
            ),
            "source `paddle`.reconcile.since: must be at most retention.claim_days (5 days)",
        ),
        (
            format!("{pdl}{}", every("1d")),
            "source `paddle`.reconcile: needs api_key",
        ),
        (
            format!("{pdl}{key}api_base = \"http://paddle.example\"\n"),
            "source `paddle`.api_base: must be an https:// URL",
        ),
        (
            format!("{pdl}hook = \"repos/o/r/1\"\n"),
            "source `paddle`.hook: applies to scheme github and preset gitlab only",
        ),
        (
            format!("{pdl}{types}"),
            "source `paddle`.event_types: applies to preset workos only",
        ),
        (
            format!("{wos}{key}{types}{}", every("31d")),
            "source `workos`.reconcile.since: must be at most 30d",
        ),
        (
            format!("{wos}{key}{}", every("1d")),
            "source `workos`.reconcile: needs event_types",
        ),
        (
            format!("{wos}{key}event_types = [\"User Created\"]\n"),
            "source `workos`.event_types: `User Created` is not a WorkOS event type",
        ),
    ];
    assert_each_refused_at_start(&cases, (KEY_VAR, "a-key"));
}
