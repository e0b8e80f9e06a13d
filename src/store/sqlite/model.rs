//! A model-based property test of the SQLite claim path (DESIGN.md §21): random sequences of
//! claims (new and resent, also across blocks of ids), clean stops (the filter saved), kills
//! (dropped without a stop: nothing saved), claims and key rewrites by another connection
//! (with explicit ids, into holes of older blocks), prunes and vacuums, against a plain map of
//! keys. Every claim's answer (processed or duplicate) and, after each step, the ledger's
//! keys must be the model's; `hookledger check` must find nothing wrong at the end.
//!
//! A fixed budget: `HOOKLEDGER_PROPTEST_CASES` cases (default 24) of up to 40 steps. It
//! prints its seed; `HOOKLEDGER_PROPTEST_SEED=<hex>` runs that sequence again.

use std::collections::BTreeMap;
use std::path::Path;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use rusqlite::Connection;

use crate::config::DEFAULT_BUSY_TIMEOUT;
use crate::event::Event;
use crate::handler::Submission;
use crate::store::sqlite::SqliteStore;
use crate::store::{Done, Outcome, Store, Work, Write};

/// Event ids `e0` … `e23`: few enough that resends are frequent.
const KEYS: usize = 24;

#[derive(Debug, Clone)]
enum Step {
    /// The writer claims `e{0}` (new or a resend).
    Claim(usize),
    /// A clean stop and start: the filter saved, then loaded.
    Restart,
    /// A kill and start: nothing saved, the filter built.
    Kill,
    /// Another connection claims `e{0}` with an explicit id: in a block of its own above the
    /// rest (the writer's next claims land there, the others are now in older blocks), or
    /// (`hole`) into a free id of the oldest block.
    Other { key: usize, hole: bool },
    /// Another connection rewrites the key of a claim (the `n`-th, by id) to `e{to}`.
    Rewrite { n: usize, to: usize },
    /// The writer's retention deletes the claims received before the `n`-th oldest.
    Prune(usize),
    /// A clean stop, `hookledger vacuum`, a start.
    Vacuum,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => (0..KEYS).prop_map(Step::Claim),
        1 => Just(Step::Restart),
        1 => Just(Step::Kill),
        2 => (0..KEYS, any::<bool>()).prop_map(|(key, hole)| Step::Other { key, hole }),
        1 => (0..8usize, 0..KEYS).prop_map(|(n, to)| Step::Rewrite { n, to }),
        1 => (0..8usize).prop_map(Step::Prune),
        1 => Just(Step::Vacuum),
    ]
}

/// The ledger as the model has it: each key's received time.
type Model = BTreeMap<String, i64>;

struct World {
    path: std::path::PathBuf,
    store: Option<SqliteStore>,
    other: Connection,
    model: Model,
    /// The clock: each step one second later.
    now: i64,
}

impl World {
    fn store(&mut self) -> &mut SqliteStore {
        self.store.as_mut().expect("open")
    }

    fn reopen(&mut self) {
        self.store = Some(SqliteStore::open(&self.path, DEFAULT_BUSY_TIMEOUT).unwrap());
    }

    fn stop_cleanly(&mut self) {
        let mut store = self.store.take().expect("open");
        store.close();
    }

    fn claim(&mut self, key: &str) -> Outcome {
        let work = Work::Event(Submission {
            token: None,
            event: Event {
                source: "src".into(),
                id: key.into(),
                kind: "thing.happened".into(),
                created: Some(1),
                body: bytes::Bytes::from_static(b"{}"),
            },
            handlers: Vec::new(),
            forward: false,
            routed: Vec::new(),
            stored: None,
        });
        let now = self.now;
        match self.store().run_batch(vec![work], now).unwrap().pop() {
            Some(Done::Event(Ok(outcome))) => outcome,
            _ => panic!("one event in, its outcome out"),
        }
    }

    fn ledger(&self) -> Model {
        let mut keys = self
            .other
            .prepare("SELECT event_id, received_at FROM webhook_events")
            .unwrap();
        let rows = keys
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
            .unwrap();
        let mut ledger = Model::new();
        for row in rows {
            let (key, at) = row.unwrap();
            assert!(ledger.insert(key.clone(), at).is_none(), "{key} twice");
        }
        ledger
    }

    fn apply(&mut self, step: &Step) {
        self.now += 1;
        match *step {
            Step::Claim(k) => {
                let key = format!("e{k}");
                let expected = match self.model.contains_key(&key) {
                    true => Outcome::Duplicate,
                    false => Outcome::Processed,
                };
                assert_eq!(self.claim(&key), expected, "{key}");
                self.model.entry(key).or_insert(self.now);
            }
            Step::Restart => {
                self.stop_cleanly();
                self.reopen();
            }
            Step::Kill => {
                drop(self.store.take());
                self.reopen();
            }
            Step::Other { key, hole } => {
                let key = format!("e{key}");
                if self.model.contains_key(&key) {
                    return; // another program does not claim what is claimed
                }
                let (min, max): (Option<i64>, Option<i64>) = self
                    .other
                    .query_row("SELECT min(id), max(id) FROM webhook_events", [], |r| {
                        Ok((r.get(0)?, r.get(1)?))
                    })
                    .unwrap();
                let id = match (hole, min, max) {
                    // The id below the lowest: a hole, in the oldest block or the one before.
                    (true, Some(min), _) if min > 1 => min - 1,
                    (_, _, max) => ((max.unwrap_or(0) >> 16) + 1 + (self.now % 3)) << 16,
                };
                self.other
                    .execute(
                        "INSERT INTO webhook_events (id, source, event_id, event_type, received_at)
                         VALUES (?1, 'src', ?2, 't', ?3)",
                        rusqlite::params![id, &key, self.now],
                    )
                    .unwrap();
                self.model.insert(key, self.now);
            }
            Step::Rewrite { n, to } => {
                let to = format!("e{to}");
                if self.model.contains_key(&to) {
                    return;
                }
                let Some((id, from)): Option<(i64, String)> = self
                    .other
                    .query_row(
                        "SELECT id, event_id FROM webhook_events ORDER BY id LIMIT 1 OFFSET ?1",
                        [n as i64],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .ok()
                else {
                    return;
                };
                self.other
                    .execute(
                        "UPDATE webhook_events SET event_id = ?2 WHERE id = ?1",
                        rusqlite::params![id, &to],
                    )
                    .unwrap();
                let at = self.model.remove(&from).expect("in the model");
                self.model.insert(to, at);
            }
            Step::Prune(n) => {
                let mut times: Vec<i64> = self.model.values().copied().collect();
                times.sort_unstable();
                let Some(&before) = times.get(n) else {
                    return;
                };
                let prune = Write::PruneEvents { before };
                let now = self.now;
                self.store()
                    .run_batch(vec![Work::Write(&prune)], now)
                    .unwrap();
                self.model.retain(|_, at| *at >= before);
            }
            Step::Vacuum => {
                self.stop_cleanly();
                super::vacuum(&self.path).unwrap();
                self.reopen();
            }
        }
        assert_eq!(self.ledger(), self.model, "after {step:?}");
    }
}

fn run(steps: &[Step], dir: &Path) {
    let path = dir.join("h.db");
    let store = SqliteStore::open(&path, DEFAULT_BUSY_TIMEOUT).unwrap();
    let other = Connection::open(&path).unwrap();
    other.busy_timeout(DEFAULT_BUSY_TIMEOUT).unwrap();
    let mut world = World {
        path,
        store: Some(store),
        other,
        model: Model::new(),
        now: 1_800_000_000,
    };
    for step in steps {
        world.apply(step);
    }
    // And every key the model holds is a duplicate once more, after a last clean restart.
    world.stop_cleanly();
    world.reopen();
    for key in world.model.keys().cloned().collect::<Vec<_>>() {
        assert_eq!(world.claim(&key), Outcome::Duplicate, "{key} at the end");
    }
    world.stop_cleanly();
    let report = super::check::check(&world.path).unwrap();
    assert!(report.is_clean(), "{report:?}");
}

#[test]
fn the_claim_path_answers_as_a_set_of_keys_would() {
    let cases = std::env::var("HOOKLEDGER_PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(24);
    let seed: [u8; 32] = match std::env::var("HOOKLEDGER_PROPTEST_SEED") {
        Ok(hex) => hex::decode(hex.trim())
            .ok()
            .and_then(|b| b.try_into().ok())
            .expect("HOOKLEDGER_PROPTEST_SEED: 64 hex digits"),
        Err(_) => {
            let mut seed = [0u8; 32];
            getrandom::fill(&mut seed).unwrap();
            seed
        }
    };
    eprintln!(
        "claim path model: {cases} case(s), HOOKLEDGER_PROPTEST_SEED={}",
        hex::encode(seed)
    );
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed));
    runner
        .run(&proptest::collection::vec(step(), 1..40), |steps| {
            let dir = tempfile::tempdir().unwrap();
            run(&steps, dir.path());
            Ok(())
        })
        .unwrap();
}

/// The sequence the model found (shrunk): claims by another connection in blocks above the
/// writer's, then the writer's claim of one of them.
#[test]
fn claims_by_another_connection_in_blocks_above_are_duplicates_for_the_writer() {
    use Step::*;
    let steps = [
        Claim(14),
        Other {
            key: 17,
            hole: false,
        },
        Other {
            key: 4,
            hole: false,
        },
        Claim(17),
        Claim(10),
        Kill,
        Prune(6),
        Claim(1),
        Claim(7),
        Claim(5),
        Claim(22),
        Restart,
        Other {
            key: 20,
            hole: true,
        },
        Claim(14),
        Claim(23),
        Claim(19),
        Claim(21),
    ];
    let dir = tempfile::tempdir().unwrap();
    run(&steps, dir.path());
}
