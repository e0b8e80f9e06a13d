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

/// `--log-format json`: every line `serve` prints is JSON, on stdout (the addresses) as on
/// stderr, and so is a start-up error; a fresh database logs its migrations in one line.
#[test]
fn with_json_logs_every_line_printed_is_json_and_a_fresh_database_logs_one_migration_line() {
    use std::io::{BufRead, Read};
    use std::process::{Command, Stdio};
    let dir = test_dir();
    let mut child = Command::new(env!("CARGO_BIN_EXE_hookledger"))
        .args(["--log-format", "json", "serve", "--listen", "127.0.0.1:0"])
        .args([
            "--admin-listen",
            "127.0.0.1:0",
            "--db",
            &db_arg_in(dir.path()),
        ])
        .env("STRIPE_WEBHOOK_SECRET", SECRET)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut printed = Vec::new();
    for _ in 0..2 {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        printed.push(line);
    }
    let listen = printed_addr(&printed[0], "listen").expect("the listen address");
    assert!(printed_addr(&printed[1], "admin").is_some(), "{printed:?}");
    let reply = hookledger::internals::Client::new(std::time::Duration::from_secs(10))
        .send(
            &format!("http://{listen}/webhooks/stripe"),
            &paid("evt_json_lines"),
            &secret(),
            now(),
        )
        .unwrap();
    assert_outcome(&reply, "evt_json_lines", "processed");
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));
    stdout.read_to_string(&mut printed[1]).unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let lines: Vec<serde_json::Value> = printed
        .concat()
        .lines()
        .chain(stderr.lines())
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect();
    let migrations: Vec<&str> = lines
        .iter()
        .filter_map(|l| l["message"].as_str())
        .filter(|m| m.contains("schema version"))
        .collect();
    assert_eq!(migrations.len(), 1, "{stderr}");
    assert!(
        migrations[0].starts_with("database at schema version ")
            && migrations[0].ends_with(" migration(s) applied)"),
        "{stderr}"
    );
    assert_eq!(
        Db::open(&db_arg_in(dir.path())).strings("SELECT event_id FROM webhook_events"),
        ["evt_json_lines"]
    );
    // A start-up that cannot run says why in JSON too (exit 2).
    let out = Command::new(env!("CARGO_BIN_EXE_hookledger"))
        .args([
            "--log-format",
            "json",
            "serve",
            "--config",
            "/nonexistent/hookledger.toml",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.trim().is_empty());
    for line in err.lines() {
        let line: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert_eq!(line["level"], "ERROR", "{line}");
    }
}

/// `deploy/hookledger.service` is hardened (its own user, a read-only system, no new
/// privileges, the secrets as credentials), runs `serve` on `deploy/hookledger.toml` as
/// installed, loads exactly the credentials that config reads (one `LoadCredential` per
/// secret), every flag of its `ExecStart` is one `serve` takes, and `systemd-analyze verify`
/// finds nothing to say about it (with `ExecStart` pointing at this build, as the unit names
/// the installed path).
#[test]
fn the_systemd_unit_is_hardened_loads_each_secret_of_its_config_and_verifies() {
    let unit = std::fs::read_to_string(deploy("hookledger.service")).unwrap();
    for line in [
        "User=hookledger\n",
        "StateDirectory=hookledger\n",
        "ProtectSystem=strict\n",
        "NoNewPrivileges=yes\n",
        "Restart=always\n",
        "CapabilityBoundingSet=\n",
    ] {
        assert!(unit.contains(line), "no `{}` in the unit", line.trim());
    }
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("an ExecStart");
    assert!(
        exec.starts_with("/usr/bin/hookledger serve --config /etc/hookledger/hookledger.toml"),
        "{exec}"
    );
    let (_, help, _) = cli(&["serve", "--help"]);
    for flag in exec.split_whitespace().filter(|w| w.starts_with("--")) {
        assert!(help.contains(flag), "serve takes no {flag}");
    }
    let loaded = |unit: &str| -> Vec<String> {
        unit.lines()
            .filter_map(|l| l.strip_prefix("LoadCredential="))
            .map(|load| {
                let (name, path) = load.split_once(':').expect("LoadCredential=NAME:PATH");
                assert_eq!(path, format!("/etc/hookledger/{name}"), "{load}");
                name.to_string()
            })
            .collect()
    };
    // As shipped (the stripe source only), and with every commented-out source turned on.
    let config = std::fs::read_to_string(deploy("hookledger.toml")).unwrap();
    assert_eq!(loaded(&unit), credentials_of(&config));
    assert_eq!(
        loaded(&uncommented(&unit)),
        credentials_of(&uncommented(&config))
    );
    // The book's deploy command needs a path allowed past ProtectSystem=strict: the unit says how.
    assert!(unit.contains("ReadWritePaths=/srv/app"), "{unit}");
    // The webhook port is the socket unit's, named as serve takes it, on the config's address.
    assert!(unit.contains("Requires=hookledger.socket\n"), "{unit}");
    let socket = std::fs::read_to_string(deploy("hookledger.socket")).unwrap();
    assert!(socket.contains("FileDescriptorName=webhook\n"), "{socket}");
    assert!(socket.contains("Service=hookledger.service\n"), "{socket}");
    let listen = config
        .lines()
        .find_map(|l| l.strip_prefix("listen"))
        .and_then(|l| l.split('"').nth(1))
        .expect("a listen address in the config");
    assert!(
        socket.contains(&format!("ListenStream={listen}\n")),
        "the socket unit does not listen on the config's {listen}: {socket}"
    );

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
        unit.replace("/usr/bin/hookledger", env!("CARGO_BIN_EXE_hookledger")),
    )
    .unwrap();
    std::fs::copy(
        deploy("hookledger.socket"),
        dir.path().join("hookledger.socket"),
    )
    .unwrap();
    let out = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .arg(dir.path().join("hookledger.socket"))
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
    assert!(!said.contains("hookledger.socket"), "{said}");
}

fn deploy(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(name)
}

/// `text` (the packaged config or unit) with its commented-out TOML or directives turned on:
/// a `#` directly before text (`#[[source]]`, `#LoadCredential=…`) goes; `# ` prose stays.
fn uncommented(text: &str) -> String {
    text.lines()
        .map(|line| match line.strip_prefix('#') {
            Some(rest) if !rest.is_empty() && !rest.starts_with([' ', '#']) => rest,
            _ => line,
        })
        .map(|line| format!("{line}\n"))
        .collect()
}

/// The `credential:NAME`s of a packaged config's `text`, in order; every secret in it is one.
fn credentials_of(text: &str) -> Vec<String> {
    let config: toml::Table = toml::from_str(text).unwrap();
    let mut secrets = vec![];
    for source in config["source"].as_array().unwrap() {
        secrets.extend(source["secrets"].as_array().unwrap().iter().cloned());
    }
    secrets.push(config["admin_token"].clone());
    secrets
        .iter()
        .map(|secret| {
            let secret = secret.as_str().unwrap();
            secret
                .strip_prefix("credential:")
                .unwrap_or_else(|| panic!("{secret} is not a credential"))
                .to_string()
        })
        .collect()
}

/// The packaged config (`deploy/hookledger.toml`, the Debian package's
/// `/etc/hookledger/hookledger.toml`), its commented-out sources turned on, has the sources
/// of `examples/hookledger.toml`, the same in all but where their secrets are read from.
#[test]
fn the_packaged_config_has_the_example_config_s_sources() {
    let read = |path: std::path::PathBuf| -> toml::Table {
        toml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    let packaged: toml::Table = toml::from_str(&uncommented(
        &std::fs::read_to_string(deploy("hookledger.toml")).unwrap(),
    ))
    .unwrap();
    let example =
        read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/hookledger.toml"));
    let without_secrets = |config: &toml::Table| -> Vec<toml::Table> {
        let sources = config["source"].as_array().unwrap().iter();
        sources
            .map(|source| {
                let mut source = source.as_table().unwrap().clone();
                source.remove("secrets").expect("secrets");
                source
            })
            .collect()
    };
    assert_eq!(without_secrets(&packaged), without_secrets(&example));
    assert_eq!(packaged["retention"], example["retention"]);
}

/// The packaged config served as the unit serves it, its secrets read from the credentials
/// systemd would hand over (`$CREDENTIALS_DIRECTORY`). As shipped it starts with Stripe's
/// secret and the admin token alone (a Stripe-only user edits nothing); with its other
/// sources turned on, a Stripe and a GitHub event signed with theirs are claimed, each once.
#[test]
fn the_packaged_config_serves_with_its_secrets_from_the_credentials_directory() {
    let shipped = std::fs::read_to_string(deploy("hookledger.toml")).unwrap();
    {
        let dir = test_dir();
        let credentials = dir.path().join("credentials");
        std::fs::create_dir(&credentials).unwrap();
        let names = credentials_of(&shipped);
        assert_eq!(names, ["stripe-webhook-secret", "admin-token"]);
        std::fs::write(credentials.join(&names[0]), format!("{SECRET}\n")).unwrap();
        std::fs::write(
            credentials.join(&names[1]),
            "admin-token-value-0123456789\n",
        )
        .unwrap();
        let config = deploy("hookledger.toml");
        let server = Server::start_with_env(
            dir.path(),
            &["--config", config.to_str().unwrap()],
            &[
                ("RUST_LOG", "info"),
                ("CREDENTIALS_DIRECTORY", credentials.to_str().unwrap()),
            ],
        );
        assert_outcome(
            &server.send(&paid("evt_shipped")),
            "evt_shipped",
            "processed",
        );
        assert_eq!(server.post("/webhooks/gh", b"{}", &[]).status, 404);
        assert_eq!(ledger_count(&server.db()), 1);
    }
    let dir = test_dir();
    let credentials = dir.path().join("credentials");
    std::fs::create_dir(&credentials).unwrap();
    let github_secret = "github_secret_from_a_credential";
    let all = uncommented(&shipped);
    for name in credentials_of(&all) {
        let value = match name.as_str() {
            "stripe-webhook-secret" => SECRET.to_string(),
            "github-webhook-secret" => github_secret.to_string(),
            "clerk-webhook-secret" => "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_string(),
            other => format!("{other}-value-0123456789"),
        };
        std::fs::write(credentials.join(&name), format!("{value}\n")).unwrap();
    }
    let config = dir.path().join("all-sources.toml");
    std::fs::write(&config, &all).unwrap();
    let server = Server::start_with_env(
        dir.path(),
        &["--config", config.to_str().unwrap()],
        &[
            ("RUST_LOG", "info"),
            ("CREDENTIALS_DIRECTORY", credentials.to_str().unwrap()),
        ],
    );
    assert_outcome(
        &server.send(&paid("evt_packaged")),
        "evt_packaged",
        "processed",
    );
    assert_outcome(
        &server.send(&paid("evt_packaged")),
        "evt_packaged",
        "duplicate",
    );

    let body = br#"{"action":"opened","number":1}"#;
    let mut mac =
        <hmac::Hmac<sha2::Sha256> as hmac::Mac>::new_from_slice(github_secret.as_bytes()).unwrap();
    hmac::Mac::update(&mut mac, body);
    let signature = format!(
        "sha256={}",
        hex::encode(hmac::Mac::finalize(mac).into_bytes())
    );
    let delivery = "0b5a3e2c-6f1d-11ef-8a3c-0242ac120002";
    let headers = [
        ("X-Hub-Signature-256", signature.as_str()),
        ("X-GitHub-Delivery", delivery),
        ("X-GitHub-Event", "pull_request"),
    ];
    assert_eq!(server.post("/webhooks/gh", body, &headers).status, 200);
    let forged = [("X-Hub-Signature-256", "sha256=00"), headers[1], headers[2]];
    assert_eq!(server.post("/webhooks/gh", body, &forged).status, 400);

    let db = server.db();
    assert_eq!(ledger_count(&db), 2);
    for (source, id) in [("stripe", "evt_packaged"), ("gh", delivery)] {
        let claims: i64 = db.one(
            "SELECT count(*) FROM webhook_events WHERE source = $1 AND event_id = $2",
            &[&source, &id],
        );
        assert_eq!(claims, 1, "{source} {id}");
    }
    // The default credits of one paid invoice, once.
    assert_eq!(credits(&db, "acct_1"), 100);
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

/// SIGTERM is a graceful stop on either store: exit 0 (systemd counts anything else a failure),
/// no panic, and what was acknowledged is in the ledger. On PostgreSQL the writer's session
/// used to drop its runtime inside the server's and panic (exit 101).
#[test]
fn sigterm_stops_serve_with_exit_0_on_either_store() {
    let mut server = Server::start(&[]);
    assert_outcome(
        &server.send(&paid("evt_sigterm")),
        "evt_sigterm",
        "processed",
    );
    let db = server.db();
    assert_eq!(server.terminate(), Some(0), "{}", server.log());
    assert!(!server.log().contains("panicked"), "{}", server.log());
    assert_eq!(
        db.strings("SELECT event_id FROM webhook_events"),
        ["evt_sigterm"]
    );
}

/// `hookledger demo` prints its table with no log line above it (its injected failure is a
/// row of the table, not an ERROR line), its steps in the order the quick start shows.
#[test]
fn the_demo_prints_no_error_line_and_its_steps_in_the_quick_starts_order() {
    let (code, stdout, stderr) = cli(&["demo"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(!stderr.contains("ERROR"), "{stderr}");
    assert!(!stdout.contains("ERROR"), "{stdout}");
    let steps = |text: &str| -> Vec<String> {
        text.lines()
            .skip_while(|l| !l.starts_with("step "))
            .skip(2)
            .take_while(|l| !l.trim().is_empty() && !l.starts_with("```"))
            .map(|l| l.split("  ").next().unwrap().to_string())
            .collect()
    };
    let book = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src/quick-start.md"),
    )
    .unwrap();
    assert_eq!(steps(&stdout).len(), 6, "{stdout}");
    assert_eq!(steps(&stdout), steps(&book), "{stdout}");
}
