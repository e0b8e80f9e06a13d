//! Hostile HTTP: oversized declarations, huge headers, slow senders, connection floods. Each
//! test checks the server stays alive and keeps serving normal events (liveness, with
//! generous bounds; the latencies under attack are measured by `hookledger-bench run --hostile`,
//! not asserted here).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::util::*;

#[test]
fn huge_content_length_is_413_without_reading_and_the_process_lives() {
    let server = Server::start(&[]);
    let mut stream = TcpStream::connect(server.addr).unwrap();
    stream
        .write_all(
            b"POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000000\r\n\r\nabc",
        )
        .unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut answer = vec![0; 1024];
    let n = stream.read(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
    assert_outcome(&server.send(&paid("evt_alive")), "evt_alive", "processed");
}

#[test]
fn header_block_over_16_kib_is_431() {
    let server = Server::start(&[]);
    let big = format!(
        "POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nX-Junk: {}\r\nContent-Length: 2\r\n\r\n{{}}",
        "j".repeat(17 * 1024)
    );
    let answer = server.raw(big.as_bytes(), Duration::from_secs(5));
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:.200}");
    // Just under the limit is fine (the request itself is then judged normally).
    let ok = format!(
        "POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nX-Junk: {}\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{{}}",
        "j".repeat(8 * 1024)
    );
    let answer = server.raw(ok.as_bytes(), Duration::from_secs(5));
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer:.200}");
    assert_outcome(
        &server.send(&paid("evt_after_431")),
        "evt_after_431",
        "processed",
    );
}

#[test]
fn slow_senders_are_cut_off_by_the_read_timeout() {
    let server = Server::start(&["--read-timeout", "1"]);
    // Headers that never finish: the connection is closed.
    let mut headers = TcpStream::connect(server.addr).unwrap();
    headers
        .write_all(b"POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    // A body that trickles: 408 after the timeout.
    let mut body = TcpStream::connect(server.addr).unwrap();
    body.write_all(b"POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        .unwrap();
    // An idle connection that sends nothing at all.
    let mut idle = TcpStream::connect(server.addr).unwrap();

    let started = Instant::now();
    for stream in [&mut headers, &mut body, &mut idle] {
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
    }
    let mut answer = String::new();
    let _ = body.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_timeout"), "{answer}");
    let mut rest = Vec::new();
    assert_eq!(headers.read_to_end(&mut rest).unwrap_or(0), rest.len());
    let mut rest = Vec::new();
    let _ = idle.read_to_end(&mut rest);
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "cut off by the 1 s timeout, not the client's"
    );
    assert_eq!(ledger_count(&server.db()), 0);
    assert_outcome(
        &server.send(&paid("evt_after_slow")),
        "evt_after_slow",
        "processed",
    );
}

#[test]
fn connections_over_the_cap_are_refused_with_503() {
    let server = Server::start(&["--max-connections", "4"]);
    let held: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(server.addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let answer = server.raw(b"", Duration::from_secs(5));
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("retry-after: 1"), "{answer}");
    assert!(answer.contains("too_many_connections"), "{answer}");
    drop(held);
    let reply = wait_for(Duration::from_secs(5), || {
        let reply = server.send(&paid("evt_after_cap"));
        (reply.status == 200).then_some(reply)
    });
    assert!(reply.is_some(), "slots are freed when connections close");
}

#[test]
fn idle_and_trickling_connections_do_not_block_normal_events() {
    let server = Server::start(&[]);
    let mut idle: Vec<TcpStream> = (0..200)
        .map(|_| TcpStream::connect(server.addr).unwrap())
        .collect();
    let mut slow: Vec<TcpStream> = (0..50)
        .map(|_| {
            let mut s = TcpStream::connect(server.addr).unwrap();
            s.write_all(
                b"POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n",
            )
            .unwrap();
            s
        })
        .collect();
    let mut worst = Duration::ZERO;
    for i in 0..20 {
        for s in &mut slow {
            let _ = s.write_all(b"x");
        }
        let started = Instant::now();
        let id = format!("evt_busy{i}");
        assert_outcome(&server.send(&paid(&id)), &id, "processed");
        worst = worst.max(started.elapsed());
    }
    eprintln!("worst latency with 200 idle + 50 trickling connections: {worst:?}");
    assert!(
        worst < Duration::from_secs(2),
        "normal events starved: {worst:?}"
    );
    assert_eq!(ledger_count(&server.db()), 20);
    idle.clear();
}
