//! Start-up refusals: a config that cannot work stops `serve` with exit code 2 and a message
//! naming what to fix, before anything is bound or created.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::util::*;

/// Runs `serve` on a fresh database path with `args` and `env` (and no other
/// `STRIPE_WEBHOOK_SECRET`), expecting a refusal: returns stderr after checking exit code 2
/// and that no database was created.
fn refused(args: &[&str], env: &[(&str, &str)]) -> String {
    let (stderr, created) = refused_at_open(args, env);
    assert!(!created, "{args:?}: the database was created");
    stderr
}

/// Runs `cmd` until it exits, with stderr captured: its exit code and stderr. One that is
/// still running after 10 s (a server that started instead of refusing) is killed, and its
/// code is `None`.
fn exit_of(cmd: &mut Command) -> (Option<i32>, String) {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_for(Duration::from_secs(10), || child.try_wait().unwrap());
    if status.is_none() {
        let _ = child.kill();
    }
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (status.and_then(|s| s.code()), stderr)
}

/// As [`refused`], for what can only be checked against the database (an effect's SQL): it
/// may have been created; returns stderr and whether it was.
fn refused_at_open(args: &[&str], env: &[(&str, &str)]) -> (String, bool) {
    let dir = test_dir();
    let (code, stderr) = exit_of(
        serve_command(db_arg_in(dir.path()))
            .args(args)
            .env_remove("STRIPE_WEBHOOK_SECRET")
            .env_remove("HOOKLEDGER_FORWARD_SECRET")
            .env_remove("CREDENTIALS_DIRECTORY")
            .envs(env.iter().copied()),
    );
    assert_eq!(code, Some(2), "{args:?} {env:?}: {stderr}");
    (stderr, database_created(dir.path()))
}

#[test]
fn secrets_empty_after_the_prefix_or_too_short_stop_start_up() {
    for (secret, reason) in [
        ("whsec_", "nothing after the prefix"),
        ("whsec_ ", "nothing after the prefix"),
        ("a", "1 characters"),
        ("whsec_short", "5 characters"),
        ("whsec_test_secret,whsec_", "nothing after the prefix"),
    ] {
        let err = refused(&[], &[("STRIPE_WEBHOOK_SECRET", secret)]);
        assert!(
            err.contains("STRIPE_WEBHOOK_SECRET") && err.contains(reason),
            "{secret:?}: {err}"
        );
        assert!(
            !err.contains(secret) || secret.len() <= 6,
            "the secret is echoed: {err}"
        );
    }
}

/// A `credential:NAME` secret (systemd's `LoadCredential=`) stops start-up, naming its key and
/// creating nothing, when there is no credentials directory, or no such credential in it.
#[test]
fn credential_secrets_without_their_credential_stop_start_up() {
    let dir = test_dir();
    let config = write(
        dir.path(),
        "hookledger.toml",
        "[[source]]\nname = \"gh\"\nscheme = \"github\"\nsecrets = [\"credential:gh-secret\"]\n",
    );
    let err = refused(&["--config", &config], &[]);
    assert!(
        err.contains("source `gh`.secrets: credential:gh-secret needs CREDENTIALS_DIRECTORY"),
        "{err}"
    );
    let credentials = dir.path().join("credentials");
    std::fs::create_dir(&credentials).unwrap();
    let credentials = credentials.to_str().unwrap();
    let err = refused(
        &["--config", &config],
        &[("CREDENTIALS_DIRECTORY", credentials)],
    );
    assert!(
        err.contains(&format!(
            "source `gh`.secrets: cannot read {credentials}/gh-secret"
        )),
        "{err}"
    );
    let err = refused(
        &["--admin-token", "credential:../admin-token"],
        &[("STRIPE_WEBHOOK_SECRET", SECRET)],
    );
    assert!(err.contains("is not a credential name"), "{err}");
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn comment_and_blank_lines_of_a_secret_file_are_not_keys_and_a_bom_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "secrets",
        &format!("\u{feff}{SECRET}\r\n\n# rotated 2024\n   \n  # whsec_commented_out_one\n"),
    );
    let server = Server::start(&["--stripe-secret-file", &file]);
    // The first line, after its byte order mark, is the key.
    assert_outcome(&server.send(&paid("evt_bom")), "evt_bom", "processed");
    for comment in [
        "# rotated 2024",
        "# whsec_commented_out_one",
        "\u{feff}whsec_test_secret",
    ] {
        let body = paid("evt_comment");
        let header =
            hookledger::internals::stripe::sign(&hookledger::Secret::new(comment), now(), &body);
        let reply = server.post("/webhooks/stripe", &body, &[("Stripe-Signature", &header)]);
        assert_error(&reply, 400, "invalid_signature");
    }
    assert_eq!(
        server.db().strings("SELECT event_id FROM webhook_events"),
        ["evt_bom"]
    );

    let only_comments = write(dir.path(), "comments", "# nothing here yet\n\n");
    let err = refused(&["--stripe-secret-file", &only_comments], &[]);
    assert!(err.contains("holds no secret"), "{err}");
}

#[test]
fn a_secret_file_beside_the_environment_variable_names_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "secret", SECRET);
    let err = refused(
        &["--stripe-secret-file", &file],
        &[("STRIPE_WEBHOOK_SECRET", SECRET)],
    );
    assert!(
        err.contains("STRIPE_WEBHOOK_SECRET is set in the environment"),
        "{err}"
    );
    let err = refused(
        &["--stripe-secret-file", &file, "--stripe-secret", SECRET],
        &[],
    );
    assert!(err.contains("--stripe-secret"), "{err}");
    assert!(!err.contains("environment"), "{err}");
}

#[test]
fn forwarding_settings_that_cannot_work_stop_start_up_naming_the_flag() {
    let with_secret = |extra: &[&str]| {
        let mut args = vec![
            "--stripe-secret",
            SECRET,
            "--forward-secret",
            FORWARD_SECRET,
        ];
        args.extend_from_slice(extra);
        refused(&args, &[])
    };
    for (args, expected) in [
        (
            &["--forward-to", "not a url"][..],
            "--forward-to (forward.url): not a URL",
        ),
        (
            &["--forward-to", "ftp://example.com/hooks"],
            "http:// or https://",
        ),
        (
            &[
                "--forward-to",
                "http://127.0.0.1:9/h",
                "--forward-timeout",
                "0s",
            ],
            "--forward-timeout",
        ),
        (
            &[
                "--forward-to",
                "http://127.0.0.1:9/h",
                "--forward-schedule",
                "5s,99999999999d",
            ],
            "--forward-schedule",
        ),
        (
            &[
                "--forward-to",
                "http://127.0.0.1:9/h",
                "--forward-schedule",
                "5s,999999999999999999d",
            ],
            "far too long",
        ),
    ] {
        let err = with_secret(args);
        assert!(err.contains(expected), "{args:?}: {err}");
    }
    // Forwarding settings without --forward-to would be ignored without a word.
    for flag in [
        &["--forward-secret", FORWARD_SECRET][..],
        &["--forward-timeout", "5s"],
        &["--forward-schedule", "5s"],
    ] {
        let mut args = vec!["--stripe-secret", SECRET];
        args.extend_from_slice(flag);
        let err = refused(&args, &[]);
        assert!(
            err.contains(flag[0]) && err.contains("without --forward-to"),
            "{flag:?}: {err}"
        );
    }
}

#[test]
fn a_second_serve_on_the_same_database_is_refused_and_cli_commands_still_work() {
    if skipped_on_postgres("the serve lock file beside the SQLite database") {
        return;
    }
    let first = Server::start(&[]);
    let (_, args) = down_app();
    let (code, stderr) = exit_of(
        serve_command(first.db_arg())
            .args(&args)
            .env("STRIPE_WEBHOOK_SECRET", SECRET),
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("another hookledger serve is using this database"),
        "{stderr}"
    );
    // The first one is undisturbed, and commands on the database still run beside it.
    assert_outcome(&first.send(&paid("evt_first")), "evt_first", "processed");
    let db = first.db_arg();
    let (code, out, err) = cli(&["events", "list", "--db", &db]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("evt_first"), "{out}");
    let (code, _, err) = cli(&["replay", "evt_first", "--db", &db]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn a_second_serve_may_start_once_the_first_has_stopped() {
    let mut first = Server::start(&[]);
    assert_eq!(first.terminate(), Some(0));
    let second = Server::start_in(&first.dir, &[]);
    assert_outcome(&second.send(&paid("evt_next")), "evt_next", "processed");
}

/// A database file hookledger may read but not write (its folder writable): `serve` refuses
/// to start instead of answering 500 to every webhook. Root writes through any permission, so
/// as root the server runs as `nobody` (through `setpriv`).
#[test]
fn a_read_only_database_file_stops_start_up_with_the_reason() {
    use std::os::unix::fs::PermissionsExt;
    if skipped_on_postgres("file permissions of the SQLite database") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut made = Server::start_in(dir.path(), &[]);
    assert_outcome(&made.send(&paid("evt_ro")), "evt_ro", "processed");
    assert_eq!(made.terminate(), Some(0));
    let db = dir.path().join("hookledger.db");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o444)).unwrap();
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let mut cmd = if root {
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_hookledger"));
        cmd
    } else {
        Command::new(env!("CARGO_BIN_EXE_hookledger"))
    };
    let (code, stderr) = exit_of(serve_args(&mut cmd, &db).env("STRIPE_WEBHOOK_SECRET", SECRET));
    let dropped = !(root && stderr.contains("setpriv"));
    if !prerequisite(
        dropped,
        "HOOKLEDGER_REQUIRE_SETPRIV",
        "running as root and setpriv cannot drop privileges here",
    ) {
        return;
    }
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("is read-only"), "{stderr}");
}

/// A config file that cannot work stops start-up, naming the source and the key, before
/// anything is bound or created.
#[test]
fn a_bad_config_file_stops_start_up_naming_the_source_and_the_key() {
    let dir = test_dir();
    let good = r#"
[[source]]
name = "stripe"
scheme = "stripe"
secrets = ["env:HOOKLEDGER_TEST_STRIPE"]
handlers = ["stripe-billing"]
"#;
    let env = [("HOOKLEDGER_TEST_STRIPE", SECRET)];
    for (name, text, expected) in [
        (
            "unknown key",
            format!("{good}\n[[source]]\nname = \"gh\"\nscheme = \"github\"\nsecret = [\"x\"]\n"),
            vec!["source `gh`", "unknown field `secret`, expected one of `name`", "line 11"],
        ),
        (
            "unknown key that looks like a secret",
            format!("{good}\n[[source]]\nname = \"gh\"\nscheme = \"github\"\nsecrets = [\"x\"]\nwhsec_TOPSECRET_0123 = 1\n"),
            vec!["source `gh`", "unknown field (not shown: it looks like a secret)", "line 12"],
        ),
        (
            "short github secret",
            format!("{good}\n[[source]]\nname = \"gh\"\nscheme = \"github\"\nsecrets = [\"short\"]\n"),
            vec!["source `gh`.secrets: refused: it has 5 characters; fewer than 10"],
        ),
        (
            "short stripe secret",
            good.replace("env:HOOKLEDGER_TEST_STRIPE", "whsec_short"),
            vec!["source `stripe`.secrets: refused: it has 5 characters after `whsec_`;"],
        ),
        (
            "unknown scheme",
            format!("{good}\n[[source]]\nname = \"gl\"\nscheme = \"gitlab\"\nsecrets = [\"x\"]\n"),
            vec!["source `gl`", "unknown variant `…`, expected one of `stripe`"],
        ),
        (
            "duplicate name",
            format!("{good}{}", good.replace("handlers = [\"stripe-billing\"]", "")),
            vec!["source `stripe`", "two sources have this name"],
        ),
        (
            "missing env secret",
            format!("{good}\n[[source]]\nname = \"gh\"\nscheme = \"github\"\nsecrets = [\"env:HOOKLEDGER_TEST_NOT_SET\"]\n"),
            vec!["source `gh`", "secrets", "HOOKLEDGER_TEST_NOT_SET is not set"],
        ),
        (
            "missing file secret",
            format!("{good}\n[[source]]\nname = \"gh\"\nscheme = \"github\"\nsecrets = [\"file:nope.secret\"]\n"),
            vec!["source `gh`", "secrets", "cannot read", "nope.secret"],
        ),
        (
            "hmac without hmac",
            format!("{good}\n[[source]]\nname = \"acme\"\nscheme = \"hmac\"\nsecrets = [\"acme_secret_1234\"]\nid = {{ header = \"X-Id\" }}\ntype = {{ json = \"/t\" }}\n"),
            vec!["source `acme`.hmac: missing"],
        ),
        (
            "hmac without header",
            format!("{good}\n[[source]]\nname = \"acme\"\nscheme = \"hmac\"\nsecrets = [\"acme_secret_1234\"]\nhmac = {{ algorithm = \"sha256\" }}\nid = {{ header = \"X-Id\" }}\ntype = {{ json = \"/t\" }}\n"),
            vec!["source `acme`", "missing field `header`"],
        ),
        (
            "{url} without public_url",
            format!("{good}\n[[source]]\nname = \"sq\"\nscheme = \"hmac\"\nsecrets = [\"square_secret_1\"]\nhmac = {{ header = \"X-Sig\", signed = \"{{url}}{{body}}\" }}\nid = {{ json = \"/id\" }}\ntype = {{ json = \"/t\" }}\n"),
            vec!["source `sq`.public_url: missing"],
        ),
        (
            "unknown timestamp unit",
            format!("{good}\n[[source]]\nname = \"sl\"\nscheme = \"hmac\"\nsecrets = [\"slack_secret_1\"]\nhmac = {{ header = \"X-Sig\", signed = \"v0:{{timestamp}}:{{body}}\", timestamp = {{ header = \"X-T\", unit = \"minutes\" }} }}\nid = {{ json = \"/id\" }}\ntype = {{ json = \"/t\" }}\n"),
            vec!["source `sl`.hmac.timestamp.unit: must be"],
        ),
        (
            "token without header",
            format!("{good}\n[[source]]\nname = \"gl\"\nscheme = \"token\"\nsecrets = [\"gitlab_token_1\"]\ntoken = {{}}\nid = {{ header = \"X-Id\" }}\ntype = {{ header = \"X-T\" }}\n"),
            vec!["source `gl`", "missing field `header`"],
        ),
        (
            "token without token",
            format!("{good}\n[[source]]\nname = \"gl\"\nscheme = \"token\"\nsecrets = [\"gitlab_token_1\"]\nid = {{ header = \"X-Id\" }}\ntype = {{ header = \"X-T\" }}\n"),
            vec!["source `gl`.token: missing"],
        ),
        (
            "unknown handler",
            good.replace("stripe-billing", "stripe-biling"),
            vec!["source `stripe`", "handlers", "unknown handler (built in: stripe-billing)"],
        ),
        (
            "max_body over the budget",
            format!("{good}\n[[source]]\nname = \"gh\"\nscheme = \"github\"\nsecrets = [\"github_secret_1\"]\nmax_body = 99999999999\n"),
            vec!["source `gh`.max_body: must be at least 1 and at most http.body_budget"],
        ),
        (
            "no room for the write-ahead log",
            format!("[storage]\nwal_limit_mb = 0\n{good}"),
            vec!["storage.wal_limit_mb: must be at least 1"],
        ),
        (
            "no payload budget for delivery",
            format!("[storage]\noutbox_payload_budget = 0\n{good}"),
            vec!["storage.outbox_payload_budget: must be at least 1"],
        ),
        (
            "tolerance on github",
            format!("{good}\n[[source]]\nname = \"gh\"\nscheme = \"github\"\nsecrets = [\"github_secret_1\"]\ntolerance = \"5m\"\n"),
            vec!["source `gh`.tolerance: does not apply"],
        ),
        (
            "stripe-billing on github",
            format!("{good}\n[[source]]\nname = \"gh\"\nscheme = \"github\"\nsecrets = [\"github_secret_1\"]\nhandlers = [\"stripe-billing\"]\n"),
            vec!["source `gh`.handlers: `stripe-billing` needs scheme stripe, not github"],
        ),
        (
            "billing settings the handler cannot read",
            format!("{good}\n[stripe_billing]\ncredit_per_invoice = 5\n"),
            vec!["stripe_billing: unknown field `credit_per_invoice`, expected `credits_per_invoice`"],
        ),
    ] {
        let path = write(dir.path(), "hookledger.toml", &text);
        let err = refused(&["--config", &path], &env);
        for part in expected {
            assert!(err.contains(part), "{name}: `{part}` not in: {err}");
        }
        assert!(!err.contains("TOPSECRET"), "{name}: a secret-like key shown: {err}");
    }
    // The same file, fixed, starts.
    let path = write(dir.path(), "hookledger.toml", good);
    let server = Server::start_with_env(
        dir.path(),
        &["--config", &path],
        &[("RUST_LOG", "info"), ("HOOKLEDGER_TEST_STRIPE", SECRET)],
    );
    assert_outcome(
        &server.send(&paid("evt_good_config")),
        "evt_good_config",
        "processed",
    );
}

/// Effects are checked at start-up, before anything listens: an unknown source, SQL that does
/// not compile (with the effect's index and the database's message), an unknown parameter (a
/// positional one too: effects bind by name), VACUUM, a change to hookledger's own tables, a
/// changed migration.
#[test]
fn bad_effects_and_changed_migrations_stop_start_up() {
    // SQLite's positional `?` (PostgreSQL's `?` is an operator: a syntax error there).
    let (no_such_table, question_mark, vacuum, drop) = match store() {
        Store::Sqlite => (
            "no such table: nope",
            "unknown parameter `?`",
            "VACUUM is not allowed",
            "`webhook_events` is the ledger",
        ),
        Store::Postgres => (
            r#"relation "nope" does not exist"#,
            "syntax error",
            "only INSERT, UPDATE, DELETE, MERGE",
            "only INSERT, UPDATE, DELETE, MERGE",
        ),
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("migrations")).unwrap();
    write(
        &dir.path().join("migrations"),
        "001_t.sql",
        "CREATE TABLE t (x INTEGER NOT NULL);",
    );
    let config = |effect: &str| {
        format!(
            "[schema]\nmigrations = \"migrations/\"\n\n[[source]]\nname = \"stripe\"\n\
             scheme = \"stripe\"\nsecrets = [\"env:HOOKLEDGER_TEST_STRIPE\"]\n\n{effect}"
        )
    };
    let env = [("HOOKLEDGER_TEST_STRIPE", SECRET)];
    let path = write(
        dir.path(),
        "a.toml",
        &config("[[effect]]\nsource = \"gh\"\non = \"*\"\nsql = \"INSERT INTO t VALUES (1)\"\n"),
    );
    let err = refused(&["--config", &path], &env);
    assert!(
        err.contains("effect 1.source: names no [[source]]"),
        "{err}"
    );
    // The parameters are checked with the config, before the database is created.
    for (sql, expected) in [
        (
            "INSERT INTO t VALUES (1); INSERT INTO t VALUES (:amount)",
            vec![
                "effect 1.sql: statement 2",
                "unknown parameter `:amount`",
                ":body",
            ],
        ),
        (
            "INSERT INTO t VALUES ($1)",
            vec![
                "effect 1.sql: statement 1",
                "positional parameter `$1`: name it",
            ],
        ),
    ] {
        let effect = format!("[[effect]]\nsource = \"stripe\"\non = \"*\"\nsql = \"{sql}\"\n");
        let path = write(dir.path(), "p.toml", &config(&effect));
        let err = refused(&["--config", &path], &env);
        for part in expected {
            assert!(err.contains(part), "`{part}` not in: {err}");
        }
    }
    for (effect, expected) in [
        (
            "[[effect]]\nsource = \"stripe\"\non = \"*\"\nsql = \"INSERT INTO t VALUES (1); INSERT INTO nope VALUES (1)\"\n",
            vec!["effect 1 (source `stripe`), statement 2", no_such_table],
        ),
        (
            "[[effect]]\nsource = \"stripe\"\non = \"*\"\nsql = \"INSERT INTO t VALUES (?)\"\n",
            vec![question_mark],
        ),
        (
            "[[effect]]\nsource = \"stripe\"\non = \"*\"\nsql = \"SELECT x FROM t\"\n",
            vec!["statement 1: it returns rows"],
        ),
        // It cannot run inside the event's transaction: every matching event would fail.
        (
            "[[effect]]\nsource = \"stripe\"\non = \"*\"\nsql = \"INSERT INTO t VALUES (1); VACUUM\"\n",
            vec!["effect 1 (source `stripe`), statement 2", vacuum],
        ),
        // hookledger's own tables: read, never changed (the outbox takes new rows only).
        (
            "[[effect]]\nsource = \"stripe\"\non = \"*\"\nsql = \"DELETE FROM webhook_events WHERE source = :source\"\n",
            vec!["effect 1 (source `stripe`), statement 1", "`webhook_events` is the ledger"],
        ),
        (
            "[[effect]]\nsource = \"stripe\"\non = \"*\"\nsql = \"DROP TABLE webhook_events\"\n",
            vec!["effect 1 (source `stripe`), statement 1", drop],
        ),
        (
            "[[effect]]\nsource = \"stripe\"\non = \"*\"\nsql = \"UPDATE outbox SET status = 'pending' WHERE key = :event_id\"\n",
            vec!["effect 1 (source `stripe`), statement 1", "only add rows to `outbox`"],
        ),
    ] {
        let path = write(dir.path(), "b.toml", &config(effect));
        let (err, created) = refused_at_open(&["--config", &path], &env);
        for part in expected {
            assert!(err.contains(part), "`{part}` not in: {err}");
        }
        // A new SQLite file is made only once the effects passed (checked in memory first).
        assert!(!created || store() == Store::Postgres, "created: {err}");
    }
    // A migration edited after it was applied.
    let path = write(dir.path(), "c.toml", &config(""));
    let db_dir = test_dir();
    let mut server = Server::start_with_env(
        db_dir.path(),
        &["--config", &path],
        &[("RUST_LOG", "info"), ("HOOKLEDGER_TEST_STRIPE", SECRET)],
    );
    assert_eq!(server.terminate(), Some(0));
    write(
        &dir.path().join("migrations"),
        "001_t.sql",
        "CREATE TABLE t (x INTEGER);",
    );
    let (code, err) = exit_of(
        serve_command(db_arg_in(db_dir.path()))
            .args(["--config", &path])
            .env("HOOKLEDGER_TEST_STRIPE", SECRET)
            .env_remove("STRIPE_WEBHOOK_SECRET"),
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("migration 001_t.sql changed after it was applied"),
        "{err}"
    );
}

#[test]
fn a_delivery_without_a_url_or_a_secret_stops_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let base = "[[source]]\nname = \"stripe\"\nscheme = \"stripe\"\nsecrets = [\"env:HOOKLEDGER_TEST_STRIPE\"]\n\n";
    let env = [("HOOKLEDGER_TEST_STRIPE", SECRET)];
    for (delivery, expected) in [
        (
            "[[delivery]]\nkind = \"send_receipt\"\n",
            "delivery `send_receipt`.url: missing: a delivery needs `url`, `command`, `nats`, `amqp` or \
             `redis`",
        ),
        (
            "[[delivery]]\nkind = \"send_receipt\"\nurl = \"http://127.0.0.1:9/r\"\n",
            "delivery `send_receipt`.secret: missing",
        ),
        (
            "[[delivery]]\nkind = \"send_receipt\"\nurl = \"ftp://x/r\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n",
            "delivery `send_receipt`.url: must be an http",
        ),
    ] {
        let path = write(dir.path(), "d.toml", &format!("{base}{delivery}"));
        let err = refused(&["--config", &path], &env);
        assert!(err.contains(expected), "`{expected}` not in: {err}");
    }
}

#[test]
fn a_command_delivery_that_cannot_run_stops_start_up_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let base = "[[source]]\nname = \"stripe\"\nscheme = \"stripe\"\nsecrets = [\"env:HOOKLEDGER_TEST_STRIPE\"]\n\n[[delivery]]\nkind = \"deploy\"\n";
    let env = [("HOOKLEDGER_TEST_STRIPE", SECRET)];
    let not_executable = dir.path().join("deploy.sh");
    std::fs::write(&not_executable, "#!/bin/sh\n").unwrap();
    let not_executable = format!("command = [{:?}]\n", not_executable.display().to_string());
    let not_executable_message = format!(
        "delivery `deploy`.command: `{}` does not exist or is not an executable",
        dir.path().join("deploy.sh").display()
    );
    for (delivery, expected) in [
        (not_executable.as_str(), not_executable_message.as_str()),
        (
            "command = [\"scripts/deploy.sh\"]\n",
            "delivery `deploy`.command: `scripts/deploy.sh` is a relative path: it needs `workdir`",
        ),
        (
            "command = [\"/bin/sh\"]\nconcurrency = 0\n",
            "delivery `deploy`.concurrency: must be at least 1",
        ),
        (
            "command = [\"/bin/sh\"]\nrate = \"often\"\n",
            "delivery `deploy`.rate: must be attempts per second or per minute",
        ),
        (
            "command = [\"/bin/sh\"]\nbreaker_failures = 0\n",
            "delivery `deploy`.breaker_failures: must be at least 1",
        ),
        ("command = []\n", "delivery `deploy`.command: is empty"),
        (
            "command = [\"deploy.sh\"]\n",
            "delivery `deploy`.command: `deploy.sh` is not an absolute path",
        ),
        (
            "command = [\"/bin/sh\"]\nurl = \"http://127.0.0.1:9/r\"\n",
            "delivery `deploy`.command: a delivery has one of `url`, `command`, `nats`, `amqp` and \
             `redis`; this one has `url` too",
        ),
        (
            "command = [\"/bin/sh\"]\nworkdir = \"/no/such/dir\"\n",
            "delivery `deploy`.workdir: must be an absolute path to a directory",
        ),
        (
            "command = [\"/bin/sh\"]\ntimeout = \"0s\"\n",
            "delivery `deploy`.timeout",
        ),
    ] {
        let path = write(dir.path(), "d.toml", &format!("{base}{delivery}"));
        let err = refused(&["--config", &path], &env);
        assert!(err.contains(expected), "`{expected}` not in: {err}");
    }
}

/// Admin settings that would let anyone read or change what the admin routes guard stop
/// start-up, naming the setting: a token on the command line (every user of the machine can
/// read it), one that is not there or is guessable, and a listener off loopback without one.
#[test]
fn admin_settings_that_would_expose_the_admin_routes_stop_start_up() {
    let env = [
        ("STRIPE_WEBHOOK_SECRET", SECRET),
        ("HOOKLEDGER_TEST_SHORT_TOKEN", "0123456789"),
    ];
    for (token, expected) in [
        (
            "a-literal-token-0123456789",
            "--admin-token takes env:NAME, file:PATH or credential:NAME, not the secret itself",
        ),
        (
            "env:HOOKLEDGER_TEST_UNSET_TOKEN",
            "--admin-token: environment variable HOOKLEDGER_TEST_UNSET_TOKEN is not set",
        ),
        (
            "env:HOOKLEDGER_TEST_SHORT_TOKEN",
            "--admin-token (admin_token): the token is shorter than 16 characters",
        ),
        (
            "file:/nonexistent/hookledger-token",
            "--admin-token: cannot read /nonexistent/hookledger-token",
        ),
    ] {
        let err = refused(&["--admin-token", token], &env);
        assert!(err.contains(expected), "`{expected}` not in: {err}");
        assert!(!err.contains("0123456789"), "the token is shown: {err}");
    }
    // Built here: the harness's command turns the admin listener off, and a flag given twice
    // is refused for that alone.
    let dir = test_dir();
    let (code, err) = exit_of(
        Command::new(env!("CARGO_BIN_EXE_hookledger"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args([
                "--admin-listen",
                "0.0.0.0:0",
                "--db",
                &db_arg_in(dir.path()),
            ])
            .env("STRIPE_WEBHOOK_SECRET", SECRET),
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(
            "--admin-listen (admin_listen): is not a loopback address: set an admin_token"
        ),
        "{err}"
    );
    assert!(!database_created(dir.path()));
}

/// A missing `[schema] migrations` folder stops start-up naming the key, before the database
/// is created (it was read only when applied, after the database had been made); so does a
/// migration that fails, on SQLite.
#[test]
fn a_missing_migrations_folder_stops_start_up_before_the_database_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "hookledger.toml",
        "[schema]\nmigrations = \"migrations/\"\n\n[[source]]\nname = \"stripe\"\n\
         scheme = \"stripe\"\nsecrets = [\"env:HOOKLEDGER_TEST_STRIPE\"]\n",
    );
    // `refused` checks that no database was created.
    let err = refused(&["--config", &path], &[("HOOKLEDGER_TEST_STRIPE", SECRET)]);
    assert!(
        err.contains("schema.migrations: cannot read folder")
            && err.contains(&dir.path().join("migrations").display().to_string()),
        "{err}"
    );

    // A migration that fails, on a new SQLite file: tried in memory first, so no file either.
    std::fs::create_dir(dir.path().join("migrations")).unwrap();
    write(
        &dir.path().join("migrations"),
        "001_bad.sql",
        "CREATE TABLE orders (id TEXT PRIMARY KEY);\nCREATE TABLE (",
    );
    let (err, created) =
        refused_at_open(&["--config", &path], &[("HOOKLEDGER_TEST_STRIPE", SECRET)]);
    assert!(err.contains("001_bad.sql"), "{err}");
    assert!(!created || store() == Store::Postgres, "created: {err}");
}

/// An effect that the database refuses is quoted as the app wrote it (`:body`, its own line
/// breaks), not as it was prepared (`$1`).
#[test]
fn an_effect_the_database_refuses_is_quoted_as_written() {
    let (no_table, syntax) = match store() {
        Store::Sqlite => ("no such table: nope", r#"near "WHER": syntax error"#),
        Store::Postgres => (r#"relation "nope" does not exist"#, "syntax error"),
    };
    let dir = tempfile::tempdir().unwrap();
    for (sql, why) in [
        (
            "INSERT INTO nope (x, y)\nVALUES (:body, :event_id)",
            no_table,
        ),
        ("UPDATE nope SET x = :body\nWHER y = :event_id", syntax),
    ] {
        let path = write(
            dir.path(),
            "hookledger.toml",
            &format!(
                "[[source]]\nname = \"stripe\"\nscheme = \"stripe\"\n\
                 secrets = [\"env:HOOKLEDGER_TEST_STRIPE\"]\n\n[[effect]]\n\
                 source = \"stripe\"\non = \"*\"\nsql = \"\"\"\n{sql}\n\"\"\"\n"
            ),
        );
        let (err, created) =
            refused_at_open(&["--config", &path], &[("HOOKLEDGER_TEST_STRIPE", SECRET)]);
        assert!(!created || store() == Store::Postgres, "created: {err}");
        assert!(
            err.contains("effect 1 (source `stripe`), statement 1") && err.contains(why),
            "{err}"
        );
        for line in sql.lines() {
            assert!(
                err.contains(&format!("    {line}")),
                "`{line}` not quoted: {err}"
            );
        }
        assert!(
            !err.contains("$1") && !err.contains("$2"),
            "the prepared SQL: {err}"
        );
    }
}

/// A build without the `postgres` feature (SQLite only) refuses a PostgreSQL database at
/// start-up, naming `database` and the build, before anything is bound; `migrate-to` says the
/// same. Neither shows the URL's password.
#[cfg(not(feature = "postgres"))]
#[test]
fn a_sqlite_only_build_refuses_a_postgres_database_naming_the_key() {
    let url = "postgres://hl:s3cr3t-pw@127.0.0.1:1/hl";
    let (code, err) = exit_of(
        serve_command(url)
            .env("STRIPE_WEBHOOK_SECRET", SECRET)
            .env_remove("HOOKLEDGER_FORWARD_SECRET"),
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("database"), "{err}");
    assert!(err.contains("built without PostgreSQL"), "{err}");
    assert!(!err.contains("s3cr3t"), "{err}");
    let dir = test_dir();
    let db = db_arg_in(dir.path());
    let (code, _, err) = cli(&["migrate-to", url, "--db", &db]);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("built without PostgreSQL"), "{err}");
    assert!(!err.contains("s3cr3t"), "{err}");
}

/// A route (`on`) that names no source, or a key that is not a JSON pointer, stops start-up
/// naming its key, before the database is created; an unknown key in an entry is named too.
#[test]
fn a_route_that_cannot_work_stops_start_up_naming_its_key() {
    let dir = test_dir();
    for (on, named) in [
        (
            r#"[{ source = "gitlab", types = ["push"] }]"#,
            "delivery `deploy`.on 1.source: names no [[source]]",
        ),
        (
            r#"[{ source = "gh" }, { source = "gh", key = "ref" }]"#,
            "delivery `deploy`.on 2.key: must be a JSON pointer",
        ),
        (
            r#"[{ source = "gh", when = { "ref" = "refs/heads/main" } }]"#,
            "delivery `deploy`.on 1.when.\"ref\": must be a JSON pointer",
        ),
        ("[]", "delivery `deploy`.on: is empty"),
        (r#"[{ source = "gh", branch = "main" }]"#, "branch"),
    ] {
        let config = write(
            dir.path(),
            "hookledger.toml",
            &format!(
                "[[source]]\nname = \"gh\"\nscheme = \"github\"\nsecrets = [\"s3cr3t-s3cr3t\"]\n\
                 [[delivery]]\nkind = \"deploy\"\ncommand = [\"/bin/true\"]\non = {on}\n"
            ),
        );
        let err = refused(&["--config", &config], &[]);
        assert!(err.contains(named), "{on}: {err}");
    }
}
