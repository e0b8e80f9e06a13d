//! SIGKILL while events stream in: every event that got a 200 survives the restart.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use hookledger::internals::invoice_event;
use hookledger::internals::Client;

use crate::util::*;

#[test]
fn sigkill_during_a_stream_loses_no_acknowledged_event() {
    let mut server = Server::start(&[]);
    let url = server.url();
    let acked = Mutex::new(Vec::new());
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for worker in 0..4 {
            let (url, acked, stop) = (&url, &acked, &stop);
            s.spawn(move || {
                let client = Client::new(Duration::from_secs(5));
                for i in 0.. {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let id = format!("evt_k{worker}_{i}");
                    let body = invoice_event(
                        &id,
                        "invoice.paid",
                        now(),
                        &format!("in_k{worker}_{i}"),
                        "cus_k",
                        "acct_k",
                    );
                    match client.send(url, body.as_bytes(), &secret(), now()) {
                        Ok(reply) if reply.status == 200 => acked.lock().unwrap().push(id),
                        Ok(reply) => panic!("unexpected answer {}: {}", reply.status, reply.body),
                        Err(_) => break, // the server is gone
                    }
                }
            });
        }
        // Kill once a good number of events has been acknowledged.
        wait_for(Duration::from_secs(30), || {
            (acked.lock().unwrap().len() >= 200).then_some(())
        })
        .expect("events were not acknowledged");
        server.kill();
        stop.store(true, Ordering::Relaxed);
    });
    let acked = acked.into_inner().unwrap();

    let restarted = Server::start_in(&server.dir, &[]);
    let db = restarted.db();
    let missing = missing_from_ledger(&db, &acked);
    assert!(
        missing.is_empty(),
        "{} acknowledged events lost: {missing:?}",
        missing.len()
    );
    // Effects committed with their claims: one grant per ledger row, no more, no less.
    let rows = ledger_count(&db);
    assert!(rows as usize >= acked.len());
    assert_eq!(count(&db, "SELECT count(*) FROM invoice_payments"), rows);
    assert_eq!(credits(&db, "acct_k"), 100 * rows);
    let check: String = db
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
}

/// Rounds of SIGKILL at random moments while senders resend events, with forwarding on.
/// `HOOKLEDGER_CHAOS_ROUNDS` raises the number of rounds (default 5).
#[test]
fn chaos_sigkill_rounds_lose_nothing_and_deliver_everything() {
    let rounds: usize = std::env::var("HOOKLEDGER_CHAOS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let app = FakeApp::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let url = app.url();
    let schedule = vec!["1s"; 60].join(",");
    let args = [
        "--forward-to",
        url.as_str(),
        "--forward-secret",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "--forward-schedule",
        schedule.as_str(),
    ];
    // Two events per invoice (paid and payment_succeeded); senders pick at random, so exact
    // resends and second reports of an invoice both happen.
    let pool: Vec<(String, Vec<u8>)> = (0..20_000)
        .map(|i| {
            let id = format!("evt_c{i}");
            let kind = if i % 2 == 0 {
                "invoice.paid"
            } else {
                "invoice.payment_succeeded"
            };
            let body = invoice_event(
                &id,
                kind,
                now(),
                &format!("in_c{}", i / 2),
                "cus_c",
                "acct_c",
            );
            (id, body.into_bytes())
        })
        .collect();
    let acked = Mutex::new(std::collections::HashSet::new());
    let mut sent_total = 0usize;
    for round in 0..rounds {
        let mut server = Server::start_in(dir.path(), &args);
        let url = server.url();
        let stop = AtomicBool::new(false);
        let sent = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for worker in 0..4u64 {
                let (url, acked, stop, pool, sent) = (&url, &acked, &stop, &pool, &sent);
                s.spawn(move || {
                    let client = Client::new(Duration::from_secs(5));
                    let mut rng = fastrand::Rng::with_seed(round as u64 * 10 + worker);
                    while !stop.load(Ordering::Relaxed) {
                        let (id, body) = &pool[rng.usize(..pool.len())];
                        sent.fetch_add(1, Ordering::Relaxed);
                        match client.send(url, body, &secret(), now()) {
                            Ok(r) if r.status == 200 => {
                                acked.lock().unwrap().insert(id.clone());
                            }
                            Ok(r) => assert_eq!(r.status, 503, "{}", r.body),
                            Err(_) => break,
                        }
                    }
                });
            }
            std::thread::sleep(Duration::from_millis(fastrand::u64(150..700)));
            server.kill();
            stop.store(true, Ordering::Relaxed);
        });
        sent_total += sent.into_inner();
    }
    let acked = acked.into_inner().unwrap();

    let server = Server::start_in(dir.path(), &args);
    let db = server.db();
    let lost = missing_from_ledger(&db, &acked);
    eprintln!(
        "chaos: {rounds} kill rounds, {sent_total} requests, {} distinct events acknowledged, {} lost",
        acked.len(),
        lost.len()
    );
    assert!(lost.is_empty(), "acknowledged events lost: {lost:?}");
    let invoices = count(&db, "SELECT count(*) FROM invoice_payments");
    assert_eq!(
        credits(&db, "acct_c"),
        100 * invoices,
        "100 credits per distinct paid invoice"
    );
    let acked_invoices: std::collections::HashSet<usize> = acked
        .iter()
        .map(|id| id.trim_start_matches("evt_c").parse::<usize>().unwrap() / 2)
        .collect();
    assert!(invoices as usize >= acked_invoices.len());
    assert_eq!(
        count(&db, "SELECT count(*) FROM webhook_events e LEFT JOIN outbox o ON o.key = e.event_id WHERE o.id IS NULL"),
        0,
        "every processed event has its outbox row"
    );
    let rows = ledger_count(&db) as usize;
    wait_for(Duration::from_secs(60), || {
        (count(&db, "SELECT count(*) FROM outbox WHERE status = 'done'") as usize == rows)
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
    let check: String = db
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
}
