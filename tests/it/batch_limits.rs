//! A batch body's bound (issue 32, item 6): more events than the source's `max_events` is
//! refused, 413 naming the limit and its key, with nothing stored; a batch at the limit is
//! stored whole, written in chunks so that other requests' events go between them.

use std::path::Path;

use hmac::Mac;

use crate::util::*;

const KEY: &str = "batch_limit_secret_1";
const LIMIT: usize = 600;

const MIGRATION: &str = "CREATE TABLE seen (source TEXT, event_id TEXT, event_type TEXT);";

const CONFIG: &str = r#"
[schema]
migrations = "migrations/"

[[source]]
name = "big"
scheme = "hmac"
secrets = ["env:BATCH_LIMIT_SECRET"]
hmac = { header = "X-Signature" }
split = "/"
id = { json = "/eventId" }
type = { json = "/subscriptionType" }
max_events = 600

[[effect]]
source = "big"
on = "*"
sql = "INSERT INTO seen VALUES (:source, :event_id, :event_type)"
"#;

fn start_in(dir: &Path) -> Server {
    std::fs::create_dir_all(dir.join("migrations")).unwrap();
    std::fs::write(dir.join("migrations/001_seen.sql"), MIGRATION).unwrap();
    let path = dir.join("hookledger.toml");
    std::fs::write(&path, CONFIG).unwrap();
    Server::start_with_env(
        dir,
        &["--config", path.to_str().unwrap()],
        &[("BATCH_LIMIT_SECRET", KEY)],
    )
}

/// A HubSpot-shaped array of `n` events, ids from `first`.
fn batch(first: usize, n: usize) -> Vec<u8> {
    let events: Vec<String> = (first..first + n)
        .map(|i| {
            format!(
                r#"{{"eventId":{i},"subscriptionId":12,"portalId":62515,"occurredAt":1700000000000,"subscriptionType":"contact.creation","attemptNumber":0,"objectId":{i},"changeSource":"CRM"}}"#
            )
        })
        .collect();
    format!("[{}]", events.join(",")).into_bytes()
}

fn post(server: &Server, body: &[u8]) -> hookledger::internals::Reply {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(KEY.as_bytes()).unwrap();
    mac.update(body);
    let signature = hex::encode(mac.finalize().into_bytes());
    server.post("/webhooks/big", body, &[("X-Signature", &signature)])
}

fn seen(db: &Db) -> i64 {
    db.one("SELECT COUNT(*) FROM seen", &[])
}

#[test]
fn a_batch_over_max_events_is_refused_413_naming_the_limit_and_stores_nothing() {
    let dir = test_dir();
    let mut server = start_in(dir.path());
    server.keep(dir);
    let reply = post(&server, &batch(1, LIMIT + 1));
    assert_error(&reply, 413, "too_many_events");
    assert!(reply.body.contains("600"), "{}", reply.body);
    assert!(
        reply.body.contains("source `big`.max_events"),
        "{}",
        reply.body
    );
    let db = server.db();
    assert_eq!(ledger_count(&db), 0);
    assert_eq!(seen(&db), 0);
}

#[test]
fn a_batch_at_max_events_is_stored_whole_in_chunks_and_again_is_all_duplicates() {
    let dir = test_dir();
    let mut server = start_in(dir.path());
    server.keep(dir);
    let body = batch(1, LIMIT);
    let reply = post(&server, &body);
    assert_eq!(reply.status, 200, "{}", reply.body);
    let events = json(&reply)["events"].as_array().unwrap().clone();
    assert_eq!(events.len(), LIMIT);
    assert!(
        events.iter().all(|e| e["outcome"] == "processed"),
        "{}",
        reply.body
    );
    let db = server.db();
    assert_eq!(ledger_count(&db), LIMIT as i64);
    assert_eq!(seen(&db), LIMIT as i64);
    let last: String = db.one(
        "SELECT event_type FROM webhook_events WHERE source = 'big' AND event_id = '600'",
        &[],
    );
    assert_eq!(last, "contact.creation");
    // The sender's retry of the same array: every event a duplicate, nothing applied twice.
    let again = post(&server, &body);
    assert_eq!(again.status, 200, "{}", again.body);
    let events = json(&again)["events"].as_array().unwrap().clone();
    assert!(
        events.iter().all(|e| e["outcome"] == "duplicate"),
        "{}",
        again.body
    );
    assert_eq!(ledger_count(&db), LIMIT as i64);
    assert_eq!(seen(&db), LIMIT as i64);
}
