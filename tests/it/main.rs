#![allow(unreachable_pub)] // one test binary: its modules share helpers with `pub`
//! One integration test binary: the real `hookledger` over real HTTP on port 0, each test
//! with its own temp directory and database: a SQLite file, or with
//! `HOOKLEDGER_TEST_STORE=postgres` a PostgreSQL database of its own (`util/store.rs`).

mod util;

mod admin;
mod alerts;
mod api;
mod batch_limits;
mod batches;
mod billing;
// The broker clients, to read what hookledger published: the default build's.
#[cfg(all(feature = "nats", feature = "amqp", feature = "redis"))]
mod brokers;
mod browser;
mod claims;
mod cli_config;
mod commands;
mod console;
mod crash;
mod delivery_budget;
mod effects;
mod embed;
mod envelopes;
mod faults;
mod filter;
mod fixtures;
mod github_recovery;
mod gitlab_recovery;
mod hostile;
mod lanes;
mod mailgun;
mod observability;
mod openapi;
mod operations;
mod oracles;
mod oracles_a;
mod oracles_b;
mod oracles_sp;
mod oracles_twilio;
mod outbox;
mod patroni;
mod payloads;
mod postgres;
mod presets;
mod proxies;
mod receiver;
mod reconcile;
mod reload;
mod restarts;
mod sdks;
mod secrets;
mod sendgrid;
mod sources;
mod startup;
mod storage;
mod stream_recovery;
mod stripe_tables;
