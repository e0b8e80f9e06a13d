//! Recovering GitLab hook requests that failed (issue 34). A fake of GitLab's project webhook
//! events API, written from GitLab's REST reference (`doc/api/project_webhooks.md`: `GET
//! /projects/:id/hooks/:hook_id/events` with `page` and `per_page`, newest first, the `Link`
//! header's `rel="next"`; each event with `id`, `trigger`, `request_headers` (the token
//! `[REDACTED]`), `request_data`, `response_status`; `POST …/events/:hook_event_id/resend`
//! answered `{"response_status": 200}`) holds 30 requests; 20 of them reached hookledger.
//! `reconcile` applies the other 10 once, or asks the fake to resend them (it then posts each
//! with the hook's token, as GitLab would); a second run does nothing; `serve` recovers them
//! at its start.

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};

use crate::util::*;

const TOKEN: &str = "glpat-recovery-test-token-0123456789";
const TOKEN_VAR: &str = "HOOKLEDGER_TEST_GITLAB_TOKEN";
const SECRET: &str = "a-gitlab-webhook-secret-token";
const HOOK: &str = "projects/7/42";
const WAIT: Duration = Duration::from_secs(30);
/// The fake's page: smaller than the 100 asked for, so that 30 requests take several pages.
const FAKE_PAGE: usize = 7;

const MIGRATION: &str = "CREATE TABLE pushes (event TEXT NOT NULL, kind TEXT NOT NULL);";

#[derive(Clone)]
struct HookEvent {
    id: u64,
    /// `X-Gitlab-Event-UUID`: new for each request GitLab sends, a resend's too.
    uuid: String,
    /// `Idempotency-Key`: the same for every request of one event.
    key: String,
    status: &'static str,
    body: Value,
}

#[derive(Default)]
struct Fake {
    /// Newest first, as GitLab lists them.
    events: Vec<HookEvent>,
    /// Where a resend is posted (the server's webhook URL).
    target: Option<String>,
    resent: Vec<u64>,
    calls: Vec<String>,
}

struct FakeGitlab {
    url: String,
    fake: Arc<Mutex<Fake>>,
}

impl FakeGitlab {
    fn start() -> FakeGitlab {
        let fake = Arc::new(Mutex::new(Fake::default()));
        let addr = serve_fake(Router::new().fallback(answer).with_state(fake.clone()));
        FakeGitlab {
            url: format!("http://{addr}/api/v4"),
            fake,
        }
    }
}

fn json_answer(status: StatusCode, link: Option<String>, body: Value) -> Response {
    let mut response = (
        status,
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response();
    if let Some(link) = link {
        response.headers_mut().insert("link", link.parse().unwrap());
    }
    response
}

async fn answer(State(fake): State<Arc<Mutex<Fake>>>, request: Request) -> Response {
    let (method, path) = (request.method().clone(), request.uri().path().to_string());
    let query = request.uri().query().unwrap_or("").to_string();
    let host = request
        .headers()
        .get("host")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("x")
        .to_string();
    let authorized = request
        .headers()
        .get("authorization")
        .is_some_and(|v| v == format!("Bearer {TOKEN}").as_str());
    let mut fake = fake.lock().unwrap();
    fake.calls.push(format!("{method} {path}?{query}"));
    if !authorized {
        return json_answer(
            StatusCode::UNAUTHORIZED,
            None,
            json!({"message": "401 Unauthorized"}),
        );
    }
    let not_found = || {
        json_answer(
            StatusCode::NOT_FOUND,
            None,
            json!({"message": "404 Not found"}),
        )
    };
    let Some(rest) = path.strip_prefix("/api/v4/projects/7/hooks/42/events") else {
        return not_found();
    };
    let params: Vec<(String, String)> = url::form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect();
    let param = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.parse::<usize>().ok())
    };
    match (
        method.as_str(),
        rest.trim_start_matches('/')
            .split('/')
            .collect::<Vec<_>>()
            .as_slice(),
    ) {
        ("GET", [""]) => {
            let per_page = param("per_page").unwrap_or(20).min(FAKE_PAGE);
            let page = param("page").unwrap_or(1);
            let start = (page - 1) * per_page;
            let listed: Vec<Value> = fake
                .events
                .iter()
                .skip(start)
                .take(per_page)
                .map(|e| {
                    json!({
                        "id": e.id, "url": "https://hooks.example.com/webhooks/gitlab", "trigger": "push_hooks",
                        "request_headers": {
                            "Content-Type": "application/json", "User-Agent": "GitLab/17.4.0",
                            "Idempotency-Key": e.key, "X-Gitlab-Event": "Push Hook",
                            "X-Gitlab-Webhook-UUID": "a753eedb-1d72-4549-9ca7-eac8ea8e50dd",
                            "X-Gitlab-Instance": "https://gitlab.example.com",
                            "X-Gitlab-Event-UUID": e.uuid, "X-Gitlab-Token": "[REDACTED]"
                        },
                        "request_data": e.body,
                        "response_headers": {}, "response_body": "", "execution_duration": 1.07,
                        "response_status": e.status
                    })
                })
                .collect();
            let link = (start + per_page < fake.events.len()).then(|| {
                format!(
                    "<http://{host}/api/v4/projects/7/hooks/42/events?page={}&per_page={per_page}>; rel=\"next\", \
                     <http://{host}/api/v4/projects/7/hooks/42/events?page=1&per_page={per_page}>; rel=\"first\"",
                    page + 1
                )
            });
            json_answer(StatusCode::OK, link, Value::Array(listed))
        }
        ("POST", [id, "resend"]) => {
            let Some(event) = fake
                .events
                .iter()
                .find(|e| e.id.to_string() == *id)
                .cloned()
            else {
                return not_found();
            };
            fake.resent.push(event.id);
            // GitLab sends it again as a request of its own: a new UUID, the same key, listed
            // first from then on.
            let again = HookEvent {
                id: 9000 + fake.resent.len() as u64,
                uuid: format!("resent-{}-{}", fake.resent.len(), event.uuid),
                status: "200",
                ..event
            };
            fake.events.insert(0, again.clone());
            if let Some(target) = fake.target.clone() {
                tokio::task::spawn_blocking(move || post_push(&target, &again));
            }
            json_answer(StatusCode::CREATED, None, json!({"response_status": 200}))
        }
        _ => not_found(),
    }
}

/// The push of request `i`.
fn push_body(i: usize) -> Value {
    json!({
        "object_kind": "push", "event_name": "push",
        "ref": if i.is_multiple_of(3) { "refs/heads/main" } else { "refs/heads/dev" },
        "after": format!("{:040x}", i), "project_id": 7,
        "project": {"id": 7, "path_with_namespace": "flightjs/Flight"}
    })
}

fn uuid(i: usize) -> String {
    format!("842d7c3e-3114-4396-8a95-{i:012}")
}

fn key(i: usize) -> String {
    format!("7c6e0583-49f2-4dc5-a50b-{i:012}")
}

/// Events 9 and 29 were received by a hookledger whose preset claimed the UUID (before it
/// claimed the `Idempotency-Key`).
fn claimed_by_uuid(i: usize) -> bool {
    i == 9 || i == 29
}

/// The id event `i` is claimed by: its `Idempotency-Key`, or its UUID for those received
/// before the preset claimed the key.
fn claimed(i: usize) -> String {
    if claimed_by_uuid(i) {
        uuid(i)
    } else {
        key(i)
    }
}

/// POSTs a request to `url` as GitLab 17.4 and later does: the hook's secret token, the
/// request's UUID and the event's `Idempotency-Key`.
fn post_push(url: &str, e: &HookEvent) -> u16 {
    post_request(url, e, true)
}

/// POSTs a request to `url` as GitLab does, with its `Idempotency-Key` or (`with_key`
/// false, as a hookledger that claimed the UUID took it) without.
fn post_request(url: &str, e: &HookEvent, with_key: bool) -> u16 {
    let mut request = ureq::post(url)
        .set("X-Gitlab-Token", SECRET)
        .set("X-Gitlab-Event", "Push Hook")
        .set("X-Gitlab-Event-UUID", &e.uuid)
        .set("Content-Type", "application/json");
    if with_key {
        request = request.set("Idempotency-Key", &e.key);
    }
    match request.send_bytes(&serde_json::to_vec(&e.body).unwrap()) {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(s, _)) => s,
        Err(err) => panic!("posting a push: {err}"),
    }
}

fn config(dir: &std::path::Path, fake: &FakeGitlab, extra: &str) -> std::path::PathBuf {
    std::fs::create_dir_all(dir.join("migrations")).unwrap();
    std::fs::write(dir.join("migrations/001_pushes.sql"), MIGRATION).unwrap();
    let path = dir.join("hookledger.toml");
    let text = format!(
        "[schema]\nmigrations = \"migrations/\"\n\n\
         [[source]]\nname = \"gl\"\npreset = \"gitlab\"\nsecrets = [\"{SECRET}\"]\nhook = \"{HOOK}\"\n\
         api_key = \"env:{TOKEN_VAR}\"\napi_base = \"{}\"\n{extra}\n\n\
         [[effect]]\nsource = \"gl\"\non = \"Push Hook\"\n\
         sql = \"INSERT INTO pushes VALUES (:event_id, :event_type)\"\n",
        fake.url
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// A fake with 30 events, and a server that received all but 10 (`i % 3 == 1`), two of them
/// claimed by their UUID (`claimed_by_uuid`); one of the ten (4) was sent again by hand and
/// that request was received (a new UUID, the same key), as was a resend by hand of one that
/// had arrived (0: a duplicate).
fn thirty_twenty_received(extra: &str) -> (FakeGitlab, Server, std::path::PathBuf) {
    let fake = FakeGitlab::start();
    let dir = test_dir();
    let path = config(dir.path(), &fake, extra);
    let mut server = Server::start_with_env(
        dir.path(),
        &["--config", path.to_str().unwrap()],
        &[(TOKEN_VAR, TOKEN), ("RUST_LOG", "info")],
    );
    let url = format!("http://{}/webhooks/gl", server.addr);
    let mut events = Vec::new();
    for i in 0..30 {
        let failed = i % 3 == 1;
        let e = HookEvent {
            id: 1000 + i as u64,
            uuid: uuid(i),
            key: key(i),
            status: if failed { "internal error" } else { "200" },
            body: push_body(i),
        };
        if !failed {
            let status = post_request(&url, &e, !claimed_by_uuid(i));
            assert_eq!(status, 200, "{}", server.log());
        }
        events.push(e);
    }
    for (resent, i) in [(5004, 4), (5000, 0)] {
        let again = HookEvent {
            id: resent,
            uuid: format!("a4e5c3d2-0000-4000-8000-{i:012}"),
            status: "200",
            ..events[i].clone()
        };
        assert_eq!(post_push(&url, &again), 200);
        events.push(again);
    }
    events.reverse();
    {
        let mut f = fake.fake.lock().unwrap();
        f.events = events;
        f.target = Some(url);
    }
    assert_eq!(ledger_count(&server.db()), 21);
    server.keep(dir);
    (fake, server, path)
}

fn reconcile(
    server: &Server,
    config: &std::path::Path,
    token: &str,
    extra: &[&str],
) -> (i32, Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_hookledger"))
        .args([
            "reconcile",
            "--source",
            "gl",
            "--since",
            "7d",
            "--json",
            "--config",
        ])
        .arg(config)
        .args(["--db", &server.db_arg()])
        .args(extra)
        .env(TOKEN_VAR, token)
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
        "SELECT event, COUNT(*) FROM pushes GROUP BY event ORDER BY event",
        &[],
    );
    assert_eq!(rows.len(), 30, "{rows:?}");
    assert!(rows.iter().all(|(_, n)| *n == 1), "{rows:?}");
    let ids: Vec<String> = (0..30).map(claimed).collect();
    let missing = missing_from_ledger(db, &ids);
    assert!(missing.is_empty(), "{missing:?}");
}

#[test]
fn gitlab_reconcile_applies_the_ten_failed_requests_once_and_a_second_run_none() {
    let (fake, server, path) = thirty_twenty_received("");
    let (code, counts, stderr) = reconcile(&server, &path, TOKEN, &["--dry-run"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        (&counts["found"], &counts["applied"]),
        (&json!(30), &json!(9)),
        "{counts}"
    );
    assert_eq!(ledger_count(&server.db()), 21, "a dry run claims nothing");

    let (code, counts, stderr) = reconcile(&server, &path, TOKEN, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        (
            &counts["found"],
            &counts["applied"],
            &counts["already_present"],
            &counts["failed"]
        ),
        (&json!(30), &json!(9), &json!(21), &json!(0)),
        "{counts}"
    );
    let db = server.db();
    assert_each_of_thirty_once(&db);
    // Event 4's first request failed and its resend was received: its first request (another
    // UUID, the same key) is not applied again; nor is a request claimed by its UUID (9).
    assert_eq!(missing_from_ledger(&db, &[uuid(4), key(9)]).len(), 2);
    // Applied as the request would have been: claimed by its key, its type from the recorded
    // headers, its body the recorded payload.
    let kind: String = db.one("SELECT kind FROM pushes WHERE event = $1", &[&key(7)]);
    assert_eq!(kind, "Push Hook");
    let body: Value = serde_json::from_slice(&stored_body(&db, &key(7))).unwrap();
    assert_eq!(body, push_body(7));
    assert!(fake.fake.lock().unwrap().resent.is_empty());

    let (code, counts, stderr) = reconcile(&server, &path, TOKEN, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        (&counts["applied"], &counts["already_present"]),
        (&json!(0), &json!(30)),
        "{counts}"
    );
    assert_each_of_thirty_once(&server.db());
}

#[test]
fn gitlab_reconcile_in_redeliver_mode_asks_gitlab_to_resend_each_failed_request_once() {
    let (fake, server, path) = thirty_twenty_received("mode = \"redeliver\"");
    let (code, counts, stderr) = reconcile(&server, &path, TOKEN, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        (&counts["redelivered"], &counts["applied"]),
        (&json!(9), &json!(0)),
        "{counts}"
    );
    let mut resent = fake.fake.lock().unwrap().resent.clone();
    resent.sort();
    // The failed ones but 4, whose resend by hand was received.
    let expected: Vec<u64> = (0..30)
        .filter(|i| i % 3 == 1 && *i != 4)
        .map(|i| 1000 + i as u64)
        .collect();
    assert_eq!(resent, expected);
    let db = server.db();
    wait_for(WAIT, || (ledger_count(&db) == 30).then_some(())).expect("the resends arrive");
    // Each resend came with a UUID of its own and the event's key: the events are claimed once
    // each, by their keys.
    let rows: Vec<(String, i64)> = db.all(
        "SELECT event, COUNT(*) FROM pushes GROUP BY event ORDER BY event",
        &[],
    );
    assert_eq!(rows.len(), 30, "{rows:?}");
    // A second run finds every event present through one of its requests: nothing is sent
    // again.
    let (code, counts, stderr) = reconcile(&server, &path, TOKEN, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        (&counts["redelivered"], &counts["already_present"]),
        (&json!(0), &json!(30)),
        "{counts}"
    );
    assert_eq!(fake.fake.lock().unwrap().resent.len(), 9);
}

#[test]
fn serve_recovers_at_its_start_what_gitlab_failed_to_deliver_while_it_was_down() {
    let (fake, mut server, _) = thirty_twenty_received("");
    let db_arg = server.db_arg();
    server.terminate();
    let dir = test_dir();
    let path = config(
        dir.path(),
        &fake,
        "reconcile = { every = \"1h\", since = \"7d\" }",
    );
    let restarted = Server::start_on_with_env(
        &db_arg,
        &["--config", path.to_str().unwrap()],
        &[(TOKEN_VAR, TOKEN), ("RUST_LOG", "info")],
    );
    let db = restarted.db();
    wait_for(WAIT, || (ledger_count(&db) == 30).then_some(()))
        .unwrap_or_else(|| panic!("not recovered: {}", restarted.log()));
    assert_each_of_thirty_once(&db);
    wait_for(WAIT, || {
        restarted
            .log()
            .contains("reconcile gl: found 30, applied 9")
            .then_some(())
    })
    .unwrap_or_else(|| panic!("{}", restarted.log()));
    let (status, _, metrics) = restarted.admin_request("GET", "/metrics", &[], b"");
    assert_eq!(status, 200, "{metrics}");
    assert!(
        metrics
            .lines()
            .any(|l| l == "hookledger_recovered_events_total{source=\"gl\"} 9"),
        "{metrics}"
    );
}

#[test]
fn a_refused_token_or_a_missing_hook_stops_the_gitlab_run_with_a_clear_message() {
    let (fake, server, path) = thirty_twenty_received("");
    let revoked = "glpat-revoked-000000000000";
    let (code, _, stderr) = reconcile(&server, &path, revoked, &[]);
    assert_ne!(code, 0, "{stderr}");
    assert!(
        stderr.contains("GitLab refused the token (HTTP 401: 401 Unauthorized)"),
        "{stderr}"
    );
    assert!(
        !stderr.contains(revoked) && !stderr.contains(TOKEN),
        "{stderr}"
    );

    let dir = test_dir();
    let other = config(dir.path(), &fake, "");
    let text = std::fs::read_to_string(&other)
        .unwrap()
        .replace(HOOK, "projects/7/43");
    std::fs::write(&other, text).unwrap();
    let (code, _, stderr) = reconcile(&server, &other, TOKEN, &[]);
    assert_ne!(code, 0, "{stderr}");
    assert!(
        stderr.contains("GitLab has no webhook projects/7/43 that this token can see"),
        "{stderr}"
    );
    assert_eq!(ledger_count(&server.db()), 21, "nothing applied");
}

#[test]
fn gitlab_recovery_settings_are_checked_at_start_up_naming_the_key() {
    let source =
        format!("[[source]]\nname = \"gl\"\npreset = \"gitlab\"\nsecrets = [\"{SECRET}\"]\n");
    let key = format!("api_key = \"env:{TOKEN_VAR}\"\n");
    let cases = [
        (format!("{source}hook = \"projects/7\"\n{key}"), "source `gl`.hook: must be \"projects/ID/HOOK_ID\""),
        (format!("{source}hook = \"{HOOK}\"\n"), "source `gl`.hook: needs api_key"),
        (format!("{source}{key}"), "source `gl`.api_key: needs hook"),
        (
            format!("{source}hook = \"{HOOK}\"\n{key}reconcile = {{ every = \"1h\", since = \"8d\" }}\n"),
            "source `gl`.reconcile.since: must be at most 7d",
        ),
        (
            format!("{source}hook = \"{HOOK}\"\n{key}\n[retention]\nclaim_days = 5\npayload_days = 5\n"),
            "retention.claim_days: must be at least 7 with source `gl`'s hook",
        ),
        (format!("{source}hook = \"{HOOK}\"\n{key}app_id = 1\n"), "source `gl`.app_id: applies to scheme github only"),
    ];
    assert_each_refused_at_start(&cases, (TOKEN_VAR, TOKEN));
}
