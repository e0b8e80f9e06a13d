//! SIGKILL while events stream in: every event that got a 200 survives the restart.

use std::time::Duration;

use crate::util::*;

#[test]
fn sigkill_during_a_stream_loses_no_acknowledged_event() {
    // Forwarding to an app that is down: each claim's outbox row is the effect to check.
    let (_, args) = down_app();
    let args = strs(&args);
    let mut server = Server::start(&args);
    let url = server.url();
    let streamed = stream_until(&url, 4, paid_numbered("evt_k"), &[], |acked| {
        wait_for(Duration::from_secs(30), || (acked() >= 200).then_some(()))
            .expect("events were not acknowledged");
        server.kill();
    });

    let restarted = Server::start_in(&server.dir, &args);
    let db = restarted.db();
    let missing = missing_from_ledger(&db, &streamed.acked);
    assert!(
        missing.is_empty(),
        "{} acknowledged events lost: {missing:?}",
        missing.len()
    );
    assert!(ledger_count(&db) as usize >= streamed.acked.len());
    // Effects committed with their claims: one outbox row per ledger row, no more, no less.
    assert_one_outbox_row_per_claim(&db);
    assert_file_intact(&db);
    assert_ledger_checks(&restarted.db_arg());
}

/// Rounds of SIGKILL at random moments while senders resend events, with forwarding on.
/// `HOOKLEDGER_CHAOS_ROUNDS` raises the number of rounds (default 5).
#[test]
fn chaos_sigkill_rounds_lose_nothing_and_deliver_everything() {
    if skipped_through_pooler("the killed server's rows wait for their lease") {
        return;
    }
    let rounds: usize = std::env::var("HOOKLEDGER_CHAOS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let app = FakeApp::start(&[]);
    let dir = test_dir();
    let url = app.url();
    let schedule = vec!["1s"; 60].join(",");
    let args = [
        "--forward-to",
        url.as_str(),
        "--forward-secret",
        FORWARD_SECRET,
        "--forward-schedule",
        schedule.as_str(),
    ];
    // Senders pick at random from the pool, so exact resends happen, also across kills.
    let pool: Vec<(String, Vec<u8>)> = (0..20_000)
        .map(|i| (format!("evt_c{i}"), paid(&format!("evt_c{i}"))))
        .collect();
    let mut acked = std::collections::HashSet::new();
    let mut sent_total = 0usize;
    for round in 0..rounds as u64 {
        let mut server = Server::start_in(dir.path(), &args);
        let url = server.url();
        let streamed = stream_until(
            &url,
            4,
            |worker, i| {
                let mut rng = fastrand::Rng::with_seed((round * 10 + worker) << 32 | i as u64);
                pool[rng.usize(..pool.len())].clone()
            },
            &[503],
            |_| {
                std::thread::sleep(Duration::from_millis(fastrand::u64(150..700)));
                server.kill();
            },
        );
        acked.extend(streamed.acked);
        sent_total += streamed.sent;
    }

    let server = Server::start_in(dir.path(), &args);
    let db = server.db();
    let lost = missing_from_ledger(&db, &acked);
    eprintln!(
        "chaos: {rounds} kill rounds, {sent_total} requests, {} distinct events acknowledged, {} lost",
        acked.len(),
        lost.len()
    );
    assert!(lost.is_empty(), "acknowledged events lost: {lost:?}");
    assert_one_outbox_row_per_claim(&db);
    let rows = ledger_count(&db) as usize;
    wait_for(Duration::from_secs(60), || {
        (db.count("SELECT count(*) FROM outbox WHERE status = 'done'") as usize == rows)
            .then_some(())
    })
    .expect("not every outbox row was delivered");
    let delivered: std::collections::HashSet<String> = app
        .deliveries()
        .into_iter()
        .filter(|d| d.status == 200)
        .map(|d| d.headers["webhook-id"].clone())
        .collect();
    for id in &acked {
        assert!(
            delivered.contains(id),
            "{id} acknowledged but never delivered"
        );
    }
    assert_file_intact(&db);
    assert_ledger_checks(&server.db_arg());
}
