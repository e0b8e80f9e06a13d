//! Where an event's id and type are (issue 32, item 11): `id` and `type` over any scheme's own
//! places, `id = "body_sha256"` for senders without ids, and the source's name as the type of
//! an event that has none (Svix's own example, Slack's slash commands and interactivity
//! posts, which are form-encoded).

use hmac::Mac;

use crate::util::*;

/// The Standard Webhooks vector's secret.
const STANDARD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SLACK_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";

const CONFIG: &str = r#"
[[source]]
name = "svix"
scheme = "standard"
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]

[[source]]
name = "orders"
scheme = "standard"
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
id = { header = "X-Order-Event" }
type = { json = "/kind" }

[[source]]
name = "slack"
preset = "slack"
secrets = ["8f742231b10e8888abcd99yyyzzz85a5"]
id = "body_sha256"
"#;

fn start() -> Server {
    let dir = test_dir();
    let path = dir.path().join("envelopes.toml");
    std::fs::write(&path, CONFIG).unwrap();
    let mut server = Server::start_in(dir.path(), &["--config", path.to_str().unwrap()]);
    server.keep(dir);
    server
}

type Headers = Vec<(String, String)>;

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

/// Svix's headers for `body` as message `id`, signed now.
fn svix_headers(id: &str, body: &[u8]) -> Headers {
    let key = hookledger::internals::SigningKey::from_secret(STANDARD_SECRET).unwrap();
    let t = now();
    vec![
        ("svix-id".into(), id.into()),
        ("svix-timestamp".into(), t.to_string()),
        ("svix-signature".into(), key.sign(id, t, body)),
    ]
}

/// Slack's `v0:` signature of a form-encoded `body`, made now.
fn slack_headers(body: &[u8]) -> Headers {
    let t = now().to_string();
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(SLACK_SECRET.as_bytes()).unwrap();
    for part in [b"v0:", t.as_bytes(), b":", body] {
        mac.update(part);
    }
    vec![
        (
            "X-Slack-Signature".into(),
            format!("v0={}", hex::encode(mac.finalize().into_bytes())),
        ),
        ("X-Slack-Request-Timestamp".into(), t),
        (
            "Content-Type".into(),
            "application/x-www-form-urlencoded".into(),
        ),
    ]
}

/// Every ledger row: source, event id, type.
fn ledger(server: &Server) -> Vec<(String, String, String)> {
    server.db().all(
        "SELECT source, event_id, event_type FROM webhook_events ORDER BY source, event_id",
        &[],
    )
}

fn sha256_hex(body: &[u8]) -> String {
    hex::encode(<sha2::Sha256 as sha2::Digest>::digest(body))
}

#[test]
fn a_standard_source_takes_id_and_type_overrides_and_an_event_without_a_type_gets_the_default() {
    let server = start();
    // Svix's own example payload: no `type` in it. Its type is the source's name.
    let example = br#"{"test": 2432232314}"#;
    let reply = post(
        &server,
        "svix",
        example,
        &svix_headers("msg_p5jXN8AQM9LWM0D4loKWxJek", example),
    );
    assert_outcome(&reply, "msg_p5jXN8AQM9LWM0D4loKWxJek", "processed");
    assert_eq!(
        stored_body(&server.db(), "msg_p5jXN8AQM9LWM0D4loKWxJek"),
        example
    );

    // The id from the sender's own header, the type from the body, over the scheme's places:
    // a second delivery of the order event (a new message id, signed again) is a duplicate.
    let body = br#"{"kind":"order.paid","order":7}"#;
    let mut headers = svix_headers("msg_1", body);
    headers.push(("X-Order-Event".into(), "order-7-paid".into()));
    assert_outcome(
        &post(&server, "orders", body, &headers),
        "order-7-paid",
        "processed",
    );
    let mut again = svix_headers("msg_2", body);
    again.push(("X-Order-Event".into(), "order-7-paid".into()));
    assert_outcome(
        &post(&server, "orders", body, &again),
        "order-7-paid",
        "duplicate",
    );
    // Without the id where the source reads it: refused, naming the place, nothing stored.
    let reply = post(&server, "orders", body, &svix_headers("msg_3", body));
    assert_error(&reply, 400, "invalid_event");
    assert!(reply.body.contains("X-Order-Event"), "{}", reply.body);
    assert_eq!(
        ledger(&server),
        [
            ("orders".into(), "order-7-paid".into(), "order.paid".into()),
            (
                "svix".into(),
                "msg_p5jXN8AQM9LWM0D4loKWxJek".into(),
                "svix".into()
            ),
        ]
    );
}

#[test]
fn a_slack_slash_command_form_post_is_keyed_by_its_body_sha256_and_a_resend_is_a_duplicate() {
    let server = start();
    let command = b"token=gIkuvaNzQIHg97ATvDxqgjtO&team_id=T0001&team_domain=example\
&channel_id=C2147483705&channel_name=test&user_id=U2147483697&user_name=Steve\
&command=%2Fweather&text=94070&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2F1234%2F5678\
&trigger_id=13345224609.738474920.8088930838d88f008e0&api_app_id=A123456";
    let id = sha256_hex(command);
    assert_outcome(
        &post(&server, "slack", command, &slack_headers(command)),
        &id,
        "processed",
    );
    // Slack signs each send anew; the same bytes are the same event.
    assert_outcome(
        &post(&server, "slack", command, &slack_headers(command)),
        &id,
        "duplicate",
    );
    assert_eq!(stored_body(&server.db(), &id), command);
    // An interactivity post: form-encoded too, its JSON in `payload`.
    let action = b"payload=%7B%22type%22%3A%22block_actions%22%2C%22trigger_id%22%3A%2212466734323.1395872398%22%7D";
    let action_id = sha256_hex(action);
    assert_outcome(
        &post(&server, "slack", action, &slack_headers(action)),
        &action_id,
        "processed",
    );
    // The Events API's JSON keeps the preset's type.
    let event = br#"{"type":"event_callback","event_id":"Ev1","event":{"type":"app_mention"}}"#;
    let event_id = sha256_hex(event);
    assert_outcome(
        &post(&server, "slack", event, &slack_headers(event)),
        &event_id,
        "processed",
    );
    let mut expected = vec![
        ("slack".to_string(), id, "slack".to_string()),
        ("slack".into(), action_id, "slack".into()),
        ("slack".into(), event_id, "app_mention".into()),
    ];
    expected.sort();
    assert_eq!(ledger(&server), expected);
}

#[test]
fn a_bad_id_or_type_place_stops_start_up_naming_its_key() {
    for (place, key) in [
        ("id = { json = \"id\" }", "source `svix`.id.json"),
        ("type = { json = \"kind\" }", "source `svix`.type.json"),
        ("type = \"body_sha256\"", "source `svix`.type.body_sha256"),
        (
            "id = { header = \"bad header\" }",
            "source `svix`.id.header",
        ),
        ("id = []", "source `svix`.id: must be a place"),
        (
            "id = [[{ header = \"X-Id\" }]]",
            "source `svix`.id[0]: must be a place",
        ),
        (
            "id = [{ header = \"X-Id\" }, { header = \"bad header\" }]",
            "source `svix`.id[1].header",
        ),
        (
            "type = [{ json = \"/kind\" }, \"body_sha256\"]",
            "source `svix`.type[1].body_sha256",
        ),
    ] {
        let dir = test_dir();
        let path = dir.path().join("bad.toml");
        let text = format!(
            "[[source]]\nname = \"svix\"\nscheme = \"standard\"\nsecrets = [\"{STANDARD_SECRET}\"]\n{place}\n"
        );
        std::fs::write(&path, text).unwrap();
        let mut child = serve_command(db_arg_in(dir.path()))
            .args(["--config", path.to_str().unwrap()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let status = wait_for(std::time::Duration::from_secs(10), || {
            child.try_wait().unwrap()
        });
        if status.is_none() {
            let _ = child.kill();
        }
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(status.and_then(|s| s.code()), Some(2), "{place}: {stderr}");
        assert!(stderr.contains(key), "{place}: {stderr}");
        assert!(!database_created(dir.path()), "{place}");
    }
}
