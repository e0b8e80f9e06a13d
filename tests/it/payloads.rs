//! Stored payloads: compressed in the ledger, stored once (a forward row refers to its
//! event's payload), read back byte for byte by every reader (the forward, `events show`, the
//! console, replay, `outbox retry`), kept by retention while a forward row needs them; rows
//! written before compression read as they did; a corrupt blob is a clear error.

use std::path::Path;
use std::time::Duration;

use sha2::Digest;

use crate::admin::TOKEN;
use crate::util::*;

const WAIT: Duration = Duration::from_secs(20);
const FORM_TOKEN: &str = "form_shared_token_1";

/// A config with `stripe` and `form` (a token source whose id and type are headers, so its
/// body may be anything: here form-encoded), forwarding to `forward` (`schedule`).
fn config(dir: &Path, forward: &str, schedule: &str) -> String {
    let config = format!(
        r#"
admin_token = "env:HOOKLEDGER_TEST_ADMIN_TOKEN"

[[source]]
name = "stripe"
scheme = "stripe"
secrets = ["env:STRIPE_WEBHOOK_SECRET"]

[[source]]
name = "form"
scheme = "token"
secrets = ["env:TEST_FORM_TOKEN"]
token = {{ header = "X-Form-Token" }}
id = {{ header = "X-Form-Id" }}
type = {{ header = "X-Form-Event" }}

[forward]
url = "{forward}"
secret = "{FORWARD_SECRET}"
schedule = {schedule}
"#
    );
    let path = dir.join("hookledger.toml");
    std::fs::write(&path, config).unwrap();
    path.to_str().unwrap().to_string()
}

fn start_in(dir: &Path, forward: &str, schedule: &str) -> Server {
    let config = config(dir, forward, schedule);
    Server::start_with_env(
        dir,
        &["--config", &config],
        &[
            ("RUST_LOG", "info"),
            ("HOOKLEDGER_TEST_ADMIN_TOKEN", TOKEN),
            ("TEST_FORM_TOKEN", FORM_TOKEN),
        ],
    )
}

fn start(forward: &str, schedule: &str) -> Server {
    let dir = test_dir();
    let mut server = start_in(dir.path(), forward, schedule);
    server.keep(dir);
    server
}

/// A real-shaped 5 KB Stripe event (the fixture), with its id made `id`.
fn stripe_body(id: &str) -> Vec<u8> {
    let fixture = String::from_utf8(fixture("invoice.paid")).unwrap();
    fixture
        .replacen("evt_1Pgci1B7WZ01zgkWrMGF0FaA", id, 1)
        .into_bytes()
}

/// A form-encoded body as GitHub sends with `application/x-www-form-urlencoded`: the JSON
/// percent-encoded after `payload=`.
fn form_body() -> Vec<u8> {
    let json = String::from_utf8(fixture("customer.subscription.updated"))
        .unwrap()
        .replace('\n', "");
    let mut body = b"payload=".to_vec();
    for b in json.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            body.push(b);
        } else {
            body.extend(format!("%{b:02X}").bytes());
        }
    }
    body
}

fn send_form(server: &Server, id: &str, body: &[u8]) {
    let reply = server.post(
        "/webhooks/form",
        body,
        &[
            ("X-Form-Token", FORM_TOKEN),
            ("X-Form-Id", id),
            ("X-Form-Event", "push"),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
    );
    assert_outcome(&reply, id, "processed");
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}

/// The body delivered for event `id` (the last delivery of it).
fn delivered(app: &FakeApp, id: &str) -> Vec<u8> {
    app.deliveries()
        .into_iter()
        .rev()
        .find(|d| d.headers["webhook-id"] == id)
        .unwrap_or_else(|| panic!("no delivery of {id}"))
        .body
}

/// (payload_codec, stored bytes) of event `id`.
fn stored(db: &Db, id: &str) -> (Option<i64>, i64) {
    db.one(
        "SELECT CAST(payload_codec AS BIGINT), CAST(length(payload) AS BIGINT)
         FROM webhook_events WHERE event_id = $1",
        &[&id],
    )
}

/// (payload_ref, own payload bytes) of event `id`'s forward row.
fn forward_row(db: &Db, id: &str) -> (Option<i64>, i64) {
    db.one(
        "SELECT CAST(payload_ref AS BIGINT), CAST(length(payload) AS BIGINT)
         FROM outbox WHERE kind = 'forward' AND key = $1",
        &[&id],
    )
}

/// `hookledger events show` of `id`: its `payload` field.
fn shown(server: &Server, source: &str, id: &str) -> serde_json::Value {
    let (code, out, err) = cli(&[
        "events",
        "show",
        id,
        "--source",
        source,
        "--db",
        &server.db_arg(),
    ]);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str::<serde_json::Value>(&out).unwrap()["payload"].clone()
}

/// JSON and form-encoded bodies: forwarded byte for byte (same SHA-256), stored compressed
/// in the ledger (codec set, fewer bytes) and once (the forward row holds no copy), and read
/// back whole by `events show`, the console and a replay.
#[test]
fn forwarded_bodies_arrive_byte_for_byte_from_one_compressed_copy() {
    let app = FakeApp::start(&[]);
    let server = start(&app.url(), r#"["1s"]"#);
    let json = stripe_body("evt_zstd");
    assert_outcome(&server.send(&json), "evt_zstd", "processed");
    let form = form_body();
    send_form(&server, "form-1", &form);

    app.wait_delivered(2, WAIT);
    assert_eq!(sha256(&delivered(&app, "evt_zstd")), sha256(&json));
    assert_eq!(sha256(&delivered(&app, "form-1")), sha256(&form));
    let db = server.db();
    wait_outbox_status(&db, "evt_zstd", "done", WAIT);
    wait_outbox_status(&db, "form-1", "done", WAIT);

    for (id, body) in [("evt_zstd", &json), ("form-1", &form)] {
        let (codec, bytes) = stored(&db, id);
        assert_eq!(codec, Some(1), "{id}: stored as a zstd frame");
        assert!(
            bytes * 2 < body.len() as i64,
            "{id}: {bytes} bytes stored for a {}-byte body",
            body.len()
        );
        assert_eq!(forward_row(&db, id), (Some(1), 0), "{id}: no second copy");
    }

    let original: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(shown(&server, "stripe", "evt_zstd"), original);
    assert_eq!(
        shown(&server, "form", "form-1"),
        serde_json::Value::String(String::from_utf8(form.clone()).unwrap())
    );

    // The console's event page shows the payload (pretty-printed JSON).
    let (status, page) = server.admin_get("/event?source=stripe&id=evt_zstd");
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("in_1Pgc6tB7WZ01zgkWu9fdqL6I"), "{page}");

    // A replay delivers the same bytes again.
    let (code, _, err) = cli(&[
        "replay",
        "form-1",
        "--source",
        "form",
        "--db",
        &server.db_arg(),
    ]);
    assert_eq!(code, 0, "{err}");
    app.wait_delivered(3, WAIT);
    assert_eq!(sha256(&delivered(&app, "form-1")), sha256(&form));
    assert_eq!(forward_row(&db, "form-1"), (Some(1), 0));
}

/// Retention never clears (or deletes with its claim) a payload a forward row still needs:
/// pending (its request held by the app) or dead (waiting for `outbox retry`); a dead row
/// retried after the prune still delivers the body byte for byte. The claim of a delivered
/// event goes as before.
#[test]
fn retention_keeps_the_payloads_that_pending_and_dead_forward_rows_need() {
    // 410: dead at once.
    let app = FakeApp::start(&[410]);
    let server = start(&app.url(), r#"["1s", "1s", "1s", "1s", "1s"]"#);
    let db = server.db();
    let dead = stripe_body("evt_dead");
    assert_outcome(&server.send(&dead), "evt_dead", "processed");
    wait_outbox_status(&db, "evt_dead", "dead", WAIT);
    assert_outcome(
        &server.send(&stripe_body("evt_done")),
        "evt_done",
        "processed",
    );
    wait_outbox_status(&db, "evt_done", "done", WAIT);
    app.hold();
    let pending = stripe_body("evt_pending");
    assert_outcome(&server.send(&pending), "evt_pending", "processed");
    wait_for(WAIT, || (app.deliveries().len() == 3).then_some(())).expect("attempt held");
    // The newest claim: retention's ages count from it.
    db.execute(
        "UPDATE webhook_events SET received_at = received_at - 500 * 86400
         WHERE event_id IN ('evt_dead', 'evt_pending', 'evt_done')",
        &[],
    );
    assert_outcome(&server.send(&paid("evt_newest")), "evt_newest", "processed");
    // 500 days: past the payload age (30) and the claim age (400).
    let (code, out, err) = cli(&["prune", "--db", &server.db_arg()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("deleted 1 ledger rows"), "{out}");
    let kept = db.strings(
        "SELECT event_id || ':' || CASE WHEN payload IS NULL THEN 'cleared' ELSE 'kept' END
         FROM webhook_events ORDER BY event_id",
    );
    assert_eq!(
        kept,
        ["evt_dead:kept", "evt_newest:kept", "evt_pending:kept"],
        "the delivered event went with its claim; the others keep their payloads"
    );

    app.release();
    wait_outbox_status(&db, "evt_pending", "done", WAIT);
    assert_eq!(sha256(&delivered(&app, "evt_pending")), sha256(&pending));
    let id: i64 = db.one(
        "SELECT id FROM outbox WHERE kind = 'forward' AND key = 'evt_dead'",
        &[],
    );
    let (code, _, err) = cli(&["outbox", "retry", &id.to_string(), "--db", &server.db_arg()]);
    assert_eq!(code, 0, "{err}");
    wait_outbox_status(&db, "evt_dead", "done", WAIT);
    assert_eq!(sha256(&delivered(&app, "evt_dead")), sha256(&dead));

    // Delivered now: the next prune may clear both.
    let (code, out, err) = cli(&["prune", "--db", &server.db_arg()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("deleted 2 ledger rows"), "{out}");
}

/// Rows written before compression (no codec; a forward row with its own copy, as the
/// previous release wrote them) read and forward as they did.
#[test]
fn rows_written_before_compression_still_read_and_forward() {
    let app = FakeApp::start(&[]);
    let server = start(&app.url(), r#"["1s"]"#);
    assert_outcome(&server.send(&paid("evt_now")), "evt_now", "processed");
    let old = stripe_body("evt_old_raw");
    let db = server.db();
    // Received now: the start's retention run, which may come after these inserts on a busy
    // machine, must not prune them (a claim at 1970 is past every horizon).
    let at = now();
    db.execute(
        "INSERT INTO webhook_events (source, event_id, event_type, created, received_at, payload)
         VALUES ('stripe', 'evt_old_raw', 'invoice.paid', 1, $2, $1)",
        &[&old, &at],
    );
    db.execute(
        "INSERT INTO outbox (kind, source, key, event_type, payload, status, next_attempt_at,
                             created_at)
         VALUES ('forward', 'stripe', 'evt_old_raw', 'invoice.paid', $1, 'pending', 0, $2)",
        &[&old, &at],
    );
    wait_outbox_status(&db, "evt_old_raw", "done", WAIT);
    assert_eq!(sha256(&delivered(&app, "evt_old_raw")), sha256(&old));
    assert_eq!(
        shown(&server, "stripe", "evt_old_raw"),
        serde_json::from_slice::<serde_json::Value>(&old).unwrap()
    );
    // A replay of it refers to the (raw) ledger payload.
    let (code, _, err) = cli(&["replay", "evt_old_raw", "--db", &server.db_arg()]);
    assert_eq!(code, 0, "{err}");
    let sent = |app: &FakeApp| {
        let deliveries = app.deliveries();
        deliveries
            .iter()
            .filter(|d| d.headers.get("webhook-id").map(String::as_str) == Some("evt_old_raw"))
            .count()
    };
    wait_for(WAIT, || (sent(&app) >= 2).then_some(())).expect("replayed");
    assert_eq!(sha256(&delivered(&app, "evt_old_raw")), sha256(&old));
    assert_eq!(forward_row(&db, "evt_old_raw"), (Some(1), 0));
}

/// A compressed payload whose bytes were damaged is a clear error: `events show` says the
/// stored payload cannot be read (exit 2, no panic), and its forward row goes dead with that
/// reason instead of being retried for ever. The server goes on.
#[test]
fn a_corrupt_compressed_payload_is_a_clear_error() {
    // Nothing listens: the row is retried every second until its payload is damaged.
    let (addr, _) = down_app();
    let server = start(
        &format!("http://{addr}/hooks"),
        &format!("[{}]", vec!["\"1s\""; 60].join(", ")),
    );
    let db = server.db();
    assert_outcome(
        &server.send(&stripe_body("evt_corrupt")),
        "evt_corrupt",
        "processed",
    );
    let (codec, bytes) = stored(&db, "evt_corrupt");
    assert_eq!(codec, Some(1));
    // The frame's first bytes kept, the rest replaced by as many other bytes.
    let garbage = vec![0x5a_u8; bytes as usize - 12];
    db.execute(
        &format!(
            "UPDATE webhook_events SET payload = {} WHERE event_id = 'evt_corrupt'",
            concat_sql()
        ),
        &[&garbage],
    );
    let (code, _, err) = cli(&["events", "show", "evt_corrupt", "--db", &server.db_arg()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("stored payload cannot be read: zstd: "),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");

    let (_, _, error) = wait_outbox_status(&db, "evt_corrupt", "dead", WAIT);
    assert!(
        error
            .as_deref()
            .unwrap_or("")
            .contains("stored payload cannot be read"),
        "{error:?}"
    );
    assert!(!server.log().contains("panicked"));
    assert_outcome(&server.send(&paid("evt_after")), "evt_after", "processed");
}

/// The SQL that keeps the first 12 bytes of `payload` (zstd's magic number, frame header and
/// more)
/// and appends `$1`, on either store.
fn concat_sql() -> &'static str {
    match store() {
        Store::Sqlite => "CAST(substr(payload, 1, 12) || $1 AS BLOB)",
        Store::Postgres => "substring(payload from 1 for 12) || $1",
    }
}

/// A source's dictionary: trained once it has 1,000 stored payloads, then every new payload
/// is compressed with it (much smaller than without), forwarded byte for byte, and read
/// back, as are the rows made before it; after a restart the same dictionary is used, and
/// no second one is trained.
#[test]
fn a_source_compresses_with_its_own_dictionary_after_1000_payloads() {
    let app = FakeApp::start(&[]);
    let dir = test_dir();
    let mut server = start_in(dir.path(), &app.url(), r#"["1s"]"#);
    let body = |i: usize| {
        String::from_utf8(stripe_body(&format!("evt_sample_{i:05}")))
            .unwrap()
            .replace("in_1Pgc6tB7WZ01zgkWu9fdqL6I", &format!("in_sample_{i:07}"))
            .replace(
                "\"amount_paid\": 2000",
                &format!("\"amount_paid\": {}", i * 37),
            )
            .into_bytes()
    };
    for i in 0..1000 {
        let id = format!("evt_sample_{i:05}");
        assert_outcome(&server.send(&body(i)), &id, "processed");
    }
    let db = server.db();
    let dict: i64 = wait_for(Duration::from_secs(60), || {
        db.opt(
            "SELECT id FROM hookledger_payload_dicts WHERE source = 'stripe'",
            &[],
        )
    })
    .expect("a dictionary for stripe");
    // The request path takes the dictionary up just after the writer stored it: until then
    // new payloads are still compressed without it.
    let mut probes = 0;
    wait_for(Duration::from_secs(60), || {
        probes += 1;
        let i = 5000 + probes;
        assert_outcome(
            &server.send(&body(i)),
            &format!("evt_sample_{i:05}"),
            "processed",
        );
        db.opt::<i64>(
            &format!(
                "SELECT payload_dict FROM webhook_events
                 WHERE event_id = 'evt_sample_{i:05}' AND payload_dict IS NOT NULL"
            ),
            &[],
        )
    })
    .expect("new payloads compressed with the dictionary");
    let after = String::from_utf8(body(5000))
        .unwrap()
        .replace("evt_sample_05000", "evt_with_dict")
        .into_bytes();
    assert_outcome(&server.send(&after), "evt_with_dict", "processed");
    let used: (Option<i64>, Option<i64>) = db.one(
        "SELECT CAST(payload_codec AS BIGINT), payload_dict FROM webhook_events
         WHERE event_id = 'evt_with_dict'",
        &[],
    );
    assert_eq!(used, (Some(1), Some(dict)));
    let (_, with_dict) = stored(&db, "evt_with_dict");
    let (_, without) = stored(&db, "evt_sample_00000");
    assert!(
        with_dict * 3 < without,
        "{with_dict} bytes with the dictionary, {without} without"
    );
    app.wait_delivered(1001 + probes, WAIT);
    wait_outbox_status(&db, "evt_with_dict", "done", WAIT);
    assert_eq!(sha256(&delivered(&app, "evt_with_dict")), sha256(&after));

    server.terminate();
    let server = start_in(dir.path(), &app.url(), r#"["1s"]"#);
    for (id, bytes) in [("evt_sample_00000", body(0)), ("evt_with_dict", after)] {
        assert_eq!(
            shown(&server, "stripe", id),
            serde_json::from_slice::<serde_json::Value>(&bytes).unwrap(),
            "{id}"
        );
    }
    let next = body(6000);
    assert_outcome(&server.send(&next), "evt_sample_06000", "processed");
    let used: Option<i64> = db.one(
        "SELECT payload_dict FROM webhook_events WHERE event_id = 'evt_sample_06000'",
        &[],
    );
    assert_eq!(used, Some(dict), "the same dictionary after a restart");
    assert_eq!(db.count("SELECT count(*) FROM hookledger_payload_dicts"), 1);
    app.wait_delivered(1002 + probes, WAIT);
    assert_eq!(sha256(&delivered(&app, "evt_sample_06000")), sha256(&next));
}
