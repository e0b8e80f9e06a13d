//! `examples/embed.rs`, run as a user would: an axum app with its own routes, hookledger's
//! routes merged in, and a Rust handler writing the app's table inside the claim's transaction.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::util::*;

#[test]
fn the_embedding_example_serves_its_routes_and_hookledger_s_with_its_handler() {
    if skipped_on_postgres("the example keeps its own table in a SQLite file, through rusqlite") {
        return;
    }
    if !cfg!(feature = "postgres") {
        // The examples' package depends on hookledger with its default features.
        eprintln!("skipped: a SQLite-only build's run does not build the examples");
        return;
    }
    // `cargo test` builds the examples next to the binary.
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_hookledger"))
        .parent()
        .unwrap()
        .join("examples/embed");
    assert!(
        exe.exists(),
        "{} was not built: `cargo test` (without --test) builds the examples",
        exe.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("embed.db");
    let mut child = Command::new(&exe)
        .arg(&db)
        .arg("127.0.0.1:0")
        .env("STRIPE_WEBHOOK_SECRET", SECRET)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("embed listening on ")
        .unwrap()
        .to_string();
    let client = hookledger::internals::Client::new(Duration::from_secs(10));
    let url = format!("http://{addr}/webhooks/stripe");

    for _ in 0..2 {
        let reply = client
            .send(&url, &paid("evt_embed"), &secret(), now())
            .unwrap();
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    let other =
        br#"{"id":"evt_embed_2","type":"customer.created","created":1,"data":{"object":{}}}"#;
    assert_eq!(
        client.send(&url, other, &secret(), now()).unwrap().status,
        200
    );

    let get = |path: &str| {
        ureq::get(&format!("http://{addr}{path}"))
            .call()
            .unwrap()
            .into_string()
            .unwrap()
    };
    assert_eq!(get("/"), "the app's own page\n");
    assert_eq!(
        get("/events-by-type"),
        "customer.created 1\ninvoice.paid 1\n"
    );

    Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    let status = wait_for(Duration::from_secs(30), || child.try_wait().unwrap())
        .expect("the example did not stop on SIGTERM");
    assert_eq!(status.code(), Some(0));
    let conn = Db::open(db.to_str().unwrap());
    assert_eq!(
        ledger_count(&conn),
        2,
        "the duplicate was not claimed twice"
    );
    assert_eq!(
        credits(&conn, "acct_1"),
        100,
        "SourceConfig::stripe keeps stripe-billing: it ran once too, before the app's handler"
    );
}
