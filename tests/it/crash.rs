//! SIGKILL while events stream in: every event that got a 200 survives the restart.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use hookledger::client::Client;
use hookledger::sample::invoice_event;

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
    let missing: Vec<&String> = acked
        .iter()
        .filter(|id| {
            count(
                &db,
                &format!("SELECT count(*) FROM webhook_events WHERE event_id = '{id}'"),
            ) != 1
        })
        .collect();
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
