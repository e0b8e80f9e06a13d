//! `[[alert]]`: one message per incident, and one when it clears, sent through hookledger's own
//! outbox (a lane of their own, kind `alert:NAME`, so a dead app does not hold them up).
//!
//! The incidents:
//! - `dead`: a row of a kind goes dead (the first one; more rows of that kind add nothing);
//!   cleared when the kind delivers a row again. Told by the outbox worker as it records an
//!   attempt ([`Observer`]).
//! - `refused`: a source's refusals (requests refused before an event could be read) pass
//!   `refused_per_minute` over `refused_window`; cleared once nobody has seen the rate over
//!   the threshold for a window. The counts are this instance's (`metrics.rs`), sampled every
//!   [`TICK`].
//! - `backlog`: the oldest pending row (not an alert's) is older than `backlog_age`; cleared
//!   when it is not. Read from the database every [`TICK`].
//!
//! # Ordering
//! An incident is inserted with the outbox row of its message in one transaction
//! (`store/alerts.rs`), and a second open incident of the same alert, cause and subject is
//! refused by a unique index: a restart, or a second instance on PostgreSQL, sends nothing
//! again. Clearing is an update guarded by `cleared_at IS NULL`, with its message in the same
//! transaction.
//!
//! # Failure modes
//! A write that fails (the database is away) is logged and tried again at the next tick or
//! the next row. Alert rows are delivered at least once, like every row (a message may come
//! twice if the chat service answers after the timeout). Alert kinds raise no alerts.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::config::{AlertConfig, Config, LaneSettings, PostTarget};
use crate::delivery::{answer, Post, Targets};
use crate::metrics::Metrics;
use crate::outbox::{Attempt, Failure, FollowUp, Observer, PendingRow, Target};
use crate::store::alerts::{self as incidents, Change, Incident};
use crate::store::{Reader, Write};
use crate::time::{format_rfc3339, unix_now};
use crate::writer::WriterHandle;

/// How often refusal counts are sampled and the backlog and open incidents read: a second
/// is soon enough for a page, and one small query a tick is nothing to the database.
pub(crate) const TICK: Duration = Duration::from_secs(1);

/// The outbox kind of an alert's messages.
pub(crate) fn kind_of(name: &str) -> String {
    format!("alert:{name}")
}

/// Whether `kind` is an alert's (those raise no alerts).
fn is_alert_kind(kind: &str) -> bool {
    kind.starts_with("alert:")
}

/// POSTs a Slack-shaped message (`{"text": …}`, the row's payload as it is).
struct Slack {
    url: String,
    agent: ureq::Agent,
    timeout: Duration,
}

impl Target for Slack {
    fn attempt(
        &self,
        _row: &PendingRow,
        payload: &[u8],
    ) -> Result<Option<Arc<dyn FollowUp>>, Failure> {
        let result = self
            .agent
            .post(&self.url)
            .set("Content-Type", "application/json")
            .send_bytes(payload);
        answer(result, &self.url, Some(self.timeout)).map(|()| None)
    }
}

/// Adds a lane per `[[alert]]` to `targets`: its messages go out on their own.
pub(crate) fn add_targets(config: &Config, targets: &mut Targets) -> anyhow::Result<()> {
    for (i, alert) in config.alerts.iter().enumerate() {
        let kind = kind_of(&alert.name_at(i + 1));
        let target: Box<dyn Target> = match (alert.format.as_str(), &alert.secret) {
            ("standard", Some(secret)) => Box::new(Post::new(
                &PostTarget {
                    url: alert.url.clone(),
                    secret: secret.clone(),
                    schedule: crate::config::default_schedule(),
                    timeout: alert.timeout,
                    lane: LaneSettings::default(),
                },
                None,
            )?),
            _ => Box::new(Slack {
                url: alert.url.clone(),
                timeout: alert.timeout,
                agent: ureq::AgentBuilder::new()
                    .timeout(alert.timeout)
                    .redirects(0)
                    .user_agent(concat!("hookledger/", env!("CARGO_PKG_VERSION")))
                    .build(),
            }),
        };
        targets
            .add(&kind, target, crate::config::default_schedule())
            .timeout(alert.timeout);
    }
    Ok(())
}

/// Refusals since the start, by source.
type Counts = HashMap<Arc<str>, u64>;

/// One configured alert.
struct Alert {
    name: String,
    kind: String,
    config: AlertConfig,
}

/// The alerts, shared by the outbox worker (as its [`Observer`]) and the watcher thread.
pub(crate) struct Watch {
    alerts: Vec<Alert>,
    writer: WriterHandle,
    reader: Reader,
    metrics: Arc<Metrics>,
    /// The open incidents (alert index, cause, subject), as last read or written here.
    open: Mutex<HashSet<(usize, String, String)>>,
    /// Refusal counts by source, sampled every tick, oldest first (the longest window's).
    samples: Mutex<VecDeque<(Instant, Counts)>>,
    /// When this instance last noted a refusal incident still there, by (alert, source).
    noted: Mutex<HashMap<(usize, Arc<str>), Instant>>,
}

impl Watch {
    /// The alerts of `config`; `None` when there is none.
    pub(crate) fn new(
        config: &Config,
        writer: WriterHandle,
        reader: Reader,
        metrics: Arc<Metrics>,
    ) -> Option<Arc<Watch>> {
        if config.alerts.is_empty() {
            return None;
        }
        let alerts = config
            .alerts
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let name = a.name_at(i + 1);
                Alert {
                    kind: kind_of(&name),
                    name,
                    config: a.clone(),
                }
            })
            .collect();
        // The counts start at zero with the process: the first sample, so refusals that come
        // before the first tick are counted too.
        let zero = metrics
            .refusals()
            .into_iter()
            .map(|(s, _)| (s, 0))
            .collect();
        Some(Arc::new(Watch {
            alerts,
            writer,
            reader,
            metrics,
            open: Mutex::default(),
            samples: Mutex::new(VecDeque::from([(Instant::now(), zero)])),
            noted: Mutex::default(),
        }))
    }

    fn is_open(&self, i: usize, cause: &str, subject: &str) -> bool {
        lock(&self.open).contains(&(i, cause.to_string(), subject.to_string()))
    }

    /// Opens (`text` set) or clears the incident; whether this write changed it.
    fn change(&self, i: usize, cause: &'static str, subject: &str, change: Change) -> bool {
        let alert = &self.alerts[i];
        let opening = matches!(change, Change::Open { .. });
        let seen = matches!(change, Change::Seen);
        let incident = Incident {
            alert: alert.name.clone(),
            cause,
            subject: subject.to_string(),
            change,
        };
        match self.writer.run_blocking(Write::Alert(incident)) {
            Ok(n) => {
                let key = (i, cause.to_string(), subject.to_string());
                if seen {
                    return n > 0;
                }
                // Opened here or elsewhere, cleared here or elsewhere: the same from now on,
                // until the next read says otherwise.
                if opening {
                    lock(&self.open).insert(key);
                } else if n > 0 {
                    lock(&self.open).remove(&key);
                }
                if n > 0 {
                    log::info!(
                        "alert {}: {cause} incident on {subject:?} {}",
                        alert.name,
                        if opening { "opened" } else { "cleared" }
                    );
                }
                n > 0
            }
            Err(e) => {
                log::error!(
                    "alert {}: cannot write the {cause} incident: {e}",
                    alert.name
                );
                false
            }
        }
    }

    fn open_with(&self, i: usize, cause: &'static str, subject: &str, text: &str) {
        let payload = self.payload(i, "alert.opened", cause, subject, text);
        let kind = self.alerts[i].kind.clone();
        self.change(i, cause, subject, Change::Open { kind, payload });
    }

    fn clear_with(
        &self,
        i: usize,
        cause: &'static str,
        subject: &str,
        text: &str,
        quiet_since: i64,
    ) -> bool {
        let payload = self.payload(i, "alert.cleared", cause, subject, text);
        let kind = self.alerts[i].kind.clone();
        self.change(
            i,
            cause,
            subject,
            Change::Clear {
                kind,
                payload,
                quiet_since,
            },
        )
    }

    /// The message as the alert's format has it.
    fn payload(&self, i: usize, kind: &str, cause: &str, subject: &str, text: &str) -> Vec<u8> {
        let alert = &self.alerts[i];
        let value = match alert.config.format.as_str() {
            "standard" => serde_json::json!({
                "type": kind,
                "timestamp": format_rfc3339(unix_now()),
                "data": {
                    "alert": alert.name,
                    "cause": cause,
                    "subject": subject,
                    "text": text,
                },
            }),
            _ => serde_json::json!({ "text": text }),
        };
        serde_json::to_vec(&value).expect("JSON values serialize")
    }

    /// Reads the open incidents of each alert (another instance may have opened or cleared
    /// some).
    fn refresh(&self) {
        let mut open = HashSet::new();
        for (i, alert) in self.alerts.iter().enumerate() {
            match self.reader.read(|db| Ok(incidents::open(db, &alert.name)?)) {
                Ok(rows) => open.extend(rows.into_iter().map(|(c, s)| (i, c, s))),
                // Kept as it was: tried again next tick.
                Err(e) => {
                    log::warn!("alerts: cannot read the open incidents: {e:#}");
                    return;
                }
            }
        }
        *lock(&self.open) = open;
    }

    /// One tick: refusal rates and the backlog.
    fn tick(&self) {
        self.refresh();
        self.refusals();
        self.backlog();
    }

    fn refusals(&self) {
        if !self.alerts.iter().any(|a| a.config.on("refused")) {
            return;
        }
        let now = Instant::now();
        let counts: Counts = self.metrics.refusals().into_iter().collect();
        let longest = self
            .alerts
            .iter()
            .map(|a| a.config.refused_window)
            .max()
            .unwrap_or_default();
        let mut samples = lock(&self.samples);
        while samples
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > longest + TICK)
        {
            samples.pop_front();
        }
        samples.push_back((now, counts.clone()));
        let unix = unix_now();
        for (i, alert) in self.alerts.iter().enumerate() {
            if !alert.config.on("refused") {
                continue;
            }
            let window = alert.config.refused_window;
            // The oldest sample within the window (at start-up, the first one: the count is
            // then over less than a window, and divided by the whole window, never inflated).
            let Some((_, base)) = samples
                .iter()
                .find(|(at, _)| now.duration_since(*at) <= window)
            else {
                continue;
            };
            for (source, count) in &counts {
                let refused = count.saturating_sub(base.get(source).copied().unwrap_or(0));
                let per_minute = refused as f64 * 60.0 / window.as_secs_f64();
                let threshold = alert.config.refused_per_minute;
                let open = self.is_open(i, "refused", source);
                if per_minute >= threshold as f64 {
                    if !open {
                        let text = format!(
                            "hookledger: source \"{source}\" refused {refused} requests in the \
                             last {} (alert at {threshold} a minute); see /status for the \
                             reasons",
                            human(window)
                        );
                        self.open_with(i, "refused", source, &text);
                        lock(&self.noted).insert((i, source.clone()), now);
                    } else {
                        // Still there: said so now and then, so no instance clears it.
                        let key = (i, source.clone());
                        let due = lock(&self.noted)
                            .get(&key)
                            .is_none_or(|at| now.duration_since(*at) >= window / 2);
                        if due && self.change(i, "refused", source, Change::Seen) {
                            lock(&self.noted).insert(key, now);
                        }
                    }
                } else if open {
                    let text = format!(
                        "hookledger: source \"{source}\" is back under {threshold} refusals a \
                         minute"
                    );
                    let quiet_since = unix - window.as_secs() as i64;
                    self.clear_with(i, "refused", source, &text, quiet_since);
                }
            }
        }
    }

    fn backlog(&self) {
        if !self.alerts.iter().any(|a| a.config.on("backlog")) {
            return;
        }
        let oldest = match self.reader.read(|db| Ok(incidents::oldest_pending(db)?)) {
            Ok(oldest) => oldest,
            Err(e) => {
                log::warn!("alerts: cannot read the oldest pending row: {e:#}");
                return;
            }
        };
        let now = unix_now();
        for (i, alert) in self.alerts.iter().enumerate() {
            if !alert.config.on("backlog") {
                continue;
            }
            let age_limit = alert.config.backlog_age;
            let over = oldest
                .as_ref()
                .filter(|(_, _, at)| now - at >= age_limit.as_secs() as i64);
            let open = self.is_open(i, "backlog", "");
            match over {
                Some((id, kind, at)) if !open => {
                    let text = format!(
                        "hookledger: the oldest pending delivery (row {id}, kind \"{kind}\") has \
                         waited {} (alert at {})",
                        human(Duration::from_secs((now - at).max(0) as u64)),
                        human(age_limit)
                    );
                    self.open_with(i, "backlog", "", &text);
                }
                None if open => {
                    let text = format!(
                        "hookledger: the delivery backlog is under {} again",
                        human(age_limit)
                    );
                    self.clear_with(i, "backlog", "", &text, i64::MAX);
                }
                _ => {}
            }
        }
    }

    /// Starts the watcher thread (refusals, backlog, incidents opened elsewhere).
    pub(crate) fn spawn(self: &Arc<Watch>) -> anyhow::Result<Watcher> {
        let (stop, stopped) = mpsc::sync_channel::<()>(0);
        let watch = self.clone();
        let thread = std::thread::Builder::new()
            .name("hookledger-alerts".into())
            .spawn(move || loop {
                watch.tick();
                match stopped.recv_timeout(TICK) {
                    Err(RecvTimeoutError::Timeout) => continue,
                    _ => break,
                }
            })?;
        Ok(Watcher { stop, thread })
    }
}

/// A row gone dead opens a `dead` incident of its kind; a row delivered clears it.
impl Observer for Watch {
    fn recorded(&self, row: &PendingRow, attempt: &Attempt) {
        if is_alert_kind(&row.kind) {
            return;
        }
        for (i, alert) in self.alerts.iter().enumerate() {
            if !alert.config.on("dead") {
                continue;
            }
            let open = self.is_open(i, "dead", &row.kind);
            match attempt {
                Attempt::Dead { error, .. } if !open => {
                    let text = format!(
                        "hookledger: deliveries of kind \"{}\" are going dead: row {} ({} {}) \
                         after {} attempts: {error}",
                        row.kind,
                        row.id,
                        row.source,
                        row.key,
                        row.attempts + 1
                    );
                    self.open_with(i, "dead", &row.kind, &text);
                }
                Attempt::Delivered { .. } if open => {
                    let text = format!(
                        "hookledger: kind \"{}\" delivers again (rows that went dead stay dead \
                         until retried: hookledger outbox retry --all-dead)",
                        row.kind
                    );
                    self.clear_with(i, "dead", &row.kind, &text, i64::MAX);
                }
                _ => {}
            }
        }
    }
}

/// The running watcher thread.
pub(crate) struct Watcher {
    /// Dropped to stop the thread.
    stop: SyncSender<()>,
    thread: JoinHandle<()>,
}

impl crate::writer::Background for Watcher {
    fn stop(self: Box<Self>) {
        drop(self.stop);
        if self.thread.join().is_err() {
            log::error!("alerts thread panicked");
        }
    }
}

/// `90s` → `1m30s`, as messages show a duration.
fn human(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, s % 3600 / 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, 0, _) => format!("{h}h"),
        (h, m, _) => format!("{h}h{m}m"),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(human(Duration::from_secs(5)), "5s");
        assert_eq!(human(Duration::from_secs(300)), "5m");
        assert_eq!(human(Duration::from_secs(90)), "1m30s");
        assert_eq!(human(Duration::from_secs(3600)), "1h");
        assert_eq!(human(Duration::from_secs(5400)), "1h30m");
    }
}
