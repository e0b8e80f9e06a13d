//! Running hookledger: its log for a log collector, its systemd unit.

use crate::util::*;

/// `--log-format json`: every line the server logs is one JSON object with the time, the
/// level, the module and the message, however odd the message; the request lines are there.
#[test]
fn json_logs_are_one_object_per_line() {
    let server = Server::start(&["--log-format", "json"]);
    assert_outcome(
        &server.send(&paid("evt_json_log")),
        "evt_json_log",
        "processed",
    );
    let forged = server.post(
        "/webhooks/stripe",
        &paid("evt_forged"),
        &[("Stripe-Signature", &forged_signature())],
    );
    assert_error(&forged, 400, "invalid_signature");
    let log = wait_for(std::time::Duration::from_secs(10), || {
        let log = server.log();
        (log.contains("evt_json_log") && log.contains("invalid_signature")).then_some(log)
    })
    .unwrap_or_else(|| panic!("no request lines in: {}", server.log()));
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect();
    for line in &lines {
        for key in ["ts", "level", "target", "message"] {
            assert!(line[key].is_string(), "no {key} in {line}");
        }
        assert!(line["ts"].as_str().unwrap().ends_with('Z'), "{line}");
    }
    assert!(lines.iter().any(|l| {
        let message = l["message"].as_str().unwrap();
        l["level"] == "INFO"
            && l["target"] == "hookledger::http::ingest"
            && message.contains("evt_json_log invoice.paid processed")
    }));
    assert!(lines
        .iter()
        .any(|l| l["message"].as_str().unwrap().contains("invalid_signature")));
    assert_eq!(ledger_count(&server.db()), 1);
}
