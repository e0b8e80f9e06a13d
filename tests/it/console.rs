//! The operator's console over HTTP (`/status`, `/events`, `/event`, `/outbox`): what it
//! shows from the database, and that every change it offers refuses without the admin token.
//! The same pages in Chromium are in `browser.rs`.

use std::path::Path;

use hookledger::internals::Reply;

use crate::admin::{TOKEN, WAIT};
use crate::util::*;

pub(crate) const GITLAB_TOKEN: &str = "gitlab_shared_token_1";

/// A config with two sources (stripe, and gitlab whose type comes from a header), a forward
/// to `forward` (a 410 is dead at once; otherwise one retry a second later) and the admin
/// token.
pub(crate) fn console_config(dir: &Path, forward: &str) -> String {
    let config = format!(
        r#"
admin_token = "env:HOOKLEDGER_TEST_ADMIN_TOKEN"

[[source]]
name = "stripe"
scheme = "stripe"
secrets = ["env:STRIPE_WEBHOOK_SECRET"]

[[source]]
name = "gitlab"
scheme = "token"
secrets = ["env:TEST_GITLAB_TOKEN"]
token = {{ header = "X-Gitlab-Token" }}
id = {{ header = "X-Gitlab-Event-UUID" }}
type = {{ header = "X-Gitlab-Event" }}

[forward]
url = "{forward}"
secret = "{FORWARD_SECRET}"
schedule = ["1s"]
"#
    );
    let path = dir.join("hookledger.toml");
    std::fs::write(&path, config).unwrap();
    path.to_str().unwrap().to_string()
}

/// A server on [`console_config`] in `dir` (a restart when its database exists).
pub(crate) fn start_console_in(dir: &Path, forward: &str) -> Server {
    let config = console_config(dir, forward);
    Server::start_with_env(
        dir,
        &["--config", &config],
        &[
            ("RUST_LOG", "info"),
            ("HOOKLEDGER_TEST_ADMIN_TOKEN", TOKEN),
            ("TEST_GITLAB_TOKEN", GITLAB_TOKEN),
        ],
    )
}

pub(crate) fn start_console(forward: &str) -> Server {
    let dir = test_dir();
    let mut server = start_console_in(dir.path(), forward);
    server.keep(dir);
    server
}

/// A GitLab-style delivery to source `gitlab`: `id`, `kind` (its type) and the `token`.
pub(crate) fn gitlab(server: &Server, id: &str, kind: &str, token: &str) -> Reply {
    server.post(
        "/webhooks/gitlab",
        br#"{"object_kind":"push"}"#,
        &[
            ("X-Gitlab-Token", token),
            ("X-Gitlab-Event-UUID", id),
            ("X-Gitlab-Event", kind),
        ],
    )
}

/// Waits until the refusals of `source` kept in the database stand for `n` requests, and
/// asserts they stand for exactly `n` (not more).
pub(crate) fn wait_refusals(db: &Db, source: &str, n: i64) {
    let kept = || {
        db.count(&format!(
            "SELECT CAST(coalesce(sum(count), 0) AS BIGINT) FROM hookledger_refusals \
             WHERE source = '{source}'"
        ))
    };
    let counted = wait_for(WAIT, || Some(kept()).filter(|k| *k >= n))
        .unwrap_or_else(|| panic!("{source}: {} refusals kept, not {n}", kept()));
    assert_eq!(counted, n, "{source}: refusals counted");
}

fn get(server: &Server, path: &str) -> String {
    let (status, body) = server.admin_get(path);
    assert_eq!(status, 200, "{path}: {body}");
    body
}

/// `/status` says why a source's requests are refused (reason, count, message) from the
/// database: the same after a restart, with the events of the last minutes; refusals of one
/// source are not shown for another.
#[test]
fn status_shows_refusals_by_reason_with_messages_and_survives_a_restart() {
    let app = FakeApp::start(&[]);
    let dir = test_dir();
    let mut server = start_console_in(dir.path(), &app.url());
    for id in ["push-1", "push-2"] {
        assert_outcome(
            &gitlab(&server, id, "Push Hook", GITLAB_TOKEN),
            id,
            "processed",
        );
    }
    assert_outcome(&server.send(&paid("evt_ok")), "evt_ok", "processed");
    for i in 0..3 {
        let reply = gitlab(&server, &format!("bad-{i}"), "Push Hook", "wrong-token");
        assert_error(&reply, 400, "invalid_signature");
    }
    let missing = server.post("/webhooks/gitlab", b"{}", &[]);
    assert_error(&missing, 400, "invalid_signature");
    let typo = server.post("/webhooks/gitlba", b"{}", &[]);
    assert_error(&typo, 404, "unknown_source");
    // Not a name a source could have: not repeated on the page.
    let junk = server.post("/webhooks/no.such~name", b"{}", &[]);
    assert_error(&junk, 404, "unknown_source");
    let db = server.db();
    wait_refusals(&db, "gitlab", 4);
    wait_refusals(&db, "*", 2);
    // Only hookledger's own words: never the token that was sent, nor a name that is not one.
    for leaked in ["wrong-token", "no.such"] {
        assert_eq!(
            db.count(&format!(
                "SELECT count(*) FROM hookledger_refusal_messages WHERE message LIKE '%{leaked}%'"
            )),
            0,
            "{leaked}"
        );
    }
    let before = get(&server, "/status");
    assert!(server.terminate().is_some());
    let server = start_console_in(dir.path(), &app.url());
    let page = get(&server, "/status");
    for page in [&before, &page] {
        let summary = page
            .split("<li id=\"summary-gitlab\">")
            .nth(1)
            .and_then(|rest| rest.split("</li>").next())
            .unwrap_or_else(|| panic!("no gitlab summary in {page}"));
        assert!(
            summary.contains("4 refused in 15 min (invalid_signature 4)"),
            "{summary}"
        );
        assert!(summary.contains("last event"), "{summary}");
        let stripe = page.split("<li id=\"summary-stripe\">").nth(1).unwrap();
        assert!(
            stripe
                .split("</li>")
                .next()
                .unwrap()
                .contains("no refusals"),
            "{stripe}"
        );
        for needle in [
            "missing X-Gitlab-Token header",
            "2 requests in the last 15 min named a source that does not exist",
            "POST /webhooks/gitlba: no source has that name",
            "POST /webhooks/(not a valid source name): no source has that name",
            "push-1",
            "push-2",
            "evt_ok",
            &format!("hookledger {}", env!("CARGO_PKG_VERSION")),
        ] {
            assert!(page.contains(needle), "no `{needle}` in {page}");
        }
    }
}

/// The events browser filters by source, type, the start of an id and a time range; an
/// event's page shows its payload escaped and its outbox row with the target.
#[test]
fn the_events_browser_filters_and_an_events_page_shows_payload_and_outbox_rows() {
    let app = FakeApp::start(&[]);
    let server = start_console(&app.url());
    for id in ["evt_alpha_1", "evt_alpha_2", "evt_beta_1"] {
        assert_outcome(&server.send(&paid(id)), id, "processed");
    }
    assert_outcome(
        &gitlab(&server, "gl-1", "Tag Push Hook", GITLAB_TOKEN),
        "gl-1",
        "processed",
    );
    // Each forward done before the page that shows one is read (they go one at a time).
    for id in ["evt_alpha_1", "evt_alpha_2", "evt_beta_1"] {
        wait_outbox_status(&server.db(), id, "done", WAIT);
    }
    let found = |query: &str| -> Vec<String> {
        let page = get(&server, &format!("/events?{query}"));
        page.split("<a class=event-link href=\"")
            .skip(1)
            .map(|s| s.split('"').next().unwrap().to_string())
            .collect()
    };
    assert_eq!(found("").len(), 4);
    assert_eq!(found("source=gitlab").len(), 1);
    assert_eq!(found("id=evt_alpha").len(), 2);
    assert_eq!(found("id=evt_alpha&source=gitlab").len(), 0);
    assert_eq!(found("type=Tag+Push+Hook").len(), 1);
    let hour_ago = now() - 3600;
    assert_eq!(found(&format!("from={hour_ago}")).len(), 4);
    assert_eq!(found(&format!("to={hour_ago}")).len(), 0);
    let bad = get(&server, "/events?from=soon");
    assert!(bad.contains("is not a time"), "{bad}");

    // A prefix is a range of ids, not a pattern: `_` and `%` are themselves.
    assert_eq!(found("id=evt%25alpha").len(), 0);
    assert_eq!(found("id=evt_alph_").len(), 0);
    let link = found("id=evt_beta").pop().unwrap();
    assert_eq!(link, "/event?source=stripe&amp;id=evt_beta_1");
    let page = get(&server, &link.replace("&amp;", "&"));
    // The target without its path (a Slack or Discord URL carries its secret there).
    let target = app.url().replace("/hooks", "/…");
    for needle in [
        "<code id=event-id>evt_beta_1</code>",
        "<td id=event-source>stripe</td>",
        "<td id=event-type>invoice.paid</td>",
        "<pre id=payload>{\n  &quot;",
        "&quot;id&quot;: &quot;evt_beta_1&quot;",
        &format!("<code>{target}</code>"),
        "<td class=\"done\">done</td>",
    ] {
        assert!(page.contains(needle), "no `{needle}` in {page}");
    }
    assert!(
        !page.contains("/hooks"),
        "the target's path is shown: {page}"
    );
    let (status, missing) = server.admin_get("/event?source=stripe&id=nope");
    assert_eq!(status, 404, "{missing}");
}

/// The outbox view lists rows of any status by kind; retrying one dead row changes that row
/// only, retrying a kind's dead rows changes only that kind's.
#[test]
fn the_outbox_view_retries_one_dead_row_or_the_dead_rows_of_a_kind() {
    let app = FakeApp::start(&[410, 410, 410]);
    let server = start_console(&app.url());
    let ids = ["evt_d1", "evt_d2", "evt_d3"];
    for id in ids {
        assert_outcome(&server.send(&paid(id)), id, "processed");
    }
    let db = server.db();
    for id in ids {
        wait_outbox_status(&db, id, "dead", WAIT);
    }
    let page = get(&server, "/outbox?kind=forward&status=dead");
    assert_eq!(page.matches("class=\"outbox-row status-dead\"").count(), 3);
    assert!(page.contains("HTTP 410"), "{page}");
    assert!(page.contains("id=retry-kind"), "{page}");
    let id: i64 = db
        .opt("SELECT id FROM outbox WHERE key = $1", &[&"evt_d2"])
        .unwrap();
    let form = format!("id={id}&token={TOKEN}");
    let (status, head, _) = server.admin_request("POST", "/outbox/retry", &[], form.as_bytes());
    assert_eq!(status, 303, "{head}");
    assert!(
        head.contains(&format!("/outbox/row?id={id}&retried=1")),
        "{head}"
    );
    wait_outbox_status(&db, "evt_d2", "done", WAIT);
    for other in ["evt_d1", "evt_d3"] {
        assert_eq!(outbox_row(&db, other).unwrap().0, "dead", "{other}");
    }
    let form = format!("kind=other&token={TOKEN}");
    let (status, head, _) =
        server.admin_request("POST", "/outbox/retry-dead", &[], form.as_bytes());
    assert_eq!(status, 303, "{head}");
    assert!(head.contains("retried=0"), "{head}");
    assert_eq!(
        db.count("SELECT count(*) FROM outbox WHERE status = 'dead'"),
        2
    );
    let form = format!("kind=forward&token={TOKEN}");
    let (status, head, _) =
        server.admin_request("POST", "/outbox/retry-dead", &[], form.as_bytes());
    assert_eq!(status, 303, "{head}");
    assert!(head.contains("retried=2"), "{head}");
    wait_outbox_status(&db, "evt_d1", "done", WAIT);
    wait_outbox_status(&db, "evt_d3", "done", WAIT);
    let row = get(&server, &format!("/outbox/row?id={id}"));
    assert!(row.contains("<td class=\"done\">done</td>"), "{row}");
}

/// Every change the console offers refuses without the token, with a wrong one, and with
/// the token as basic auth (a browser sends that by itself, so another site's form could):
/// each time nothing changes in the database. Reads on a rebound name need the token.
#[test]
fn every_change_of_the_console_refuses_without_the_admin_token() {
    let app = FakeApp::start(&[410]);
    let server = start_console(&app.url());
    assert_outcome(&server.send(&paid("evt_t")), "evt_t", "processed");
    let db = server.db();
    wait_outbox_status(&db, "evt_t", "dead", WAIT);
    let id: i64 = db
        .opt("SELECT id FROM outbox WHERE key = $1", &[&"evt_t"])
        .unwrap();
    let snapshot = || {
        db.opt::<(String, i64, i64)>(
            "SELECT status, attempts, queued FROM outbox WHERE id = $1",
            &[&id],
        )
        .unwrap()
    };
    let before = snapshot();
    let basic = {
        use base64::Engine;
        let encoded = base64::engine::general_purpose::STANDARD.encode(format!("x:{TOKEN}"));
        format!("Basic {encoded}")
    };
    let actions = [
        ("/event/replay", "source=stripe&id=evt_t".to_string()),
        ("/outbox/retry", format!("id={id}")),
        ("/outbox/retry-dead", "kind=forward".to_string()),
        ("/status/retry-dead", String::new()),
    ];
    for (path, form) in &actions {
        let tries: [(Vec<(&str, &str)>, String); 4] = [
            (vec![], form.clone()),
            (vec![], format!("{form}&token=not-the-token-at-all")),
            (vec![("Authorization", &basic)], form.clone()),
            (
                vec![("Authorization", "Bearer not-the-token-at-all")],
                form.clone(),
            ),
        ];
        for (headers, body) in &tries {
            let (status, _, reply) = server.admin_request("POST", path, headers, body.as_bytes());
            assert_eq!(status, 401, "{path} {headers:?} {body}: {reply}");
            assert_eq!(snapshot(), before, "{path} changed the row");
        }
        assert_eq!(server.admin_get(path).0, 405, "{path} by GET");
    }
    assert_eq!(db.count("SELECT count(*) FROM outbox"), 1);
    // With the token as a bearer header, the replay goes through.
    let bearer = format!("Bearer {TOKEN}");
    let (status, head, _) = server.admin_request(
        "POST",
        "/event/replay",
        &[("Authorization", &bearer)],
        b"source=stripe&id=evt_t",
    );
    assert_eq!(status, 303, "{head}");
    wait_outbox_status(&db, "evt_t", "done", WAIT);
    let rebound = [("Host", "rebound.example:9090")];
    for path in [
        "/events",
        "/event?source=stripe&id=evt_t",
        "/outbox",
        "/outbox/row?id=1",
    ] {
        assert_eq!(
            server.admin_request("GET", path, &rebound, b"").0,
            401,
            "{path}"
        );
    }
}

/// With no admin token set, every change the console offers is refused (403, naming the
/// setting), whatever the request carries, and nothing changes in the database; the pages
/// still read on loopback.
#[test]
fn without_an_admin_token_set_no_change_of_the_console_goes_through() {
    let app = FakeApp::start(&[410]);
    let mut args = crate::admin::forwarding(&app);
    args.truncate(6); // no token
    let server = Server::start(&strs(&args));
    assert_outcome(&server.send(&paid("evt_u")), "evt_u", "processed");
    let db = server.db();
    wait_outbox_status(&db, "evt_u", "dead", WAIT);
    let id: i64 = db
        .opt("SELECT id FROM outbox WHERE key = $1", &[&"evt_u"])
        .unwrap();
    let snapshot = || {
        db.opt::<(String, i64, i64)>(
            "SELECT status, attempts, queued FROM outbox WHERE id = $1",
            &[&id],
        )
        .unwrap()
    };
    let before = snapshot();
    let bearer = format!("Bearer {TOKEN}");
    for (path, form) in [
        ("/event/replay", "source=stripe&id=evt_u".to_string()),
        ("/outbox/retry", format!("id={id}")),
        ("/outbox/retry-dead", "kind=forward".to_string()),
        ("/status/retry-dead", String::new()),
    ] {
        for (headers, body) in [
            (vec![], form.clone()),
            (vec![], format!("{form}&token={TOKEN}")),
            (vec![("Authorization", bearer.as_str())], form.clone()),
        ] {
            let (status, _, reply) = server.admin_request("POST", path, &headers, body.as_bytes());
            assert_eq!(status, 403, "{path} {headers:?} {body}: {reply}");
            assert!(reply.contains("--admin-token"), "{path}: {reply}");
            assert_eq!(snapshot(), before, "{path} changed the row");
        }
    }
    assert_eq!(db.count("SELECT count(*) FROM outbox"), 1);
    for path in ["/events", "/outbox", &format!("/outbox/row?id={id}")] {
        get(&server, path);
    }
}

/// A flood of refusals from several threads at once is kept exactly (every request counted)
/// in a bounded number of rows: a few per source, reason and second, not one per request;
/// the accepted events meanwhile are all processed.
#[test]
fn a_flood_of_refusals_is_counted_exactly_in_few_rows() {
    let app = FakeApp::start(&[]);
    let server = start_console(&app.url());
    let minute = || now() / 60;
    let first_minute = minute();
    let flood = 600;
    std::thread::scope(|s| {
        for t in 0..6 {
            let server = &server;
            s.spawn(move || {
                for i in 0..flood / 6 {
                    let reply = gitlab(server, &format!("f-{t}-{i}"), "Push Hook", "wrong-token");
                    assert_error(&reply, 400, "invalid_signature");
                }
            });
        }
        for i in 0..20 {
            let id = format!("evt_during_flood_{i}");
            assert_outcome(&server.send(&paid(&id)), &id, "processed");
        }
    });
    let db = server.db();
    wait_refusals(&db, "gitlab", flood);
    // A row per source, reason and minute (the flood may cross from one minute into the
    // next), and a few messages.
    let minutes = minute() - first_minute + 1;
    let rows = db.count("SELECT count(*) FROM hookledger_refusals");
    assert!(
        rows <= minutes,
        "{rows} rows for {flood} refusals in {minutes} minutes of the clock"
    );
    let messages = db.count("SELECT count(*) FROM hookledger_refusal_messages");
    assert!(messages <= 5, "{messages} messages kept");
    assert_eq!(ledger_count(&db), 20);
}

/// The events browser pages by key: 50 a page, newest first, a link to the older ones (from
/// the last one shown) and back to the newest.
#[test]
fn the_events_browser_pages_through_the_ledger_newest_first() {
    let app = FakeApp::start(&[]);
    let server = start_console(&app.url());
    for i in 0..53 {
        let id = format!("evt_page_{i:02}");
        assert_outcome(&server.send(&paid(&id)), &id, "processed");
    }
    let ids = |page: &str| -> Vec<String> {
        page.split("<a class=event-link href=\"/event?source=stripe&amp;id=")
            .skip(1)
            .map(|s| s.split('"').next().unwrap().to_string())
            .collect()
    };
    let first = get(&server, "/events?source=stripe");
    assert_eq!(ids(&first).len(), 50);
    assert!(!first.contains("id=newest"), "{first}");
    let older = first
        .split("<a id=older href=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap_or_else(|| panic!("no older link in {first}"))
        .replace("&amp;", "&");
    assert!(
        older.starts_with("/events?source=stripe&after_at=")
            && older.ends_with("&after_source=stripe&after_id=evt_page_03"),
        "{older}"
    );
    let second = get(&server, &older);
    assert!(!second.contains("id=older"), "{second}");
    assert!(
        second.contains("<a id=newest href=\"/events?source=stripe\""),
        "{second}"
    );
    // Sent one after the other: newest first is the reverse of the order they were sent in
    // (received in the same second, the greater id is listed first).
    let listed: Vec<String> = [ids(&first), ids(&second)].concat();
    let expected: Vec<String> = (0..53).rev().map(|i| format!("evt_page_{i:02}")).collect();
    assert_eq!(listed, expected);
}

/// An error of the server (here an effect's, whose text carries a value of the payload, as a
/// database's `DETAIL: Key (email)=(…)` does) is counted on `/status` by its kind, for a single
/// event and for an event of an array alike; its text is only in the log.
#[test]
fn a_server_errors_text_is_never_kept_for_status_only_its_kind() {
    const KEY: &str = "console_hmac_secret_1";
    const LEAK: &str = "leak-4242@example.com";
    let dir = test_dir();
    std::fs::create_dir_all(dir.path().join("migrations")).unwrap();
    std::fs::write(
        dir.path().join("migrations/001_seen.sql"),
        "CREATE TABLE seen (source TEXT, event_id TEXT);",
    )
    .unwrap();
    let config = r#"
admin_token = "env:HOOKLEDGER_TEST_ADMIN_TOKEN"

[schema]
migrations = "migrations/"

[[source]]
name = "single"
scheme = "hmac"
secrets = ["env:CONSOLE_HMAC"]
hmac = { header = "X-Signature" }
id = { json = "/id" }
type = { json = "/type" }

[[source]]
name = "batch"
scheme = "hmac"
secrets = ["env:CONSOLE_HMAC"]
hmac = { header = "X-Signature" }
split = "/"
id = { json = "/id" }
type = { json = "/type" }

[[effect]]
source = "single"
on = "*"
sql = "INSERT INTO seen VALUES (:source, :event_id)"

[[effect]]
source = "batch"
on = "*"
sql = "INSERT INTO seen VALUES (:source, :event_id)"
"#;
    let path = dir.path().join("hookledger.toml");
    std::fs::write(&path, config).unwrap();
    let server = Server::start_with_env(
        dir.path(),
        &["--config", path.to_str().unwrap()],
        &[
            ("RUST_LOG", "info"),
            ("HOOKLEDGER_TEST_ADMIN_TOKEN", TOKEN),
            ("CONSOLE_HMAC", KEY),
        ],
    );
    let db = server.db();
    db.inject_failure(
        "refuse_leak",
        "INSERT",
        "seen",
        "new.event_id = 'evt_leak'",
        &format!("duplicate key: Key (email)=({LEAK}) already exists"),
    );
    let post = |source: &str, body: &str| {
        use hmac::Mac;
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(KEY.as_bytes()).unwrap();
        mac.update(body.as_bytes());
        let signature = hex::encode(mac.finalize().into_bytes());
        server.post(
            &format!("/webhooks/{source}"),
            body.as_bytes(),
            &[("X-Signature", &signature)],
        )
    };
    let event = r#"{"id":"evt_leak","type":"user.created"}"#;
    assert_error(&post("single", event), 500, "internal");
    let array = format!(r#"[{{"id":"evt_fine","type":"user.created"}},{event}]"#);
    assert_error(&post("batch", &array), 500, "internal");
    // Both counted, by their kind, once each (the array's other event committed).
    wait_refusals(&db, "single", 1);
    wait_refusals(&db, "batch", 1);
    assert_eq!(
        db.strings("SELECT source || '/' || reason FROM hookledger_refusals ORDER BY source"),
        ["batch/internal", "single/internal"]
    );
    assert_eq!(
        db.strings("SELECT message FROM hookledger_refusal_messages ORDER BY source"),
        [
            "event evt_leak: internal: see the log for the error",
            "event evt_leak: internal: see the log for the error"
        ]
    );
    assert_eq!(
        db.count(&format!(
            "SELECT count(*) FROM hookledger_refusal_messages WHERE message LIKE '%{LEAK}%'"
        )),
        0
    );
    let page = get(&server, "/status");
    assert!(!page.contains(LEAK), "{page}");
    assert!(page.contains("see the log for the error"), "{page}");
    wait_for(WAIT, || server.log().contains(LEAK).then_some(())).expect("the text is in the log");
    assert_eq!(db.strings("SELECT event_id FROM seen"), ["evt_fine"]);
}
