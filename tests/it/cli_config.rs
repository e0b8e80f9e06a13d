//! The CLI's database commands with `--config` (the database and store settings of the file
//! `serve` runs with, its secrets unread, `--db` over it), `events list --source --follow`,
//! and `outbox show`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::util::*;

const WAIT: Duration = Duration::from_secs(20);

/// A config file in a folder of its own naming `db_arg` as its database, with a source whose
/// secret is an unset variable (a command must not need it) and `[retention]` ages.
fn cli_config(dir: &std::path::Path, db_arg: &str) -> String {
    let config = format!(
        r#"
database = "{db_arg}"

[storage]
busy_timeout = "7s"

[retention]
claim_days = 5
payload_days = 2

[[source]]
name = "stripe"
scheme = "stripe"
secrets = ["env:HOOKLEDGER_TEST_UNSET_SECRET_FOR_CLI"]
"#
    );
    let path = dir.join("ops.toml");
    std::fs::write(&path, config).unwrap();
    path.to_str().unwrap().to_string()
}

fn ok(args: &[&str]) -> String {
    let (code, out, err) = cli(args);
    assert_eq!(code, 0, "{args:?}: {err}");
    out
}

#[test]
fn every_database_command_takes_config_and_db_overrides_it() {
    let app = FakeApp::start(&[500, 500]);
    let server = Server::start(&[
        "--forward-to",
        &app.url(),
        "--forward-secret",
        FORWARD_SECRET,
        "--forward-schedule",
        "1s",
    ]);
    assert_outcome(&server.send(&paid("evt_cfg")), "evt_cfg", "processed");
    let db = server.db();
    wait_outbox_status(&db, "evt_cfg", "dead", WAIT);
    let folder = test_dir();
    let config = cli_config(folder.path(), &server.db_arg());
    let config = config.as_str();

    let out = ok(&["events", "list", "--config", config]);
    assert!(
        out.contains("evt_cfg") && out.contains("invoice.paid"),
        "{out}"
    );
    let out = ok(&["events", "show", "evt_cfg", "--config", config]);
    assert!(out.contains("\"id\": \"evt_cfg\""), "{out}");

    let rows: serde_json::Value =
        serde_json::from_str(&ok(&["outbox", "list", "--json", "--config", config])).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 1);
    assert_eq!(rows[0]["status"], "dead");
    let id = rows[0]["id"].as_i64().unwrap().to_string();

    // `outbox show ID`: the row, its target's answer as the cause.
    let out = ok(&["outbox", "show", &id, "--config", config]);
    assert!(
        out.contains("evt_cfg")
            && out.contains("dead")
            && out.contains(&format!(
                "HTTP 500 from {}",
                app.url().replace("/hooks", "/…")
            )),
        "{out}"
    );
    let shown: serde_json::Value =
        serde_json::from_str(&ok(&["outbox", "show", &id, "--json", "--config", config])).unwrap();
    assert_eq!(shown["key"], "evt_cfg");
    assert_eq!(shown["attempts"], 2);
    let (code, _, err) = cli(&["outbox", "show", "999999", "--config", config]);
    assert_eq!(
        (code, err.contains("no outbox row 999999")),
        (2, true),
        "{err}"
    );

    let out = ok(&["outbox", "retry", &id, "--config", config]);
    assert!(out.contains(&format!("row {id} back to pending")), "{out}");
    app.wait_delivered(1, WAIT);
    wait_outbox_status(&db, "evt_cfg", "done", WAIT);

    ok(&["replay", "evt_cfg", "--config", config]);
    app.wait_delivered(2, WAIT);
    wait_outbox_status(&db, "evt_cfg", "done", WAIT);

    // The file's retention ages, unless flags say otherwise.
    let out = ok(&["prune", "--config", config]);
    assert!(
        out.contains("ledger rows older than 5 days") && out.contains("payloads older than 2 days"),
        "{out}"
    );
    let out = ok(&["prune", "--config", config, "--retention-days", "9"]);
    assert!(out.contains("ledger rows older than 9 days"), "{out}");
    assert_eq!(ledger_count(&db), 1, "nothing that young is pruned");

    // --db wins over the file's database.
    let elsewhere = folder.path().join("elsewhere.db");
    let elsewhere = elsewhere.to_str().unwrap();
    for args in [
        vec!["events", "list"],
        vec!["outbox", "list"],
        vec!["outbox", "show", "1"],
        vec!["outbox", "retry", "1"],
        vec!["replay", "evt_cfg"],
        vec!["prune"],
    ]
    .into_iter()
    // A SQLite-only build refuses the target first (startup.rs).
    .chain(cfg!(feature = "postgres").then(|| vec!["migrate-to", "postgres://u:p@127.0.0.1:9/x"]))
    {
        let mut args = args.clone();
        args.extend(["--config", config, "--db", elsewhere]);
        let (code, _, err) = cli(&args);
        assert_eq!(code, 2, "{args:?}");
        assert!(err.contains("elsewhere.db"), "{args:?}: {err}");
    }
    // A config file that is not there is named.
    let (code, _, err) = cli(&["events", "list", "--config", "/nonexistent/ops.toml"]);
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent/ops.toml"), "{err}");
}

#[test]
fn migrate_to_takes_the_sqlite_ledger_from_config() {
    if skipped_on_postgres("migrate-to copies a SQLite ledger") || !postgres_reachable() {
        return;
    }
    let mut server = Server::start(&[]);
    assert_outcome(&server.send(&paid("evt_mig")), "evt_mig", "processed");
    let folder = test_dir();
    let config = cli_config(folder.path(), &server.db_arg());
    let pg_dir = test_dir();
    let pg = postgres_db_in(pg_dir.path());
    // Stopped first, as migrate-to asks (its temp directory lives on with it).
    server.terminate();
    let out = ok(&["migrate-to", &pg, "--config", &config]);
    assert!(out.contains("webhook_events: 1 row(s)"), "{out}");
    let copied: Vec<String> = Db::open(&pg).strings("SELECT event_id FROM webhook_events");
    assert_eq!(copied, ["evt_mig"]);
}

#[test]
fn events_list_follow_prints_the_sources_events_as_they_arrive() {
    let server = Server::start(&[]);
    assert_outcome(&server.send(&paid("evt_f1")), "evt_f1", "processed");
    let db = server.db();
    // An event of another source, written as a receiver of it would.
    db.execute(
        "INSERT INTO webhook_events (event_id, event_type, source, received_at, payload)
         VALUES ('evt_other', 'ping', 'shop', $1, NULL)",
        &[&now()],
    );
    let (code, out, _) = cli(&[
        "events",
        "list",
        "--source",
        "shop",
        "--db",
        &server.db_arg(),
    ]);
    assert_eq!(code, 0);
    assert!(
        out.contains("evt_other") && !out.contains("evt_f1"),
        "{out}"
    );

    let mut follow = Command::new(env!("CARGO_BIN_EXE_hookledger"))
        .args(["events", "list", "--source", "stripe", "--follow"])
        .args(["--db", &server.db_arg()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, lines) = mpsc::channel::<String>();
    let stdout = follow.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let first = lines.recv_timeout(WAIT).expect("the last event, at once");
    assert!(first.contains("stripe  evt_f1  invoice.paid"), "{first}");
    // Sent after it started: printed as it arrives; the other source's is not.
    db.execute(
        "INSERT INTO webhook_events (event_id, event_type, source, received_at, payload)
         VALUES ('evt_other2', 'ping', 'shop', $1, NULL)",
        &[&now()],
    );
    assert_outcome(&server.send(&paid("evt_f2")), "evt_f2", "processed");
    let next = lines.recv_timeout(WAIT).expect("the new event");
    assert!(next.contains("stripe  evt_f2  invoice.paid"), "{next}");
    assert!(
        lines.recv_timeout(Duration::from_secs(2)).is_err(),
        "nothing else: not evt_f1 again, not the other source's"
    );
    assert!(
        follow.try_wait().unwrap().is_none(),
        "it follows until interrupted"
    );
    follow.kill().unwrap();
    follow.wait().unwrap();
}
