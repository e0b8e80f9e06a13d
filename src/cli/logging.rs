//! The log: `tracing` events (and the `log` records of the crate and its dependencies, bridged
//! into them) written to stderr, one line each, as text or as one JSON object (by a thread of
//! their own: `log_buffer`).
//!
//! A line carries the time, the level, the module (`target`), the message and the event's
//! fields: `source`, `event_id`, `outcome`, `status`, `reason`, `kind`, `row_id`, … (a log
//! collector filters on them; no parsing of the message). `RUST_LOG` chooses what is written,
//! as before (`info` by default).
//!
//! # Failure modes
//! The HTTP client's and the PostgreSQL client's lines below info are never written, whatever
//! `RUST_LOG` says (even `ureq::unit=debug`): at debug ureq logs whole requests, with the
//! delivery signature and any `user:password@` of a target URL, and tokio-postgres logs every
//! statement's parameters, webhook bodies included.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::filter::{EnvFilter, FilterExt};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::{Context, Filter, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

use super::log_buffer::{Buffered, LogGuard};
use super::LogFormat;

/// Crates whose lines below info can hold a secret or a body (see the module doc).
const NOISY: [&str; 3] = ["ureq", "tokio_postgres", "postgres"];

/// Installs the log for the process: lines in `format`, filtered by `RUST_LOG` (else
/// `default_level`), written by a thread of their own (`log_buffer`). A second call (a test
/// harness that installed its own) changes nothing. Keep the guard until the process ends:
/// dropping it writes the lines still waiting.
pub fn init(format: LogFormat, default_level: &str) -> LogGuard {
    let env = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let lines = tracing_subscriber::fmt::layer()
        .event_format(Lines {
            json: format == LogFormat::Json,
        })
        .with_writer(Buffered)
        .with_filter(env.and(Quiet));
    // With the `tracing-log` feature this also sends `log` records through the same filter.
    let _ = tracing_subscriber::registry().with(lines).try_init();
    LogGuard::new()
}

/// Holds back what [`too_chatty`] says.
struct Quiet;

impl<S> Filter<S> for Quiet {
    fn enabled(&self, metadata: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        !too_chatty(metadata)
    }

    // Static for a call site (its target and level): a `tracing` call site is decided once.
    // (`log` records share call sites; each is decided by `enabled`.)
    fn callsite_enabled(&self, metadata: &'static Metadata<'static>) -> Interest {
        match too_chatty(metadata) {
            true => Interest::never(),
            false => Interest::sometimes(),
        }
    }
}

/// A line below info from one of the [`NOISY`] crates.
fn too_chatty(metadata: &Metadata<'_>) -> bool {
    let target = metadata.target();
    let noisy = NOISY
        .iter()
        .any(|c| target == *c || target.strip_prefix(c).is_some_and(|t| t.starts_with("::")));
    noisy && *metadata.level() > Level::INFO
}

/// The line format: `2026-11-30T09:40:37.730Z INFO  target: message key=value …`, or
/// `{"ts":"2026-11-30T09:40:37.730Z","level":"INFO","target":"…","message":"…","key":value,…}`.
struct Lines {
    json: bool,
}

impl<S, N> FormatEvent<S, N> for Lines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        use tracing_log::NormalizeEvent;
        let normalized = event.normalized_metadata();
        let metadata = normalized.as_ref().unwrap_or_else(|| event.metadata());
        let mut fields = Fields::default();
        event.record(&mut fields);
        let ts = timestamp();
        if self.json {
            let mut line = serde_json::Map::new();
            line.insert("ts".into(), ts.into());
            line.insert("level".into(), metadata.level().as_str().into());
            line.insert("target".into(), metadata.target().into());
            line.insert("message".into(), fields.message.into());
            for (name, value) in fields.pairs {
                line.insert(name.into(), value);
            }
            return writeln!(writer, "{}", serde_json::Value::Object(line));
        }
        write!(
            writer,
            "{ts} {:<5} {}: {}",
            metadata.level().as_str(),
            metadata.target(),
            fields.message
        )?;
        for (name, value) in &fields.pairs {
            match value {
                // Bare when it reads as one word; else quoted and escaped, so a value cannot
                // forge a field or a line.
                serde_json::Value::String(s)
                    if !s.is_empty()
                        && !s.chars().any(|c| {
                            c.is_whitespace() || c.is_control() || c == '"' || c == '='
                        }) =>
                {
                    write!(writer, " {name}={s}")?
                }
                other => write!(writer, " {name}={other}")?,
            }
        }
        writeln!(writer)
    }
}

/// An event's message and its other fields, in the order written.
#[derive(Default)]
struct Fields {
    message: String,
    pairs: Vec<(&'static str, serde_json::Value)>,
}

impl Fields {
    fn push(&mut self, field: &Field, value: serde_json::Value) {
        match field.name() {
            "message" => {
                self.message = match value {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                }
            }
            // What the `log` bridge adds (the record's module, file and line): not ours.
            name if name.starts_with("log.") => {}
            name => self.pairs.push((name, value)),
        }
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.push(field, value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.push(field, value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.push(field, value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.push(field, value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.push(field, value.into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let mut text = String::new();
        let _ = write!(text, "{value:?}");
        self.push(field, text.into());
    }
}

/// Now, as `2026-11-30T09:40:37.730Z`.
fn timestamp() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    stamp(now.as_secs() as i64, now.subsec_millis())
}

thread_local! {
    /// The last second a line of this thread was stamped with, formatted: a busy server logs
    /// many lines a second.
    static SECOND: std::cell::RefCell<(i64, String)> = const {
        std::cell::RefCell::new((i64::MIN, String::new()))
    };
}

/// `secs` and `millis` as `2026-11-30T09:40:37.730Z`.
fn stamp(secs: i64, millis: u32) -> String {
    let stamped = |second: &str| {
        let mut out = String::with_capacity(second.len() + 5);
        out.push_str(second.trim_end_matches('Z'));
        let _ = write!(out, ".{millis:03}Z");
        out
    };
    // A line logged while the thread's locals are dropped (a thread ending) formats its own.
    SECOND
        .try_with(|cell| {
            let mut cached = cell.try_borrow_mut().ok()?;
            let (second, text) = &mut *cached;
            if *second != secs {
                *text = crate::time::format_rfc3339(secs);
                *second = secs;
            }
            Some(stamped(text))
        })
        .ok()
        .flatten()
        .unwrap_or_else(|| stamped(&crate::time::format_rfc3339(secs)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_noisy_crates_lines_below_info_are_held_back() {
        use tracing::callsite::Identifier;
        struct Site;
        impl tracing::callsite::Callsite for Site {
            fn set_interest(&self, _: Interest) {}
            fn metadata(&self) -> &Metadata<'_> {
                unreachable!()
            }
        }
        static SITE: Site = Site;
        for (target, level, held) in [
            ("ureq::unit", Level::DEBUG, true),
            ("ureq", Level::TRACE, true),
            ("tokio_postgres::query", Level::DEBUG, true),
            ("postgres", Level::DEBUG, true),
            ("ureq::unit", Level::INFO, false),
            ("tokio_postgres", Level::WARN, false),
            ("ureqx", Level::DEBUG, false),
            ("postgresql_client", Level::DEBUG, false),
            ("hookledger::delivery", Level::TRACE, false),
        ] {
            let metadata = Metadata::new(
                "x",
                target,
                level,
                None,
                None,
                None,
                tracing::field::FieldSet::new(&[], Identifier(&SITE)),
                tracing::metadata::Kind::EVENT,
            );
            assert_eq!(too_chatty(&metadata), held, "{target} {level}");
        }
    }

    #[test]
    fn a_stamp_is_its_own_second_also_after_another_one() {
        assert_eq!(stamp(1_764_495_637, 730), "2025-11-30T09:40:37.730Z");
        assert_eq!(stamp(1_764_495_637, 5), "2025-11-30T09:40:37.005Z");
        assert_eq!(stamp(1_764_495_638, 0), "2025-11-30T09:40:38.000Z");
        assert_eq!(stamp(0, 999), "1970-01-01T00:00:00.999Z");
        assert_eq!(stamp(1_764_495_637, 730), "2025-11-30T09:40:37.730Z");
    }

    #[test]
    fn the_timestamp_has_milliseconds_and_utc() {
        let ts = timestamp();
        assert_eq!(ts.len(), "2026-11-30T09:40:37.730Z".len(), "{ts}");
        assert!(ts.ends_with('Z') && ts.as_bytes()[19] == b'.', "{ts}");
    }
}
