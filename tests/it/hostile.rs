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
    let request = format!(
        "POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nStripe-Signature: {}\r\n\
         Content-Length: 100000000000\r\n\r\nabc",
        forged_signature()
    );
    stream.write_all(request.as_bytes()).unwrap();
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
    let request = format!(
        "POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nStripe-Signature: {}\r\n\
         Content-Length: 1000\r\n\r\n{{",
        forged_signature()
    );
    body.write_all(request.as_bytes()).unwrap();
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

/// 1,100 idle connections to the admin listener once used up a 1,024-file process and
/// webhooks timed out. The admin listener has its own cap (64): past it a request is refused
/// at once, and the webhook port is not affected.
#[test]
fn idle_connections_over_the_admin_cap_are_refused_and_webhooks_still_answer() {
    let server = Server::start(&[]);
    let admin = server.admin.unwrap();
    let idle: Vec<TcpStream> = (0..80)
        .map(|_| TcpStream::connect(admin).unwrap())
        .collect();
    // Accepted in order: the 64 first hold the slots, the next ones are refused.
    let (status, body) = server.admin_get("/healthz");
    assert!(status == 503 || status == 0, "{status} {body}");
    if status == 503 {
        assert!(body.contains("too_many_connections"), "{body}");
    }
    let started = Instant::now();
    assert_outcome(
        &server.send(&paid("evt_admin_flood")),
        "evt_admin_flood",
        "processed",
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the webhook waited {:?}",
        started.elapsed()
    );
    assert_eq!(ledger_count(&server.db()), 1);
    drop(idle);
    let ok = wait_for(Duration::from_secs(10), || {
        (server.admin_get("/healthz").0 == 200).then_some(())
    });
    assert!(ok.is_some(), "admin slots are freed when connections close");
}

/// An idle admin connection is closed after the read timeout, as on the webhook port.
#[test]
fn an_idle_admin_connection_is_closed_after_the_read_timeout() {
    let server = Server::start(&["--read-timeout", "1"]);
    let mut idle = TcpStream::connect(server.admin.unwrap()).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut rest = Vec::new();
    let closed = idle.read_to_end(&mut rest);
    assert!(closed.is_ok(), "not closed by the server: {closed:?}");
    assert_eq!(server.admin_get("/healthz").0, 200);
}

/// Under a limit of 1,024 open files the default cap of 1,024 connections could never answer
/// its 503 (`accept` failed first): the cap is lowered under the limit, logged, and then
/// refuses with a 503.
#[test]
fn under_a_limit_of_1024_files_the_connection_cap_is_lowered_and_answers_503() {
    if !prerequisite(
        installed("prlimit"),
        "HOOKLEDGER_REQUIRE_PRLIMIT",
        "prlimit (util-linux) is not installed",
    ) {
        return;
    }
    let dir = test_dir();
    let mut cmd = std::process::Command::new("prlimit");
    cmd.args(["--nofile=1024:1024", "--", env!("CARGO_BIN_EXE_hookledger")]);
    let mut child = serve_args(&mut cmd, db_arg_in(dir.path()))
        .args(["--read-timeout", "60"])
        .env("STRIPE_WEBHOOK_SECRET", SECRET)
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stderr = child.stderr.take().unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let _child = Kill(child);
    let (lines, log) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    let addr: std::net::SocketAddr = line
        .trim()
        .strip_prefix("hookledger listening on ")
        .unwrap_or_else(|| panic!("not started: {line:?}"))
        .parse()
        .unwrap();
    let lowered = loop {
        let line = log
            .recv_timeout(Duration::from_secs(30))
            .expect("no line about the cap");
        if line.contains("lowered to") {
            break line;
        }
    };
    assert!(
        lowered.contains("--max-connections (http.max_connections) 1024 lowered to 768"),
        "{lowered}"
    );
    let held: Vec<TcpStream> = (0..768)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    let mut over = TcpStream::connect(addr).unwrap();
    over.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut answer = String::new();
    let _ = over.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    drop(held);
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
            s.write_all(&head(Some(&forged_signature()), 100)).unwrap();
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

/// A request head for `POST /webhooks/stripe` declaring a body of `len` bytes, with a
/// `Stripe-Signature` if one is given.
fn head(signature: Option<&str>, len: usize) -> Vec<u8> {
    let signature = signature
        .map(|s| format!("Stripe-Signature: {s}\r\n"))
        .unwrap_or_default();
    format!("POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\n{signature}Content-Length: {len}\r\n\r\n")
        .into_bytes()
}

/// Sends `head` and a first slice of the body it declares, and returns the answer that comes
/// within `wait` (empty if none), with the connection, still open.
fn start_request(server: &Server, head: &[u8], wait: Duration) -> (String, TcpStream) {
    let mut stream = TcpStream::connect(server.addr).unwrap();
    stream.write_all(head).unwrap();
    let _ = stream.write_all(&[b'x'; 100]);
    stream.set_read_timeout(Some(wait)).unwrap();
    let mut answer = vec![0; 2048];
    let n = stream.read(&mut answer).unwrap_or(0);
    (String::from_utf8_lossy(&answer[..n]).into_owned(), stream)
}

/// Senders without the secret cannot make the server hold their bodies: a missing, malformed
/// or stale signature header is answered at once, before the (unfinished) body is read.
#[test]
fn a_missing_or_stale_signature_is_refused_before_the_body_is_read() {
    let server = Server::start(&[]);
    let stale = format!("t={},v1={}", now() - 3600, "ab".repeat(32));
    for (signature, kind) in [
        (None, "invalid_signature"),
        (Some("t=yesterday"), "invalid_signature"),
        (Some(stale.as_str()), "timestamp_out_of_tolerance"),
    ] {
        // The body is never finished; the read timeout (10 s) is longer than the wait.
        let (answer, _open) =
            start_request(&server, &head(signature, 1_000_000), Duration::from_secs(5));
        assert!(
            answer.starts_with("HTTP/1.1 400"),
            "{signature:?}: {answer:?}"
        );
        assert!(answer.contains(kind), "{answer}");
        assert!(answer.contains("connection: close"), "{answer}");
    }
    assert_eq!(ledger_count(&server.db()), 0);
    assert_outcome(
        &server.send(&paid("evt_after_early")),
        "evt_after_early",
        "processed",
    );
}

/// With a forged but fresh header the body must be read to find the forgery; the bodies being
/// read at once are bounded by --max-body-in-flight, and beyond it a request gets a 503 with
/// Retry-After before its body is read. The room comes back when the senders go.
#[test]
fn bodies_over_the_in_flight_budget_get_503_without_being_read() {
    let server = Server::start(&["--max-body", "4096", "--max-body-in-flight", "8192"]);
    let forged = forged_signature();
    // Two unfinished 4 KiB bodies take the whole budget.
    let holders: Vec<TcpStream> = (0..2)
        .map(|_| {
            let (answer, stream) = start_request(
                &server,
                &head(Some(&forged), 4096),
                Duration::from_millis(300),
            );
            assert_eq!(answer, "", "a holder was answered");
            stream
        })
        .collect();
    let (answer, _third) =
        start_request(&server, &head(Some(&forged), 4096), Duration::from_secs(5));
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer:?}");
    assert!(answer.contains("\"error\":\"overloaded\""), "{answer}");
    assert!(answer.contains("retry-after: 1"), "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
    drop(holders);
    let reply = wait_for(Duration::from_secs(5), || {
        let reply = server.send(&paid("evt_after_budget"));
        (reply.status == 200).then_some(reply)
    })
    .expect("the budget is given back when the senders go");
    assert_outcome(&reply, "evt_after_budget", "processed");
    assert_eq!(ledger_count(&server.db()), 1);
}

#[test]
fn a_max_body_in_flight_below_max_body_stops_start_up() {
    let dir = test_dir();
    let db = db_arg_in(dir.path());
    let (code, _, err) = cli(&[
        "serve",
        "--stripe-secret",
        SECRET,
        "--max-body",
        "4096",
        "--max-body-in-flight",
        "1024",
        "--db",
        &db,
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--max-body-in-flight"), "{err}");
    assert!(
        !database_created(dir.path()),
        "nothing is created before the config is valid"
    );
}
