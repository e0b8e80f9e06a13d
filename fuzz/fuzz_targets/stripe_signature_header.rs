//! Arbitrary bytes as a `Stripe-Signature` header value: `parse_header` must never panic, and
//! an `Ok` must hold what `verify` relies on (see `hookledger_fuzz::check_header`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = hookledger_fuzz::check_header(data);
});
