//! Shared test harness: the real `hookledger` binary on port 0 with its own temp directory
//! and database (SQLite or PostgreSQL: `store`), a signing client, fixtures, and database
//! snapshots.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hookledger::internals::stripe;
use hookledger::internals::{Client, Reply};
use hookledger::Secret;

mod cluster;
mod store;
pub use cluster::Cluster;
pub use store::*;

pub const SECRET: &str = "whsec_test_secret";

/// A config file's `[[source]]` of Stripe named `stripe`, its secret from
/// `STRIPE_WEBHOOK_SECRET` (as [`Server`] sets it).
pub const STRIPE_SOURCE_TOML: &str =
    "[[source]]\nname = \"stripe\"\nscheme = \"stripe\"\nsecrets = [\"env:STRIPE_WEBHOOK_SECRET\"]\n";

pub fn secret() -> Secret {
    Secret::new(SECRET)
}

pub fn now() -> i64 {
    hookledger::internals::unix_now()
}

/// Unix time `t` as RFC 3339 in UTC (`2026-12-07T10:18:49Z`), as providers' APIs write times.
pub fn rfc3339(t: i64) -> String {
    let out = Command::new("date")
        .args(["-u", "-d", &format!("@{t}"), "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Waits for the first heartbeat `serve` writes at its start (the next is 30 s away): a test
/// that holds SQLite's write lock takes it after, so that the writer's wait is for the test's
/// own requests and not for the beat.
pub fn wait_for_first_heartbeat(server: &Server) {
    let db = server.db();
    wait_for(Duration::from_secs(5), || {
        (db.count("SELECT count(*) FROM hookledger_heartbeat") == 1).then_some(())
    })
    .expect("serve writes its first heartbeat at its start");
}

/// Each config text of `cases` stops `serve` at start-up (exit 2) with its expected message
/// (which names the key), before the database is created; `env` is set for its `env:`
/// references.
pub fn assert_each_refused_at_start(cases: &[(String, &str)], env: (&str, &str)) {
    for (text, expected) in cases {
        let dir = test_dir();
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, text).unwrap();
        let out = serve_command(dir.path().join("db.sqlite"))
            .args(["--config", path.to_str().unwrap()])
            .env(env.0, env.1)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text}\n{stderr}");
        assert!(
            stderr.contains(expected),
            "{text}\nexpected {expected:?} in:\n{stderr}"
        );
        assert!(
            !dir.path().join("db.sqlite").exists(),
            "nothing created: {text}"
        );
    }
}

/// Serves `router` on 127.0.0.1, port 0, on a thread of its own for the rest of the test
/// process: a fake of a provider's API. Its address.
pub fn serve_fake(router: axum::Router) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let listener = {
        let _entered = runtime.enter();
        tokio::net::TcpListener::from_std(listener).unwrap()
    };
    std::thread::spawn(move || {
        runtime
            .block_on(async { axum::serve(listener, router).await })
            .unwrap()
    });
    addr
}

/// `tests/fixtures` in this repository (origin and licence in its README.md).
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The raw bytes of `tests/fixtures/stripe/events/<name>.json`.
pub fn fixture(name: &str) -> Vec<u8> {
    let path = fixtures_dir()
        .join("stripe/events")
        .join(format!("{name}.json"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The names of all event fixtures.
pub fn fixture_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(fixtures_dir().join("stripe/events"))
        .expect("fixtures directory")
        .map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.trim_end_matches(".json").to_string()
        })
        .collect();
    names.sort();
    names
}

/// A running `hookledger serve` child process.
pub struct Server {
    child: Child,
    pub addr: SocketAddr,
    /// The admin listener's address (`/healthz`, `/readyz`), unless `args` turned it off.
    pub admin: Option<SocketAddr>,
    pub dir: PathBuf,
    /// Its `--db`.
    db_arg: String,
    stderr: Arc<Mutex<String>>,
    client: Client,
    _temp: Option<TestDir>,
}

impl Server {
    /// Starts a server in a fresh temp directory with secret [`SECRET`] and extra `args`.
    pub fn start(args: &[&str]) -> Server {
        let temp = test_dir();
        let mut server = Server::start_in(temp.path(), args);
        server._temp = Some(temp);
        server
    }

    /// Starts a server on the database of `dir` ([`db_arg_in`]), which may already exist: a
    /// restart.
    pub fn start_in(dir: &Path, args: &[&str]) -> Server {
        Server::start_with_env(dir, args, &[("RUST_LOG", "info")])
    }

    /// As [`Server::start_in`], with extra environment variables.
    pub fn start_with_env(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        Server::spawn(dir, db_arg_in(dir), args, env)
    }

    /// Starts another server on an existing database (`db_arg`, e.g. a running server's
    /// [`Server::db_arg`]), in a temp directory of its own that does not own the database.
    #[allow(dead_code)] // for the tests of several servers on one PostgreSQL database
    pub fn start_on(db_arg: &str, args: &[&str]) -> Server {
        let temp = test_dir();
        let mut server = Server::spawn(
            temp.path(),
            db_arg.to_string(),
            args,
            &[("RUST_LOG", "info")],
        );
        server._temp = Some(temp);
        server
    }

    /// As [`Server::start_on`], with `env` (and no `RUST_LOG` unless it says so).
    pub fn start_on_with_env(db_arg: &str, args: &[&str], env: &[(&str, &str)]) -> Server {
        let temp = test_dir();
        let mut server = Server::spawn(temp.path(), db_arg.to_string(), args, env);
        server._temp = Some(temp);
        server
    }

    /// `hookledger serve --config FILE` and no other flag: the file says where it listens
    /// (port 0, and its admin listener too) and names the database of `dir` ([`db_arg_in`]).
    pub fn start_from_file(dir: &Path, config: &Path) -> Server {
        let args = ["--config", config.to_str().unwrap()];
        Server::spawn_with(dir, db_arg_in(dir), &args, &[("RUST_LOG", "info")], false)
    }

    /// Runs `hookledger serve` in `dir` on `db_arg` and waits for its address.
    fn spawn(dir: &Path, db_arg: String, args: &[&str], env: &[(&str, &str)]) -> Server {
        Server::spawn_with(dir, db_arg, args, env, true)
    }

    /// [`Server::spawn`]; without `own_flags`, only `args` (no `--db`, `--listen`, ...).
    fn spawn_with(
        dir: &Path,
        db_arg: String,
        args: &[&str],
        env: &[(&str, &str)],
        own_flags: bool,
    ) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hookledger"));
        cmd.arg("serve");
        if own_flags {
            // A free port each, so that servers can run side by side (unless `args` say
            // where).
            if !args.contains(&"--listen") {
                cmd.arg("--listen").arg("127.0.0.1:0");
            }
            if !args.contains(&"--admin-listen") {
                cmd.arg("--admin-listen").arg("127.0.0.1:0");
            }
            cmd.arg("--db").arg(&db_arg);
        }
        cmd.args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if !args.iter().any(|a| a.starts_with("--stripe-secret")) {
            cmd.env("STRIPE_WEBHOOK_SECRET", SECRET);
        } else {
            cmd.env_remove("STRIPE_WEBHOOK_SECRET");
        }
        let mut child = cmd.spawn().expect("spawning hookledger");
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut err_pipe = child.stderr.take().unwrap();
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err_pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let addr = match printed_addr(&line, "listen") {
            Some(addr) => addr,
            None => {
                let _ = child.wait();
                std::thread::sleep(Duration::from_millis(100));
                panic!(
                    "server did not start: stdout {line:?}, stderr {}",
                    stderr.lock().unwrap()
                );
            }
        };
        // The admin line follows, unless the admin listener is off.
        let admin_off = args.windows(2).any(|w| w == ["--admin-listen", "off"]);
        let admin = (!admin_off).then(|| {
            line.clear();
            stdout.read_line(&mut line).unwrap();
            printed_addr(&line, "admin").unwrap_or_else(|| panic!("no admin address: {line:?}"))
        });
        std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
        Server {
            child,
            addr,
            admin,
            dir: dir.to_path_buf(),
            db_arg,
            stderr,
            client: Client::new(Duration::from_secs(30)),
            _temp: None,
        }
    }

    /// Keeps `dir` (the server's temp directory) alive as long as the server.
    pub fn keep(&mut self, dir: TestDir) {
        self._temp = Some(dir);
    }

    pub fn url(&self) -> String {
        format!("http://{}/webhooks/stripe", self.addr)
    }

    /// Its database as `--db` takes it, for the CLI commands.
    pub fn db_arg(&self) -> String {
        self.db_arg.clone()
    }

    /// Its SQLite file, for the tests about the file itself.
    pub fn db_path(&self) -> PathBuf {
        PathBuf::from(&self.db_arg)
    }

    /// A connection to the server's database (for assertions and fault injection).
    pub fn db(&self) -> Db {
        Db::open(&self.db_arg)
    }

    /// Signs `body` now with [`SECRET`] and POSTs it.
    pub fn send(&self, body: &[u8]) -> Reply {
        self.send_at(body, now())
    }

    pub fn send_at(&self, body: &[u8], t: i64) -> Reply {
        self.client
            .send(&self.url(), body, &secret(), t)
            .expect("request failed")
    }

    /// POSTs `body` to `path` with exactly `headers`.
    pub fn post(&self, path: &str, body: &[u8], headers: &[(&str, &str)]) -> Reply {
        self.client
            .post(&format!("http://{}{path}", self.addr), body, headers)
            .expect("request failed")
    }

    /// Sends raw bytes on a new connection and returns everything the server answers
    /// (until it closes or `timeout`).
    pub fn raw(&self, request: &[u8], timeout: Duration) -> String {
        let mut stream = TcpStream::connect(self.addr).unwrap();
        stream.set_read_timeout(Some(timeout)).unwrap();
        stream.write_all(request).unwrap();
        let mut out = Vec::new();
        let _ = stream.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    /// GET `path` on the admin listener: (status, body).
    pub fn admin_get(&self, path: &str) -> (u16, String) {
        let (status, _, body) = self.admin_request("GET", path, &[], b"");
        (status, body)
    }

    /// A request to the admin listener: (status, head, body).
    pub fn admin_request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> (u16, String, String) {
        let admin = self.admin.expect("the admin listener is on");
        let mut stream = TcpStream::connect(admin).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nconnection: close\r\ncontent-length: {}\r\n",
            body.len()
        );
        if !headers
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case("host"))
        {
            request.push_str(&format!("host: {admin}\r\n"));
        }
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        stream.write_all(request.as_bytes()).unwrap();
        stream.write_all(body).unwrap();
        let mut out = String::new();
        let _ = stream.read_to_string(&mut out);
        let status = out.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
        let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
        (status, head.to_string(), body.to_string())
    }

    /// Everything the server logged so far.
    pub fn log(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Its process id.
    #[allow(dead_code)] // for the restart tests
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether its process is still running.
    #[allow(dead_code)] // for the restart tests
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Waits (at most 30 s) for an exit a signal sent elsewhere asked for; its exit code.
    #[allow(dead_code)] // for the restart tests
    pub fn wait_exit(&mut self) -> Option<i32> {
        wait_for(Duration::from_secs(30), || self.child.try_wait().unwrap())
            .expect("server did not exit")
            .code()
    }

    /// SIGKILL: no shutdown code runs.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then waits for the exit; returns the exit code.
    #[allow(dead_code)] // used by the outbox and shutdown tests
    pub fn terminate(&mut self) -> Option<i32> {
        self.signal("TERM")
    }

    /// Sends signal `name` (`TERM`, `HUP`) and waits for the exit; returns the exit code.
    pub fn signal(&mut self, name: &str) -> Option<i32> {
        Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        wait_for(Duration::from_secs(30), || self.child.try_wait().unwrap())
            .unwrap_or_else(|| panic!("server did not exit after SIG{name}"))
            .code()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address `serve` printed on `line` for `key` (`listen`, `admin`): `hookledger listening
/// on ADDR` / `hookledger admin on ADDR`, or with `--log-format json` `{"listen":"ADDR"}`.
pub fn printed_addr(line: &str, key: &str) -> Option<SocketAddr> {
    let line = line.trim();
    if line.starts_with('{') {
        let value: serde_json::Value = serde_json::from_str(line).ok()?;
        return value[key].as_str()?.parse().ok();
    }
    let prefix = match key {
        "listen" => "hookledger listening on ".to_string(),
        _ => format!("hookledger {key} on "),
    };
    line.strip_prefix(&prefix)?.parse().ok()
}

/// Polls `f` until it returns `Some` or `deadline` passes.
pub fn wait_for<T>(deadline: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The JSON body of a reply.
pub fn json(reply: &Reply) -> serde_json::Value {
    serde_json::from_str(&reply.body)
        .unwrap_or_else(|e| panic!("reply body is not JSON ({e}): {}", reply.body))
}

/// Asserts a 200 with `outcome` for `event_id`.
#[track_caller]
pub fn assert_outcome(reply: &Reply, event_id: &str, outcome: &str) {
    assert_eq!(reply.status, 200, "{}", reply.body);
    let body = json(reply);
    assert_eq!(body["event_id"], event_id, "{}", reply.body);
    assert_eq!(body["outcome"], outcome, "{}", reply.body);
}

/// Asserts an error reply with `status` and `kind`, and a message for the sender.
#[track_caller]
pub fn assert_error(reply: &Reply, status: u16, kind: &str) {
    assert_eq!(reply.status, status, "{}", reply.body);
    let body = json(reply);
    assert_eq!(body["error"], kind, "{}", reply.body);
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{}",
        reply.body
    );
}

/// Every row of every table, for "nothing changed" assertions.
pub fn snapshot(db: &Db) -> Vec<(String, Vec<String>)> {
    db.tables()
        .into_iter()
        // hookledger's records of the migrations it applied (its own, its handlers') hold
        // when, and its count of refused requests (written by the refusal recorder once a
        // second, so a refusal's row may land before or after a snapshot), and the SQLite
        // writer's filter of keys saved at a clean stop (there after a stop, gone once a server
        // starts), and the ledger's identity (random bytes of each database, which binds a
        // saved filter to it), and the heartbeat (the time, every 30 s, written from the
        // start): not the data under test.
        // `status` tests, `claims.rs` and `github_recovery.rs` check those.
        .filter(|table| {
            ![
                "hookledger_migrations",
                "hookledger_handler_migrations",
                "hookledger_refusals",
                "hookledger_refusal_messages",
                "hookledger_claims_filter",
                "hookledger_ledger",
                "hookledger_heartbeat",
            ]
            .contains(&table.as_str())
        })
        .map(|table| {
            let rows = db.rows_as_text(&table);
            (table, rows)
        })
        .collect()
}

/// The ids among `ids` that have no row in `webhook_events` (acknowledged but lost).
pub fn missing_from_ledger<'a>(
    db: &Db,
    ids: impl IntoIterator<Item = &'a String>,
) -> Vec<&'a String> {
    ids.into_iter()
        .filter(|id| {
            db.one::<i64>(
                "SELECT count(*) FROM webhook_events WHERE event_id = $1",
                &[id],
            ) != 1
        })
        .collect()
}

/// For tests that need something outside Rust (a tool, root): whether to run. Where it is
/// missing the test is skipped with a message, unless `require_var` is set (as `.ci/run`
/// does), where a missing prerequisite fails the test instead.
pub fn prerequisite(available: bool, require_var: &str, what: &str) -> bool {
    if !available {
        assert!(
            std::env::var_os(require_var).is_none(),
            "{require_var} is set: {what}"
        );
        eprintln!("skipped: {what}");
    }
    available
}

/// Whether `program --version` runs and succeeds here (an optional tool a test needs).
pub fn installed(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Owned arguments as the `&[&str]` that [`Server::start`] takes.
pub fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

pub fn ledger_count(db: &Db) -> i64 {
    db.count("SELECT count(*) FROM webhook_events")
}

pub fn credits(db: &Db, account: &str) -> i64 {
    db.one(
        "SELECT coalesce((SELECT credits FROM accounts WHERE id = $1), 0)",
        &[&account],
    )
}

pub fn subscription_status(db: &Db, id: &str) -> Option<String> {
    db.opt("SELECT status FROM subscriptions WHERE id = $1", &[&id])
}

/// A signed-now `invoice.paid` for invoice `in_<id>` of account `acct_1`.
pub fn paid(id: &str) -> Vec<u8> {
    paid_invoice(id, &format!("in_{id}"))
}

/// A signed-now `invoice.paid` with event id `event_id` for `invoice`, account `acct_1`.
pub fn paid_invoice(event_id: &str, invoice: &str) -> Vec<u8> {
    hookledger::internals::invoice_event(
        event_id,
        "invoice.paid",
        now(),
        invoice,
        "cus_1",
        "acct_1",
    )
    .into_bytes()
}

/// A `Stripe-Signature` that passes every check made before the body is read (fresh, well
/// formed) but matches no body: what an attacker without the secret can send.
pub fn forged_signature() -> String {
    format!("t={},v1={}", now(), "ab".repeat(32))
}

/// The header Stripe would send for `body` now.
pub fn signature(body: &[u8]) -> String {
    stripe::sign(&secret(), now(), body)
}

/// One request the fake app received.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub headers: std::collections::HashMap<String, String>,
    pub body: Vec<u8>,
    pub status: u16,
    /// When the request was read.
    pub at: Instant,
}

/// A fake app on port 0: answers each request with the next scripted status (then 200),
/// and records what it got.
pub struct FakeApp {
    pub addr: SocketAddr,
    pub deliveries: Arc<Mutex<Vec<Delivery>>>,
    script: Arc<Mutex<std::collections::VecDeque<u16>>>,
    /// While set, requests are recorded on arrival but not answered.
    held: Arc<std::sync::atomic::AtomicBool>,
    /// While set, the app is down: every request is answered 503 (and recorded), the script
    /// untouched.
    down: Arc<std::sync::atomic::AtomicBool>,
    /// How long each answer waits (a slow app), and the requests in flight now and at most.
    pace: Arc<Pace>,
}

/// A fake app's answer delay and how many requests it had in flight at once.
#[derive(Default)]
pub struct Pace {
    delay_ms: std::sync::atomic::AtomicU64,
    now: std::sync::atomic::AtomicUsize,
    max: std::sync::atomic::AtomicUsize,
}

impl FakeApp {
    pub fn start(script: &[u16]) -> FakeApp {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        FakeApp::serve(listener, script)
    }

    /// An app that is down ([`FakeApp::up`] brings it back) on a port it keeps all along: a
    /// test that let its port go and bound it again could find it taken (`AddrInUse`).
    pub fn start_down() -> FakeApp {
        let app = FakeApp::start(&[]);
        app.down.store(true, std::sync::atomic::Ordering::SeqCst);
        app
    }

    /// The app is back: requests get the script's statuses again (then 200).
    pub fn up(&self) {
        self.down.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// Serves on a given listener.
    pub fn serve(listener: std::net::TcpListener, script: &[u16]) -> FakeApp {
        let addr = listener.local_addr().unwrap();
        let deliveries = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(script.iter().copied().collect()));
        let held = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let pace = Arc::new(Pace::default());
        let (log, queue, hold, is_down, paced) = (
            deliveries.clone(),
            Arc::clone(&script),
            held.clone(),
            down.clone(),
            pace.clone(),
        );
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (log, queue, hold, is_down, paced) = (
                    log.clone(),
                    queue.clone(),
                    hold.clone(),
                    is_down.clone(),
                    paced.clone(),
                );
                std::thread::spawn(move || {
                    let _ = handle(stream, &log, &queue, &hold, &is_down, &paced);
                });
            }
        });
        FakeApp {
            addr,
            deliveries,
            script,
            held,
            down,
            pace,
        }
    }

    /// From now on, requests are recorded when they arrive and answered only after
    /// [`FakeApp::release`]: a delivery attempt stays in flight.
    pub fn hold(&self) {
        self.held.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn release(&self) {
        self.held.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// From now on, each answer comes `delay` after its request was read (a slow app).
    #[allow(dead_code)]
    pub fn slow(&self, delay: Duration) {
        self.pace.delay_ms.store(
            delay.as_millis() as u64,
            std::sync::atomic::Ordering::SeqCst,
        );
    }

    /// The most requests the app was answering at once.
    #[allow(dead_code)]
    pub fn max_in_flight(&self) -> usize {
        self.pace.max.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn url(&self) -> String {
        format!("http://{}/hooks", self.addr)
    }

    pub fn deliveries(&self) -> Vec<Delivery> {
        self.deliveries.lock().unwrap().clone()
    }

    /// Waits until at least `n` requests with status 2xx arrived.
    pub fn wait_delivered(&self, n: usize, deadline: Duration) -> Vec<Delivery> {
        wait_for(deadline, || {
            let ok: Vec<Delivery> = self
                .deliveries()
                .into_iter()
                .filter(|d| (200..300).contains(&d.status))
                .collect();
            (ok.len() >= n).then_some(ok)
        })
        .unwrap_or_else(|| panic!("fewer than {n} deliveries: {:?}", self.deliveries().len()))
    }

    #[allow(dead_code)]
    pub fn push_script(&self, statuses: &[u16]) {
        self.script.lock().unwrap().extend(statuses);
    }
}

fn handle(
    mut stream: TcpStream,
    log: &Mutex<Vec<Delivery>>,
    script: &Mutex<std::collections::VecDeque<u16>>,
    held: &std::sync::atomic::AtomicBool,
    down: &std::sync::atomic::AtomicBool,
    pace: &Pace,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut headers = std::collections::HashMap::new();
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            // The sender died mid-request (e.g. a SIGKILL test): nothing was delivered.
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let trimmed = line.trim_end();
        if trimmed.is_empty() {
            break;
        }
        if let Some((k, v)) = trimmed.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let len: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    reader.read_exact(&mut body)?;
    let status = if down.load(std::sync::atomic::Ordering::SeqCst) {
        503
    } else {
        script.lock().unwrap().pop_front().unwrap_or(200)
    };
    log.lock().unwrap().push(Delivery {
        headers,
        body,
        status,
        at: Instant::now(),
    });
    use std::sync::atomic::Ordering::SeqCst;
    let now = pace.now.fetch_add(1, SeqCst) + 1;
    pace.max.fetch_max(now, SeqCst);
    std::thread::sleep(Duration::from_millis(pace.delay_ms.load(SeqCst)));
    while held.load(SeqCst) {
        std::thread::sleep(Duration::from_millis(10));
    }
    pace.now.fetch_sub(1, SeqCst);
    write!(
        stream,
        "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    )?;
    stream.flush()
}

/// `hookledger serve` on port 0 and `db`, no admin listener: for tests that run the process
/// themselves (a refusal at start-up, another user).
pub fn serve_command(db: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hookledger"));
    serve_args(&mut cmd, db);
    cmd
}

/// [`serve_command`]'s arguments, on a command of the caller's (`setpriv … hookledger`).
pub fn serve_args(cmd: &mut Command, db: impl AsRef<std::ffi::OsStr>) -> &mut Command {
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "off",
        "--db",
    ])
    .arg(db)
}

/// Runs the `hookledger` CLI with `args`; returns (exit code, stdout, stderr).
pub fn cli(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_hookledger"))
        .args(args)
        .env_remove("STRIPE_WEBHOOK_SECRET")
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Waits until the outbox row for `key` has `status`; returns (status, attempts, last_error).
pub fn wait_outbox_status(
    db: &Db,
    key: &str,
    status: &str,
    deadline: Duration,
) -> (String, i64, Option<String>) {
    wait_for(deadline, || outbox_row(db, key).filter(|r| r.0 == status))
        .unwrap_or_else(|| panic!("outbox row {key} not {status}: {:?}", outbox_row(db, key)))
}

/// (status, attempts, last_error) of the outbox row for `key`.
pub fn outbox_row(db: &Db, key: &str) -> Option<(String, i64, Option<String>)> {
    db.opt(
        "SELECT status, attempts, last_error FROM outbox WHERE kind = 'forward' AND key = $1",
        &[&key],
    )
}

/// The secret of the Standard Webhooks vector `standard-webhooks-sign-function-works`.
pub const FORWARD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A local address no one listens on now, for a server that must be told its port before it
/// starts (a config that names its own URL).
pub fn free_addr() -> std::net::SocketAddr {
    let parked = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    parked.local_addr().unwrap()
}

/// An app that is down (its port refuses connections) and the serve arguments to forward to
/// it: many short retries, so no row runs out of schedule before the app is back. For an app
/// that stays down: one that comes back is [`FakeApp::start_down`] (the port is kept).
///
/// The port is bound and never listened on, for the life of the test process: a connection
/// to it is refused, and no other program can take it meanwhile (a port let go could be bound
/// by another and answer).
pub fn down_app() -> (std::net::SocketAddr, Vec<String>) {
    let parked = tokio::net::TcpSocket::new_v4().unwrap();
    parked.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = parked.local_addr().unwrap();
    std::mem::forget(parked);
    (addr, down_app_args(&format!("http://{addr}/hooks")))
}

pub fn down_app_args(url: &str) -> Vec<String> {
    let schedule = vec!["1s"; 60].join(",");
    [
        "--forward-to",
        url,
        "--forward-secret",
        FORWARD_SECRET,
        "--forward-schedule",
        &schedule,
    ]
    .map(str::to_string)
    .to_vec()
}

/// The pipeline's own witness that effects commit with their claims: with forwarding on, each
/// ledger row has exactly one `forward` outbox row keyed by its event id, and no row is
/// without its claim.
pub fn assert_one_outbox_row_per_claim(db: &Db) {
    let claims = ledger_count(db);
    let rows = db.count("SELECT count(*) FROM outbox WHERE kind = 'forward'");
    let matched = db.count(
        "SELECT count(*) FROM webhook_events e JOIN outbox o ON o.kind = 'forward' AND o.key = e.event_id",
    );
    assert_eq!(
        (rows, matched),
        (claims, claims),
        "{claims} claims, {rows} outbox rows, {matched} matching"
    );
}

/// What a stream of events left behind once the server was stopped.
pub struct Streamed<T> {
    /// The ids answered 200, in the order the answers came.
    pub acked: Vec<String>,
    /// Requests sent, answered or not.
    pub sent: usize,
    /// What `stop` returned.
    pub stopped: T,
}

/// `next` for [`stream_until`]: sender `w` sends paid invoice events `{prefix}{w}_{i}`.
pub fn paid_numbered(prefix: &str) -> impl Fn(u64, usize) -> (String, Vec<u8>) + Sync + '_ {
    move |worker, i| {
        let id = format!("{prefix}{worker}_{i}");
        let body = paid(&id);
        (id, body)
    }
}

/// Sends events from `workers` threads until `stop` returns, then until each sender sees the
/// server gone. Sender `w` sends `next(w, i)` as its `i`-th event; a 200 is recorded, a status
/// in `tolerated` is let pass, any other answer fails the test. `stop` gets the number of
/// events acknowledged so far and is meant to kill or terminate the server.
pub fn stream_until<T>(
    url: &str,
    workers: u64,
    next: impl Fn(u64, usize) -> (String, Vec<u8>) + Sync,
    tolerated: &[u16],
    stop: impl FnOnce(&dyn Fn() -> usize) -> T,
) -> Streamed<T> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let acked = Mutex::new(Vec::new());
    let sent = AtomicUsize::new(0);
    let done = AtomicBool::new(false);
    let stopped = std::thread::scope(|s| {
        for worker in 0..workers {
            let (acked, sent, done, next) = (&acked, &sent, &done, &next);
            s.spawn(move || {
                let client = Client::new(Duration::from_secs(5));
                for i in 0.. {
                    if done.load(Ordering::Relaxed) {
                        break;
                    }
                    let (id, body) = next(worker, i);
                    sent.fetch_add(1, Ordering::Relaxed);
                    match client.send(url, &body, &secret(), now()) {
                        Ok(r) if r.status == 200 => acked.lock().unwrap().push(id),
                        Ok(r) if tolerated.contains(&r.status) => {}
                        Ok(r) => panic!("unexpected answer {} for {id}: {}", r.status, r.body),
                        Err(_) => break, // the server is gone
                    }
                }
            });
        }
        let stopped = stop(&|| acked.lock().unwrap().len());
        done.store(true, Ordering::Relaxed);
        stopped
    });
    Streamed {
        acked: acked.into_inner().unwrap(),
        sent: sent.into_inner(),
        stopped,
    }
}

/// What `hookledger send ARGS` sends (`--url` is added: a listener of the test's own): the
/// signature headers (not `Host` or `Content-Length`) and the body, exactly as signed.
pub fn capture_send(args: &[&str]) -> (Vec<(String, String)>, Vec<u8>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "http://{}/webhooks/captured",
        listener.local_addr().unwrap()
    );
    let mut all: Vec<String> = vec!["send".into(), "--url".into(), url];
    all.extend(args.iter().map(|a| a.to_string()));
    let sender = std::thread::spawn(move || cli(&strs(&all)));
    let (mut stream, _) = listener.accept().unwrap();
    let (head, body) = read_request(&mut stream);
    use std::io::Write;
    let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
    drop(stream);
    let _ = sender.join();
    let headers = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(": "))
        .filter(|(k, _)| {
            !k.eq_ignore_ascii_case("content-length") && !k.eq_ignore_ascii_case("host")
        })
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    (headers, body)
}

/// One HTTP/1.1 request: its head and its body (by `Content-Length`).
fn read_request(stream: &mut std::net::TcpStream) -> (String, Vec<u8>) {
    use std::io::Read;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = stream.read(&mut chunk).unwrap();
        assert!(n > 0, "the request ended early");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(": ")?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            let mut body = buf[end + 4..].to_vec();
            while body.len() < length {
                let n = stream.read(&mut chunk).unwrap();
                assert!(n > 0, "the body ended early");
                body.extend_from_slice(&chunk[..n]);
            }
            return (head, body);
        }
    }
}

/// The body the ledger keeps for event `id`, read back with the reference zstd library (not
/// hookledger's reader): a payload is stored compressed, with its source's dictionary once it
/// has one.
pub fn stored_body(db: &Db, id: &str) -> Vec<u8> {
    let (payload, codec, dict): (Vec<u8>, Option<i64>, Option<i64>) = db.one(
        "SELECT payload, CAST(payload_codec AS BIGINT), payload_dict FROM webhook_events
         WHERE event_id = $1",
        &[&id],
    );
    if codec.unwrap_or(0) == 0 {
        return payload;
    }
    let dict: Vec<u8> = match dict {
        Some(d) => db.one(
            "SELECT dict FROM hookledger_payload_dicts WHERE id = $1",
            &[&d],
        ),
        None => Vec::new(),
    };
    zstd::bulk::Decompressor::with_dictionary(&dict)
        .and_then(|mut d| d.decompress(&payload, 64 << 20))
        .unwrap_or_else(|e| panic!("{id}: the stored payload is not zstd: {e}"))
}

/// On SQLite, `hookledger check` finds nothing wrong with the ledger at `db_arg` (no key
/// twice across blocks, payloads decode, outbox rows refer to events, a saved filter whole):
/// run after the tests that write ledgers (claims, kills).
pub fn assert_ledger_checks(db_arg: &str) {
    if store() != Store::Sqlite {
        return;
    }
    let (code, out, err) = cli(&["check", "--db", db_arg]);
    assert_eq!(code, 0, "hookledger check:\n{out}{err}");
}
