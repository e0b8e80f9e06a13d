//! Recovery of events a provider will not resend, shared by each provider's run (Stripe's
//! `reconcile` in the Stripe wing): what a run counts, the lookup that skips the events the
//! ledger has, and the apply that claims the rest through the writer, as webhooks are.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::config::{refuse, Config, ConfigError, SourceConfig};
use crate::event::Event;
use crate::metrics::Metrics;
use crate::source::Source;
use crate::store::ledger::by_key;
use crate::store::{Outcome, Reader};
use crate::writer::WriterHandle;

pub(crate) mod client;
pub(crate) mod github;
pub(crate) mod gitlab;
pub(crate) mod jwt;
pub(crate) mod paddle;
pub(crate) mod stream;
pub(crate) mod workos;

/// What a run found and did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Counts {
    /// Events (GitHub: delivery GUIDs) the provider listed.
    pub(crate) found: u64,
    /// Claimed and applied now (with `--dry-run`: would be, or would be redelivered).
    pub(crate) applied: u64,
    /// Deliveries the provider was asked to deliver again (`mode = "redeliver"`): each comes
    /// as a webhook of its own, claimed then.
    pub(crate) redelivered: u64,
    /// Claimed already (by a webhook or an earlier run).
    pub(crate) already_present: u64,
    /// Not applied: unreadable, refused by a handler, or the database failed.
    pub(crate) failed: u64,
}

impl From<Counts> for crate::metrics::RecoveryCounts {
    fn from(c: Counts) -> Self {
        crate::metrics::RecoveryCounts {
            found: c.found,
            applied: c.applied,
            redelivered: c.redelivered,
            already_present: c.already_present,
            failed: c.failed,
        }
    }
}

/// Claims and applies `events` through `writer`, as webhooks are: counted applied, already
/// present (a webhook or another run came first) or failed (logged).
pub(crate) fn apply(
    source: &Source,
    events: Vec<Event>,
    writer: &WriterHandle,
    counts: &mut Counts,
) {
    let mut waiting = Vec::with_capacity(events.len());
    for event in events {
        let id = event.id.clone();
        match source.submission(event) {
            Ok(submission) => match writer.submit_blocking(submission) {
                Ok(reply) => waiting.push((id, reply)),
                Err(e) => {
                    log::error!("reconcile {} {id}: {e}", source.name);
                    counts.failed += 1;
                }
            },
            Err(e) => {
                log::error!("reconcile {} {id}: refused: {}", source.name, e.summary());
                counts.failed += 1;
            }
        }
    }
    for (id, reply) in waiting {
        match reply.blocking_recv() {
            Ok(Ok(Outcome::Processed)) => {
                log::info!("reconcile {} {id}: applied", source.name);
                counts.applied += 1;
            }
            Ok(Ok(Outcome::Duplicate)) => counts.already_present += 1,
            Ok(Err(e)) => {
                log::error!("reconcile {} {id}: {e}", source.name);
                counts.failed += 1;
            }
            Err(_) => {
                log::error!("reconcile {} {id}: the writer stopped", source.name);
                counts.failed += 1;
            }
        }
    }
}

/// The event of a request a provider recorded (its headers and payload, as a delivery log
/// shows them), read as the source reads a webhook: the body is the payload serialized again;
/// `id` is the delivery's id and the header it goes in, added when the log left it out. An
/// id the source reads elsewhere is refused: the claim must be the delivery's, or `key` (an
/// id the provider keeps for all deliveries of the event, as GitLab's `Idempotency-Key`).
pub(crate) fn event_of_request(
    source: &Source,
    (id_header, id): (&'static str, &str),
    key: Option<&str>,
    recorded: &serde_json::Map<String, serde_json::Value>,
    payload: &serde_json::Value,
) -> Result<Event, String> {
    use axum::http::{HeaderMap, HeaderName, HeaderValue};
    let body = serde_json::to_vec(payload).map_err(|e| e.to_string())?;
    let mut headers = HeaderMap::new();
    for (name, value) in recorded {
        if let (Ok(name), Some(Ok(value))) = (
            HeaderName::from_bytes(name.as_bytes()),
            value.as_str().map(HeaderValue::from_str),
        ) {
            headers.insert(name, value);
        }
    }
    if !headers.contains_key(id_header) {
        let value = HeaderValue::from_str(id).map_err(|e| e.to_string())?;
        headers.insert(id_header, value);
    }
    let envelope = source.envelope(&headers, &body).map_err(|e| e.summary())?;
    if envelope.id != id && Some(envelope.id.as_str()) != key {
        return Err(format!(
            "the delivery's request says id {}, not {id}; not applied",
            envelope.id
        ));
    }
    Ok(Event {
        source: source.name.clone(),
        id: envelope.id,
        kind: envelope.kind,
        created: envelope.created,
        body: body.into(),
    })
}

/// `events` without those the ledger has (counted as present); a failed read counts failed.
pub(crate) fn without_present(
    source: &Source,
    events: Vec<Event>,
    reader: &Reader,
    counts: &mut Counts,
) -> Vec<Event> {
    let mut missing = Vec::with_capacity(events.len());
    for event in events {
        match present(reader, &source.name, &event.id) {
            Ok(false) => missing.push(event),
            Ok(true) => counts.already_present += 1,
            Err(e) => {
                log::error!("reconcile {} {}: {e}", source.name, event.id);
                counts.failed += 1;
            }
        }
    }
    missing
}

/// Whether the ledger has claimed `(source, id)`.
pub(crate) fn present(reader: &Reader, source: &str, id: &str) -> anyhow::Result<bool> {
    let rows = reader.read(|ledger| {
        Ok(ledger.query(&by_key(ledger.dialect(), "1", "$1", "$2"), &[&source, &id])?)
    })?;
    Ok(!rows.is_empty())
}

/// One provider's run over the events since a time (Unix seconds), until done or the flag
/// is set: what it counted, or why it stopped.
pub(crate) type RunFn = Box<dyn FnMut(i64, &AtomicBool) -> Result<Counts, String> + Send>;

/// A [`Periodic`] for each source of `config` with `reconcile = { every, since }` that `run`
/// makes a run for (`None`: this provider's wing has none for it), each counting what it
/// applied in `metrics`. `run` gets the source's config, the source, and the flag its API
/// client is to watch (a retry's pause ends once it is set: shutdown waits for at most one API
/// call).
pub(crate) fn periodic_each(
    config: &Config,
    sources: &HashMap<Arc<str>, Arc<Source>>,
    metrics: &Arc<Metrics>,
    mut run: impl FnMut(&SourceConfig, Arc<Source>, Arc<AtomicBool>) -> Option<RunFn>,
) -> anyhow::Result<Vec<Periodic>> {
    let mut all = Vec::new();
    for c in &config.sources {
        let (Some(every), Some(source)) = (c.reconcile, sources.get(c.name.as_str())) else {
            continue;
        };
        let stop = Arc::new(AtomicBool::new(false));
        if let Some(once) = run(c, source.clone(), stop.clone()) {
            all.push(Periodic::spawn(
                &c.name,
                every.every,
                every.since,
                stop,
                metrics.clone(),
                once,
            )?);
        }
    }
    Ok(all)
}

/// The periodic recoveries of each source of `config` that has one, for the providers of this
/// module (GitHub, GitLab, Paddle, WorkOS; Stripe's is the Stripe wing's), each on a thread of
/// its own.
pub(crate) fn periodic(
    config: &Config,
    sources: &HashMap<Arc<str>, Arc<Source>>,
    writer: &WriterHandle,
    reader: &Reader,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<Vec<Periodic>> {
    let mut all = github::periodic(config, sources, writer, reader, metrics)?;
    all.extend(gitlab::periodic(config, sources, writer, reader, metrics)?);
    let (sourced, stores) = ((config, sources), (writer, reader));
    all.extend(stream::periodic::<paddle::PaddleApi>(
        sourced,
        stores,
        metrics,
        paddle::is_paddle,
        paddle::PADDLE_API_BASE,
    )?);
    all.extend(stream::periodic::<workos::WorkosApi>(
        sourced,
        stores,
        metrics,
        workos::is_workos,
        workos::WORKOS_API_BASE,
    )?);
    Ok(all)
}

/// Sleeps `pause` in steps of 100 ms, unless `cancel` is set first: whether it slept it out.
pub(crate) fn pause(pause: Duration, cancel: Option<&AtomicBool>) -> bool {
    let step = Duration::from_millis(100);
    let mut left = pause;
    while !left.is_zero() {
        if cancel.is_some_and(|c| c.load(Ordering::SeqCst)) {
            return false;
        }
        std::thread::sleep(left.min(step));
        left = left.saturating_sub(step);
    }
    true
}

/// `serve`'s periodic reconcile of one source: a run over the last `since` at start-up (after
/// downtime is when events were missed), then every `every`, on a thread of its own.
pub(crate) struct Periodic {
    stop: Arc<AtomicBool>,
    wake: mpsc::SyncSender<()>,
    thread: JoinHandle<()>,
}

impl Periodic {
    /// Starts the thread of `source`; the first run starts at once. `stop` is the flag the
    /// run's API client watches (a retry's pause ends when it is set); what each run applied
    /// goes to `metrics` (`hookledger_recovered_events_total`), and the run is kept as the
    /// source's last, for the console.
    pub(crate) fn spawn(
        source: &str,
        every: Duration,
        since: Duration,
        stop: Arc<AtomicBool>,
        metrics: Arc<Metrics>,
        mut run: RunFn,
    ) -> anyhow::Result<Periodic> {
        let (wake, woken) = mpsc::sync_channel(1);
        let flag = stop.clone();
        let name = source.to_string();
        let thread = std::thread::Builder::new()
            .name(format!("hookledger-reconcile-{name}"))
            .spawn(move || {
                while !flag.load(Ordering::SeqCst) {
                    let result = run(horizon(since), &flag);
                    metrics.recovered(
                        &name,
                        crate::metrics::Recovery {
                            at: crate::time::unix_now(),
                            result: result.clone().map(Into::into),
                        },
                    );
                    match result {
                        Ok(c) => {
                            log::info!(
                                "reconcile {name}: found {}, applied {}, redelivered {}, \
                                 already present {}, failed {}",
                                c.found,
                                c.applied,
                                c.redelivered,
                                c.already_present,
                                c.failed
                            )
                        }
                        Err(e) => log::error!("reconcile {name}: {e}"),
                    }
                    match woken.recv_timeout(every) {
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        // Stopped, or dropped without `stop` (an app that never shut down).
                        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
                    }
                }
            })
            .map_err(|e| anyhow::anyhow!("cannot start the reconcile thread: {e}"))?;
        Ok(Periodic { stop, wake, thread })
    }

    /// Lets a run in progress finish its page (or its API call), and stops.
    pub(crate) fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.wake.try_send(());
        if self.thread.join().is_err() {
            log::error!("reconcile thread panicked");
        }
    }
}

impl crate::writer::Background for Periodic {
    fn stop(self: Box<Self>) {
        Periodic::stop(*self)
    }
}

/// The API base of a run: `flag` (`--api-base`, checked here) over the source's own (checked
/// at start-up), else the provider's `default`.
pub(crate) fn api_base<'a>(
    flag: Option<&'a str>,
    source: &'a SourceConfig,
    default: &'a str,
) -> Result<&'a str, ConfigError> {
    if let Some(base) = flag {
        check_api_base("--api-base", base)?;
    }
    Ok(flag.or(source.api_base.as_deref()).unwrap_or(default))
}

/// Refuses a look back of nothing or past what the provider keeps (`max`, written `max_text`,
/// for the reason `why`).
pub(crate) fn check_since(
    since: Duration,
    max: Duration,
    max_text: &str,
    why: &str,
) -> anyhow::Result<()> {
    if since.is_zero() || since > max {
        anyhow::bail!("since must be more than 0 and at most {max_text} ({why})");
    }
    Ok(())
}

/// The Unix time `since` ago: where a run's look back ends.
pub(crate) fn horizon(since: Duration) -> i64 {
    crate::time::unix_now() - since.as_secs() as i64
}

/// Refuses an API base the secret key would travel to in clear: it must be `https://`, or
/// `http://` to this machine (a loopback address, 127.0.0.0/8 or ::1, or `localhost`: a test
/// server). `key` names the setting (`source `stripe`.api_base`, or a flag); the URL itself is
/// not repeated.
pub(crate) fn check_api_base(key: &str, base: &str) -> Result<(), ConfigError> {
    let Ok(url) = url::Url::parse(base) else {
        refuse!(key, "not a URL");
    };
    let loopback = match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        None => false,
    };
    match url.scheme() {
        "https" if url.has_host() => Ok(()),
        "http" if loopback => Ok(()),
        _ => refuse!(
            key,
            "must be an https:// URL: the API key goes in every request (http:// only to a \
             loopback host, 127.0.0.1, ::1 or localhost, for a test server)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_look_back_of_nothing_or_past_the_provider_s_keep_is_refused_with_the_reason() {
        let day = Duration::from_secs(86_400);
        let why = "GitHub keeps a hook's deliveries for 3 days";
        assert!(check_since(3 * day, 3 * day, "3d", why).is_ok());
        assert!(check_since(Duration::from_secs(1), 3 * day, "3d", why).is_ok());
        for since in [Duration::ZERO, 3 * day + Duration::from_secs(1)] {
            let e = check_since(since, 3 * day, "3d", why).unwrap_err();
            assert_eq!(
                e.to_string(),
                "since must be more than 0 and at most 3d (GitHub keeps a hook's deliveries \
                 for 3 days)"
            );
        }
    }
}
