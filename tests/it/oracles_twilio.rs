//! Twilio's Python SDK (`twilio`, its `RequestValidator`) as an independent oracle of the
//! `twilio` preset, as in `oracles.rs`: it verifies what `hookledger send` signs, and what it
//! signs (a form body to a URL with a query; a JSON body with `bodySHA256` in the query) is
//! processed, a duplicate the second time, and refused with one byte changed. `.ci/run`
//! installs it and sets `HOOKLEDGER_REQUIRE_SDKS`, so in CI a missing SDK fails the test.

use crate::oracles::{accepted_once, header, python_has, run, REQUIRE};
use crate::util::*;

/// Twilio's SDK: `verify <url> <signature>` prints whether the form body on stdin verifies;
/// `sign <url>` prints the signature of the form body on stdin; `sign-json <url>` prints the
/// URL with the JSON body's `bodySHA256` and its signature.
const SDK: &str = "import sys\n\
    from urllib.parse import parse_qsl\n\
    from twilio.request_validator import RequestValidator\n\
    mode, token, url = sys.argv[1:4]\n\
    body = sys.stdin.buffer.read().decode()\n\
    v = RequestValidator(token)\n\
    params = dict(parse_qsl(body, keep_blank_values=True))\n\
    if mode == 'verify':\n\
    \x20   print(v.validate(url, params, sys.argv[4]))\n\
    elif mode == 'sign':\n\
    \x20   print(v.compute_signature(url, params))\n\
    else:\n\
    \x20   url = url + '?bodySHA256=' + v.compute_hash(body)\n\
    \x20   print(url, v.compute_signature(url, {}))\n\
    \x20   print(v.validate(url, body, v.compute_signature(url, {})))";

#[test]
fn twilios_sdk_verifies_what_send_signs_and_hookledger_accepts_what_it_signs() {
    if !prerequisite(
        python_has("twilio.request_validator"),
        REQUIRE,
        "the Python twilio package (python3 -m pip install twilio)",
    ) {
        return;
    }
    let token = "twilio-auth-token-0123456789abcd";
    // The URL set at Twilio; a proxy in front forwards to us.
    let url = "https://hooks.example.com/webhooks/twilio";
    let dir = test_dir();
    let config = dir.path().join("oracle.toml");
    std::fs::write(
        &config,
        format!(
            "[[source]]\nname = \"twilio\"\npreset = \"twilio\"\nsecrets = [\"{token}\"]\n\
             public_url = \"{url}\"\n"
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let sdk = |args: &[&str], body: &[u8]| {
        let mut all = vec!["-c", SDK];
        all.extend(args);
        run("python3", &all, None, body)
    };

    // The SDK verifies what `send` signs, and not with a changed parameter.
    let file = fixtures_dir().join("twilio/message-status.txt");
    let (headers, body) = capture_send(&[
        "--config",
        config,
        "--source",
        "twilio",
        file.to_str().unwrap(),
    ]);
    let signature = header(&headers, "X-Twilio-Signature").to_string();
    assert_eq!(sdk(&["verify", token, url, &signature], &body), "True");
    let changed = String::from_utf8(body.clone())
        .unwrap()
        .replace("delivered", "undelivered");
    assert_eq!(
        sdk(&["verify", token, url, &signature], changed.as_bytes()),
        "False"
    );

    let server = Server::start_in(dir.path(), &["--config", config]);
    // A form body the SDK signs, called at a URL with a query: the sid and status are the id
    // (no idempotency token).
    let query = "?foo=1&bar=2";
    let signed = sdk(&["sign", token, &format!("{url}{query}")], &body);
    accepted_once(
        &server,
        &format!("/webhooks/twilio{query}"),
        &body,
        &[
            ("X-Twilio-Signature", &signed),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        "SM1f0e8ae6ade43cb3c0ce4525424e404f.delivered",
        false,
    );
    // The same signature for the URL without the query is refused.
    let reply = server.post(
        "/webhooks/twilio",
        &body,
        &[
            ("X-Twilio-Signature", &signed),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
    );
    assert_eq!(reply.status, 400, "another URL: {}", reply.body);

    // A JSON body: its SHA-256 in the signed URL's query.
    let json_body = br#"{"sid":"EX0123456789abcdef0123456789abcdef","status":"ended"}"#;
    let out = sdk(&["sign-json", token, url], json_body);
    let mut lines = out.lines();
    let (signed_url, signature) = lines.next().unwrap().split_once(' ').unwrap();
    assert_eq!(lines.next(), Some("True"), "the SDK verifies its own");
    let query = &signed_url[url.len()..];
    assert!(query.starts_with("?bodySHA256="), "{signed_url}");
    accepted_once(
        &server,
        &format!("/webhooks/twilio{query}"),
        json_body,
        &[
            ("X-Twilio-Signature", signature),
            ("Content-Type", "application/json"),
        ],
        "EX0123456789abcdef0123456789abcdef",
        false,
    );
    assert_eq!(ledger_count(&server.db()), 2);
}
