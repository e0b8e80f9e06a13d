//! What this process saw, for `/metrics` (Prometheus) and `/status`: counters that the request
//! path, the writer and the outbox worker bump, and the last events of each source.
//!
//! Every family is there from the first scrape, and the series whose labels are known at
//! start (each source's request duration, each delivery kind's attempts and breaker) are
//! there at zero: an alert on a rate sees 0, not nothing.
//!
//! `/metrics` answers in the OpenMetrics text format to a scraper that asks for it
//! (Prometheus does), and in the Prometheus text format 0.0.4 otherwise ([`to_prometheus_text`]):
//! what `curl` and `promtool check metrics` read.
//!
//! Recording costs a few atomic operations and, per event, one short lock of its source's
//! [`Activity`]. The outbox gauges are read from the database when `/metrics` is scraped, not
//! kept up to date on the hot path.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, RwLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::store::listings::OutboxSummary;
use crate::store::WalWatch;

/// Events kept per source for `/status`.
const RECENT: usize = 10;
/// Minutes of throughput kept per source for `/status`.
pub(crate) const MINUTES: usize = 15;
/// Distinct `type` label values per source: a type comes from the request (for some schemes
/// an unsigned header), so a sender could otherwise make one series per request. Later types
/// are counted as [`OTHER_TYPE`].
pub(crate) const MAX_TYPES: usize = 100;
/// The `type` label of the types past [`MAX_TYPES`].
pub(crate) const OTHER_TYPE: &str = "other";

/// How a verified event ended, as counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Processed,
    Duplicate,
    /// Verified and read, then not committed (a handler refused it, or the database did).
    Failed,
    /// A handshake the sender requires before it delivers, answered; nothing claimed.
    Challenge,
}

impl Outcome {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Outcome::Processed => "processed",
            Outcome::Duplicate => "duplicate",
            Outcome::Failed => "failed",
            Outcome::Challenge => "challenge",
        }
    }
}

impl From<crate::store::Outcome> for Outcome {
    fn from(outcome: crate::store::Outcome) -> Self {
        match outcome {
            crate::store::Outcome::Processed => Outcome::Processed,
            crate::store::Outcome::Duplicate => Outcome::Duplicate,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    source: Arc<str>,
    r#type: String,
    outcome: &'static str,
}

/// One reconcile run of a source, as the console shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Recovery {
    /// When it ended (Unix seconds).
    pub(crate) at: i64,
    /// What it counted, or why it stopped.
    pub(crate) result: Result<RecoveryCounts, String>,
}

/// What a reconcile run counted (the recoveries' `Counts`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RecoveryCounts {
    pub(crate) found: u64,
    pub(crate) applied: u64,
    pub(crate) redelivered: u64,
    pub(crate) already_present: u64,
    pub(crate) failed: u64,
}

/// A time no instance was up: from the last heartbeat before this start to the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Downtime {
    pub(crate) from: i64,
    pub(crate) to: i64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabels {
    version: &'static str,
}

/// The request-duration histogram of one source: 0.25 ms to about 4 s.
fn request_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_25, 2.0, 15))
}

/// The results of a delivery attempt (`Attempt::label`), each a series from the start.
const DELIVERY_RESULTS: [&str; 3] = ["delivered", "retry", "dead"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RejectedLabels {
    source: Arc<str>,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeliveryLabels {
    kind: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutboxLabels {
    kind: String,
    status: String,
}

/// The writer's own metrics, handed to it when it starts.
#[derive(Clone, Debug)]
pub(crate) struct WriterMetrics {
    /// Jobs per transaction.
    pub(crate) batch_size: Histogram,
    /// Jobs queued and not yet taken by the writer.
    pub(crate) queue_depth: Gauge,
}

impl Default for WriterMetrics {
    fn default() -> Self {
        WriterMetrics {
            batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 10)),
            queue_depth: Gauge::default(),
        }
    }
}

/// One event as `/status` lists it.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    /// Unix seconds it was answered.
    pub(crate) at: i64,
    pub(crate) id: String,
    pub(crate) kind: String,
    pub(crate) outcome: Outcome,
    /// Why it failed (the answer's error kind); empty otherwise.
    pub(crate) reason: &'static str,
    pub(crate) millis: f64,
}

/// Events answered in one minute.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Minute {
    /// Unix minute (seconds / 60).
    pub(crate) minute: i64,
    pub(crate) processed: u64,
    pub(crate) duplicate: u64,
    pub(crate) failed: u64,
}

/// One source's last events (newest first) and its events per minute (oldest first).
#[derive(Debug, Clone, Default)]
pub(crate) struct Activity {
    pub(crate) recent: VecDeque<Seen>,
    pub(crate) minutes: VecDeque<Minute>,
    /// Requests refused before an event could be read (signature, size, body).
    pub(crate) rejected: u64,
}

impl Activity {
    fn record(&mut self, seen: Seen) {
        let minute = seen.at.div_euclid(60);
        if self.minutes.back().is_none_or(|m| m.minute < minute) {
            if self.minutes.len() == MINUTES {
                self.minutes.pop_front();
            }
            self.minutes.push_back(Minute {
                minute,
                ..Minute::default()
            });
        }
        // Usually the newest; an earlier one when two requests crossed a minute's end.
        if let Some(m) = self.minutes.iter_mut().rev().find(|m| m.minute == minute) {
            match seen.outcome {
                Outcome::Processed => m.processed += 1,
                Outcome::Duplicate => m.duplicate += 1,
                Outcome::Failed => m.failed += 1,
                Outcome::Challenge => {}
            }
        }
        if self.recent.len() == RECENT {
            self.recent.pop_back();
        }
        self.recent.push_front(seen);
    }
}

/// A delivery kind's lane as its worker last said: whether its breaker is open (its pending
/// rows are paused), and how many attempts run now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Lane {
    pub(crate) breaker_open: bool,
    pub(crate) in_flight: i64,
}

/// Everything counted, and the registry `/metrics` encodes.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    events: Family<EventLabels, Counter>,
    rejected: Family<RejectedLabels, Counter>,
    /// Events `serve`'s reconcile runs applied from a provider's API, by source.
    recovered: Family<SourceLabels, Counter>,
    /// Each source's last reconcile run, for the console.
    recoveries: Mutex<HashMap<Arc<str>, Recovery>>,
    /// The last time no instance was up before this one started, by the heartbeat.
    downtime: Mutex<Option<Downtime>>,
    request_seconds: Family<SourceLabels, Histogram, fn() -> Histogram>,
    writer: WriterMetrics,
    deliveries: Family<DeliveryLabels, Counter>,
    breaker_open: Family<KindLabels, Gauge>,
    in_flight: Family<KindLabels, Gauge>,
    /// Each delivery kind's breaker and attempts in flight, for `/status` and the `paused`
    /// rows: written by the outbox worker's lanes, read at scrape time.
    lanes: Mutex<BTreeMap<String, Lane>>,
    outbox_rows: Family<OutboxLabels, Gauge>,
    outbox_oldest_pending: Gauge,
    /// One per configured source: only those can reach a handler (a reload changes which).
    activity: RwLock<HashMap<Arc<str>, Mutex<Activity>>>,
    /// The `type` label values of each configured source so far (at most [`MAX_TYPES`]).
    types: RwLock<HashMap<Arc<str>, Mutex<HashSet<String>>>>,
    /// When the serving config was loaded (Unix seconds), and the SHA-256 of its file.
    config_loaded: Gauge,
    config_sha256: Mutex<Option<String>>,
    /// The configured sources' names, in config order (the console lists them so).
    names: RwLock<Vec<Arc<str>>>,
    /// Reloads refused (a bad file, a key that cannot change live).
    reloads_refused: Counter,
    /// The label of requests for a source that does not exist.
    unknown_source: Arc<str>,
    /// SQLite's write-ahead log as its checkpointer sees it ([`Metrics::with_wal`]), with the
    /// series that show it.
    wal: Option<(Arc<WalWatch>, Gauge, Counter)>,
    /// One scrape at a time sets the outbox gauges and encodes.
    scrape: Mutex<()>,
    /// The families that may have no series yet (their labels come from requests or rows),
    /// as `# HELP` and `# TYPE` lines: written when the encoder, which skips an empty family,
    /// left them out.
    described: Vec<(String, String)>,
}

impl Metrics {
    /// Metrics for `sources` (the configured source names); `spans_dropped` is the trace
    /// exporter's count of the spans it dropped.
    pub(crate) fn new<'a>(
        sources: impl IntoIterator<Item = &'a Arc<str>>,
        spans_dropped: Counter,
    ) -> Metrics {
        let sources: Vec<&Arc<str>> = sources.into_iter().collect();
        let unknown_source: Arc<str> = Arc::from("-");
        let mut registry = Registry::with_prefix("hookledger");
        registry.register(
            "build",
            "The running hookledger's version (always 1)",
            Info::new(VersionLabels {
                version: env!("CARGO_PKG_VERSION"),
            }),
        );
        let mut described = Vec::new();
        let mut describe = |name: &str, kind: &str, help: &str| {
            let name = format!("hookledger_{name}");
            described.push((
                format!("# TYPE {name} {kind}\n"),
                format!("# HELP {name} {help}.\n# TYPE {name} {kind}\n"),
            ));
            help.to_string()
        };
        let events = Family::<EventLabels, Counter>::default();
        registry.register(
            "events",
            describe(
                "events",
                "counter",
                "Verified events answered, by source, type and outcome (processed, duplicate, \
                 failed; challenge: a handshake answered, nothing claimed)",
            ),
            events.clone(),
        );
        let rejected = Family::<RejectedLabels, Counter>::default();
        registry.register(
            "rejected",
            describe(
                "rejected",
                "counter",
                "Webhook requests answered with an error, by source and reason (the error's kind)",
            ),
            rejected.clone(),
        );
        let recovered = Family::<SourceLabels, Counter>::default();
        registry.register(
            "recovered_events",
            describe(
                "recovered_events",
                "counter",
                "Events the periodic reconcile of `serve` claimed and applied from a provider's \
                 API, by source (a delivery it asked the provider to send again is counted in \
                 hookledger_events when it arrives)",
            ),
            recovered.clone(),
        );
        let request_seconds =
            Family::<SourceLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                request_histogram,
            );
        for source in sources.iter().copied().chain([&unknown_source]) {
            let _ = request_seconds.get_or_create(&SourceLabels {
                source: source.clone(),
            });
        }
        registry.register(
            "request_duration_seconds",
            "Time from a webhook request's arrival to its answer, by source (`-`: a source \
             that does not exist)",
            request_seconds.clone(),
        );
        let writer = WriterMetrics::default();
        registry.register(
            "batch_size",
            "Jobs (events and other writes) per writer transaction",
            writer.batch_size.clone(),
        );
        registry.register(
            "writer_queue_depth",
            "Jobs waiting for the writer",
            writer.queue_depth.clone(),
        );
        let deliveries = Family::<DeliveryLabels, Counter>::default();
        registry.register(
            "delivery_attempts",
            describe(
                "delivery_attempts",
                "counter",
                "Outbox delivery attempts by kind and result (delivered, retry, dead)",
            ),
            deliveries.clone(),
        );
        let breaker_open = Family::<KindLabels, Gauge>::default();
        registry.register(
            "delivery_breaker_open",
            describe(
                "delivery_breaker_open",
                "gauge",
                "Whether a delivery kind's circuit breaker is open (1: paused after consecutive \
                 failures, 0: delivering)",
            ),
            breaker_open.clone(),
        );
        let in_flight = Family::<KindLabels, Gauge>::default();
        registry.register(
            "delivery_in_flight",
            describe(
                "delivery_in_flight",
                "gauge",
                "Delivery attempts of a kind running now",
            ),
            in_flight.clone(),
        );
        let outbox_rows = Family::<OutboxLabels, Gauge>::default();
        registry.register(
            "outbox_rows",
            describe(
                "outbox_rows",
                "gauge",
                "Outbox rows by kind and status (pending; paused: pending while the kind's \
                 breaker is open; done, dead, superseded), read at scrape time",
            ),
            outbox_rows.clone(),
        );
        let outbox_oldest_pending = Gauge::default();
        registry.register(
            "outbox_oldest_pending_seconds",
            "Age of the oldest pending outbox row (0 when none), read at scrape time",
            outbox_oldest_pending.clone(),
        );
        registry.register(
            "trace_spans_dropped",
            "Trace spans not exported: the exporter's queue was full, or the OTLP collector did \
             not take them (0 when traces are off)",
            spans_dropped,
        );
        let config_loaded = Gauge::default();
        registry.register(
            "config_loaded_timestamp_seconds",
            "When the serving config was loaded, at the start or by the last reload that \
             applied (Unix seconds)",
            config_loaded.clone(),
        );
        let reloads_refused = Counter::default();
        registry.register(
            "config_reloads_refused",
            "Reloads refused: a bad file, or a key that cannot change while serving (the \
             running config kept serving)",
            reloads_refused.clone(),
        );
        Metrics {
            registry,
            events,
            rejected,
            recovered,
            recoveries: Mutex::default(),
            downtime: Mutex::default(),
            request_seconds,
            writer,
            deliveries,
            breaker_open,
            in_flight,
            lanes: Mutex::default(),
            outbox_rows,
            outbox_oldest_pending,
            activity: RwLock::new(
                sources
                    .iter()
                    .map(|s| ((*s).clone(), Mutex::default()))
                    .collect(),
            ),
            types: RwLock::new(
                sources
                    .iter()
                    .map(|s| ((*s).clone(), Mutex::default()))
                    .collect(),
            ),
            config_loaded,
            config_sha256: Mutex::new(None),
            names: RwLock::new(sources.iter().map(|s| (*s).clone()).collect()),
            reloads_refused,
            unknown_source,
            wal: None,
            scrape: Mutex::new(()),
            described,
        }
    }

    /// With the SQLite write-ahead log's series, read from `watch` at scrape time:
    /// `hookledger_wal_bytes` and `hookledger_wal_over_limit_total`.
    pub(crate) fn with_wal(mut self, watch: Option<Arc<WalWatch>>) -> Metrics {
        let Some(watch) = watch else {
            return self;
        };
        let (bytes, over) = (Gauge::default(), Counter::default());
        self.registry.register(
            "wal_bytes",
            "SQLite: the write-ahead log file's size at the checkpointer's last look (every \
             100 ms)",
            bytes.clone(),
        );
        self.registry.register(
            "wal_over_limit",
            "SQLite: times the write-ahead log file stayed past storage.wal_limit_mb for over \
             2 s (a reader holding an old snapshot, mostly; logged with its cause)",
            over.clone(),
        );
        self.wal = Some((watch, bytes, over));
        self
    }

    /// The SQLite write-ahead log's watch, when the store has one.
    pub(crate) fn wal(&self) -> Option<&WalWatch> {
        self.wal.as_ref().map(|(watch, _, _)| &**watch)
    }

    /// The writer's metrics, to hand to it.
    pub(crate) fn writer(&self) -> WriterMetrics {
        self.writer.clone()
    }

    /// A verified event of `source` answered after `seconds`.
    pub(crate) fn event(&self, source: &Arc<str>, seen: Seen, seconds: f64) {
        self.observe(source, seconds);
        self.count(source, seen);
    }

    /// The events of one request of `source` (an array of them), answered after `seconds`:
    /// one request, each event counted.
    pub(crate) fn events(&self, source: &Arc<str>, seen: Vec<Seen>, seconds: f64) {
        self.observe(source, seconds);
        for one in seen {
            self.count(source, one);
        }
    }

    /// A handshake of type `kind` that `source`'s sender requires, answered after `seconds`:
    /// counted as outcome `challenge`; not an event of `/status`.
    pub(crate) fn challenge(&self, source: &Arc<str>, kind: &str, seconds: f64) {
        self.observe(source, seconds);
        let labels = EventLabels {
            source: source.clone(),
            r#type: self.type_label(source, kind),
            outcome: Outcome::Challenge.label(),
        };
        self.events.get_or_create(&labels).inc();
    }

    /// A request of `source` answered after `seconds`.
    fn observe(&self, source: &Arc<str>, seconds: f64) {
        let labels = SourceLabels {
            source: source.clone(),
        };
        self.request_seconds.get_or_create(&labels).observe(seconds);
    }

    fn count(&self, source: &Arc<str>, seen: Seen) {
        let labels = EventLabels {
            source: source.clone(),
            r#type: self.type_label(source, &seen.kind),
            outcome: seen.outcome.label(),
        };
        self.events.get_or_create(&labels).inc();
        if seen.outcome == Outcome::Failed {
            self.reject(source, seen.reason);
        }
        if let Some(activity) = read(&self.activity).get(source) {
            lock(activity).record(seen);
        }
    }

    /// The `type` label of `kind` for `source`: itself while the source has fewer than
    /// [`MAX_TYPES`] others, else [`OTHER_TYPE`].
    fn type_label(&self, source: &Arc<str>, kind: &str) -> String {
        let all = read(&self.types);
        let Some(types) = all.get(source) else {
            return OTHER_TYPE.to_string();
        };
        let mut types = lock(types);
        if types.contains(kind) {
            return kind.to_string();
        }
        if types.len() < MAX_TYPES {
            types.insert(kind.to_string());
            return kind.to_string();
        }
        OTHER_TYPE.to_string()
    }

    /// A request refused before an event could be read; `source` is `None` when no source
    /// has that name.
    pub(crate) fn rejected(&self, source: Option<&Arc<str>>, reason: &'static str, seconds: f64) {
        let source = source.unwrap_or(&self.unknown_source);
        self.observe(source, seconds);
        self.reject(source, reason);
        if let Some(activity) = read(&self.activity).get(source) {
            lock(activity).rejected += 1;
        }
    }

    fn reject(&self, source: &Arc<str>, reason: &'static str) {
        let labels = RejectedLabels {
            source: source.clone(),
            reason,
        };
        self.rejected.get_or_create(&labels).inc();
    }

    /// A delivery attempt of an outbox row of `kind`.
    pub(crate) fn delivery(&self, kind: &str, result: &'static str) {
        let labels = DeliveryLabels {
            kind: kind.to_string(),
            result,
        };
        self.deliveries.get_or_create(&labels).inc();
    }

    /// A delivery kind that has a lane: its series, at zero, and its breaker closed.
    pub(crate) fn lane(&self, kind: &str) {
        for result in DELIVERY_RESULTS {
            let _ = self.deliveries.get_or_create(&DeliveryLabels {
                kind: kind.to_string(),
                result,
            });
        }
        self.breaker(kind, false);
    }

    /// Whether the circuit breaker of `kind` is open.
    pub(crate) fn breaker(&self, kind: &str, open: bool) {
        let labels = KindLabels {
            kind: kind.to_string(),
        };
        self.breaker_open
            .get_or_create(&labels)
            .set(i64::from(open));
        lock(&self.lanes)
            .entry(kind.to_string())
            .or_default()
            .breaker_open = open;
    }

    /// An attempt of `kind` started (`1`) or ended (`-1`).
    pub(crate) fn in_flight(&self, kind: &str, delta: i64) {
        let labels = KindLabels {
            kind: kind.to_string(),
        };
        self.in_flight.get_or_create(&labels).inc_by(delta);
        lock(&self.lanes)
            .entry(kind.to_string())
            .or_default()
            .in_flight += delta;
    }

    /// Each delivery kind's lane now, in kind order.
    pub(crate) fn lanes(&self) -> BTreeMap<String, Lane> {
        lock(&self.lanes).clone()
    }

    /// Each configured source's requests refused before an event could be read, since the
    /// start (the alerts sample them).
    pub(crate) fn refusals(&self) -> Vec<(Arc<str>, u64)> {
        read(&self.activity)
            .iter()
            .map(|(name, a)| (name.clone(), lock(a).rejected))
            .collect()
    }

    /// After a reload: the activity of exactly `sources` (a kept source keeps its own).
    pub(crate) fn set_sources<'a>(&self, sources: impl IntoIterator<Item = &'a Arc<str>>) {
        let sources: Vec<&Arc<str>> = sources.into_iter().collect();
        fn keep<T: Default>(map: &RwLock<HashMap<Arc<str>, Mutex<T>>>, names: &[&Arc<str>]) {
            let mut map = map.write().unwrap_or_else(|e| e.into_inner());
            map.retain(|name, _| names.contains(&name));
            for name in names {
                map.entry((*name).clone()).or_default();
            }
        }
        keep(&self.activity, &sources);
        keep(&self.types, &sources);
        *self.names.write().unwrap_or_else(|e| e.into_inner()) =
            sources.into_iter().cloned().collect();
    }

    /// The configured sources' names, in config order.
    pub(crate) fn source_names(&self) -> Vec<String> {
        read(&self.names).iter().map(|s| s.to_string()).collect()
    }

    /// The serving config was loaded at `at` (Unix seconds), from a file with this hash.
    pub(crate) fn config_loaded(&self, at: i64, sha256: Option<String>) {
        self.config_loaded.set(at);
        *lock(&self.config_sha256) = sha256;
    }

    /// When the serving config was loaded, and the SHA-256 of its file (none without one).
    pub(crate) fn config(&self) -> (i64, Option<String>) {
        (self.config_loaded.get(), lock(&self.config_sha256).clone())
    }

    /// A reconcile run of `source` ended: what it applied is counted, and the run is kept as
    /// the source's last.
    pub(crate) fn recovered(&self, source: &str, run: Recovery) {
        let source: Arc<str> = Arc::from(source);
        if let Ok(counts) = &run.result {
            self.recovered
                .get_or_create(&SourceLabels {
                    source: source.clone(),
                })
                .inc_by(counts.applied);
        }
        lock(&self.recoveries).insert(source, run);
    }

    /// The last reconcile run of `source`, if one ran since the start.
    pub(crate) fn recovery(&self, source: &str) -> Option<Recovery> {
        lock(&self.recoveries).get(source).cloned()
    }

    /// The last time no instance was up, found at start-up from the heartbeat.
    pub(crate) fn set_downtime(&self, downtime: Option<Downtime>) {
        *lock(&self.downtime) = downtime;
    }

    pub(crate) fn downtime(&self) -> Option<Downtime> {
        *lock(&self.downtime)
    }

    /// A reload was refused.
    pub(crate) fn reload_refused(&self) {
        self.reloads_refused.inc();
    }

    /// A copy of each source's activity, in name order.
    pub(crate) fn activity(&self) -> Vec<(Arc<str>, Activity)> {
        let mut all: Vec<_> = read(&self.activity)
            .iter()
            .map(|(name, a)| (name.clone(), lock(a).clone()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// The OpenMetrics text, with the outbox gauges set from `outbox` (read at `now`).
    pub(crate) fn encode(&self, outbox: &OutboxSummary, now: i64) -> String {
        let _scrape = lock(&self.scrape);
        self.outbox_rows.clear();
        let lanes = self.lanes();
        for row in &outbox.counts {
            let paused = lanes.get(&row.kind).is_some_and(|l| l.breaker_open);
            let status = match row.status.as_str() {
                "pending" if paused => "paused".to_string(),
                status => status.to_string(),
            };
            let labels = OutboxLabels {
                kind: row.kind.clone(),
                status,
            };
            self.outbox_rows.get_or_create(&labels).set(row.rows);
        }
        let age = outbox.oldest_pending.map_or(0, |at| (now - at).max(0));
        self.outbox_oldest_pending.set(age);
        if let Some((watch, bytes, over)) = &self.wal {
            use std::sync::atomic::Ordering::Relaxed;
            bytes.set(i64::try_from(watch.bytes.load(Relaxed)).unwrap_or(i64::MAX));
            let total = watch.over_total.load(Relaxed);
            over.inc_by(total.saturating_sub(over.get()));
        }
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        // Every family from the start: an empty one as its description alone.
        let eof = text.strip_suffix("# EOF\n").map_or(text.len(), str::len);
        let mut missing = String::new();
        for (typed, description) in &self.described {
            if !text.contains(typed.as_str()) {
                missing.push_str(description);
            }
        }
        text.insert_str(eof, &missing);
        text
    }
}

/// The OpenMetrics text `openmetrics` (as [`Metrics::encode`] writes it) in the Prometheus text
/// format 0.0.4: a counter's `# HELP` and `# TYPE` name its samples (`…_total`), an info is a
/// gauge named `…_info`, and there is no `# UNIT` or `# EOF`. The samples are the same.
pub(crate) fn to_prometheus_text(openmetrics: &str) -> String {
    let mut types: HashMap<&str, &str> = HashMap::new();
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some((name, kind)) = rest.split_once(' ') {
                types.insert(name, kind);
            }
        }
    }
    let renamed = |name: &str| match types.get(name) {
        Some(&"counter") => (format!("{name}_total"), "counter"),
        Some(&"info") => (format!("{name}_info"), "gauge"),
        Some(&"stateset" | &"gaugehistogram") | None => (name.to_string(), "untyped"),
        Some(kind) => (name.to_string(), *kind),
    };
    let mut text = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            // OpenMetrics escapes `"` in help text too; 0.0.4 only `\\` and newlines.
            let help = help.replace("\\\"", "\"");
            text.push_str(&format!("# HELP {} {help}\n", renamed(name).0));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split_once(' ').map_or(rest, |(name, _)| name);
            let (name, kind) = renamed(name);
            text.push_str(&format!("# TYPE {name} {kind}\n"));
        } else if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        } else {
            text.push_str(line);
            text.push('\n');
        }
    }
    text
}

/// The lock, also after a panic elsewhere: what it guards is counts, never half-written.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(at: i64, id: &str, outcome: Outcome) -> Seen {
        Seen {
            at,
            id: id.into(),
            kind: "invoice.paid".into(),
            outcome,
            reason: "",
            millis: 1.0,
        }
    }

    #[test]
    fn activity_keeps_the_last_events_newest_first_and_counts_per_minute() {
        let mut a = Activity::default();
        for i in 0..25 {
            let outcome = if i % 5 == 0 {
                Outcome::Duplicate
            } else {
                Outcome::Processed
            };
            a.record(seen(600 + i, &format!("evt_{i}"), outcome));
        }
        a.record(seen(660, "evt_next_minute", Outcome::Failed));
        // Answered last, but in the minute before: counted there.
        a.record(seen(659, "evt_late", Outcome::Processed));
        assert_eq!(a.recent.len(), RECENT);
        assert_eq!(a.recent[0].id, "evt_late");
        assert_eq!(a.recent[1].id, "evt_next_minute");
        let minutes: Vec<_> = a.minutes.iter().copied().collect();
        assert_eq!(
            minutes,
            [
                Minute {
                    minute: 10,
                    processed: 21,
                    duplicate: 5,
                    failed: 0
                },
                Minute {
                    minute: 11,
                    processed: 0,
                    duplicate: 0,
                    failed: 1
                }
            ]
        );
        for m in 12..40 {
            a.record(seen(m * 60, "x", Outcome::Processed));
        }
        assert_eq!(a.minutes.len(), MINUTES);
        assert_eq!(a.minutes.back().unwrap().minute, 39);
    }

    #[test]
    fn encode_counts_events_by_label_and_sets_the_outbox_gauges() {
        let stripe: Arc<str> = Arc::from("stripe");
        let m = Metrics::new([&stripe], Counter::default());
        m.event(&stripe, seen(1, "evt_1", Outcome::Processed), 0.001);
        m.event(&stripe, seen(1, "evt_1", Outcome::Duplicate), 0.001);
        m.event(&stripe, seen(1, "evt_1", Outcome::Duplicate), 0.001);
        m.rejected(None, "unknown_source", 0.0);
        m.delivery("forward", "retry");
        m.breaker("forward", false);
        m.breaker("send_receipt", true);
        m.in_flight("forward", 1);
        m.in_flight("forward", 1);
        m.in_flight("forward", -1);
        let count = |kind: &str, status: &str, rows| crate::store::listings::OutboxCount {
            kind: kind.into(),
            status: status.into(),
            rows,
        };
        let outbox = OutboxSummary {
            counts: vec![
                count("forward", "pending", 3),
                count("forward", "superseded", 4),
                count("send_receipt", "pending", 5),
            ],
            oldest_pending: Some(100),
        };
        let text = m.encode(&outbox, 130);
        for line in [
            r#"hookledger_events_total{source="stripe",type="invoice.paid",outcome="processed"} 1"#,
            r#"hookledger_events_total{source="stripe",type="invoice.paid",outcome="duplicate"} 2"#,
            r#"hookledger_rejected_total{source="-",reason="unknown_source"} 1"#,
            r#"hookledger_delivery_attempts_total{kind="forward",result="retry"} 1"#,
            r#"hookledger_delivery_breaker_open{kind="forward"} 0"#,
            r#"hookledger_delivery_breaker_open{kind="send_receipt"} 1"#,
            r#"hookledger_outbox_rows{kind="forward",status="pending"} 3"#,
            r#"hookledger_outbox_rows{kind="forward",status="superseded"} 4"#,
            // Pending while the kind's breaker is open.
            r#"hookledger_outbox_rows{kind="send_receipt",status="paused"} 5"#,
            r#"hookledger_delivery_in_flight{kind="forward"} 1"#,
            "hookledger_outbox_oldest_pending_seconds 30",
            r#"hookledger_request_duration_seconds_count{source="stripe"} 3"#,
            r#"hookledger_request_duration_seconds_count{source="-"} 1"#,
            "hookledger_trace_spans_dropped_total 0",
            "hookledger_batch_size_count 0",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
        // A status that is gone is gone from the next scrape.
        let text = m.encode(&OutboxSummary::default(), 130);
        assert!(!text.contains("hookledger_outbox_rows{"), "{text}");
        assert!(text.contains("hookledger_outbox_oldest_pending_seconds 0"));
    }

    #[test]
    fn every_family_is_there_from_the_start_with_its_known_series_at_zero() {
        let stripe: Arc<str> = Arc::from("stripe");
        let m = Metrics::new([&stripe], Counter::default());
        m.lane("forward");
        let text = m.encode(&OutboxSummary::default(), 1);
        for family in [
            "hookledger_build",
            "hookledger_events",
            "hookledger_rejected",
            "hookledger_request_duration_seconds",
            "hookledger_batch_size",
            "hookledger_writer_queue_depth",
            "hookledger_delivery_attempts",
            "hookledger_delivery_breaker_open",
            "hookledger_outbox_rows",
            "hookledger_outbox_oldest_pending_seconds",
            "hookledger_trace_spans_dropped",
        ] {
            assert!(
                text.lines()
                    .any(|l| l.starts_with(&format!("# TYPE {family} "))),
                "no family {family} in\n{text}"
            );
        }
        for line in [
            r#"hookledger_request_duration_seconds_count{source="stripe"} 0"#,
            r#"hookledger_request_duration_seconds_count{source="-"} 0"#,
            r#"hookledger_delivery_attempts_total{kind="forward",result="delivered"} 0"#,
            r#"hookledger_delivery_attempts_total{kind="forward",result="retry"} 0"#,
            r#"hookledger_delivery_attempts_total{kind="forward",result="dead"} 0"#,
            r#"hookledger_delivery_breaker_open{kind="forward"} 0"#,
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
        }
    }

    #[test]
    fn the_prometheus_text_names_counters_by_their_samples_and_has_no_eof() {
        let stripe: Arc<str> = Arc::from("stripe");
        let m = Metrics::new([&stripe], Counter::default());
        m.event(&stripe, seen(1, "evt_1", Outcome::Processed), 0.001);
        let text = to_prometheus_text(&m.encode(&OutboxSummary::default(), 1));
        for line in [
            "# TYPE hookledger_events_total counter",
            "# TYPE hookledger_build_info gauge",
            "# TYPE hookledger_request_duration_seconds histogram",
            "# TYPE hookledger_writer_queue_depth gauge",
            r#"hookledger_events_total{source="stripe",type="invoice.paid",outcome="processed"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
        }
        assert!(text
            .lines()
            .any(|l| l.starts_with("# HELP hookledger_events_total ")));
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
        let build = format!(
            r#"hookledger_build_info{{version="{}"}} 1"#,
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.lines().any(|l| l == build), "no `{build}` in\n{text}");
        assert!(!text.contains("# TYPE hookledger_events counter"), "{text}");
    }

    #[test]
    fn a_challenge_and_each_event_of_an_array_are_counted_in_one_request_each() {
        let slack: Arc<str> = Arc::from("slack");
        let m = Metrics::new([&slack], Counter::default());
        m.challenge(&slack, "url_verification", 0.001);
        let mut failed = seen(1, "evt_3", Outcome::Failed);
        failed.reason = "internal";
        let array = vec![
            seen(1, "evt_1", Outcome::Processed),
            seen(1, "evt_2", Outcome::Duplicate),
            failed,
        ];
        m.events(&slack, array, 0.002);
        let text = m.encode(&OutboxSummary::default(), 1);
        for line in [
            r#"hookledger_events_total{source="slack",type="url_verification",outcome="challenge"} 1"#,
            r#"hookledger_events_total{source="slack",type="invoice.paid",outcome="processed"} 1"#,
            r#"hookledger_events_total{source="slack",type="invoice.paid",outcome="duplicate"} 1"#,
            r#"hookledger_events_total{source="slack",type="invoice.paid",outcome="failed"} 1"#,
            r#"hookledger_rejected_total{source="slack",reason="internal"} 1"#,
            r#"hookledger_request_duration_seconds_count{source="slack"} 2"#,
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
        }
        let activity = m.activity();
        assert_eq!(
            activity[0].1.recent.len(),
            3,
            "the challenge is not an event"
        );
    }

    #[test]
    fn a_source_gets_at_most_max_types_type_labels_and_the_rest_count_as_other() {
        let github: Arc<str> = Arc::from("github");
        let stripe: Arc<str> = Arc::from("stripe");
        let m = Metrics::new([&github, &stripe], Counter::default());
        for i in 0..MAX_TYPES + 50 {
            let mut seen = seen(1, "d-1", Outcome::Duplicate);
            seen.kind = format!("type-{i}");
            m.event(&github, seen, 0.001);
        }
        // A type seen before the cap keeps its label; another source has its own types.
        let mut early = seen(1, "d-1", Outcome::Duplicate);
        early.kind = "type-0".into();
        m.event(&github, early, 0.001);
        m.event(&stripe, seen(1, "evt_1", Outcome::Processed), 0.001);
        let text = m.encode(&OutboxSummary::default(), 1);
        let github_series: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with(r#"hookledger_events_total{source="github","#))
            .collect();
        assert_eq!(github_series.len(), MAX_TYPES + 1, "{text}");
        for line in [
            r#"hookledger_events_total{source="github",type="other",outcome="duplicate"} 50"#,
            r#"hookledger_events_total{source="github",type="type-0",outcome="duplicate"} 2"#,
            r#"hookledger_events_total{source="stripe",type="invoice.paid",outcome="processed"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
        }
        assert!(!text.contains(&format!("type-{MAX_TYPES}\"")), "{text}");
    }
}
