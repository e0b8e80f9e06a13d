//! `serve` reads its config again on SIGHUP: a source added and one removed, a secret rotated,
//! under a steady load that sees no failed request, in the same process; a bad file refused
//! with its key named while the running config serves on; a change only a start reads made by
//! a restart in place; a SIGHUP during a reload that is still reading the file.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hookledger::internals::{stripe, Reply};
use hookledger::Secret;
use sha2::Digest;

use crate::restarts::{assert_nothing_refused_or_lost, finished, load, STARTING};
use crate::util::*;

/// The secret a rotation moves to.
const ROTATED: &str = "whsec_rotated_0123456789abcdef";
const GITHUB: &str = "gh-reload-secret-0123456789";

/// The Stripe source with `secrets` (`env:`, `file:`).
fn stripe_source(secrets: &[&str]) -> String {
    let secrets: Vec<String> = secrets.iter().map(|s| format!("{s:?}")).collect();
    format!(
        "[[source]]\nname = \"stripe\"\nscheme = \"stripe\"\nsecrets = [{}]\n",
        secrets.join(", ")
    )
}

fn github_source(dir: &Path) -> String {
    let file = dir.join("gh.secret");
    std::fs::write(&file, GITHUB).unwrap();
    format!(
        "[[source]]\nname = \"gh\"\nscheme = \"github\"\nsecrets = [\"file:{}\"]\n",
        file.display()
    )
}

fn rotated_file(dir: &Path) -> String {
    let file = dir.join("rotated.secret");
    std::fs::write(&file, ROTATED).unwrap();
    format!("file:{}", file.display())
}

/// Writes `text` as the config and sends SIGHUP; returns once the log has `want` one more
/// time than before.
fn reload(server: &Server, config: &Path, text: &str, want: &str) {
    std::fs::write(config, text).unwrap();
    let before = server.log().matches(want).count();
    hup(server);
    wait_for(Duration::from_secs(20), || {
        (server.log().matches(want).count() > before).then_some(())
    })
    .unwrap_or_else(|| panic!("no {want:?} after SIGHUP: {}", server.log()));
}

fn hup(server: &Server) {
    std::process::Command::new("kill")
        .args(["-HUP", &server.pid().to_string()])
        .status()
        .unwrap();
}

fn github_push(server: &Server, delivery: &str) -> u16 {
    let body = br#"{"ref":"refs/heads/main"}"#;
    let mut mac =
        <hmac::Hmac<sha2::Sha256> as hmac::Mac>::new_from_slice(GITHUB.as_bytes()).unwrap();
    hmac::Mac::update(&mut mac, body);
    let signature = format!(
        "sha256={}",
        hex::encode(hmac::Mac::finalize(mac).into_bytes())
    );
    let headers = [
        ("X-Hub-Signature-256", signature.as_str()),
        ("X-GitHub-Delivery", delivery),
        ("X-GitHub-Event", "push"),
    ];
    server.post("/webhooks/gh", body, &headers).status
}

fn stripe_signed_with(server: &Server, secret: &str, id: &str) -> Reply {
    let body = paid(id);
    let header = stripe::sign(&Secret::new(secret), now(), &body);
    server.post(
        "/webhooks/stripe",
        &body,
        &[
            ("Content-Type", "application/json"),
            ("Stripe-Signature", &header),
        ],
    )
}

fn start(dir: &Path, config: &Path, text: &str) -> Server {
    std::fs::write(config, text).unwrap();
    Server::start_in(dir, &["--config", config.to_str().unwrap()])
}

#[test]
fn sighup_adds_a_source_rotates_a_secret_and_removes_a_source_in_the_same_process_failing_no_request(
) {
    let dir = test_dir();
    let config = dir.path().join("hookledger.toml");
    let mut server = start(
        dir.path(),
        &config,
        &stripe_source(&["env:STRIPE_WEBHOOK_SECRET"]),
    );
    let pid = server.pid();
    assert_eq!(github_push(&server, "gh-before"), 404, "no gh source yet");

    // Under load (new connections, the old secret), the rotation's first half and a new
    // source: both secrets verify.
    let stop = Arc::new(AtomicBool::new(false));
    let seen = load(server.addr, 200, "hup", stop.clone());
    std::thread::sleep(Duration::from_millis(1500));
    let rotated = rotated_file(dir.path());
    let both = stripe_source(&["env:STRIPE_WEBHOOK_SECRET", &rotated]) + &github_source(dir.path());
    reload(&server, &config, &both, "reload: sources swapped");
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::SeqCst);
    let seen = finished(&seen);
    assert_nothing_refused_or_lost(&seen, &server.db(), 0);
    assert!(
        server
            .log()
            .contains("added: [gh], removed: [], changed: [stripe]"),
        "{}",
        server.log()
    );

    assert_eq!(github_push(&server, "gh-1"), 200, "{}", server.log());
    assert_outcome(
        &stripe_signed_with(&server, ROTATED, "evt_rotated"),
        "evt_rotated",
        "processed",
    );
    assert_outcome(&server.send(&paid("evt_old")), "evt_old", "processed");
    let db = server.db();
    assert_eq!(
        db.strings("SELECT source FROM webhook_events WHERE event_id = 'gh-1'"),
        ["gh"]
    );

    // The rotation's second half, and the new source removed again: the old secret is refused
    // (nothing claimed), the rotated one verifies; a resend is a duplicate across the swaps.
    let only_rotated = stripe_source(&[&rotated]);
    reload(&server, &config, &only_rotated, "reload: sources swapped");
    assert_error(
        &server.send(&paid("evt_old_after")),
        400,
        "invalid_signature",
    );
    assert_outcome(
        &stripe_signed_with(&server, ROTATED, "evt_rotated"),
        "evt_rotated",
        "duplicate",
    );
    assert_eq!(github_push(&server, "gh-2"), 404);
    assert_eq!(
        db.strings(
            "SELECT event_id FROM webhook_events WHERE event_id IN ('evt_old_after', 'gh-2')"
        ),
        Vec::<String>::new()
    );

    // One process all along, which started once; /status names the file now serving.
    assert_eq!(server.pid(), pid);
    assert!(server.alive());
    assert_eq!(server.log().matches(STARTING).count(), 1);
    let sha256 = hex::encode(sha2::Sha256::digest(only_rotated.as_bytes()));
    let (status, page) = server.admin_get("/status");
    assert_eq!(status, 200);
    assert!(page.contains(&sha256), "no {sha256} on /status: {page}");
    assert!(
        !server.log().contains(ROTATED) && !server.log().contains(GITHUB),
        "a secret in the log"
    );
    assert_eq!(server.terminate(), Some(0));
}

#[test]
fn a_bad_file_on_sighup_is_refused_naming_the_key_and_the_running_config_serves_on() {
    let dir = test_dir();
    let config = dir.path().join("hookledger.toml");
    // Where it listens and its database from the file alone, so that a change to them is
    // the file's (a flag would win over it).
    let db = format!("database = {:?}", db_arg_in(dir.path()));
    let top = format!("listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n{db}\n");
    let good = top.clone() + &stripe_source(&["env:STRIPE_WEBHOOK_SECRET"]);
    std::fs::write(&config, &good).unwrap();
    let mut server = Server::start_from_file(dir.path(), &config);
    let pid = server.pid();
    let unknown_key = good.replace("secrets =", "secretz =");
    let other = dir.path().join("other.db").display().to_string();
    let other_db = good.replace(&db, &format!("database = {other:?}"));
    let other_port = good.replacen("listen = \"127.0.0.1:0\"", "listen = \"127.0.0.1:1\"", 1);
    let missing_secret = top + &stripe_source(&["file:/nonexistent/stripe.secret"]);
    for (text, named) in [
        (unknown_key.as_str(), "secretz"),
        (other_db.as_str(), "database"),
        (other_port.as_str(), "listen"),
        (missing_secret.as_str(), "/nonexistent/stripe.secret"),
        ("not toml [", "config file"),
    ] {
        reload(&server, &config, text, "reload refused");
        let log = server.log();
        let line = log.lines().rfind(|l| l.contains("reload refused")).unwrap();
        assert!(line.contains(named), "{named:?} not named: {line}");
        assert!(line.contains("the running config keeps serving"), "{line}");
        let id = format!("evt_after_{named}");
        assert_outcome(&server.send(&paid(&id)), &id, "processed");
    }
    assert!(!dir.path().join("other.db").exists());
    let (_, metrics) = server.admin_get("/metrics");
    assert!(
        metrics.contains("hookledger_config_reloads_refused_total 5"),
        "{metrics}"
    );
    assert_eq!(ledger_count(&server.db()), 5);

    // A change only a start reads (here the retention) is a restart in place: the same
    // process, started twice, on the same sockets.
    let longer = format!("{good}\n[retention]\nclaim_days = 90\n");
    reload(&server, &config, &longer, STARTING);
    assert!(
        server.log().contains("reload: retention changed"),
        "{}",
        server.log()
    );
    assert_eq!(server.pid(), pid);
    assert_outcome(
        &server.send(&paid("evt_restarted")),
        "evt_restarted",
        "processed",
    );
    assert_outcome(
        &server.send(&paid("evt_after_secretz")),
        "evt_after_secretz",
        "duplicate",
    );
    assert_eq!(server.terminate(), Some(0));
}

/// A SIGHUP while a reload still reads the file (a secret `file:` that is a FIFO nobody has
/// written yet) is not lost: the reload runs again after it. Meanwhile events are served.
#[test]
fn a_sighup_during_a_reload_runs_it_again_after_it_and_events_are_served_meanwhile() {
    let dir = test_dir();
    let config = dir.path().join("hookledger.toml");
    let good = stripe_source(&["env:STRIPE_WEBHOOK_SECRET"]);
    let server = start(dir.path(), &config, &good);
    let fifo = dir.path().join("secret.fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let waiting = stripe_source(&[
        "env:STRIPE_WEBHOOK_SECRET",
        &format!("file:{}", fifo.display()),
    ]);
    reload(
        &server,
        &config,
        &waiting,
        "SIGHUP: reading the config again",
    );
    hup(&server);
    wait_for(Duration::from_secs(10), || {
        server
            .log()
            .contains("a reload is running; it runs again once this one ends")
            .then_some(())
    })
    .unwrap_or_else(|| panic!("the second SIGHUP was not held: {}", server.log()));
    assert_outcome(
        &server.send(&paid("evt_meanwhile")),
        "evt_meanwhile",
        "processed",
    );
    // Each read of the file opens the FIFO once: the first reload, then the one it owed. A
    // write blocks until the FIFO is opened (a thread of its own), and the second waits for
    // the second read, so that it cannot reach the first reader, still open.
    let feed = |fifo: &Path| {
        let fifo = fifo.to_path_buf();
        std::thread::spawn(move || std::fs::write(fifo, ROTATED).unwrap());
    };
    feed(&fifo);
    wait_for(Duration::from_secs(20), || {
        (server
            .log()
            .matches("SIGHUP: reading the config again")
            .count()
            == 2)
            .then_some(())
    })
    .unwrap_or_else(|| panic!("the owed reload did not start: {}", server.log()));
    assert!(server.log().contains("reload: sources swapped"));
    feed(&fifo);
    wait_for(Duration::from_secs(20), || {
        server
            .log()
            .contains("reload: the config is unchanged")
            .then_some(())
    })
    .unwrap_or_else(|| panic!("the owed reload did not end: {}", server.log()));
    assert_outcome(
        &stripe_signed_with(&server, ROTATED, "evt_fifo"),
        "evt_fifo",
        "processed",
    );
}
