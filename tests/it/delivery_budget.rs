//! The payload bytes the outbox worker holds at once (issue 32, item 5): with
//! `storage.outbox_payload_budget` smaller than the pending rows' payloads together, the
//! attempts in flight never hold more than the budget, and every row is delivered.

use std::time::Duration;

use crate::util::*;

const WAIT: Duration = Duration::from_secs(60);
const ROWS: usize = 10;
const PAD: usize = 3 << 20;
/// Room for two of the 3 MiB payloads, not three.
const BUDGET: usize = 7 << 20;

#[test]
fn large_pending_forwards_hold_no_more_payload_bytes_than_the_budget_and_all_are_delivered() {
    let app = FakeApp::start(&[]);
    app.hold();
    let dir = test_dir();
    let config = format!(
        r#"
[storage]
outbox_payload_budget = {BUDGET}

[[source]]
name = "stripe"
scheme = "stripe"
secrets = ["env:STRIPE_WEBHOOK_SECRET"]
max_body = 4194304

[forward]
url = "{url}"
secret = "{FORWARD_SECRET}"
schedule = ["1s", "1s", "1s", "1s", "1s"]
timeout = "30s"
concurrency = 12
"#,
        url = app.url()
    );
    let path = dir.path().join("hookledger.toml");
    std::fs::write(&path, config).unwrap();
    let mut server = Server::start_in(dir.path(), &["--config", path.to_str().unwrap()]);
    server.keep(dir);
    let pad = "x".repeat(PAD);
    for i in 0..ROWS {
        let id = format!("evt_budget_{i}");
        let body = format!(r#"{{"id":"{id}","type":"big.thing","created":1,"pad":"{pad}"}}"#);
        assert_outcome(&server.send(body.as_bytes()), &id, "processed");
    }
    // The app answers nothing yet: what arrived is what the worker holds in flight.
    wait_for(WAIT, || (app.deliveries().len() >= 2).then_some(())).expect("two attempts in flight");
    std::thread::sleep(Duration::from_secs(2));
    let in_flight: usize = app.deliveries().iter().map(|d| d.body.len()).sum();
    assert!(
        in_flight <= BUDGET,
        "{} payloads ({in_flight} bytes) in flight, over the budget of {BUDGET}",
        app.deliveries().len()
    );
    app.release();
    app.wait_delivered(ROWS, WAIT);
    let db = server.db();
    for i in 0..ROWS {
        wait_outbox_status(&db, &format!("evt_budget_{i}"), "done", WAIT);
    }
    let max = app.max_in_flight();
    assert!(max <= 2, "{max} attempts in flight at once");
}
