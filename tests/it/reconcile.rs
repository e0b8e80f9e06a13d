//! `hookledger reconcile` against a fake Stripe API (`examples/fake_stripe.rs`, run in
//! process): missed events recovered exactly once, retries, a refused key, a kill midway;
//! and `serve`'s periodic reconcile.

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::openapi::{assert_answers_fit, Answered};
use crate::util::*;

#[allow(dead_code)]
#[path = "../../examples/fake_stripe.rs"]
mod fake_stripe;

use fake_stripe::FakeStripe;

pub(crate) const API_KEY: &str = "sk_test_reconcile_0123456789";
const KEY_VAR: &str = "HOOKLEDGER_TEST_STRIPE_API_KEY";
const WAIT: Duration = Duration::from_secs(30);

/// 250 paid invoices, one event each, a minute apart from `start` (the newest first in
/// Stripe's list), credited to five accounts.
fn invoices(start: i64) -> Vec<(String, Vec<u8>)> {
    (0..250)
        .map(|i| {
            let id = format!("evt_rec_{i:03}");
            let body = hookledger::internals::invoice_event(
                &id,
                "invoice.paid",
                start + i * 60,
                &format!("in_rec_{i:03}"),
                "cus_rec",
                &format!("acct_rec_{}", i % 5),
            );
            (id, body.into_bytes())
        })
        .collect()
}

/// Each call `fake` answered is a route of Stripe's OpenAPI description, answered with a body
/// that fits it (tests/fixtures/stripe/openapi-events.json).
fn assert_fits_stripes_description(fake: &FakeStripe) {
    let answered: Vec<Answered> = fake
        .calls()
        .into_iter()
        .map(|call| {
            let (path, query) = call
                .path_and_query
                .split_once('?')
                .unwrap_or((&call.path_and_query, ""));
            Answered {
                method: call.method.clone(),
                path: path.to_owned(),
                query: query.to_owned(),
                status: call.status,
                body: serde_json::from_str(&call.body).unwrap(),
            }
        })
        .collect();
    assert_answers_fit("Stripe", "stripe/openapi-events.json", &answered);
}

/// A subscription as Stripe's API answers it (the fixture's object, whole), with this id,
/// status and metadata, of customer `cus_tie`.
fn subscription(id: &str, status: &str, metadata: Value) -> Value {
    let event: Value = serde_json::from_slice(&fixture("customer.subscription.updated")).unwrap();
    let mut object = event["data"]["object"].clone();
    object["id"] = json!(id);
    object["status"] = json!(status);
    object["customer"] = json!("cus_tie");
    object["metadata"] = metadata;
    object
}

/// 40 of the 250 never arrived as webhooks.
fn missed(i: usize) -> bool {
    i % 25 < 4
}

/// Four hours ago: all of [`invoices`] are in the last 3 days.
fn hours_ago() -> i64 {
    now() - 250 * 60
}

/// A fake API with every event of [`invoices`]`(start)`, and a server that got all but the
/// missed ones as webhooks.
fn received_all_but_40(start: i64) -> (FakeStripe, Server) {
    let fake = FakeStripe::start(API_KEY);
    let server = Server::start(&[]);
    for (i, (id, body)) in invoices(start).into_iter().enumerate() {
        fake.add_event(serde_json::from_slice(&body).unwrap());
        if !missed(i) {
            assert_outcome(&server.send(&body), &id, "processed");
        }
    }
    assert_eq!(ledger_count(&server.db()), 210);
    (fake, server)
}

fn reconcile_command(fake: &FakeStripe, db_arg: &str, extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hookledger"));
    cmd.args(["reconcile", "--source", "stripe", "--since", "3d", "--json"])
        .args([
            "--api-base",
            &fake.url(),
            "--api-key",
            &format!("env:{KEY_VAR}"),
        ])
        .args(["--db", db_arg])
        .args(extra)
        .env(KEY_VAR, API_KEY)
        .env_remove("STRIPE_API_KEY")
        .env_remove("HOOKLEDGER_CONFIG");
    cmd
}

/// Runs reconcile to the end: (exit code, stdout, stderr).
fn reconcile(fake: &FakeStripe, db_arg: &str, extra: &[&str]) -> (i32, String, String) {
    let out = reconcile_command(fake, db_arg, extra).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn counts(stdout: &str) -> (u64, u64, u64, u64) {
    let v: serde_json::Value =
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let n = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v}"));
    (n("found"), n("applied"), n("already_present"), n("failed"))
}

fn total_credits(db: &Db) -> i64 {
    db.count("SELECT CAST(COALESCE(sum(credits), 0) AS BIGINT) FROM accounts")
}

/// The tables a run leaves, without the times of day it ran at, one string per row.
fn outcome_tables(db: &Db) -> Vec<Vec<String>> {
    [
        "SELECT event_id || '|' || event_type || '|' || source || '|' || CAST(created AS TEXT)
         FROM webhook_events ORDER BY event_id",
        "SELECT stripe_invoice_id || '|' || account_id || '|' || CAST(amount_paid AS TEXT)
             || '|' || event_id
         FROM invoice_payments ORDER BY stripe_invoice_id",
        "SELECT id || '|' || CAST(credits AS TEXT) || '|'
             || COALESCE(CAST(plan_until AS TEXT), '')
         FROM accounts ORDER BY id",
    ]
    .iter()
    .map(|sql| db.strings(sql))
    .collect()
}

/// 250 events over 3 pages, 40 of them missed: exactly those 40 are applied (credits and
/// all), while the server keeps running on the database; a second run applies nothing.
#[test]
fn reconcile_applies_exactly_the_missed_events_and_a_second_run_none() {
    let (fake, server) = received_all_but_40(hours_ago());
    let db = server.db();
    assert_eq!(total_credits(&db), 210 * 100);

    let (code, out, err) = reconcile(&fake, &server.db_arg(), &["--dry-run"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(counts(&out), (250, 40, 210, 0), "dry run");
    assert_eq!(ledger_count(&db), 210, "a dry run changes nothing");

    let (code, out, err) = reconcile(&fake, &server.db_arg(), &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(counts(&out), (250, 40, 210, 0));
    assert_eq!(ledger_count(&db), 250);
    assert_eq!(total_credits(&db), 250 * 100);
    for account in 0..5 {
        assert_eq!(credits(&db, &format!("acct_rec_{account}")), 50 * 100);
    }
    // Three pages of at most 100, each after the last event of the one before.
    let lists: Vec<_> = fake
        .calls()
        .into_iter()
        .filter(|c| c.path_and_query.starts_with("/v1/events"))
        .collect();
    assert_eq!(lists.len(), 6, "{lists:?}"); // the dry run's three, then the run's
    assert!(lists[3].path_and_query.contains("limit=100"), "{lists:?}");
    assert!(
        lists[3].path_and_query.contains("created%5Bgte%5D="),
        "{lists:?}"
    );
    assert!(
        lists[4]
            .path_and_query
            .contains("starting_after=evt_rec_150"),
        "{lists:?}"
    );
    assert!(
        lists[5]
            .path_and_query
            .contains("starting_after=evt_rec_050"),
        "{lists:?}"
    );

    let (code, out, err) = reconcile(&fake, &server.db_arg(), &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(counts(&out), (250, 0, 250, 0));
    assert_eq!(total_credits(&db), 250 * 100);
    // A webhook that arrives after all is a duplicate.
    let (_, late) = &invoices(hours_ago())[0];
    assert_outcome(&server.send(late), "evt_rec_000", "duplicate");
    assert_fits_stripes_description(&fake);
}

/// Rate limited on the first two calls: retried after a pause, and the run completes.
#[test]
fn reconcile_retries_a_rate_limit() {
    let (fake, server) = received_all_but_40(hours_ago());
    fake.fail_next(429, 2);
    let (code, out, err) = reconcile(&fake, &server.db_arg(), &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(counts(&out), (250, 40, 210, 0));
    let statuses: Vec<u16> = fake.calls().iter().map(|c| c.status).collect();
    assert_eq!(statuses, [429, 429, 200, 200, 200]);
    assert!(err.contains("429"), "the retries are logged: {err}");
    assert_eq!(ledger_count(&server.db()), 250);
    assert_fits_stripes_description(&fake);
}

/// A key Stripe refuses stops the run at once with a clear message, never the key.
#[test]
fn reconcile_stops_on_a_refused_key() {
    let (fake, server) = received_all_but_40(hours_ago());
    let out = reconcile_command(&fake, &server.db_arg(), &[])
        .env(KEY_VAR, "sk_test_wrong_key_0123456789")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("Stripe refused the API key (HTTP 401"),
        "{err}"
    );
    assert!(
        !err.contains("wrong_key_0123456789"),
        "the key is shown: {err}"
    );
    assert_eq!(fake.calls().len(), 1, "not retried");
    assert_eq!(ledger_count(&server.db()), 210);
    assert_fits_stripes_description(&fake);
}

/// An API that answers the same page with `has_more: true` whatever the cursor once kept a
/// run going for ever: the run stops at the repeat with an error, and the first page's events
/// stay applied. `serve`'s periodic run stops the same way and the server goes on.
#[test]
fn reconcile_stops_when_the_api_repeats_a_page() {
    let (fake, server) = received_all_but_40(hours_ago());
    fake.repeat_page();
    let mut child = reconcile_command(&fake, &server.db_arg(), &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if wait_for(WAIT, || child.try_wait().unwrap()).is_none() {
        child.kill().unwrap();
        panic!("reconcile still runs: {} calls", fake.calls().len());
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("listed the page ending with event evt_rec_150 again"),
        "{err}"
    );
    assert_eq!(fake.calls().len(), 2, "the repeat is the second call");
    // The first page (the newest 100 events) was applied, once.
    let first_page = (150..250).filter(|i| missed(*i)).count() as i64;
    assert_eq!(ledger_count(&server.db()), 210 + first_page);

    let periodic = serve_with_api(&fake, "reconcile = { every = \"1h\", since = \"1d\" }\n");
    wait_for(WAIT, || {
        periodic
            .log()
            .contains("again (the cursor did not advance")
            .then_some(())
    })
    .unwrap_or_else(|| panic!("the periodic run did not stop: {}", periodic.log()));
    // A fresh ledger: the whole first page was applied.
    assert_eq!(ledger_count(&periodic.db()), 100);
    let (_, late) = &invoices(hours_ago())[0];
    assert_outcome(&periodic.send(late), "evt_rec_000", "processed");
}

/// Killed while it waits for the second page (after the first page's events committed), then
/// run again: the same tables as one clean run on the same start.
#[test]
fn reconcile_killed_midway_and_rerun_ends_as_one_clean_run() {
    let start = hours_ago();
    let (clean_fake, clean) = received_all_but_40(start);
    let (code, _, err) = reconcile(&clean_fake, &clean.db_arg(), &[]);
    assert_eq!(code, 0, "{err}");

    let (fake, server) = received_all_but_40(start);
    let db = server.db();
    fake.delay_call(2, Duration::from_secs(60));
    let mut child = reconcile_command(&fake, &server.db_arg(), &[])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The first page holds the newest 100 events, 16 of them missed.
    let first_page = (150..250).filter(|i| missed(*i)).count() as i64;
    wait_for(WAIT, || {
        (ledger_count(&db) == 210 + first_page).then_some(())
    })
    .unwrap_or_else(|| panic!("page 1 not applied: {}", ledger_count(&db)));
    wait_for(WAIT, || (fake.calls().len() >= 2).then_some(())).expect("page 2 asked for");
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(ledger_count(&db), 210 + first_page);

    let (code, out, err) = reconcile(&fake, &server.db_arg(), &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        counts(&out),
        (250, 40 - first_page as u64, 210 + first_page as u64, 0)
    );
    assert_eq!(outcome_tables(&db), outcome_tables(&clean.db()));
}

/// `reconcile = { every, since }` on the source: `serve` recovers missed events by itself,
/// through its writer: once at start-up (with `every = "1h"` nothing else could have run),
/// then every `every` (an event added later is picked up).
#[test]
fn serve_reconciles_at_start_up_and_then_periodically() {
    let fake = FakeStripe::start(API_KEY);
    let events = invoices(hours_ago());
    for (_, body) in events.iter().take(5) {
        fake.add_event(serde_json::from_slice(body).unwrap());
    }
    let hourly = serve_with_api(&fake, "reconcile = { every = \"1h\", since = \"1d\" }\n");
    let db = hourly.db();
    wait_for(WAIT, || (ledger_count(&db) == 5).then_some(()))
        .unwrap_or_else(|| panic!("not reconciled at start-up: {}", hourly.log()));
    assert_eq!(total_credits(&db), 5 * 100);
    assert!(
        hourly
            .log()
            .contains("reconcile stripe: found 5, applied 5"),
        "{}",
        hourly.log()
    );

    let server = serve_with_api(&fake, "reconcile = { every = \"1s\", since = \"1d\" }\n");
    let db = server.db();
    wait_for(WAIT, || (ledger_count(&db) == 5).then_some(())).expect("first run");
    fake.add_event(serde_json::from_slice(&events[5].1).unwrap());
    wait_for(WAIT, || (ledger_count(&db) == 6).then_some(()))
        .unwrap_or_else(|| panic!("a later event not reconciled: {}", server.log()));
    assert_eq!(total_credits(&db), 6 * 100);
}

/// A config whose `stripe` source uses the fake API for reconcile and refreshes.
fn api_config(dir: &std::path::Path, fake: &FakeStripe, extra: &str) -> std::path::PathBuf {
    let config = dir.join("hookledger.toml");
    std::fs::write(
        &config,
        format!(
            "[[source]]\nname = \"stripe\"\nscheme = \"stripe\"\n\
             secrets = [\"env:STRIPE_WEBHOOK_SECRET\"]\nhandlers = [\"stripe-billing\"]\n\
             api_key = \"env:{KEY_VAR}\"\napi_base = \"{}\"\n{extra}",
            fake.url()
        ),
    )
    .unwrap();
    config
}

/// `serve` with the config of [`api_config`].
fn serve_with_api(fake: &FakeStripe, extra: &str) -> Server {
    let dir = test_dir();
    let config = api_config(dir.path(), fake, extra);
    let mut server = Server::start_with_env(
        dir.path(),
        &["--config", config.to_str().unwrap()],
        &[
            (KEY_VAR, API_KEY),
            ("STRIPE_WEBHOOK_SECRET", SECRET),
            ("RUST_LOG", "info"),
        ],
    );
    server.keep(dir);
    server
}

fn subscription_update(id: &str, created: i64, subscription: &str, status: &str) -> Vec<u8> {
    hookledger::internals::subscription_event(
        id,
        "customer.subscription.updated",
        created,
        subscription,
        "cus_tie",
        "acct_tie",
        status,
    )
    .into_bytes()
}

/// Two `customer.subscription.updated` of one subscription in the same second, one active
/// and one canceled: in either order the stored status ends as Stripe's API reports it (the
/// second event's here, where the tie rule alone keeps the first's).
#[test]
fn a_tie_ends_with_the_status_stripes_api_reports_in_either_order() {
    for (first, second) in [("active", "canceled"), ("canceled", "active")] {
        let fake = FakeStripe::start(API_KEY);
        fake.set_subscription(subscription(
            "sub_tie",
            second,
            json!({ "account_id": "acct_tie" }),
        ));
        let server = serve_with_api(&fake, "");
        let db = server.db();
        let t = now() - 30;
        let one = subscription_update("evt_tie_1", t, "sub_tie", first);
        assert_outcome(&server.send(&one), "evt_tie_1", "processed");
        assert_eq!(subscription_status(&db, "sub_tie").as_deref(), Some(first));
        let two = subscription_update("evt_tie_2", t, "sub_tie", second);
        assert_outcome(&server.send(&two), "evt_tie_2", "processed");
        wait_for(WAIT, || {
            (subscription_status(&db, "sub_tie").as_deref() == Some(second)).then_some(())
        })
        .unwrap_or_else(|| {
            panic!(
                "{first} then {second}: {:?}\n{}",
                subscription_status(&db, "sub_tie"),
                server.log()
            )
        });
        let fetches: Vec<_> = fake
            .calls()
            .into_iter()
            .filter(|c| c.path_and_query == "/v1/subscriptions/sub_tie")
            .collect();
        assert_eq!(fetches.len(), 1, "one fetch, for the tie: {fetches:?}");
        assert_eq!(
            db.count("SELECT value FROM counters WHERE name = 'subscription_ties'"),
            1
        );
        let (status, attempts, _): (String, i64, Option<String>) = db.one(
            "SELECT status, attempts, last_error FROM outbox WHERE kind = 'stripe_refresh'",
            &[],
        );
        assert_eq!((status.as_str(), attempts), ("done", 1));
        // A later event still wins over the fetched state.
        let three = subscription_update("evt_tie_3", now() + 5, "sub_tie", "past_due");
        assert_outcome(&server.send(&three), "evt_tie_3", "processed");
        assert_eq!(
            subscription_status(&db, "sub_tie").as_deref(),
            Some("past_due")
        );
        assert_fits_stripes_description(&fake);
    }
}

/// Without a tie nothing is fetched; with `refresh = "always"` every subscription event is.
#[test]
fn refresh_always_fetches_after_every_subscription_event() {
    let fake = FakeStripe::start(API_KEY);
    fake.set_subscription(subscription("sub_always", "unpaid", json!({})));
    let quiet = serve_with_api(&fake, "");
    let body = subscription_update("evt_once", now() - 30, "sub_always", "active");
    assert_outcome(&quiet.send(&body), "evt_once", "processed");
    // The row would have been queued in the event's transaction.
    let refreshes = "SELECT count(*) FROM outbox WHERE kind = 'stripe_refresh'";
    assert_eq!(quiet.db().count(refreshes), 0);
    assert!(fake.calls().is_empty(), "{:?}", fake.calls());
    assert_eq!(
        subscription_status(&quiet.db(), "sub_always").as_deref(),
        Some("active")
    );

    let server = serve_with_api(&fake, "refresh = \"always\"\n");
    let db = server.db();
    assert_outcome(&server.send(&body), "evt_once", "processed");
    wait_for(WAIT, || {
        (subscription_status(&db, "sub_always").as_deref() == Some("unpaid")).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "{:?}\n{}",
            subscription_status(&db, "sub_always"),
            server.log()
        )
    });
    assert_eq!(fake.calls().len(), 1);
    assert_eq!(db.count(refreshes), 1);
    assert_fits_stripes_description(&fake);
}

/// With `--forward` (as `serve --forward-to` does), each applied event is queued for the app
/// in its claim's transaction: one forward row per ledger row, the recovered ones included.
#[test]
fn reconcile_with_forward_queues_each_applied_event_for_the_app() {
    let fake = FakeStripe::start(API_KEY);
    let (_, args) = down_app();
    let server = Server::start(&strs(&args));
    for (i, (id, body)) in invoices(hours_ago()).into_iter().take(10).enumerate() {
        fake.add_event(serde_json::from_slice(&body).unwrap());
        if i % 2 == 0 {
            assert_outcome(&server.send(&body), &id, "processed");
        }
    }
    let (code, out, err) = reconcile(&fake, &server.db_arg(), &["--forward"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(counts(&out), (10, 5, 5, 0));
    let db = server.db();
    assert_eq!(ledger_count(&db), 10);
    assert_one_outbox_row_per_claim(&db);
}

/// The quick start without a config file: `--stripe-api-key` and `--stripe-api-base` give the
/// `stripe` source its API, and a tie settles on Stripe's answer.
#[test]
fn the_serve_flags_alone_give_the_stripe_source_its_api() {
    let fake = FakeStripe::start(API_KEY);
    // A terse answer: no customer, no metadata.
    fake.set_subscription(json!({ "id": "sub_flags", "status": "canceled" }));
    let dir = test_dir();
    let key = format!("env:{KEY_VAR}");
    let mut server = Server::start_with_env(
        dir.path(),
        &["--stripe-api-key", &key, "--stripe-api-base", &fake.url()],
        &[(KEY_VAR, API_KEY), ("RUST_LOG", "info")],
    );
    server.keep(dir);
    let db = server.db();
    let t = now() - 30;
    for (id, status) in [("evt_flag_1", "active"), ("evt_flag_2", "canceled")] {
        let body = subscription_update(id, t, "sub_flags", status);
        assert_outcome(&server.send(&body), id, "processed");
    }
    wait_for(WAIT, || {
        (subscription_status(&db, "sub_flags").as_deref() == Some("canceled")).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "{:?}\n{}",
            subscription_status(&db, "sub_flags"),
            server.log()
        )
    });
}
