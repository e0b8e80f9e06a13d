//! Arbitrary bytes as a (verified) Stripe event body: `parse_stripe` must never panic, and an
//! `Ok` must hold what the ledger relies on (see `hookledger_fuzz::check_event`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = hookledger_fuzz::check_event(data);
});
