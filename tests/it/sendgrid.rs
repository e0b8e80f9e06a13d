//! SendGrid through its preset: a signed array of events, each claimed and applied on its
//! own in one transaction.

use crate::presets::SENDGRID_TEST_KEY;
use crate::util::*;

/// A batch of three events, one of them claimed by an earlier batch: two new ledger rows, and
/// the app's effect once per event.
#[test]
fn a_sendgrid_batch_of_three_with_one_already_claimed_adds_two_and_runs_each_effect_once() {
    let dir = test_dir();
    std::fs::create_dir_all(dir.path().join("migrations")).unwrap();
    std::fs::write(
        dir.path().join("migrations/001_mail.sql"),
        "CREATE TABLE mail_events (event_id TEXT PRIMARY KEY, kind TEXT NOT NULL);",
    )
    .unwrap();
    let config = dir.path().join("hookledger.toml");
    std::fs::write(
        &config,
        format!(
            r#"[schema]
migrations = "migrations/"

[[source]]
name = "sendgrid"
preset = "sendgrid"
secrets = ["{SENDGRID_TEST_KEY}"]

[[effect]]
source = "sendgrid"
on = "*"
sql = "INSERT INTO mail_events (event_id, kind) VALUES (:event_id, :event_type)"
"#
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let mut server = Server::start_in(dir.path(), &["--config", config]);
    let all = std::fs::read(fixtures_dir().join("sendgrid/events.json")).unwrap();
    let events: Vec<serde_json::Value> = serde_json::from_slice(&all).unwrap();
    let first = serde_json::to_vec(&[&events[1]]).unwrap();
    let send = |body: &[u8], name: &str| {
        let file = dir.path().join(name);
        std::fs::write(&file, body).unwrap();
        let url = format!("http://{}/webhooks/sendgrid", server.addr);
        let file = file.to_str().unwrap().to_string();
        cli(&[
            "send", "--config", config, "--source", "sendgrid", "--url", &url, &file,
        ])
    };
    let (code, out, err) = send(&first, "first.json");
    assert_eq!(code, 0, "{out} {err}");
    assert!(out.starts_with("200") && out.contains("processed"), "{out}");
    let (code, out, err) = send(&all, "all.json");
    assert_eq!(code, 0, "{out} {err}");
    let answer: serde_json::Value =
        serde_json::from_str(out.trim_start_matches("200").trim()).unwrap();
    let outcomes: Vec<(&str, &str)> = answer["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["event_id"].as_str().unwrap(),
                e["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            ("sg_event_id_processed_5e8Fh1", "processed"),
            ("sg_event_id_delivered_7kQ2m9", "duplicate"),
            ("sg_event_id_open_3pR7t2", "processed"),
        ]
    );
    let db = server.db();
    assert_eq!(
        db.strings(
            "SELECT event_id FROM webhook_events WHERE source = 'sendgrid' ORDER BY event_id"
        ),
        [
            "sg_event_id_delivered_7kQ2m9",
            "sg_event_id_open_3pR7t2",
            "sg_event_id_processed_5e8Fh1"
        ]
    );
    assert_eq!(
        db.strings("SELECT event_id || ':' || kind FROM mail_events ORDER BY event_id"),
        [
            "sg_event_id_delivered_7kQ2m9:delivered",
            "sg_event_id_open_3pR7t2:open",
            "sg_event_id_processed_5e8Fh1:processed"
        ],
        "each event's effect once"
    );
    server.keep(dir);
}
