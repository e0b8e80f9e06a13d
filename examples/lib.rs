//! Nothing: the package `hookledger-examples` exists for its examples (`embed.rs`,
//! `fake_app.rs`, `fake_stripe.rs`, `jetstream_worker.rs`), which build with its normal
//! dependencies only.
