//! The `mailgun` scheme over HTTP: a delivery signed as Mailgun's "Securing webhooks" docs
//! show (the HMAC computed here, apart from hookledger's code) is processed, the same again is
//! a duplicate, and a wrong signature is refused with nothing claimed. Mailgun's own SDKs
//! (Python `mailgun`, npm `mailgun.js`) do not verify webhooks, so there is no SDK oracle: the
//! published algorithm is the reference.

use crate::util::*;

const KEY: &str = "mailgun-webhook-signing-key-for-tests";

/// Hex HMAC-SHA256 of `timestamp` + `token` under `key`, as Mailgun's docs compute it.
fn mailgun_signature(key: &str, timestamp: &str, token: &str) -> String {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key.as_bytes()).unwrap();
    mac.update(timestamp.as_bytes());
    mac.update(token.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

fn delivery(timestamp: &str, token: &str, signature: &str) -> Vec<u8> {
    format!(
        r#"{{"signature":{{"timestamp":"{timestamp}","token":"{token}","signature":"{signature}"}},"event-data":{{"event":"delivered","id":"CPgfbmQMTCKtHW6uIWtuVe","timestamp":1521472262.908181,"recipient":"alice@example.com"}}}}"#
    )
    .into_bytes()
}

#[test]
fn a_delivery_signed_as_mailguns_docs_show_is_processed_once_and_a_wrong_signature_is_refused() {
    let dir = test_dir();
    let config = dir.path().join("mailgun.toml");
    std::fs::write(
        &config,
        format!("[[source]]\nname = \"mailgun\"\npreset = \"mailgun\"\nsecrets = [\"{KEY}\"]\n"),
    )
    .unwrap();
    let server = Server::start_in(dir.path(), &["--config", config.to_str().unwrap()]);
    let t = now().to_string();
    let token = "a8ce0edb2dd8301dee6c2405235584e45aa91d1e9f979f3de0";
    let headers = [("Content-Type", "application/json")];

    let wrong = delivery(&t, token, &mailgun_signature("another-key", &t, token));
    let reply = server.post("/webhooks/mailgun", &wrong, &headers);
    assert_eq!(reply.status, 400, "a wrong signature: {}", reply.body);
    assert_eq!(ledger_count(&server.db()), 0, "nothing claimed");

    let body = delivery(&t, token, &mailgun_signature(KEY, &t, token));
    let reply = server.post("/webhooks/mailgun", &body, &headers);
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(reply.body.contains("processed"), "{}", reply.body);
    let reply = server.post("/webhooks/mailgun", &body, &headers);
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(reply.body.contains("duplicate"), "{}", reply.body);
    assert_eq!(
        server
            .db()
            .strings("SELECT event_id FROM webhook_events WHERE source = 'mailgun'"),
        vec!["CPgfbmQMTCKtHW6uIWtuVe".to_string()]
    );
}

/// Regression (a black-box probe): Mailgun signs only its timestamp and token, so one captured
/// delivery's `signature` object verified on a forged event, which was processed. A token
/// already used by another event is refused (Mailgun's advice), and nothing of it is stored;
/// Mailgun's own retry of the first event is a duplicate, as before.
#[test]
fn a_captured_signature_on_another_event_is_refused_as_a_replay_and_stores_nothing() {
    let dir = test_dir();
    let config = dir.path().join("mailgun.toml");
    std::fs::write(
        &config,
        format!("[[source]]\nname = \"mailgun\"\npreset = \"mailgun\"\nsecrets = [\"{KEY}\"]\n"),
    )
    .unwrap();
    let server = Server::start_in(dir.path(), &["--config", config.to_str().unwrap()]);
    let t = now().to_string();
    let token = "5d4a1d2b0e9f8c7b6a5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a";
    let signature = mailgun_signature(KEY, &t, token);
    let headers = [("Content-Type", "application/json")];

    let genuine = delivery(&t, token, &signature);
    let reply = server.post("/webhooks/mailgun", &genuine, &headers);
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(reply.body.contains("processed"), "{}", reply.body);

    let forged = String::from_utf8(genuine.clone())
        .unwrap()
        .replace("CPgfbmQMTCKtHW6uIWtuVe", "forged-event-id-0001")
        .replace("alice@example.com", "mallory@example.com");
    let reply = server.post("/webhooks/mailgun", forged.as_bytes(), &headers);
    assert_eq!(reply.status, 400, "a replayed signature: {}", reply.body);
    assert!(reply.body.contains("replayed_signature"), "{}", reply.body);

    let reply = server.post("/webhooks/mailgun", &genuine, &headers);
    assert!(reply.body.contains("duplicate"), "{}", reply.body);
    assert_eq!(
        server
            .db()
            .strings("SELECT event_id FROM webhook_events WHERE source = 'mailgun'"),
        vec!["CPgfbmQMTCKtHW6uIWtuVe".to_string()],
        "the forged event is not in the ledger"
    );
    assert_eq!(
        server
            .db()
            .strings("SELECT token FROM hookledger_signature_tokens WHERE source = 'mailgun'"),
        vec![token.to_string()]
    );
}
