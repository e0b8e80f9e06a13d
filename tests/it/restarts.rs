//! Restarts that refuse no delivery: `serve` on listening sockets handed to it as systemd
//! hands them (`LISTEN_FDS`), restarted five times under a steady load by a holder that keeps
//! the socket; the same with `serve`'s own restart in place (SIGUSR2); `/readyz` during a
//! stop; and the passed sockets it refuses.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use command_fds::{CommandFdExt, FdMapping};

use crate::util::*;

/// What a steady load saw.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// Event ids answered 200 `processed`.
    pub(crate) acknowledged: Vec<String>,
    /// Connections that could not be made (refused, reset before an answer, timed out).
    pub(crate) failed: Vec<String>,
    /// Answers other than 200.
    pub(crate) not_2xx: Vec<String>,
}

/// Sends signed `invoice.paid` events to `addr` at about `per_second`, a new connection each
/// (as providers do), from 4 threads, until `stop`.
pub(crate) fn load(
    addr: SocketAddr,
    per_second: u32,
    prefix: &str,
    stop: Arc<AtomicBool>,
) -> Arc<Mutex<Seen>> {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let threads = 4;
    let every = Duration::from_secs(1) * threads / per_second;
    let mut handles = Vec::new();
    for thread in 0..threads {
        let (seen, stop, prefix) = (seen.clone(), stop.clone(), prefix.to_string());
        handles.push(std::thread::spawn(move || {
            let agent = ureq::AgentBuilder::new()
                .max_idle_connections(0)
                .timeout(Duration::from_secs(30))
                .build();
            let url = format!("http://{addr}/webhooks/stripe");
            let mut next = Instant::now();
            for n in 0.. {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let id = format!("evt_{prefix}_{thread}_{n}");
                let body = paid(&id);
                let reply = agent
                    .post(&url)
                    .set("Content-Type", "application/json")
                    .set("Stripe-Signature", &signature(&body))
                    .send_bytes(&body);
                let mut seen = seen.lock().unwrap();
                match reply {
                    Ok(r) if r.status() == 200 => {
                        let text = r.into_string().unwrap_or_default();
                        if text.contains("\"processed\"") {
                            seen.acknowledged.push(id);
                        } else {
                            seen.not_2xx.push(format!("{id}: 200 {text}"));
                        }
                    }
                    Ok(r) => seen.not_2xx.push(format!("{id}: {}", r.status())),
                    Err(ureq::Error::Status(code, r)) => seen.not_2xx.push(format!(
                        "{id}: {code} {}",
                        r.into_string().unwrap_or_default()
                    )),
                    Err(e) => seen.failed.push(format!("{id}: {e}")),
                }
                drop(seen);
                next += every;
                if let Some(wait) = next.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
        }));
    }
    // The threads end with `stop`; joined through the Arc's last owner below.
    std::thread::spawn(move || handles.into_iter().for_each(|h| h.join().unwrap()));
    seen
}

/// Waits until the load's threads have all finished their last request.
pub(crate) fn finished(seen: &Arc<Mutex<Seen>>) -> Seen {
    // Each thread holds a clone until it ends; the load's joiner then drops the handles.
    wait_for(Duration::from_secs(60), || {
        (Arc::strong_count(seen) == 1).then_some(())
    })
    .expect("the load's threads did not finish");
    std::mem::take(&mut *seen.lock().unwrap())
}

pub(crate) fn assert_nothing_refused_or_lost(seen: &Seen, db: &Db, restarts: usize) {
    assert!(
        seen.failed.is_empty(),
        "{} of {} requests could not connect or had no answer across {restarts} restarts: {:?}",
        seen.failed.len(),
        seen.acknowledged.len() + seen.failed.len() + seen.not_2xx.len(),
        &seen.failed[..seen.failed.len().min(5)]
    );
    assert!(
        seen.not_2xx.is_empty(),
        "answers not 200: {:?}",
        &seen.not_2xx
    );
    // About 200 a second for over 5 s: a load that ran, not a handful.
    assert!(
        seen.acknowledged.len() > 500,
        "only {} events acknowledged",
        seen.acknowledged.len()
    );
    let missing = missing_from_ledger(db, &seen.acknowledged);
    assert!(
        missing.is_empty(),
        "acknowledged, not in the ledger: {missing:?}"
    );
    assert_eq!(ledger_count(db), seen.acknowledged.len() as i64);
}

/// `hookledger serve` handed `listener` as systemd hands a socket unit's: fd 3, `LISTEN_FDS=1`,
/// `LISTEN_FDNAMES=webhook`, `LISTEN_PID` its own (set by the shell it replaces). Returns once
/// it printed its address.
fn spawn_on_socket(listener: &TcpListener, db_arg: &str) -> Child {
    let fd = OwnedFd::from(listener.try_clone().unwrap());
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("export LISTEN_PID=$$; exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_hookledger"))
        .args(["serve", "--admin-listen", "off", "--db", db_arg])
        .env("LISTEN_FDS", "1")
        .env("LISTEN_FDNAMES", "webhook")
        .env("STRIPE_WEBHOOK_SECRET", SECRET)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    cmd.fd_mappings(vec![FdMapping {
        parent_fd: fd,
        child_fd: 3,
    }])
    .unwrap();
    let mut child = cmd.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let at = printed_addr(&line, "listen").unwrap_or_else(|| panic!("did not start: {line:?}"));
    assert_eq!(
        at,
        listener.local_addr().unwrap(),
        "serve did not use the passed socket"
    );
    child
}

#[test]
fn five_restarts_on_a_socket_held_as_systemd_holds_it_refuse_nothing_and_lose_nothing() {
    let dir = test_dir();
    let db_arg = db_arg_in(dir.path());
    // The holder: as systemd's socket unit, it keeps the listening socket across restarts and
    // never accepts on it.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut serve = spawn_on_socket(&listener, &db_arg);
    let stop = Arc::new(AtomicBool::new(false));
    let seen = load(addr, 200, "held", stop.clone());
    let restarts = 5;
    for _ in 0..restarts {
        std::thread::sleep(Duration::from_millis(1000));
        // systemctl restart: SIGTERM, wait for the exit, start again.
        Command::new("kill")
            .args(["-TERM", &serve.id().to_string()])
            .status()
            .unwrap();
        let status = serve.wait().unwrap();
        assert!(status.success(), "serve exited with {status} on SIGTERM");
        serve = spawn_on_socket(&listener, &db_arg);
    }
    std::thread::sleep(Duration::from_millis(1000));
    stop.store(true, Ordering::SeqCst);
    let seen = finished(&seen);
    Command::new("kill")
        .args(["-TERM", &serve.id().to_string()])
        .status()
        .unwrap();
    assert!(serve.wait().unwrap().success());
    assert_nothing_refused_or_lost(&seen, &Db::open(&db_arg), restarts);
    assert_ledger_checks(&db_arg);
}

/// The line each start logs.
pub(crate) const STARTING: &str = concat!("hookledger ", env!("CARGO_PKG_VERSION"), " starting");

#[test]
fn five_restarts_in_place_on_sigusr2_keep_the_pid_refuse_nothing_and_lose_nothing() {
    let mut server = Server::start(&[]);
    let pid = server.pid();
    let stop = Arc::new(AtomicBool::new(false));
    let seen = load(server.addr, 200, "usr2", stop.clone());
    let restarts = 5;
    for restart in 1..=restarts {
        std::thread::sleep(Duration::from_millis(1000));
        Command::new("kill")
            .args(["-USR2", &pid.to_string()])
            .status()
            .unwrap();
        // Started again: the log has one more "starting" line.
        wait_for(Duration::from_secs(30), || {
            (server.log().matches(STARTING).count() == restart + 1).then_some(())
        })
        .unwrap_or_else(|| panic!("no restart {restart}: {}", server.log()));
        assert_eq!(server.pid(), pid);
        assert!(server.alive(), "serve exited on SIGUSR2: {}", server.log());
    }
    std::thread::sleep(Duration::from_millis(1000));
    stop.store(true, Ordering::SeqCst);
    let seen = finished(&seen);
    assert_eq!(
        server.log().matches("restarting in place").count(),
        restarts
    );
    // The restarted process still answers on both of its listeners.
    assert_eq!(server.admin_get("/readyz").0, 200);
    assert_nothing_refused_or_lost(&seen, &server.db(), restarts);
    assert_eq!(server.terminate(), Some(0));
    assert_ledger_checks(&server.db_arg());
}

/// A starter that read the address and closed its end of stdout (a script, `| head -1`):
/// the restart in place prints the address again into the closed pipe, and serves on.
#[test]
fn a_restart_in_place_serves_on_when_nobody_reads_its_stdout_any_more() {
    let dir = test_dir();
    let log = dir.path().join("serve.log");
    let mut child = serve_command(db_arg_in(dir.path()))
        .env("STRIPE_WEBHOOK_SECRET", SECRET)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    // The reader is dropped here: the pipe's read end is closed.
    let addr = printed_addr(&line, "listen").expect("an address");
    let post = |id: &str| {
        let body = paid(id);
        ureq::post(&format!("http://{addr}/webhooks/stripe"))
            .set("Stripe-Signature", &signature(&body))
            .send_bytes(&body)
            .map(|r| r.into_string().unwrap_or_default())
            .map_err(|e| e.to_string())
    };
    assert!(post("evt_before").unwrap().contains("processed"));
    Command::new("kill")
        .args(["-USR2", &child.id().to_string()])
        .status()
        .unwrap();
    let logged = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_for(Duration::from_secs(30), || {
        (logged().matches(STARTING).count() == 2).then_some(())
    })
    .unwrap_or_else(|| panic!("no second start: {}", logged()));
    let answer = wait_for(Duration::from_secs(10), || post("evt_after").ok());
    assert!(
        child.try_wait().unwrap().is_none(),
        "it exited: {}",
        logged()
    );
    assert!(
        answer.is_some_and(|a| a.contains("processed")),
        "{}",
        logged()
    );
    assert!(
        logged().contains("cannot print the address to stdout"),
        "{}",
        logged()
    );
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));
    let db = Db::open(&db_arg_in(dir.path()));
    assert_eq!(ledger_count(&db), 2);
}

#[test]
fn readyz_answers_503_from_the_moment_a_stop_begins() {
    let mut server = Server::start(&[]);
    assert_eq!(server.admin_get("/readyz").0, 200);
    // A request in flight (half its body sent) holds the drain open.
    let mut slow = TcpStream::connect(server.addr).unwrap();
    let body = paid("evt_in_flight");
    write!(
        slow,
        "POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Stripe-Signature: {}\r\nContent-Length: {}\r\n\r\n",
        signature(&body),
        body.len()
    )
    .unwrap();
    slow.write_all(&body[..10]).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    Command::new("kill")
        .args(["-TERM", &server.pid().to_string()])
        .status()
        .unwrap();
    let (status, reply) = wait_for(Duration::from_secs(10), || {
        let (status, reply) = server.admin_get("/readyz");
        (status != 200).then_some((status, reply))
    })
    .expect("/readyz answered 200 after SIGTERM");
    assert_eq!(status, 503, "{reply}");
    assert!(reply.contains("\"ready\":false"), "{reply}");
    assert!(
        server.alive(),
        "serve did not wait for the request in flight"
    );
    // The request in flight still completes and is answered after COMMIT.
    slow.write_all(&body[10..]).unwrap();
    let mut answer = String::new();
    slow.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"processed\""), "{answer}");
    assert_eq!(server.wait_exit(), Some(0));
    assert_eq!(ledger_count(&server.db()), 1);
}

/// `serve` with `fd` (if any) as fd 3 and `env`; returns (exit code, stderr).
fn refused_start(fd: Option<OwnedFd>, env: &[(&str, &str)], db: &std::path::Path) -> (i32, String) {
    let mut cmd = serve_command(db);
    cmd.env("STRIPE_WEBHOOK_SECRET", SECRET)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(fd) = fd {
        cmd.fd_mappings(vec![FdMapping {
            parent_fd: fd,
            child_fd: 3,
        }])
        .unwrap();
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn passed_sockets_that_cannot_serve_stop_the_start_naming_the_fd_and_create_nothing() {
    let dir = test_dir();
    let db = dir.path().join("never.db");
    let listen = [("LISTEN_FDS", "1"), ("LISTEN_FDNAMES", "webhook")];
    // Nothing open at fd 3.
    let (code, err) = refused_start(None, &listen, &db);
    assert_ne!(code, 0);
    assert!(
        err.contains("fd 3 (webhook) of LISTEN_FDS is not a listening TCP socket"),
        "{err}"
    );
    // A file, a UDP socket, a TCP socket that does not listen.
    let file = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
    let udp = OwnedFd::from(std::net::UdpSocket::bind("127.0.0.1:0").unwrap());
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let connected = OwnedFd::from(TcpStream::connect(server.local_addr().unwrap()).unwrap());
    for (what, fd, says) in [
        ("a file", file, "is not a listening TCP socket"),
        ("a UDP socket", udp, "is not a listening TCP socket"),
        (
            "a connected socket",
            connected,
            "is a TCP socket that is not listening",
        ),
    ] {
        let (code, err) = refused_start(Some(fd), &listen, &db);
        assert_ne!(code, 0, "{what}");
        assert!(
            err.contains(&format!("fd 3 (webhook) of LISTEN_FDS {says}")),
            "{what}: {err}"
        );
    }
    // Names other than webhook and admin, and a count that is not one.
    let listening = || OwnedFd::from(TcpListener::bind("127.0.0.1:0").unwrap());
    let (code, err) = refused_start(
        Some(listening()),
        &[("LISTEN_FDS", "1"), ("LISTEN_FDNAMES", "metrics")],
        &db,
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("fd 3 of LISTEN_FDS is named \"metrics\""),
        "{err}"
    );
    let (code, err) = refused_start(Some(listening()), &[("LISTEN_FDS", "many")], &db);
    assert_ne!(code, 0);
    assert!(
        err.contains("LISTEN_FDS=\"many\" is not a count of sockets"),
        "{err}"
    );
    assert!(!db.exists(), "a refused start created {}", db.display());
}

#[test]
fn sockets_passed_to_another_process_are_left_alone_and_serve_binds_its_own() {
    // LISTEN_PID=1: the variables were meant for another process (inherited by mistake).
    let dir = test_dir();
    let server = Server::start_with_env(
        dir.path(),
        &[],
        &[
            ("RUST_LOG", "info"),
            ("LISTEN_FDS", "1"),
            ("LISTEN_PID", "1"),
        ],
    );
    let reply = server.send(&paid("evt_own_socket"));
    assert_outcome(&reply, "evt_own_socket", "processed");
    assert!(
        server.log().contains("LISTEN_PID=1 is not this process"),
        "{}",
        server.log()
    );
    assert_eq!(ledger_count(&server.db()), 1);
}

/// After kill -9 (no filter saved) on a ledger of 300,000 claims, `serve` does not read them
/// all before it listens: the first requests are answered exactly (a resend of an old claim
/// `duplicate`, a new event `processed`) while the filter is built in the background, and
/// after it is taken too. How soon is the bench's to measure (`hookledger-bench start`).
#[test]
fn after_kill_9_a_large_ledger_is_served_at_once_while_its_filter_is_built_behind() {
    if store() == Store::Postgres {
        eprintln!("skipped on PostgreSQL: its unique index is the claim, it builds no filter");
        return;
    }
    let dir = test_dir();
    let mut first = Server::start_in(dir.path(), &[]);
    let old = "evt_fill_000000123456";
    {
        let db = first.db_path();
        let mut conn = rusqlite::Connection::open(db).unwrap();
        let tx = conn.transaction().unwrap();
        let mut insert = tx
            .prepare(
                "INSERT INTO webhook_events (source, event_id, event_type, created, received_at)
                 VALUES ('stripe', ?1, 'invoice.paid', ?2, ?2)",
            )
            .unwrap();
        for i in 0..300_000 {
            insert
                .execute(rusqlite::params![
                    format!("evt_fill_{i:012}"),
                    now() - 86_400
                ])
                .unwrap();
        }
        drop(insert);
        tx.commit().unwrap();
    }
    assert_outcome(
        &first.send(&paid("evt_before_the_kill")),
        "evt_before_the_kill",
        "processed",
    );
    first.kill();

    let server = Server::start_in(dir.path(), &[]);
    assert_outcome(&server.send(&paid(old)), old, "duplicate");
    assert_outcome(
        &server.send(&paid("evt_before_the_kill")),
        "evt_before_the_kill",
        "duplicate",
    );
    assert_outcome(
        &server.send(&paid("evt_first_new")),
        "evt_first_new",
        "processed",
    );
    let log = server.log();
    assert!(
        log.contains("is built in the background") && !log.contains("built in the background in"),
        "served before the filter was built: {log}"
    );
    wait_for(Duration::from_secs(60), || {
        // The writer takes the filter at its next transaction.
        let _ = server.send(&paid(&format!("evt_nudge_{}", now())));
        server
            .log()
            .contains("claim(s) built in the background in")
            .then_some(())
    })
    .unwrap_or_else(|| panic!("the filter was not taken: {}", server.log()));
    assert_outcome(&server.send(&paid(old)), old, "duplicate");
    assert_outcome(
        &server.send(&paid("evt_first_new")),
        "evt_first_new",
        "duplicate",
    );
    assert_outcome(&server.send(&paid("evt_after")), "evt_after", "processed");
    let db = server.db();
    let filled: i64 = db.one(
        "SELECT count(*) FROM webhook_events WHERE event_id LIKE 'evt_fill_%'",
        &[],
    );
    assert_eq!(filled, 300_000);
    // Each event answered `processed` once, and granted its credits once.
    let processed = ledger_count(&db) - filled;
    assert!(processed >= 4, "{processed}");
    assert_eq!(credits(&db, "acct_1"), 100 * processed);
}
