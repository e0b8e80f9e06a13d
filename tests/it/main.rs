//! One integration test binary: the real `hookledger` over real HTTP on port 0, each test
//! with its own temp directory and SQLite file.

mod util;

mod crash;
mod fixtures;
mod outbox;
mod receiver;
