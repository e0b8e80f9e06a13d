//! Each source's payload dictionary: trained once on its first stored payloads, kept in the
//! database for ever, and handed to the source, which compresses with it from then on.
//!
//! Ordering: at start-up the dictionaries already stored are loaded before the first request
//! ([`load`]). A source without one compresses with plain zstd; the trainer thread looks
//! every [`POLL`] for a source with [`SAMPLES`] stored payloads, trains on them (off the
//! writer: training takes a fraction of a second), stores the dictionary through the writer
//! and reads back the one stored: with several instances on PostgreSQL, the first stored
//! wins and every instance uses that one. A dictionary is never retrained or deleted: rows
//! made with it stay readable for as long as they are kept.
//!
//! Failure modes: training can fail (samples too alike, or too few bytes): the source goes on
//! with plain zstd, and it is tried again at the next start. A database that cannot be read
//! or written is tried again at the next look.

use std::collections::HashMap;
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::payload::{self, Dictionaries};
use crate::store::{payload as stored, Reader, Write};
use crate::writer::WriterHandle;

/// Payloads a dictionary is trained on: zstd's guidance is about 100× the dictionary's size
/// in samples; 1,000 webhook bodies of a few KB are that, and are there within minutes at
/// the rates where the bytes matter.
pub(crate) const SAMPLES: i64 = 1000;

/// Largest dictionary: 32 KB. Measured with the zstd CLI (level 3, trained on 1,000 of the
/// 4–5 KB Stripe events of `tests/fixtures/stripe` with ids and times varied, 200 others
/// compressed): 16 KB gives 333 bytes an event, 32 KB 272, 64 KB 269. Each source's
/// dictionary is held in memory twice (to compress and to decompress).
pub(crate) const DICT_BYTES: usize = 32 * 1024;

/// How often the trainer looks for a source with enough payloads.
const POLL: Duration = Duration::from_secs(10);

/// How often the trainer checks whether to look before [`POLL`]: it does once [`SAMPLES`]
/// payloads were compressed without a dictionary since its last look, so that a busy source
/// gets its dictionary within about a second of its 1,000th payload, not ten. Until then each
/// payload costs plain zstd on the request's thread (about five times the instructions).
const SOON: Duration = Duration::from_secs(1);

/// Whether the trainer looks now: [`POLL`] since its last look, or [`SAMPLES`] payloads
/// compressed without a dictionary since then (`plain`, counted by [`Dictionaries`]).
fn look_now(since_look: Duration, plain: u64) -> bool {
    since_look >= POLL || plain >= SAMPLES as u64
}

/// Hands each source of `sources` its stored dictionary, if it has one.
pub(crate) fn load(
    reader: &Reader,
    sources: &[Arc<str>],
    dictionaries: &Dictionaries,
) -> anyhow::Result<()> {
    for source in sources {
        if let Some(dict) = reader.read(|conn| stored::dictionary_of(conn, source))? {
            dictionaries.set(source.clone(), dict);
        }
    }
    Ok(())
}

/// Trains, stores and hands out the dictionary of `source` if it has [`SAMPLES`] payloads
/// (or takes the one another instance stored); whether it is done: the source has one now,
/// or its payloads cannot make one (then it goes on without, until the next start).
pub(crate) fn train(
    reader: &Reader,
    writer: &WriterHandle,
    source: &Arc<str>,
    dictionaries: &Dictionaries,
) -> anyhow::Result<bool> {
    if let Some(dict) = reader.read(|conn| stored::dictionary_of(conn, source))? {
        dictionaries.set(source.clone(), dict);
        return Ok(true);
    }
    if !reader.read(|conn| stored::has_samples(conn, source, SAMPLES))? {
        return Ok(false);
    }
    let samples = reader.read(|conn| stored::samples(conn, source, SAMPLES))?;
    if (samples.len() as i64) < SAMPLES {
        return Ok(false);
    }
    let dict = match payload::train(&samples, DICT_BYTES) {
        Ok(dict) => dict,
        Err(e) => {
            log::warn!(
                "payloads of source {source} stay compressed without a dictionary: zstd could \
                 not train one on them ({e})"
            );
            return Ok(true);
        }
    };
    drop(samples);
    writer.run_blocking(Write::Dictionary {
        source: source.to_string(),
        dict,
    })?;
    // The one stored: this one, or another instance's stored first.
    match reader.read(|conn| stored::dictionary_of(conn, source))? {
        Some(dict) => {
            log::info!(
                "payloads of source {source} are now compressed with dictionary {}",
                dict.id
            );
            dictionaries.set(source.clone(), dict);
            Ok(true)
        }
        None => Ok(false),
    }
}

/// The trainer thread. Dropping or calling `stop` ends it.
pub(crate) struct Trainer {
    /// Never sent on: dropping it (in `stop`) wakes the thread, which then ends.
    stop: SyncSender<()>,
    thread: JoinHandle<()>,
}

impl Trainer {
    /// Looks every [`POLL`] (or sooner, see [`look_now`]) until each of `sources` has a
    /// dictionary.
    pub(crate) fn spawn(
        writer: WriterHandle,
        reader: Reader,
        sources: Vec<Arc<str>>,
        dictionaries: Arc<Dictionaries>,
    ) -> anyhow::Result<Trainer> {
        let (stop, stopped) = mpsc::sync_channel::<()>(0);
        let thread = std::thread::Builder::new()
            .name("hookledger-dictionaries".into())
            .spawn(move || {
                let mut waiting: HashMap<Arc<str>, ()> = sources
                    .into_iter()
                    .filter(|s| dictionaries.get(s).is_none())
                    .map(|s| (s, ()))
                    .collect();
                loop {
                    let looked = (std::time::Instant::now(), dictionaries.plain());
                    waiting.retain(|source, ()| {
                        match train(&reader, &writer, source, &dictionaries) {
                            Ok(done) => !done,
                            Err(e) => {
                                log::warn!(
                                    "payloads: no dictionary for source {source} yet: {e:#}"
                                );
                                true
                            }
                        }
                    });
                    if waiting.is_empty() {
                        let _ = stopped.recv();
                        break;
                    }
                    loop {
                        match stopped.recv_timeout(SOON) {
                            Err(RecvTimeoutError::Timeout) => {}
                            _ => return,
                        }
                        let plain = dictionaries.plain().saturating_sub(looked.1);
                        if look_now(looked.0.elapsed(), plain) {
                            break;
                        }
                    }
                }
            })?;
        Ok(Trainer { stop, thread })
    }
}

impl crate::writer::Background for Trainer {
    fn stop(self: Box<Self>) {
        drop(self.stop);
        if self.thread.join().is_err() {
            log::error!("dictionary trainer thread panicked");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trainer_looks_again_after_a_poll_or_as_soon_as_enough_payloads_came() {
        assert!(!look_now(SOON, 0));
        assert!(!look_now(SOON, SAMPLES as u64 - 1));
        // A busy source: 1,000 payloads in the last second, so it may have its samples now.
        assert!(look_now(SOON, SAMPLES as u64));
        // A quiet one: every ten seconds, as before.
        assert!(look_now(POLL, 0));
    }
}
