//! Independent oracles for more presets: the providers' own SDKs, not hookledger's code, check
//! what `hookledger send` signs, and sign what hookledger must accept. Gated like
//! `oracles.rs` (`.ci/run` installs the SDKs and sets `HOOKLEDGER_REQUIRE_SDKS`, so in CI a
//! missing one fails the test): the Python `slack_sdk` package, and the npm package
//! `@linear/sdk` in the folder `HOOKLEDGER_ORACLES` names (its `node_modules`).

use crate::oracles::{
    config_with, header, node_oracles, one_byte_changed, python_has, run, REQUIRE,
};
use crate::util::*;

#[test]
fn slacks_sdk_verifies_what_send_signs_and_hookledger_accepts_what_it_signs() {
    if !prerequisite(
        python_has("slack_sdk"),
        REQUIRE,
        "the Python slack_sdk package (python3 -m pip install slack-sdk)",
    ) {
        return;
    }
    // The signing secret of Slack's "Verifying requests from Slack" example.
    let secret = "8f742231b10e8888abcd99yyyzzz85a5";
    let dir = test_dir();
    let config = config_with(dir.path(), "slack", "slack", secret);
    let file = fixtures_dir().join("slack/event_callback.json");
    let (headers, body) = capture_send(&[
        "--config",
        &config,
        "--source",
        "slack",
        file.to_str().unwrap(),
    ]);
    // Slack's SDK: is_valid checks the v0 signature and the timestamp's age (5 minutes).
    let verify = "import sys\n\
        from slack_sdk.signature import SignatureVerifier\n\
        body = sys.stdin.buffer.read()\n\
        print(SignatureVerifier(sys.argv[1]).is_valid(body, sys.argv[2], sys.argv[3]))";
    let slack_verifies = |body: &[u8]| {
        run(
            "python3",
            &[
                "-c",
                verify,
                secret,
                header(&headers, "X-Slack-Request-Timestamp"),
                header(&headers, "X-Slack-Signature"),
            ],
            None,
            body,
        )
    };
    assert_eq!(slack_verifies(&body), "True", "slack_sdk verifies send's");
    let changed = one_byte_changed(&body);
    assert_eq!(slack_verifies(&changed), "False", "and not another body");

    // The other way: the SDK signs, hookledger takes it.
    let server = Server::start_in(dir.path(), &["--config", &config]);
    let t = now().to_string();
    let signature = run(
        "python3",
        &[
            "-c",
            "import sys\n\
             from slack_sdk.signature import SignatureVerifier\n\
             body = sys.stdin.buffer.read()\n\
             print(SignatureVerifier(sys.argv[1]).generate_signature(timestamp=sys.argv[2], body=body))",
            secret,
            &t,
        ],
        None,
        &body,
    );
    assert!(signature.starts_with("v0="), "{signature}");
    let sent = |body: &[u8]| {
        server.post(
            "/webhooks/slack",
            body,
            &[
                ("X-Slack-Signature", &signature),
                ("X-Slack-Request-Timestamp", &t),
            ],
        )
    };
    assert_outcome(&sent(&body), "Ev123ABC456", "processed");
    assert_outcome(&sent(&body), "Ev123ABC456", "duplicate");
    assert_eq!(sent(&changed).status, 400, "one changed byte");
    assert_eq!(ledger_count(&server.db()), 1);
}

/// Linear's SDK has no signing function: it verifies what `send` signs (its
/// `LinearWebhookClient.verify` also wants the body's signed `webhookTimestamp` within a
/// minute, so the fixture is sent with the current time there), and hookledger takes what the
/// SDK verified.
#[test]
fn linears_sdk_verifies_what_send_signs_and_hookledger_takes_it() {
    let oracles = node_oracles("@linear/sdk");
    if !prerequisite(
        oracles.is_some() && installed("node"),
        REQUIRE,
        "node and @linear/sdk under HOOKLEDGER_ORACLES",
    ) {
        return;
    }
    let oracles = oracles.unwrap();
    let secret = "lin_wh_oracle_test_secret_0123456789";
    let dir = test_dir();
    let config = config_with(dir.path(), "linear", "linear", secret);
    let fixture = std::fs::read_to_string(fixtures_dir().join("linear/issue.create.json")).unwrap();
    let stamp = "\"webhookTimestamp\": 1706782530000";
    assert!(fixture.contains(stamp));
    let fresh = fixture.replace(stamp, &format!("\"webhookTimestamp\": {}", now() * 1000));
    let file = dir.path().join("issue.create.json");
    std::fs::write(&file, &fresh).unwrap();
    let (headers, body) = capture_send(&[
        "--config",
        &config,
        "--source",
        "linear",
        "--type",
        "Issue",
        file.to_str().unwrap(),
    ]);
    let script = "import { LinearWebhookClient } from '@linear/sdk/webhooks';\n\
        import { readFileSync } from 'node:fs';\n\
        const body = readFileSync(0);\n\
        const [secret, signature] = process.argv.slice(2);\n\
        try {\n\
          const data = new LinearWebhookClient(secret).parseData(body, signature);\n\
          console.log(`${data.type} ${data.action}`);\n\
        } catch (e) {\n\
          console.log(`refused: ${e.message}`);\n\
        }\n";
    let path = oracles.join(format!("oracle-linear-{}.mjs", std::process::id()));
    std::fs::write(&path, script).unwrap();
    let signature = header(&headers, "Linear-Signature");
    let linear = |body: &[u8]| {
        run(
            "node",
            &[path.to_str().unwrap(), secret, signature],
            Some(&oracles),
            body,
        )
    };
    assert_eq!(linear(&body), "Issue create", "@linear/sdk verifies send's");
    let changed = one_byte_changed(&body);
    assert!(
        linear(&changed).starts_with("refused"),
        "and not another body"
    );
    let _ = std::fs::remove_file(&path);

    let server = Server::start_in(dir.path(), &["--config", &config]);
    let pairs: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let id = header(&headers, "Linear-Delivery");
    let sent = |body: &[u8]| server.post("/webhooks/linear", body, &pairs);
    assert_outcome(&sent(&body), id, "processed");
    assert_outcome(&sent(&body), id, "duplicate");
    assert_eq!(sent(&changed).status, 400, "one changed byte");
    assert_eq!(ledger_count(&server.db()), 1);
}
