//! Delivery into real message brokers: a `[[delivery]]` with `nats` (a JetStream stream),
//! `amqp` (RabbitMQ) or `redis` (a Redis stream), fed by a route (`on = [...]`, no SQL). Each
//! test starts its own `nats-server` and `redis-server` on free ports (Debian's packages);
//! RabbitMQ is the one at `HOOKLEDGER_TEST_AMQP` (`.ci/run` starts it), each test with exchanges
//! and queues of its own. Without them the tests are skipped, unless `HOOKLEDGER_REQUIRE_BROKERS`
//! is set (as `.ci/run` does). What the brokers hold is read with their own clients.

use std::collections::{BTreeMap, BTreeSet};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::util::*;

const WAIT: Duration = Duration::from_secs(30);
/// Events each "arrive once" test sends; every fifth is sent twice.
const EVENTS: usize = 200;
const KIND: &str = "events";

/// Whether the brokers can run here; skipped with a message, or failed under
/// `HOOKLEDGER_REQUIRE_BROKERS`, where they cannot.
fn brokers() -> bool {
    prerequisite(
        installed("nats-server") && installed("redis-server") && amqp_url().is_some(),
        "HOOKLEDGER_REQUIRE_BROKERS",
        "nats-server and redis-server (apt-get install nats-server redis-server) and a RabbitMQ \
         at HOOKLEDGER_TEST_AMQP (apt-get install rabbitmq-server; \
         HOOKLEDGER_TEST_AMQP=amqp://guest:guest@127.0.0.1:5672/%2f) are needed for the broker \
         tests",
    )
}

/// The RabbitMQ of the tests, when it answers.
fn amqp_url() -> Option<String> {
    let url = std::env::var("HOOKLEDGER_TEST_AMQP").ok()?;
    let parsed = url::Url::parse(&url).ok()?;
    let addr = format!("{}:{}", parsed.host_str()?, parsed.port().unwrap_or(5672));
    TcpStream::connect(addr).ok().map(|_| url)
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A broker process of the test's own, killed when dropped.
struct Broker {
    child: Child,
    port: u16,
    _dir: TestDir,
}

impl Broker {
    /// `nats-server` with JetStream, its store in a temp dir, on `port`.
    fn nats_on(port: u16, extra: &[&str]) -> Broker {
        let dir = test_dir();
        let store = dir.path().display().to_string();
        let port_arg = port.to_string();
        let mut args = vec!["-js", "-a", "127.0.0.1", "-p", &port_arg, "-sd", &store];
        args.extend_from_slice(extra);
        Broker::spawn("nats-server", &args, port, dir)
    }

    fn nats() -> Broker {
        Broker::nats_on(free_port(), &[])
    }

    /// `redis-server` on `port`, keeping nothing on disk.
    fn redis_on(port: u16) -> Broker {
        let dir = test_dir();
        let port_arg = port.to_string();
        let store = dir.path().display().to_string();
        let args = [
            "--port",
            &port_arg,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            &store,
        ];
        Broker::spawn("redis-server", &args, port, dir)
    }

    fn redis() -> Broker {
        Broker::redis_on(free_port())
    }

    fn spawn(program: &str, args: &[&str], port: u16, dir: TestDir) -> Broker {
        let child = Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        let broker = Broker {
            child,
            port,
            _dir: dir,
        };
        wait_for(Duration::from_secs(10), || {
            TcpStream::connect(("127.0.0.1", port)).ok()
        })
        .unwrap_or_else(|| panic!("{program} did not listen on {port}"));
        broker
    }

    fn url(&self, scheme: &str) -> String {
        format!("{scheme}://127.0.0.1:{}", self.port)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A runtime for the brokers' async clients (the test reads what they hold).
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

/// Creates the JetStream stream `name` for `subjects` with a duplicate window of `window`.
fn make_stream(nats: &Broker, name: &str, subjects: &[&str], window: Duration, max_msg: i32) {
    block_on(async {
        let client = async_nats::connect(nats.url("nats")).await.unwrap();
        let jetstream = async_nats::jetstream::new(client);
        jetstream
            .create_stream(async_nats::jetstream::stream::Config {
                name: name.to_string(),
                subjects: subjects.iter().map(|s| s.to_string()).collect(),
                duplicate_window: window,
                max_message_size: max_msg,
                ..Default::default()
            })
            .await
            .unwrap();
    });
}

/// A message as a broker holds it: the dedupe id it was published with, its metadata and body.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    id: String,
    fields: BTreeMap<String, String>,
    body: Vec<u8>,
}

/// Every message of the JetStream stream `name`, in order.
fn nats_messages(nats: &Broker, name: &str) -> Vec<Held> {
    block_on(async {
        let client = async_nats::connect(nats.url("nats")).await.unwrap();
        let jetstream = async_nats::jetstream::new(client);
        let mut stream = jetstream.get_stream(name).await.unwrap();
        let state = stream.info().await.unwrap().state.clone();
        let mut held = Vec::new();
        for seq in state.first_sequence..=state.last_sequence {
            if state.messages == 0 {
                break;
            }
            let message = stream.get_raw_message(seq).await.unwrap();
            let mut fields = BTreeMap::new();
            let mut id = String::new();
            for (name, values) in message.headers.iter() {
                let value = values.first().map(|v| v.as_str().to_string());
                let value = value.unwrap_or_default();
                if name.to_string() == "Nats-Msg-Id" {
                    id = value;
                } else {
                    fields.insert(name.to_string(), value);
                }
            }
            held.push(Held {
                id,
                fields,
                body: message.payload.to_vec(),
            });
        }
        held
    })
}

/// Every entry of the Redis stream `name`: its guard's id is not in the entry, so `id` is the
/// entry's id.
fn redis_entries(redis: &Broker, name: &str) -> Vec<Held> {
    let client = redis::Client::open(redis.url("redis")).unwrap();
    let mut connection = client.get_connection().unwrap();
    let entries: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
        .arg(name)
        .arg("-")
        .arg("+")
        .query(&mut connection)
        .unwrap();
    entries
        .into_iter()
        .map(|(id, flat)| {
            let mut fields = BTreeMap::new();
            let mut body = Vec::new();
            for pair in flat.chunks(2) {
                let name = String::from_utf8(pair[0].clone()).unwrap();
                if name == "body" {
                    body = pair[1].clone();
                } else {
                    fields.insert(name, String::from_utf8(pair[1].clone()).unwrap());
                }
            }
            Held { id, fields, body }
        })
        .collect()
}

fn redis_cmd(redis: &Broker, args: &[&str]) -> String {
    let client = redis::Client::open(redis.url("redis")).unwrap();
    let mut connection = client.get_connection().unwrap();
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    let value: redis::Value = cmd.query(&mut connection).unwrap();
    format!("{value:?}")
}

/// A channel on the tests' RabbitMQ, with its connection (which must outlive it).
async fn amqp_channel() -> (lapin::Connection, lapin::Channel) {
    let properties = lapin::ConnectionProperties::default();
    let connection = lapin::Connection::connect(&amqp_url().unwrap(), properties)
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    (connection, channel)
}

/// An exchange and a durable queue bound to it with `routing_key`, named after `tag`, on the
/// tests' RabbitMQ (as an operator makes them). Returns the exchange and the queue.
fn make_exchange(tag: &str) -> (String, String) {
    use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
    let exchange = format!("hl-{tag}-{}", fastrand::u32(..));
    let queue = format!("{exchange}-q");
    block_on(async {
        let (_connection, channel) = amqp_channel().await;
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        channel
            .exchange_declare(
                exchange.as_str().into(),
                lapin::ExchangeKind::Direct,
                durable,
                Default::default(),
            )
            .await
            .unwrap();
        let durable = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        channel
            .queue_declare(queue.as_str().into(), durable, Default::default())
            .await
            .unwrap();
        channel
            .queue_bind(
                queue.as_str().into(),
                exchange.as_str().into(),
                "events".into(),
                QueueBindOptions::default(),
                Default::default(),
            )
            .await
            .unwrap();
    });
    (exchange, queue)
}

/// Every message in `queue` (taken off it, acknowledged), its `message_id` as `id`.
fn amqp_messages(queue: &str) -> Vec<Held> {
    use lapin::options::{BasicAckOptions, BasicGetOptions, QueueDeleteOptions};
    block_on(async {
        let (_connection, channel) = amqp_channel().await;
        let mut held = Vec::new();
        while let Some(message) = channel
            .basic_get(queue.into(), BasicGetOptions::default())
            .await
            .unwrap()
        {
            let properties = &message.delivery.properties;
            assert_eq!(*properties.delivery_mode(), Some(2), "not persistent");
            let mut fields = BTreeMap::new();
            for (name, value) in &properties.headers().clone().unwrap_or_default() {
                if let lapin::types::AMQPValue::LongString(value) = value {
                    fields.insert(name.to_string(), value.to_string());
                }
            }
            held.push(Held {
                id: properties
                    .message_id()
                    .as_ref()
                    .map(|id| id.to_string())
                    .unwrap_or_default(),
                fields,
                body: message.delivery.data.clone(),
            });
            message
                .delivery
                .ack(BasicAckOptions::default())
                .await
                .unwrap();
        }
        let _ = channel
            .queue_delete(queue.into(), QueueDeleteOptions::default())
            .await;
        held
    })
}

/// The broker table of a delivery into the JetStream `stream` at `url`.
fn nats_table(url: &str, subject: &str, stream: &str) -> String {
    format!("nats = {{ url = \"{url}\", subject = \"{subject}\", stream = \"{stream}\" }}")
}

/// The broker table of a delivery into the Redis `stream` at `url`, which it may create.
fn redis_table(url: &str, stream: &str) -> String {
    format!("redis = {{ url = \"{url}\", stream = \"{stream}\", create = true }}")
}

/// The broker table of a delivery to `exchange` (routing key `events`) at `url`.
fn amqp_table(url: &str, exchange: &str) -> String {
    format!("amqp = {{ url = \"{url}\", exchange = \"{exchange}\", routing_key = \"events\" }}")
}

/// A config with the Stripe source and the `events` delivery of every Stripe event (a route,
/// no SQL) into `broker` (the delivery's broker table, inline), with `extra` lines: its path.
fn config(dir: &Path, broker: &str, extra: &str) -> String {
    let path = dir.join("hookledger.toml");
    std::fs::write(&path, config_text(broker, extra)).unwrap();
    path.to_str().unwrap().to_string()
}

fn config_text(broker: &str, extra: &str) -> String {
    format!(
        r#"{STRIPE_SOURCE_TOML}
[[delivery]]
kind = "{KIND}"
{broker}
on = [{{ source = "stripe", types = ["invoice.*"] }}]
schedule = ["1s", "1s", "1s", "1s", "1s", "1s", "1s", "1s", "1s", "1s"]
breaker_failures = 1000
{extra}
"#
    )
}

/// Sends `n` new events, `evt_{prefix}_{i}`, with every fifth sent twice; their ids and
/// bodies.
fn send_events(server: &Server, prefix: &str, n: usize) -> BTreeMap<String, Vec<u8>> {
    let mut sent = BTreeMap::new();
    for i in 0..n {
        let id = format!("evt_{prefix}_{i}");
        let body = paid(&id);
        for _ in 0..if i % 5 == 0 { 2 } else { 1 } {
            let reply = server.send(&body);
            assert_eq!(reply.status, 200, "{id}: {}", reply.body);
        }
        sent.insert(id, body);
    }
    sent
}

/// Waits until each of the `n` rows is pending after two attempts at least; their errors.
fn wait_retried(server: &Server, db: &Db, n: usize) -> Vec<String> {
    wait_for(WAIT, || {
        let errors = db.strings(&format!(
            "SELECT last_error FROM outbox WHERE kind = '{KIND}' AND attempts >= 2 \
             AND status = 'pending'"
        ));
        (errors.len() == n).then_some(errors)
    })
    .unwrap_or_else(|| panic!("rows not retried; log: {}", server.log()))
}

fn done(db: &Db) -> i64 {
    db.count(&format!(
        "SELECT count(*) FROM outbox WHERE kind = '{KIND}' AND status = 'done'"
    ))
}

fn wait_all_done(server: &Server, db: &Db, n: usize) {
    wait_for(WAIT, || (done(db) == n as i64).then_some(())).unwrap_or_else(|| {
        panic!(
            "{} of {n} rows done; rows: {:?}\nlog: {}",
            done(db),
            db.strings(&format!(
                "SELECT status || ' ' || attempts || ' ' || coalesce(last_error, '') FROM outbox \
                 WHERE kind = '{KIND}' AND status <> 'done' LIMIT 3"
            )),
            server.log()
        )
    });
}

/// Each event once, with the body sent and its metadata; `deduped`: each dedupe id once too.
fn assert_each_once(held: &[Held], sent: &BTreeMap<String, Vec<u8>>, what: &str) {
    let mut seen = BTreeSet::new();
    for message in held {
        let id = &message.fields["hookledger-event-id"];
        assert!(seen.insert(id.clone()), "{what}: {id} twice");
        assert_eq!(
            message.body, sent[id],
            "{what}: {id}'s body is not the one sent"
        );
        assert_eq!(message.fields["hookledger-source"], "stripe", "{what}");
        assert_eq!(message.fields["hookledger-event-type"], "invoice.paid");
        assert_eq!(message.fields["hookledger-kind"], KIND);
        assert_eq!(message.fields["hookledger-key"], *id);
    }
    assert_eq!(
        seen.len(),
        sent.len(),
        "{what}: {} of {}",
        seen.len(),
        sent.len()
    );
}

/// A server delivering into `broker` with [`EVENTS`] events sent (some twice) and every row
/// done: the server (which keeps its directory) and what was sent.
fn delivered(broker: &str, prefix: &str) -> (Server, BTreeMap<String, Vec<u8>>) {
    let dir = test_dir();
    let path = config(dir.path(), broker, "");
    let mut server = Server::start_in(dir.path(), &["--config", &path]);
    let sent = send_events(&server, prefix, EVENTS);
    wait_all_done(&server, &server.db(), EVENTS);
    server.keep(dir);
    (server, sent)
}

#[test]
fn each_event_is_in_the_jetstream_stream_once_with_its_metadata() {
    if !brokers() {
        return;
    }
    let nats = Broker::nats();
    make_stream(&nats, "EVENTS", &["hooks.>"], Duration::from_secs(7200), -1);
    let broker = nats_table(&nats.url("nats"), "hooks.stripe", "EVENTS");
    let (server, sent) = delivered(&broker, "n");
    let db = server.db();
    let held = nats_messages(&nats, "EVENTS");
    assert_each_once(&held, &sent, "NATS");
    // The dedupe id is the row's: kind, row id and times queued.
    let ids: Vec<String> = db.strings(&format!(
        "SELECT kind || ':' || id || ':' || queued FROM outbox WHERE kind = '{KIND}' ORDER BY id"
    ));
    let mut published: Vec<String> = held.iter().map(|h| h.id.clone()).collect();
    published.sort_by_key(|id| id.split(':').nth(1).unwrap().parse::<i64>().unwrap());
    assert_eq!(published, ids);
}

#[test]
fn each_event_is_in_the_redis_stream_once_with_its_metadata() {
    if !brokers() {
        return;
    }
    let redis = Broker::redis();
    let broker = redis_table(&redis.url("redis"), "hooks");
    let (_server, sent) = delivered(&broker, "r");
    let held = redis_entries(&redis, "hooks");
    assert_each_once(&held, &sent, "Redis");
}

#[test]
fn each_event_is_in_the_rabbitmq_queue_with_its_message_id() {
    if !brokers() {
        return;
    }
    let (exchange, queue) = make_exchange("once");
    let broker = amqp_table(&amqp_url().unwrap(), &exchange);
    let (server, sent) = delivered(&broker, "a");
    let db = server.db();
    let held = amqp_messages(&queue);
    assert_each_once(&held, &sent, "RabbitMQ");
    let ids: BTreeSet<String> = held.iter().map(|h| h.id.clone()).collect();
    let rows: BTreeSet<String> = db
        .strings(&format!(
            "SELECT kind || ':' || id || ':' || queued FROM outbox WHERE kind = '{KIND}'"
        ))
        .into_iter()
        .collect();
    assert_eq!(ids, rows, "message_id is the row's id");
}

/// Marks every row pending again as queued (as a crash after the broker's confirm and before
/// the row's write leaves it), so that the next server publishes each again.
fn as_if_crashed_after_publishing(db: &Db) {
    db.execute(
        &format!("UPDATE outbox SET status = 'pending', next_attempt_at = 0, done_at = NULL WHERE kind = '{KIND}'"),
        &[],
    );
}

#[test]
fn a_row_published_again_after_a_crash_is_stored_once_by_jetstream_and_redis() {
    if !brokers() {
        return;
    }
    let nats = Broker::nats();
    make_stream(&nats, "AGAIN", &["again"], Duration::from_secs(7200), -1);
    let redis = Broker::redis();
    redis_cmd(&redis, &["XADD", "again", "*", "made", "by-the-operator"]);
    for (broker, held) in [
        (
            nats_table(&nats.url("nats"), "again", "AGAIN"),
            Box::new(|| nats_messages(&nats, "AGAIN")) as Box<dyn Fn() -> Vec<Held>>,
        ),
        (
            format!(
                "redis = {{ url = \"{}\", stream = \"again\" }}",
                redis.url("redis")
            ),
            Box::new(|| {
                let mut entries = redis_entries(&redis, "again");
                entries.retain(|e| !e.fields.contains_key("made"));
                entries
            }),
        ),
    ] {
        let dir = test_dir();
        let path = config(dir.path(), &broker, "");
        let mut server = Server::start_in(dir.path(), &["--config", &path]);
        let db = server.db();
        let sent = send_events(&server, "again", 20);
        wait_all_done(&server, &db, 20);
        assert_eq!(held().len(), 20, "{broker}");
        server.terminate();
        as_if_crashed_after_publishing(&db);
        let server = Server::start_in(dir.path(), &["--config", &path]);
        wait_all_done(&server, &db, 20);
        let attempts = db.count(&format!(
            "SELECT CAST(sum(attempts) AS BIGINT) FROM outbox WHERE kind = '{KIND}'"
        ));
        assert!(attempts >= 40, "{attempts}: not attempted again");
        assert_each_once(&held(), &sent, &broker);
    }
}

#[test]
fn after_a_kill_mid_publish_each_event_is_in_each_broker_once_and_in_rabbitmq_at_least_once() {
    if !brokers() || skipped_through_pooler("the killed server's rows wait for their lease") {
        return;
    }
    let nats = Broker::nats();
    make_stream(&nats, "KILLED", &["killed"], Duration::from_secs(7200), -1);
    let redis = Broker::redis();
    let (exchange, queue) = make_exchange("killed");
    let deliveries = [
        ("nats", nats_table(&nats.url("nats"), "killed", "KILLED")),
        ("redis", redis_table(&redis.url("redis"), "killed")),
        ("amqp", amqp_table(&amqp_url().unwrap(), &exchange)),
    ];
    for (name, broker) in &deliveries {
        let dir = test_dir();
        // A slow lane, so that the kill lands while rows are being published.
        let path = config(dir.path(), broker, "rate = \"100/s\"\nconcurrency = 4");
        let mut server = Server::start_in(dir.path(), &["--config", &path]);
        let db = server.db();
        let sent = send_events(&server, name, EVENTS);
        wait_for(WAIT, || (done(&db) >= 20).then_some(())).expect("publishing started");
        server.kill();
        let before = done(&db);
        assert!(before < EVENTS as i64, "{name}: all done before the kill");
        let server = Server::start_in(dir.path(), &["--config", &path]);
        wait_all_done(&server, &db, EVENTS);
        match *name {
            "nats" => assert_each_once(&nats_messages(&nats, "KILLED"), &sent, name),
            "redis" => assert_each_once(&redis_entries(&redis, "killed"), &sent, name),
            _ => {
                // At least once: each event's id is there, and every copy is the same row's.
                let held = amqp_messages(&queue);
                let mut by_event: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
                for message in &held {
                    by_event
                        .entry(message.fields["hookledger-event-id"].clone())
                        .or_default()
                        .insert(message.id.clone());
                }
                assert_eq!(
                    by_event.keys().cloned().collect::<BTreeSet<_>>(),
                    sent.keys().cloned().collect::<BTreeSet<_>>()
                );
                assert!(by_event.values().all(|ids| ids.len() == 1), "{by_event:?}");
            }
        }
    }
}

#[test]
fn a_broker_that_is_down_or_refuses_the_credentials_keeps_the_rows_until_it_takes_them() {
    if !brokers() {
        return;
    }
    // NATS and Redis down at start and for the first attempts, then up on the same port.
    let (nats_port, redis_port) = (free_port(), free_port());
    for (name, broker, start) in [
        (
            "nats",
            format!(
                "nats = {{ url = \"nats://127.0.0.1:{nats_port}\", subject = \"late\", \
                 stream = \"LATE\", create = true }}"
            ),
            Box::new(move || {
                let nats = Broker::nats_on(nats_port, &[]);
                make_stream(&nats, "LATE", &["late"], Duration::from_secs(7200), -1);
                nats
            }) as Box<dyn Fn() -> Broker>,
        ),
        (
            "redis",
            format!(
                "redis = {{ url = \"redis://127.0.0.1:{redis_port}\", stream = \"late\", \
                 create = true }}"
            ),
            Box::new(move || Broker::redis_on(redis_port)),
        ),
    ] {
        let dir = test_dir();
        let path = config(dir.path(), &broker, "");
        let server = Server::start_in(dir.path(), &["--config", &path]);
        let db = server.db();
        let sent = send_events(&server, &format!("late_{name}"), 10);
        let failing = wait_retried(&server, &db, 10);
        let said = if name == "nats" {
            "NATS at"
        } else {
            "Redis at"
        };
        assert!(failing.iter().all(|e| e.contains(said)), "{failing:?}");
        let up = start();
        wait_all_done(&server, &db, 10);
        let held = if name == "nats" {
            nats_messages(&up, "LATE")
        } else {
            redis_entries(&up, "late")
        };
        assert_each_once(&held, &sent, name);
    }
}

#[test]
fn rabbitmq_refusing_the_credentials_keeps_the_rows_until_the_user_exists() {
    if !brokers() {
        return;
    }
    if !prerequisite(
        Command::new("rabbitmqctl")
            .arg("status")
            .output()
            .is_ok_and(|o| o.status.success()),
        "HOOKLEDGER_REQUIRE_BROKERS",
        "rabbitmqctl (run as root, beside the RabbitMQ of HOOKLEDGER_TEST_AMQP) is needed",
    ) {
        return;
    }
    let (exchange, queue) = make_exchange("creds");
    let user = format!("hl-user-{}", fastrand::u32(..));
    let base = url::Url::parse(&amqp_url().unwrap()).unwrap();
    let url = format!(
        "amqp://{user}:not-yet@{}:{}/%2f",
        base.host_str().unwrap(),
        base.port().unwrap_or(5672)
    );
    let dir = test_dir();
    let broker = format!(
        "amqp = {{ url = \"{url}\", exchange = \"{exchange}\", routing_key = \"events\" }}"
    );
    let path = config(dir.path(), &broker, "");
    let server = Server::start_in(dir.path(), &["--config", &path]);
    let db = server.db();
    let sent = send_events(&server, "creds", 10);
    let failing = wait_retried(&server, &db, 10);
    assert!(
        failing
            .iter()
            .all(|e| e.contains("RabbitMQ at") && !e.contains("not-yet")),
        "{failing:?}"
    );
    assert!(!server.log().contains("not-yet"), "the password in the log");
    let ctl = |args: &[&str]| {
        let out = Command::new("rabbitmqctl").args(args).output().unwrap();
        assert!(out.status.success(), "rabbitmqctl {args:?}: {out:?}");
    };
    ctl(&["add_user", &user, "not-yet"]);
    ctl(&["set_permissions", "-p", "/", &user, ".*", ".*", ".*"]);
    wait_all_done(&server, &db, 10);
    ctl(&["delete_user", &user]);
    assert_each_once(&amqp_messages(&queue), &sent, "RabbitMQ");
}

#[test]
fn a_message_over_the_brokers_limit_is_dead_with_the_brokers_reason() {
    if !brokers() {
        return;
    }
    // The stream takes messages of at most 1 KiB; an invoice event is more.
    let nats = Broker::nats();
    make_stream(&nats, "SMALL", &["small"], Duration::from_secs(7200), 1024);
    let dir = test_dir();
    let broker = nats_table(&nats.url("nats"), "small", "SMALL");
    let path = config(dir.path(), &broker, "");
    let server = Server::start_in(dir.path(), &["--config", &path]);
    let db = server.db();
    let body = paid("evt_big");
    assert!(body.len() > 1024);
    assert_eq!(server.send(&body).status, 200);
    let dead = wait_for(WAIT, || {
        db.strings(&format!(
            "SELECT attempts || ' ' || last_error FROM outbox WHERE kind = '{KIND}' \
             AND status = 'dead'"
        ))
        .pop()
    })
    .unwrap_or_else(|| panic!("not dead; log: {}", server.log()));
    assert!(
        dead.starts_with("1 ") && dead.contains("NATS at") && dead.contains("maximum"),
        "{dead}"
    );
    assert!(nats_messages(&nats, "SMALL").is_empty());
}

#[test]
fn a_stream_subject_or_exchange_that_is_not_there_stops_start_up_naming_the_key() {
    if !brokers() {
        return;
    }
    let nats = Broker::nats();
    make_stream(&nats, "THERE", &["there.*"], Duration::from_secs(7200), -1);
    let redis = Broker::redis();
    redis_cmd(&redis, &["SET", "plain", "a string"]);
    let (nats_url, redis_url, amqp) = (nats.url("nats"), redis.url("redis"), amqp_url().unwrap());
    let cases = [
        (
            format!("nats = {{ url = \"{nats_url}\", subject = \"there.a\", stream = \"MISSING\" }}"),
            "delivery `events`.nats.stream: there is no JetStream stream `MISSING`",
        ),
        (
            format!("nats = {{ url = \"{nats_url}\", subject = \"elsewhere\", stream = \"THERE\" }}"),
            "delivery `events`.nats.subject: the stream `THERE` does not take `elsewhere`",
        ),
        (
            format!("redis = {{ url = \"{redis_url}\", stream = \"missing\" }}"),
            "delivery `events`.redis.stream: there is no stream `missing`",
        ),
        (
            format!("redis = {{ url = \"{redis_url}\", stream = \"plain\" }}"),
            "delivery `events`.redis.stream: `plain` at redis://127.0.0.1",
        ),
        (
            format!("amqp = {{ url = \"{amqp}\", exchange = \"hl-missing\", routing_key = \"x\" }}"),
            "delivery `events`.amqp.exchange: there is no exchange `hl-missing`",
        ),
        (
            "nats = { url = \"http://127.0.0.1:1\", subject = \"a\", stream = \"B\" }".to_string(),
            "delivery `events`.nats.url: must be a nats:// or tls:// URL with a host",
        ),
        (
            format!("nats = {{ url = \"{nats_url}\", subject = \"a.*\", stream = \"B\" }}"),
            "delivery `events`.nats.subject: must be a subject to publish to",
        ),
        (
            format!("url = \"http://127.0.0.1:1/\"\nredis = {{ url = \"{redis_url}\", stream = \"s\" }}"),
            "delivery `events`.redis: a delivery has one of `url`, `command`, `nats`, `amqp` and \
             `redis`; this one has `url` too",
        ),
    ];
    let cases: Vec<(String, &str)> = cases
        .into_iter()
        .map(|(broker, named)| (config_text(&broker, ""), named))
        .collect();
    assert_each_refused_at_start(&cases, ("STRIPE_WEBHOOK_SECRET", SECRET));
}

/// `examples/jetstream_worker.rs`, as `cargo test` builds it beside this test binary.
fn jetstream_worker() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().unwrap();
    let worker = exe.parent()?.parent()?.join("examples/jetstream_worker");
    prerequisite(
        worker.exists(),
        "HOOKLEDGER_REQUIRE_BROKERS",
        "the jetstream_worker example, built by `cargo test --workspace`",
    )
    .then_some(worker)
}

#[test]
fn the_jetstream_worker_example_records_each_event_once() {
    if !brokers() {
        return;
    }
    let Some(worker) = jetstream_worker() else {
        return;
    };
    let nats = Broker::nats();
    let dir = test_dir();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let example = std::fs::read_to_string(repo.join("examples/jetstream-worker.toml")).unwrap();
    let config = example.replace("nats://127.0.0.1:4222", &nats.url("nats"));
    assert_ne!(config, example, "the example names its NATS URL");
    let path = dir.path().join("hookledger.toml");
    std::fs::write(&path, config).unwrap();
    let server = Server::start_in(dir.path(), &["--config", path.to_str().unwrap()]);
    let sent: BTreeSet<String> = send_events(&server, "worker", 30).into_keys().collect();
    let worker_db = dir.path().join("worker.db");
    let mut child = Command::new(worker)
        .args(["--nats", &nats.url("nats"), "--exit-after", "30", "--db"])
        .arg(&worker_db)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let exited = wait_for(WAIT, || child.try_wait().unwrap());
    if exited.is_none() {
        let _ = child.kill();
    }
    assert!(
        exited.is_some_and(|s| s.success()),
        "the worker: {exited:?}"
    );
    let recorded = rusqlite::Connection::open(&worker_db).unwrap();
    let mut query = recorded
        .prepare("SELECT event_id FROM events WHERE source = 'stripe' AND type = 'invoice.paid'")
        .unwrap();
    let ids: BTreeSet<String> = query
        .query_map([], |row| row.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(ids, sent);
}
