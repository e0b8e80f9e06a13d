//! What a source may add once a request verified: a body that is an array of events (`split`,
//! as SendGrid and HubSpot post them), each claimed and applied alone in one transaction; and
//! the handshakes a sender requires before it delivers (`handshake`), answered only with a
//! good signature and never claimed. Signed here with the `hmac` crate (scheme `hmac`).

use std::path::Path;

use hmac::Mac;

use crate::util::*;

const KEY: &str = "batch_sender_secret_1";
const ZOOM_TOKEN: &str = "zoom_secret_token_1";

const MIGRATION: &str =
    "CREATE TABLE seen (source TEXT, event_id TEXT, event_type TEXT, body TEXT);";

const CONFIG: &str = r#"
[schema]
migrations = "migrations/"

[[source]]
name = "sendgrid"
scheme = "hmac"
secrets = ["env:BATCH_SECRET"]
hmac = { header = "X-Signature" }
split = "/"
id = { json = "/sg_event_id" }
type = { json = "/event" }

[[source]]
name = "slack"
scheme = "hmac"
secrets = ["env:BATCH_SECRET"]
hmac = { header = "X-Signature" }
id = { json = "/event_id" }
type = { json = "/type" }
handshake = "slack"

[[source]]
name = "zoom"
scheme = "hmac"
secrets = ["env:ZOOM_SECRET"]
hmac = { header = "X-Signature" }
id = { json = "/payload/id" }
type = { json = "/event" }
handshake = "zoom"

[[source]]
name = "twitch"
scheme = "hmac"
secrets = ["env:BATCH_SECRET"]
hmac = { header = "X-Signature" }
id = { header = "Twitch-Eventsub-Message-Id" }
type = { header = "Twitch-Eventsub-Subscription-Type" }
handshake = "twitch"

[[effect]]
source = "sendgrid"
on = "*"
sql = "INSERT INTO seen VALUES (:source, :event_id, :event_type, :body)"
"#;

fn start_in(dir: &Path) -> Server {
    std::fs::create_dir_all(dir.join("migrations")).unwrap();
    std::fs::write(dir.join("migrations/001_seen.sql"), MIGRATION).unwrap();
    let path = dir.join("hookledger.toml");
    std::fs::write(&path, CONFIG).unwrap();
    let env = [
        ("RUST_LOG", "info"),
        ("BATCH_SECRET", KEY),
        ("ZOOM_SECRET", ZOOM_TOKEN),
    ];
    Server::start_with_env(dir, &["--config", path.to_str().unwrap()], &env)
}

fn start() -> Server {
    let dir = test_dir();
    let mut server = start_in(dir.path());
    server.keep(dir);
    server
}

fn hex_hmac(key: &str, data: &[u8]) -> String {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key.as_bytes()).unwrap();
    mac.update(data);
    hex::encode(mac.finalize().into_bytes())
}

/// POSTs `body` to `source`, signed with `key`, with `headers` too.
fn post_signed(
    server: &Server,
    source: &str,
    key: &str,
    body: &[u8],
    headers: &[(&str, &str)],
) -> hookledger::internals::Reply {
    let signature = hex_hmac(key, body);
    let mut all = vec![("X-Signature", signature.as_str())];
    all.extend_from_slice(headers);
    server.post(&format!("/webhooks/{source}"), body, &all)
}

fn sendgrid(server: &Server, body: &str) -> hookledger::internals::Reply {
    post_signed(server, "sendgrid", KEY, body.as_bytes(), &[])
}

/// A SendGrid-shaped event.
fn sg(id: &str, event: &str) -> String {
    format!(
        r#"{{"email":"a@example.com","timestamp":1700000000,"event":"{event}","sg_event_id":"{id}","sg_message_id":"m.1"}}"#
    )
}

/// Each listed event's `(event_id, outcome)`.
fn outcomes(reply: &hookledger::internals::Reply) -> Vec<(String, String)> {
    json(reply)["events"]
        .as_array()
        .unwrap_or_else(|| panic!("no events in {}", reply.body))
        .iter()
        .map(|e| {
            (
                e["event_id"].as_str().unwrap().to_string(),
                e["outcome"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

fn seen(db: &Db) -> Vec<String> {
    db.strings("SELECT event_id || '/' || event_type FROM seen ORDER BY event_id")
}

/// The line of `/metrics` for `source`, `kind` and `outcome`, if any.
fn events_metric(server: &Server, source: &str, kind: &str, outcome: &str) -> Option<String> {
    let (status, text) = server.admin_get("/metrics");
    assert_eq!(status, 200);
    let prefix = format!(
        r#"hookledger_events_total{{source="{source}",type="{kind}",outcome="{outcome}"}} "#
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix).map(str::to_string))
}

#[test]
fn an_array_of_events_is_claimed_and_applied_event_by_event_in_one_answer() {
    let server = start();
    let db = server.db();
    let reply = sendgrid(&server, &format!("[{}]", sg("sg_1", "delivered")));
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(outcomes(&reply), pairs(&[("sg_1", "processed")]));

    // Three events, one already claimed: two new ledger rows, each effect once.
    let (e2, e3) = (sg("sg_2", "open"), sg("sg_3", "click"));
    let body = format!("[{},\n  {e2} , {e3}]", sg("sg_1", "delivered"));
    let reply = sendgrid(&server, &body);
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(
        outcomes(&reply),
        pairs(&[
            ("sg_1", "duplicate"),
            ("sg_2", "processed"),
            ("sg_3", "processed")
        ])
    );
    assert_eq!(ledger_count(&db), 3);
    assert_eq!(seen(&db), ["sg_1/delivered", "sg_2/open", "sg_3/click"]);
    // Each event's body is its own bytes, in the ledger and to the effects.
    assert_eq!(stored_body(&db, "sg_2"), e2.as_bytes());
    assert_eq!(
        db.strings("SELECT body FROM seen WHERE event_id = 'sg_3'"),
        [e3]
    );
    assert_eq!(
        events_metric(&server, "sendgrid", "open", "processed").as_deref(),
        Some("1")
    );
    assert_eq!(
        events_metric(&server, "sendgrid", "delivered", "duplicate").as_deref(),
        Some("1")
    );

    // An event its effect refuses fails alone: 500, the others committed, the retry finds
    // them duplicates.
    db.inject_failure(
        "refuse_sg_bad",
        "INSERT",
        "seen",
        "new.event_id = 'sg_bad'",
        "injected by the test",
    );
    let body = format!(
        "[{},{},{}]",
        sg("sg_4", "open"),
        sg("sg_bad", "bounce"),
        sg("sg_5", "open")
    );
    let reply = sendgrid(&server, &body);
    assert_error(&reply, 500, "internal");
    assert!(!reply.body.contains("injected"), "{}", reply.body);
    assert_eq!(
        outcomes(&reply),
        pairs(&[
            ("sg_4", "processed"),
            ("sg_bad", "failed"),
            ("sg_5", "processed")
        ])
    );
    assert_eq!(json(&reply)["events"][1]["error"], "internal");
    assert_eq!(ledger_count(&db), 5, "sg_4 and sg_5, not sg_bad");
    assert_eq!(
        events_metric(&server, "sendgrid", "bounce", "failed").as_deref(),
        Some("1")
    );
    db.remove_failure("refuse_sg_bad", "seen");
    let reply = sendgrid(&server, &body);
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(
        outcomes(&reply),
        pairs(&[
            ("sg_4", "duplicate"),
            ("sg_bad", "processed"),
            ("sg_5", "duplicate")
        ])
    );
    assert_eq!(db.count("SELECT count(*) FROM seen"), 6, "each effect once");

    // Two copies of one event in one array: the first claims it.
    let twice = format!("[{0},{0}]", sg("sg_6", "open"));
    let reply = sendgrid(&server, &twice);
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(
        outcomes(&reply),
        pairs(&[("sg_6", "processed"), ("sg_6", "duplicate")])
    );
    assert_eq!(db.count("SELECT count(*) FROM seen"), 7);
}

#[test]
fn an_array_that_is_not_there_or_an_event_without_its_id_claims_nothing() {
    let server = start();
    let db = server.db();
    let refused = |body: &str, names: &str| {
        let reply = sendgrid(&server, body);
        assert_error(&reply, 400, "invalid_event");
        let message = json(&reply)["message"].as_str().unwrap().to_string();
        assert!(message.contains(names), "{message}");
    };
    refused(&sg("sg_1", "open"), "array of events at `/`");
    refused("[]", "empty");
    let no_id = r#"{"event":"open","email":"b@example.com"}"#;
    refused(
        &format!("[{},{no_id}]", sg("sg_1", "open")),
        "`/sg_event_id` in element 1",
    );
    refused(r#"[{"sg_event_id":"sg_2"}]"#, "`/event` in element 0");
    // A forged signature is refused before the body is read as events.
    let body = format!("[{}]", sg("sg_1", "open"));
    let forged = post_signed(&server, "sendgrid", "not_the_key", body.as_bytes(), &[]);
    assert_error(&forged, 400, "invalid_signature");
    assert_eq!(ledger_count(&db), 0, "nothing claimed");
    assert_eq!(db.count("SELECT count(*) FROM seen"), 0);
    assert_eq!(db.count("SELECT count(*) FROM outbox"), 0);
}

#[test]
fn handshakes_are_answered_only_with_a_good_signature_and_claim_nothing() {
    let server = start();
    let db = server.db();

    // Slack: the challenge back.
    let slack = br#"{"token":"Jhj5dZrVaK7ZwHHjRyZWjbDl","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
    let bad = post_signed(&server, "slack", "not_the_key", slack, &[]);
    assert_error(&bad, 400, "invalid_signature");
    assert!(!bad.body.contains("3eZbrw1a"), "{}", bad.body);
    let good = post_signed(&server, "slack", KEY, slack, &[]);
    assert_eq!(good.status, 200, "{}", good.body);
    assert_eq!(
        json(&good)["challenge"],
        "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"
    );
    // An event of the same source is an event.
    let event = br#"{"type":"event_callback","event_id":"Ev1","event":{"type":"message"}}"#;
    assert_outcome(
        &post_signed(&server, "slack", KEY, event, &[]),
        "Ev1",
        "processed",
    );

    // Zoom: the plain token and its HMAC-SHA256 with the secret token, in hex.
    let zoom = br#"{"payload":{"plainToken":"qgg8vlvZRS6UYooatFL8Aw"},"event_ts":1654503849680,"event":"endpoint.url_validation"}"#;
    let bad = post_signed(&server, "zoom", KEY, zoom, &[]);
    assert_error(&bad, 400, "invalid_signature");
    assert!(!bad.body.contains("qgg8vlvZ"), "{}", bad.body);
    let good = post_signed(&server, "zoom", ZOOM_TOKEN, zoom, &[]);
    assert_eq!(good.status, 200, "{}", good.body);
    let answer = json(&good);
    assert_eq!(answer["plainToken"], "qgg8vlvZRS6UYooatFL8Aw");
    assert_eq!(
        answer["encryptedToken"],
        hex_hmac(ZOOM_TOKEN, b"qgg8vlvZRS6UYooatFL8Aw")
    );

    // Twitch: the challenge back as text, when the message type says so.
    let twitch = br#"{"challenge":"pogchamp-kappa-360noscope-vohiyo","subscription":{"id":"f1c2a387","type":"channel.follow"}}"#;
    let verification = [
        (
            "Twitch-Eventsub-Message-Type",
            "webhook_callback_verification",
        ),
        ("Twitch-Eventsub-Message-Id", "e76c6bd4"),
        ("Twitch-Eventsub-Subscription-Type", "channel.follow"),
    ];
    let bad = post_signed(&server, "twitch", "not_the_key", twitch, &verification);
    assert_error(&bad, 400, "invalid_signature");
    assert!(!bad.body.contains("pogchamp"), "{}", bad.body);
    let good = post_signed(&server, "twitch", KEY, twitch, &verification);
    assert_eq!(good.status, 200, "{}", good.body);
    assert_eq!(good.body, "pogchamp-kappa-360noscope-vohiyo");
    let raw = server.raw(
        &raw_post("/webhooks/twitch", KEY, twitch, &verification),
        std::time::Duration::from_secs(5),
    );
    assert!(
        raw.to_ascii_lowercase()
            .contains("content-type: text/plain"),
        "{raw}"
    );

    // A handshake without its value is the sender's fault.
    let empty = br#"{"type":"url_verification"}"#;
    assert_error(
        &post_signed(&server, "slack", KEY, empty, &[]),
        400,
        "invalid_event",
    );

    assert_eq!(
        db.strings("SELECT source || '/' || event_id FROM webhook_events"),
        ["slack/Ev1"],
        "no handshake is claimed"
    );
    for (source, kind, n) in [
        ("slack", "url_verification", "1"),
        ("zoom", "endpoint.url_validation", "1"),
        ("twitch", "webhook_callback_verification", "2"),
    ] {
        assert_eq!(
            events_metric(&server, source, kind, "challenge").as_deref(),
            Some(n),
            "{source}"
        );
    }
}

/// A whole HTTP/1.1 POST of `body` to `path`, signed with `key`, closing the connection.
fn raw_post(path: &str, key: &str, body: &[u8], headers: &[(&str, &str)]) -> Vec<u8> {
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\ncontent-type: application/json\r\nx-signature: {}\r\ncontent-length: {}\r\n",
        hex_hmac(key, body),
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut request = head.into_bytes();
    request.extend_from_slice(body);
    request
}
