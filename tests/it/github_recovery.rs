//! Recovering GitHub deliveries that failed (issue 34): GitHub never retries one. A fake of
//! the hook-deliveries API (written from GitHub's REST reference: `GET
//! /repos/{owner}/{repo}/hooks/{hook_id}/deliveries` with `per_page` and `cursor`, the `Link`
//! header's `rel="next"`, `GET …/deliveries/{delivery_id}` with the request's headers and
//! payload, `POST …/deliveries/{delivery_id}/attempts` answered 202) holds 30 deliveries; 20
//! of them reached hookledger. `reconcile` applies the other 10 once, or asks the fake to
//! redeliver them (the fake then posts each, signed, as GitHub would); a second run does
//! nothing; `serve` recovers them at its start.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hmac::Mac;
use serde_json::{json, Value};

use crate::openapi::{assert_answers_fit, Answered};
use crate::util::*;

const TOKEN: &str = "github_pat_11RECOVERY_test_token_0123456789";
const TOKEN_VAR: &str = "HOOKLEDGER_TEST_GITHUB_TOKEN";
const SECRET: &str = "a-github-webhook-secret-for-recovery";
const HOOK: &str = "repos/octo/app/4242";
const WAIT: Duration = Duration::from_secs(30);
/// The fake's page: smaller than GitHub's 100, so that 30 deliveries take several pages.
const FAKE_PAGE: usize = 7;

const MIGRATION: &str = "CREATE TABLE pushes (delivery TEXT NOT NULL, kind TEXT NOT NULL);";

/// One delivery as the fake keeps it.
#[derive(Clone)]
struct Delivery {
    id: u64,
    guid: String,
    delivered_at: String,
    redelivery: bool,
    status_code: u16,
    body: Value,
}

#[derive(Default)]
struct Fake {
    /// Newest first, as GitHub lists them.
    deliveries: Vec<Delivery>,
    /// Where a redelivery is posted (the server's webhook URL).
    target: Option<String>,
    redelivered: Vec<u64>,
    /// The next calls answer this status.
    fail: Option<(u16, usize)>,
    /// Every list call answers the first page, with a `next` link, as a broken API might.
    repeat: bool,
    /// The GitHub App's hook instead of the repository's: the App's id and its public key
    /// (RSAPublicKey DER), which each call's JWT must verify with.
    app: Option<(u64, Vec<u8>)>,
    /// Each call that was answered: method, path, query, status and body.
    answered: Vec<Answered>,
    calls: Vec<String>,
}

struct FakeGithub {
    addr: SocketAddr,
    fake: Arc<Mutex<Fake>>,
}

impl FakeGithub {
    fn start() -> FakeGithub {
        let fake = Arc::new(Mutex::new(Fake::default()));
        let addr = serve_fake(Router::new().fallback(answer).with_state(fake.clone()));
        FakeGithub { addr, fake }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn redelivered(&self) -> Vec<u64> {
        self.fake.lock().unwrap().redelivered.clone()
    }
}

async fn answer(State(fake): State<Arc<Mutex<Fake>>>, request: Request) -> Response {
    let (method, path, query) = (
        request.method().clone(),
        request.uri().path().to_string(),
        request.uri().query().unwrap_or("").to_string(),
    );
    let headers = request.headers().clone();
    let answer = {
        let mut fake = fake.lock().unwrap();
        fake.calls.push(format!("{method} {path}?{query}"));
        let routed = route(&mut fake, &method, &path, &query, &headers);
        let (status, body) = match &routed {
            Routed::Json(status, _, body) => (status.as_u16(), body.clone()),
            Routed::Redeliver(status, _, _) => (status.as_u16(), json!({})),
        };
        fake.answered.push(Answered {
            method: method.to_string(),
            path: path.clone(),
            query: query.clone(),
            status,
            body,
        });
        routed
    };
    match answer {
        Routed::Json(status, link, body) => {
            let mut response = (status, body.to_string()).into_response();
            response
                .headers_mut()
                .insert("content-type", "application/json".parse().unwrap());
            if let Some(link) = link {
                response.headers_mut().insert("link", link.parse().unwrap());
            }
            response
        }
        Routed::Redeliver(status, target, delivery) => {
            // GitHub delivers it again, signed with the hook's secret, with the same GUID.
            if let Some(target) = target {
                tokio::task::spawn_blocking(move || post_delivery(&target, &delivery));
            }
            (status, "{}").into_response()
        }
    }
}

enum Routed {
    Json(StatusCode, Option<String>, Value),
    Redeliver(StatusCode, Option<String>, Delivery),
}

fn route(fake: &mut Fake, method: &Method, path: &str, query: &str, headers: &HeaderMap) -> Routed {
    let not_found = Routed::Json(
        StatusCode::NOT_FOUND,
        None,
        json!({"message": "Not Found", "documentation_url": "https://docs.github.com/rest"}),
    );
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let authorized = match &fake.app {
        None => bearer == Some(TOKEN),
        Some((app_id, public)) => bearer.is_some_and(|jwt| app_jwt_verifies(jwt, *app_id, public)),
    };
    if !authorized {
        return Routed::Json(
            StatusCode::UNAUTHORIZED,
            None,
            json!({"message": "Bad credentials", "documentation_url": "https://docs.github.com/rest"}),
        );
    }
    if let Some((status, left)) = fake.fail {
        fake.fail = (left > 1).then_some((status, left - 1));
        return Routed::Json(
            StatusCode::from_u16(status).unwrap(),
            None,
            json!({"message": "Server Error"}),
        );
    }
    let prefix = match fake.app {
        Some(_) => "/app/hook/deliveries",
        None => "/repos/octo/app/hooks/4242/deliveries",
    };
    let Some(rest) = path.strip_prefix(prefix) else {
        return not_found;
    };
    let params: HashMap<String, String> = url::form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect();
    let parts: Vec<&str> = rest.trim_start_matches('/').split('/').collect();
    match (method.as_str(), parts.as_slice()) {
        ("GET", [""]) => {
            let per_page: usize = params
                .get("per_page")
                .and_then(|p| p.parse().ok())
                .unwrap_or(30);
            let start: usize = if fake.repeat {
                None
            } else {
                params.get("cursor")
            }
            .and_then(|c| c.strip_prefix("v1_"))
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
            let take = per_page.min(FAKE_PAGE);
            let page: Vec<Value> = fake
                .deliveries
                .iter()
                .skip(start)
                .take(take)
                .map(|d| {
                    json!({
                        "id": d.id, "guid": d.guid, "delivered_at": d.delivered_at,
                        "redelivery": d.redelivery, "duration": 0.27, "status": "OK",
                        "status_code": d.status_code, "event": "push", "action": null,
                        "installation_id": null, "repository_id": 1296269, "throttled_at": null
                    })
                })
                .collect();
            let link = (fake.repeat || start + take < fake.deliveries.len()).then(|| {
                format!(
                    "<http://{}{prefix}?per_page={per_page}&cursor=v1_{}>; rel=\"next\"",
                    headers
                        .get("host")
                        .and_then(|h| h.to_str().ok())
                        .unwrap_or("x"),
                    start + take
                )
            });
            Routed::Json(StatusCode::OK, link, Value::Array(page))
        }
        ("GET", [id]) => match fake.deliveries.iter().find(|d| d.id.to_string() == *id) {
            Some(d) => Routed::Json(
                StatusCode::OK,
                None,
                json!({
                    "id": d.id, "guid": d.guid, "delivered_at": d.delivered_at,
                    "redelivery": d.redelivery, "duration": 0.27, "status": "OK",
                    "status_code": d.status_code, "event": "push", "action": null,
                    "installation_id": null, "repository_id": 1296269, "url": "",
                    "request": {
                        "headers": {
                            "Accept": "*/*",
                            "X-GitHub-Delivery": d.guid,
                            "X-GitHub-Event": "push",
                            "X-GitHub-Hook-ID": "4242",
                            "Content-Type": "application/json"
                        },
                        "payload": d.body
                    },
                    "response": {"headers": {}, "payload": null}
                }),
            ),
            None => not_found,
        },
        ("POST", [id, "attempts"]) => {
            match fake.deliveries.iter().find(|d| d.id.to_string() == *id) {
                Some(d) => {
                    fake.redelivered.push(d.id);
                    Routed::Redeliver(StatusCode::ACCEPTED, fake.target.clone(), d.clone())
                }
                None => not_found,
            }
        }
        _ => not_found,
    }
}

/// Whether `jwt` is a GitHub App JWT as GitHub takes one: RS256, signed by the App's key,
/// issued by `app_id`, valid now for at most 10 minutes.
fn app_jwt_verifies(jwt: &str, app_id: u64, public: &[u8]) -> bool {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    let parts: Vec<&str> = jwt.split('.').collect();
    let [header, claims, signature] = parts.as_slice() else {
        return false;
    };
    let decode = |part: &str| URL_SAFE_NO_PAD.decode(part).ok();
    let (Some(h), Some(c), Some(sig)) = (decode(header), decode(claims), decode(signature)) else {
        return false;
    };
    let (h, c): (Value, Value) = match (serde_json::from_slice(&h), serde_json::from_slice(&c)) {
        (Ok(h), Ok(c)) => (h, c),
        _ => return false,
    };
    let key = ring::signature::UnparsedPublicKey::new(
        &ring::signature::RSA_PKCS1_2048_8192_SHA256,
        public,
    );
    let (iat, exp) = (
        c["iat"].as_i64().unwrap_or(0),
        c["exp"].as_i64().unwrap_or(0),
    );
    h["alg"] == "RS256"
        && key
            .verify(format!("{header}.{claims}").as_bytes(), &sig)
            .is_ok()
        && c["iss"].as_str() == Some(app_id.to_string().as_str())
        && iat <= now()
        && now() < exp
        && exp - iat <= 600
}

/// The tests' App key (`tests/fixtures/github/app-private-key.pem`) and its public key as
/// RSAPublicKey DER.
fn app_key() -> (std::path::PathBuf, Vec<u8>) {
    use base64::Engine;
    let path = fixtures_dir().join("github/app-private-key.pem");
    let pem = std::fs::read_to_string(&path).unwrap();
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap();
    let pair = ring::signature::RsaKeyPair::from_der(&der).unwrap();
    use ring::signature::KeyPair;
    (path, pair.public_key().as_ref().to_vec())
}

/// Each call the fake answered is a route of GitHub's OpenAPI description of the
/// hook-delivery routes (a subset of github/rest-api-description,
/// `tests/fixtures/github/openapi-hook-deliveries.json`), and each body fits its schema.
fn assert_as_github_s_openapi_says(fake: &FakeGithub) {
    let answered = fake.fake.lock().unwrap().answered.clone();
    assert_answers_fit("GitHub", "github/openapi-hook-deliveries.json", &answered);
}

/// The push of delivery `i`.
fn push_body(i: usize) -> Value {
    json!({
        "ref": if i.is_multiple_of(3) { "refs/heads/main" } else { "refs/heads/dev" },
        "after": format!("{:040x}", i),
        "repository": {"full_name": "octo/app"},
        "pusher": {"name": "octo"}
    })
}

fn guid(i: usize) -> String {
    format!("5f1e2a00-0000-11ee-8000-{i:012}")
}

/// POSTs a delivery to `url` as GitHub does, signed with the hook's secret.
fn post_delivery(url: &str, d: &Delivery) -> u16 {
    let body = serde_json::to_vec(&d.body).unwrap();
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(&body);
    let signature = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
    match ureq::post(url)
        .set("X-Hub-Signature-256", &signature)
        .set("X-GitHub-Delivery", &d.guid)
        .set("X-GitHub-Event", "push")
        .set("Content-Type", "application/json")
        .send_bytes(&body)
    {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(s, _)) => s,
        Err(e) => panic!("posting a delivery: {e}"),
    }
}

fn config(dir: &std::path::Path, fake: &FakeGithub, extra: &str) -> std::path::PathBuf {
    let credentials = format!("hook = \"{HOOK}\"\napi_key = \"env:{TOKEN_VAR}\"");
    config_with(dir, fake, &credentials, extra)
}

fn config_with(
    dir: &std::path::Path,
    fake: &FakeGithub,
    credentials: &str,
    extra: &str,
) -> std::path::PathBuf {
    std::fs::create_dir_all(dir.join("migrations")).unwrap();
    std::fs::write(dir.join("migrations/001_pushes.sql"), MIGRATION).unwrap();
    let path = dir.join("hookledger.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[schema]
migrations = "migrations/"

[[source]]
name = "gh"
preset = "github"
secrets = ["{SECRET}"]
{credentials}
api_base = "{}"
{extra}

[[effect]]
source = "gh"
on = "push"
sql = "INSERT INTO pushes VALUES (:event_id, :event_type)"
"#,
            fake.url()
        ),
    )
    .unwrap();
    path
}

/// A fake with 30 deliveries of the last hours (two of them also redelivered, the same GUID
/// listed twice), and a server that received all but 10 (`i % 3 == 1`).
fn thirty_twenty_received(extra: &str) -> (FakeGithub, Server, std::path::PathBuf) {
    let fake = FakeGithub::start();
    let dir = test_dir();
    let path = config(dir.path(), &fake, extra);
    thirty_twenty_received_at(fake, dir, path)
}

fn thirty_twenty_received_at(
    fake: FakeGithub,
    dir: TestDir,
    path: std::path::PathBuf,
) -> (FakeGithub, Server, std::path::PathBuf) {
    let mut server = Server::start_with_env(
        dir.path(),
        &["--config", path.to_str().unwrap()],
        &[(TOKEN_VAR, TOKEN), ("RUST_LOG", "info")],
    );
    let url = format!("http://{}/webhooks/gh", server.addr);
    let mut deliveries = Vec::new();
    for i in 0..30 {
        let at = now() - 3600 * 3 + i as i64 * 60;
        let d = Delivery {
            id: 1000 + i as u64,
            guid: guid(i),
            delivered_at: rfc3339(at),
            redelivery: false,
            status_code: if i % 3 == 1 { 502 } else { 200 },
            body: push_body(i),
        };
        if i % 3 != 1 {
            assert_eq!(post_delivery(&url, &d), 200);
        }
        deliveries.push(d);
    }
    // Two failed ones were redelivered by hand, and failed again: a GUID listed twice.
    for i in [1, 4] {
        let mut again = deliveries[i].clone();
        again.id += 5000;
        again.redelivery = true;
        deliveries.push(again);
    }
    deliveries.reverse();
    {
        let mut f = fake.fake.lock().unwrap();
        f.deliveries = deliveries;
        f.target = Some(url);
    }
    assert_eq!(ledger_count(&server.db()), 20);
    server.keep(dir);
    (fake, server, path)
}

fn reconcile(server: &Server, config: &std::path::Path, extra: &[&str]) -> (i32, Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_hookledger"))
        .args([
            "reconcile",
            "--source",
            "gh",
            "--since",
            "3d",
            "--json",
            "--config",
        ])
        .arg(config)
        .args(["--db", &server.db_arg()])
        .args(extra)
        .env(TOKEN_VAR, TOKEN)
        .env_remove("HOOKLEDGER_CONFIG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let counts = serde_json::from_str(stdout.trim()).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), counts, stderr)
}

fn pushes(db: &Db) -> Vec<(String, i64)> {
    db.all(
        "SELECT delivery, COUNT(*) FROM pushes GROUP BY delivery ORDER BY delivery",
        &[],
    )
}

fn assert_each_of_thirty_once(db: &Db) {
    assert_eq!(ledger_count(db), 30);
    let rows = pushes(db);
    assert_eq!(rows.len(), 30, "{rows:?}");
    assert!(rows.iter().all(|(_, n)| *n == 1), "{rows:?}");
    let guids: Vec<String> = (0..30).map(guid).collect();
    let missing = missing_from_ledger(db, &guids);
    assert!(missing.is_empty(), "{missing:?}");
}

#[test]
fn reconcile_applies_the_ten_failed_deliveries_once_and_a_second_run_none() {
    let (fake, server, path) = thirty_twenty_received("");
    let (code, counts, stderr) = reconcile(&server, &path, &["--dry-run"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(counts["found"], 30, "{counts}");
    assert_eq!(counts["applied"], 10, "would apply: {counts}");
    assert_eq!(ledger_count(&server.db()), 20, "a dry run claims nothing");

    let (code, counts, stderr) = reconcile(&server, &path, &[]);
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
    // Applied as the webhook would have been: its type from the request's headers, its body
    // the payload GitHub shows.
    let kind: String = db.one("SELECT kind FROM pushes WHERE delivery = $1", &[&guid(4)]);
    assert_eq!(kind, "push");
    let body: Value = serde_json::from_slice(&stored_body(&db, &guid(4))).unwrap();
    assert_eq!(body, push_body(4));
    assert!(fake.redelivered().is_empty());
    let calls = fake.fake.lock().unwrap().calls.clone();
    assert!(calls.iter().all(|c| !c.contains(TOKEN)), "{calls:?}");
    assert_as_github_s_openapi_says(&fake);

    let (code, counts, stderr) = reconcile(&server, &path, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        (&counts["applied"], &counts["already_present"]),
        (&json!(0), &json!(30)),
        "{counts}"
    );
    assert_each_of_thirty_once(&server.db());
}

#[test]
fn a_github_app_s_own_hook_is_read_with_the_app_s_jwt_and_recovered_once() {
    let fake = FakeGithub::start();
    let (key_path, public) = app_key();
    fake.fake.lock().unwrap().app = Some((4242, public));
    let dir = test_dir();
    let credentials = |app_id: u64| {
        format!(
            "hook = \"app\"\napp_id = {app_id}\nprivate_key = \"file:{}\"",
            key_path.display()
        )
    };
    // With serve's own reconcile too: its run at the start (the fake has no delivery yet).
    let path = config_with(
        dir.path(),
        &fake,
        &credentials(4242),
        "reconcile = { every = \"1h\", since = \"1d\" }",
    );
    let (fake, server, path) = thirty_twenty_received_at(fake, dir, path);
    wait_for(WAIT, || {
        server
            .log()
            .contains("reconcile gh: found 0, applied 0")
            .then_some(())
    })
    .unwrap_or_else(|| panic!("serve's run of the App hook: {}", server.log()));
    let (code, counts, stderr) = reconcile(&server, &path, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        (
            &counts["found"],
            &counts["applied"],
            &counts["already_present"]
        ),
        (&json!(30), &json!(10), &json!(20)),
        "{counts}"
    );
    assert_each_of_thirty_once(&server.db());
    let calls = fake.fake.lock().unwrap().calls.clone();
    assert!(
        calls.iter().all(|c| c.contains(" /app/hook/deliveries")),
        "{calls:?}"
    );
    let (code, counts, _) = reconcile(&server, &path, &[]);
    assert_eq!((code, &counts["applied"]), (0, &json!(0)), "{counts}");
    assert_as_github_s_openapi_says(&fake);

    // A JWT GitHub does not take (another App's id as its issuer): refused, nothing claimed.
    let other = test_dir();
    let wrong = config_with(other.path(), &fake, &credentials(99), "");
    let (code, _, stderr) = reconcile(&server, &wrong, &[]);
    assert_ne!(code, 0, "{stderr}");
    assert!(
        stderr.contains("GitHub refused the token (HTTP 401"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("BEGIN RSA") && !stderr.contains("eyJ"),
        "{stderr}"
    );
}

#[test]
fn reconcile_in_redeliver_mode_asks_github_for_each_failed_delivery_and_they_arrive_once() {
    let (fake, server, path) = thirty_twenty_received("mode = \"redeliver\"");
    let (code, counts, stderr) = reconcile(&server, &path, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        (&counts["redelivered"], &counts["applied"]),
        (&json!(10), &json!(0)),
        "{counts}"
    );
    let mut asked = fake.redelivered();
    asked.sort();
    // The newest delivery of each GUID: the redelivery of 1 and 4, the first of the others.
    let mut expected: Vec<u64> = (0..30)
        .filter(|i| i % 3 == 1)
        .map(|i| 1000 + i as u64)
        .collect();
    for i in [1, 4] {
        expected.retain(|id| *id != 1000 + i);
        expected.push(6000 + i);
    }
    expected.sort();
    assert_eq!(asked, expected);
    assert_as_github_s_openapi_says(&fake);
    let db = server.db();
    wait_for(WAIT, || (ledger_count(&db) == 30).then_some(())).expect("the redeliveries arrive");
    assert_each_of_thirty_once(&db);
}

#[test]
fn serve_recovers_at_its_start_what_failed_while_it_was_down() {
    let (_fake, mut server, _) = thirty_twenty_received("");
    let db_arg = server.db_arg();
    server.terminate();
    // Down for ten minutes: the last heartbeat the first server wrote is ten minutes old.
    let down_since = now() - 600;
    assert_eq!(
        server.db().execute(
            "UPDATE hookledger_heartbeat SET at = $1 WHERE id = 1",
            &[&down_since]
        ),
        1,
        "the first server wrote its heartbeat"
    );
    let dir = test_dir();
    let path = config(
        dir.path(),
        &_fake,
        "reconcile = { every = \"1h\", since = \"1d\" }",
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
            .contains("reconcile gh: found 30, applied 10")
            .then_some(())
    })
    .unwrap_or_else(|| panic!("{}", restarted.log()));
    // What the run applied is counted for /metrics, by source.
    let (status, _, metrics) = restarted.admin_request("GET", "/metrics", &[], b"");
    assert_eq!(status, 200, "{metrics}");
    assert!(
        metrics
            .lines()
            .any(|l| l == "hookledger_recovered_events_total{source=\"gh\"} 10"),
        "{metrics}"
    );
    // The console says when no instance was up, and what the recovery found since.
    let (status, _, page) = restarted.admin_request("GET", "/status", &[], b"");
    assert_eq!(status, 200, "{page}");
    let down = page
        .split("<p class=refused id=downtime>")
        .nth(1)
        .and_then(|rest| rest.split("</p>").next())
        .unwrap_or_else(|| panic!("no downtime line: {page}"));
    assert!(down.starts_with("Down from "), "{down}");
    assert!(
        down.contains("(10 min)") || down.contains("(11 min)"),
        "{down}"
    );
    let recovery = page
        .split("<p class=recovery id=\"recovery-gh\">")
        .nth(1)
        .and_then(|rest| rest.split("</p>").next())
        .unwrap_or_else(|| panic!("no recovery line: {page}"));
    assert!(
        recovery.contains("found 30, applied 10, already present 20, failed 0."),
        "{recovery}"
    );
}

#[test]
fn a_refused_token_a_missing_hook_or_a_repeated_page_stops_the_run_with_a_clear_message() {
    let (fake, server, path) = thirty_twenty_received("");
    let out = Command::new(env!("CARGO_BIN_EXE_hookledger"))
        .args(["reconcile", "--source", "gh", "--config"])
        .arg(&path)
        .args(["--db", &server.db_arg()])
        .env(TOKEN_VAR, "github_pat_revoked_000000000000")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr.contains("GitHub refused the token (HTTP 401: Bad credentials)"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("revoked_000"),
        "the token is never printed: {stderr}"
    );
    assert_eq!(ledger_count(&server.db()), 20);

    let other = path.with_file_name("other.toml");
    std::fs::write(
        &other,
        std::fs::read_to_string(&path)
            .unwrap()
            .replace(HOOK, "repos/octo/app/999"),
    )
    .unwrap();
    let (code, _, stderr) = reconcile(&server, &other, &[]);
    assert_ne!(code, 0);
    assert!(
        stderr.contains("GitHub has no webhook repos/octo/app/999 that this token can see"),
        "{stderr}"
    );
    assert_eq!(ledger_count(&server.db()), 20);

    // An API that lists its first page again and again: the run stops at the repeat.
    fake.fake.lock().unwrap().repeat = true;
    let (code, _, stderr) = reconcile(&server, &path, &[]);
    assert_ne!(code, 0);
    assert!(
        stderr.contains("GitHub's API listed the page after cursor v1_7 again"),
        "{stderr}"
    );
    let lists = fake
        .fake
        .lock()
        .unwrap()
        .calls
        .iter()
        .filter(|c| c.starts_with("GET") && c.contains("/deliveries?"))
        .count();
    assert!(lists <= 8, "{lists} list calls in all");
    fake.fake.lock().unwrap().repeat = false;
    // What the first page lacked was applied before the repeat, each event whole.
    let before = ledger_count(&server.db());
    assert!((20..30).contains(&before), "{before}");

    // GitHub's side failing twice is retried; the run then ends as a clean one.
    fake.fake.lock().unwrap().fail = Some((502, 2));
    let (code, counts, stderr) = reconcile(&server, &path, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(counts["applied"], 30 - before, "{counts}");
    assert_each_of_thirty_once(&server.db());
}

#[test]
fn github_recovery_settings_are_checked_at_start_up_naming_the_key() {
    let fake = FakeGithub::start();
    let base = format!("api_base = \"{}\"", fake.url());
    let cases = [
        (
            format!("[[source]]\nname = \"gh\"\npreset = \"github\"\nsecrets = [\"{SECRET}\"]\nhook = \"repos/octo/4242\"\napi_key = \"env:{TOKEN_VAR}\"\n"),
            "source `gh`.hook: must be \"repos/OWNER/REPO/HOOK_ID\"",
        ),
        (
            format!("[[source]]\nname = \"gh\"\npreset = \"github\"\nsecrets = [\"{SECRET}\"]\nhook = \"{HOOK}\"\n"),
            "source `gh`.hook: needs api_key",
        ),
        (
            format!("[[source]]\nname = \"gh\"\npreset = \"github\"\nsecrets = [\"{SECRET}\"]\napi_key = \"env:{TOKEN_VAR}\"\nreconcile = {{ every = \"1h\", since = \"1d\" }}\n"),
            "source `gh`.reconcile: needs hook",
        ),
        (
            format!("[[source]]\nname = \"gh\"\npreset = \"github\"\nsecrets = [\"{SECRET}\"]\nhook = \"{HOOK}\"\napi_key = \"env:{TOKEN_VAR}\"\n{base}\nreconcile = {{ every = \"1h\", since = \"4d\" }}\n"),
            "source `gh`.reconcile.since: must be at most 3d",
        ),
        (
            format!("[[source]]\nname = \"gh\"\npreset = \"github\"\nsecrets = [\"{SECRET}\"]\nhook = \"{HOOK}\"\napi_key = \"env:{TOKEN_VAR}\"\nmode = \"resend\"\n"),
            "source `gh`: mode: must be apply or redeliver",
        ),
        (
            format!("[[source]]\nname = \"s\"\nscheme = \"stripe\"\nsecrets = [\"whsec_0123456789abcdef\"]\nhook = \"{HOOK}\"\n"),
            "source `s`.hook: applies to scheme github and preset gitlab only, not stripe",
        ),
        (
            format!("[[source]]\nname = \"gh\"\npreset = \"github\"\nsecrets = [\"{SECRET}\"]\nhook = \"app\"\napp_id = 4242\n"),
            "source `gh`.hook: \"app\" needs app_id (the App's id, on its settings page) and private_key",
        ),
        (
            format!("[[source]]\nname = \"gh\"\npreset = \"github\"\nsecrets = [\"{SECRET}\"]\nhook = \"app\"\napp_id = 4242\nprivate_key = \"env:{TOKEN_VAR}\"\n"),
            "source `gh`.private_key: not a PEM private key",
        ),
        (
            format!("[[source]]\nname = \"gh\"\npreset = \"github\"\nsecrets = [\"{SECRET}\"]\nhook = \"app\"\napi_key = \"env:{TOKEN_VAR}\"\n"),
            "source `gh`.api_key: a GitHub App's hook is read with the App's own JWT",
        ),
        (
            format!("[[source]]\nname = \"gh\"\npreset = \"github\"\nsecrets = [\"{SECRET}\"]\nhook = \"{HOOK}\"\napi_key = \"env:{TOKEN_VAR}\"\napp_id = 4242\n"),
            "source `gh`.app_id: applies to hook = \"app\" only",
        ),
    ];
    assert_each_refused_at_start(&cases, (TOKEN_VAR, TOKEN));
}
