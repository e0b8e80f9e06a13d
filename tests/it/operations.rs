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

/// `deploy/hookledger.service` is hardened (its own user, a read-only system, no new
/// privileges, the secret as a credential), every flag of its `ExecStart` is one `serve`
/// takes, and `systemd-analyze verify` finds nothing to say about it (with `ExecStart`
/// pointing at this build, as the unit names the installed path).
#[test]
fn the_systemd_unit_is_hardened_and_verifies() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/hookledger.service");
    let unit = std::fs::read_to_string(&path).unwrap();
    for line in [
        "DynamicUser=yes",
        "StateDirectory=hookledger",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "LoadCredential=stripe-webhook-secret:",
        "LoadCredential=admin-token:",
        "CapabilityBoundingSet=\n",
    ] {
        assert!(unit.contains(line), "no `{}` in the unit", line.trim());
    }
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("an ExecStart");
    let (_, help, _) = cli(&["serve", "--help"]);
    for flag in exec.split_whitespace().filter(|w| w.starts_with("--")) {
        assert!(help.contains(flag), "serve takes no {flag}");
    }
    // Every credential it reads is one the unit loads.
    for word in exec.split_whitespace() {
        if let Some((_, name)) = word.split_once("%d/") {
            let load = format!("LoadCredential={name}:");
            assert!(unit.contains(&load), "{word} without {load}");
        }
    }
    if !prerequisite(
        installed("systemd-analyze"),
        "HOOKLEDGER_REQUIRE_SYSTEMD_ANALYZE",
        "systemd-analyze is not installed",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("hookledger.service");
    std::fs::write(
        &copy,
        unit.replace(
            "/usr/local/bin/hookledger",
            env!("CARGO_BIN_EXE_hookledger"),
        ),
    )
    .unwrap();
    let out = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "systemd-analyze verify failed: {said}"
    );
    // It exits 0 over directives it ignores; it names the file when it does.
    assert!(!said.contains("hookledger.service"), "{said}");
}

/// The admin listener answers `/healthz` and `/readyz` (after a heartbeat write committed,
/// which the database shows); the webhook port does not answer the operators' routes.
#[test]
fn the_admin_listener_answers_health_and_readiness_and_the_webhook_port_does_not() {
    let server = Server::start(&[]);
    assert_eq!(server.admin_get("/healthz"), (200, "ok\n".to_string()));
    assert_eq!(server.admin_get("/readyz"), (200, "ready\n".to_string()));
    let at: i64 = server
        .db()
        .one("SELECT at FROM hookledger_heartbeat WHERE id = 1", &[]);
    assert!((now() - at).abs() <= 5, "heartbeat at {at}");
    assert_eq!(server.admin_get("/nope").0, 404);
    for path in ["/metrics", "/status", "/readyz"] {
        let reply = server.raw(
            format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
            std::time::Duration::from_secs(10),
        );
        assert!(reply.starts_with("HTTP/1.1 404"), "{path}: {reply}");
    }
    // Off: no admin line, nothing listening.
    let quiet = Server::start(&["--admin-listen", "off"]);
    assert!(quiet.admin.is_none());
    assert_outcome(
        &quiet.send(&paid("evt_no_admin")),
        "evt_no_admin",
        "processed",
    );
}
