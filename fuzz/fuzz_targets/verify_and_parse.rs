//! The request path from verify to parse. The input is `<header line>\n<body>`.
//!
//! Three requests are made from it:
//! 1. the hostile header with the body, as an attacker would send them (must fail cleanly
//!    unless the header really is valid, e.g. a seed from the fixtures);
//! 2. the body correctly signed by `stripe::sign`, which must verify, so the parser behind a
//!    valid signature sees every body the fuzzer makes;
//! 3. the hostile header with a valid `v1` for its own `t` appended: a real `v1` among junk
//!    entries must still be found, and the timestamp check must decide alone.
//!
//! And headers signed for a different body, another timestamp or another secret must never
//! verify.
#![no_main]

use hookledger::internals::stripe;
use hookledger::{Secret, VerifyError};
use hookledger_fuzz::{check_event, check_header, to_hex, MAX_SIGNATURES};
use libfuzzer_sys::fuzz_target;

/// The secret the fixture headers in `signatures.json` were made with.
const SECRET: &str = "whsec_test_secret";

/// The `created` of `customer.created.json`, so that fixture's seed verifies as sent; the
/// other fixtures are minutes to hours away and exercise the tolerance errors.
const NOW: i64 = 1_721_953_934;

const TOLERANCE: u64 = stripe::DEFAULT_TOLERANCE_SECS;

/// Whether `t` is within the tolerance of `NOW` (in i128: `t` is any i64).
fn in_tolerance(t: i64) -> bool {
    (i128::from(NOW) - i128::from(t)).abs() <= i128::from(TOLERANCE)
}

fuzz_target!(|data: &[u8]| {
    let (header, body) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let secrets = [Secret::new(SECRET)];

    // 1. As sent.
    let parsed = check_header(header);
    match stripe::verify(&secrets, Some(header), body, NOW, TOLERANCE) {
        Ok(t) => {
            assert_eq!(parsed.as_ref().map(|h| h.timestamp), Ok(t));
            assert!(in_tolerance(t), "t={t} accepted at now={NOW}");
            let _ = check_event(body);
        }
        Err(e) => {
            if let Err(parse_error) = &parsed {
                assert_eq!(&e, parse_error, "verify and parse_header disagree");
            }
        }
    }
    assert_eq!(
        stripe::verify(&secrets, None, body, NOW, TOLERANCE),
        Err(VerifyError::MissingHeader(stripe::HEADER))
    );

    // 2. Correctly signed, at a timestamp inside the tolerance picked by the input.
    let t = NOW + (data.len() as i64 % 601) - 300;
    let signed = stripe::sign(&secrets[0], t, body);
    assert_eq!(
        stripe::verify(&secrets, Some(signed.as_bytes()), body, NOW, TOLERANCE),
        Ok(t),
        "a correctly signed body did not verify"
    );
    let _ = check_event(body);

    // Signed for something else: never valid for this body.
    let mut longer = body.to_vec();
    longer.push(b' ');
    let mut others = vec![stripe::sign(&secrets[0], t, &longer)];
    if let Some((first, rest)) = body.split_first() {
        let mut flipped = body.to_vec();
        flipped[0] = first ^ 1;
        others.push(stripe::sign(&secrets[0], t, &flipped));
        others.push(stripe::sign(&secrets[0], t, rest));
    }
    // Another timestamp with the same v1, and another secret.
    let v1 = signed.split_once(",v1=").expect("sign writes t=…,v1=…").1;
    others.push(format!("t={},v1={v1}", t + 1));
    others.push(stripe::sign(&Secret::new("whsec_other"), t, body));
    for other in &others {
        assert_eq!(
            stripe::verify(&secrets, Some(other.as_bytes()), body, NOW, TOLERANCE),
            Err(VerifyError::NoMatch),
            "{other} verified a body it was not made for"
        );
    }

    // 3. The hostile header plus a valid v1 for its own timestamp.
    if let Ok(h) = &parsed {
        let text = std::str::from_utf8(header).expect("parsed headers are UTF-8");
        let valid = to_hex(&stripe::compute(&secrets[0], h.timestamp, body));
        let combined = format!("{text},v1={valid}");
        let result = stripe::verify(&secrets, Some(combined.as_bytes()), body, NOW, TOLERANCE);
        if h.v1.len() < MAX_SIGNATURES {
            if in_tolerance(h.timestamp) {
                assert_eq!(result, Ok(h.timestamp), "{combined}");
            } else {
                assert!(
                    matches!(
                        result,
                        Err(VerifyError::TooOld { .. } | VerifyError::InFuture { .. })
                    ),
                    "{combined}: {result:?}"
                );
            }
        } else {
            // Past the cap the appended v1 is not read; it can only pass through the others.
            assert!(
                result.is_err() || h.v1.iter().any(|s| to_hex(s) == valid),
                "{combined}: {result:?}"
            );
        }
    }
});
