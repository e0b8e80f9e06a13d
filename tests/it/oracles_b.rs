//! More providers' SDKs as independent oracles of the catalog's presets, as in `oracles.rs`:
//! each SDK verifies what `hookledger send` signs as the preset, and what the SDK (or, where
//! the SDK only verifies, the provider's published algorithm, checked by the SDK first) signs
//! is processed, a duplicate the second time, and refused with one byte changed. They need
//! the Python packages `squareup`, `hubspot-api-client` and `workos`, and the npm package
//! `@paddle/paddle-node-sdk` in the folder `HOOKLEDGER_ORACLES` names (`.ci/run` installs them
//! and sets `HOOKLEDGER_REQUIRE_SDKS`, so in CI a missing one fails the test).

use crate::oracles::{
    accepted_once, header, node_oracles, one_byte_changed, python_has, run, REQUIRE,
};
use crate::util::*;

/// A config with one source `name` of `preset`, its secret in the file, and `extra` lines.
fn config_of(dir: &std::path::Path, name: &str, secret: &str, extra: &str) -> String {
    let path = dir.join("oracle.toml");
    std::fs::write(
        &path,
        format!(
            "[[source]]\nname = \"{name}\"\npreset = \"{name}\"\nsecrets = [\"{secret}\"]\n{extra}"
        ),
    )
    .unwrap();
    path.to_str().unwrap().to_string()
}

/// What `hookledger send` sends as source `name` of `config` with `fixture`.
fn sent_by_hookledger(config: &str, name: &str, fixture: &str) -> (Vec<(String, String)>, Vec<u8>) {
    let file = fixtures_dir().join(fixture);
    capture_send(&["--config", config, "--source", name, file.to_str().unwrap()])
}

#[test]
fn squares_sdk_verifies_what_send_signs_and_hookledger_accepts_what_it_signs() {
    if !prerequisite(
        python_has("square.utils.webhooks_helper"),
        REQUIRE,
        "the Python squareup package (python3 -m pip install squareup)",
    ) {
        return;
    }
    let secret = "square-signature-key-0123456789";
    // The URL Square calls, as set in its subscription; a proxy in front forwards to us.
    let url = "https://hooks.example.com/webhooks/square";
    let dir = test_dir();
    let config = config_of(
        dir.path(),
        "square",
        secret,
        &format!("public_url = \"{url}\"\n"),
    );
    let (headers, body) = sent_by_hookledger(&config, "square", "square/payment.updated.json");
    let signature = header(&headers, "x-square-hmacsha256-signature").to_string();
    let verify = "import sys\n\
        from square.utils.webhooks_helper import verify_signature\n\
        body = sys.stdin.buffer.read().decode()\n\
        print(verify_signature(request_body=body, signature_header=sys.argv[1], \
        signature_key=sys.argv[2], notification_url=sys.argv[3]))";
    let verified = |signature: &str, body: &[u8]| {
        run(
            "python3",
            &["-c", verify, signature, secret, url],
            None,
            body,
        )
    };
    assert_eq!(
        verified(&signature, &body),
        "True",
        "the SDK verifies send's"
    );
    let changed = one_byte_changed(&body);
    assert_eq!(verified(&signature, &changed), "False");

    // The SDK only verifies: Square's published algorithm signs, and the SDK agrees first.
    let signed = run(
        "python3",
        &[
            "-c",
            "import sys, hmac, hashlib, base64\n\
             body = sys.stdin.buffer.read()\n\
             mac = hmac.new(sys.argv[1].encode(), sys.argv[2].encode() + body, hashlib.sha256)\n\
             print(base64.b64encode(mac.digest()).decode())",
            secret,
            url,
        ],
        None,
        &body,
    );
    assert_eq!(verified(&signed, &body), "True");
    let server = Server::start_in(dir.path(), &["--config", &config]);
    accepted_once(
        &server,
        "/webhooks/square",
        &body,
        &[("x-square-hmacsha256-signature", &signed)],
        "6a8f5f28-54a1-4eb0-a98a-3111513fd4fc",
        false,
    );
}

#[test]
fn hubspots_sdk_verifies_what_send_signs_and_hookledger_accepts_what_it_signs() {
    if !prerequisite(
        python_has("hubspot.utils.signature"),
        REQUIRE,
        "the Python hubspot-api-client package (python3 -m pip install hubspot-api-client)",
    ) {
        return;
    }
    let secret = "hubspot-client-secret-0123456789";
    let url = "https://hooks.example.com/webhooks/hubspot";
    let dir = test_dir();
    let config = config_of(
        dir.path(),
        "hubspot",
        secret,
        &format!("public_url = \"{url}\"\n"),
    );
    let (headers, body) = sent_by_hookledger(&config, "hubspot", "hubspot/contact.creation.json");
    let sdk = |mode: &str, args: &[&str], body: &[u8]| {
        let script = "import sys\n\
            from hubspot.utils.signature import Signature\n\
            body = sys.stdin.buffer.read().decode()\n\
            mode, secret, uri, timestamp = sys.argv[1:5]\n\
            if mode == 'verify':\n\
            \x20   print(Signature.is_valid(signature=sys.argv[5], client_secret=secret, \
            request_body=body, http_uri=uri, signature_version='v3', timestamp=timestamp))\n\
            else:\n\
            \x20   print(Signature.get_signature(secret, body, 'v3', uri, 'POST', timestamp))";
        let mut all = vec!["-c", script, mode];
        all.extend(args);
        run("python3", &all, None, body)
    };
    let timestamp = header(&headers, "X-HubSpot-Request-Timestamp").to_string();
    assert_eq!(timestamp.len(), 13, "milliseconds: {timestamp}");
    let verified = sdk(
        "verify",
        &[
            secret,
            url,
            &timestamp,
            header(&headers, "X-HubSpot-Signature-v3"),
        ],
        &body,
    );
    assert_eq!(verified, "True", "the SDK verifies send's");

    let now_ms = (now() * 1000).to_string();
    let signed = sdk("sign", &[secret, url, &now_ms], &body);
    let server = Server::start_in(dir.path(), &["--config", &config]);
    accepted_once(
        &server,
        "/webhooks/hubspot",
        &body,
        &[
            ("X-HubSpot-Signature-v3", &signed),
            ("X-HubSpot-Request-Timestamp", &now_ms),
        ],
        "1",
        true,
    );
}

#[test]
fn workoss_sdk_verifies_what_send_signs_and_hookledger_accepts_what_it_signs() {
    if !prerequisite(
        python_has("workos.webhooks._verification"),
        REQUIRE,
        "the Python workos package (python3 -m pip install workos)",
    ) {
        return;
    }
    let secret = "workos-webhook-secret-0123456789";
    let dir = test_dir();
    let config = config_of(dir.path(), "workos", secret, "");
    let (headers, body) = sent_by_hookledger(&config, "workos", "workos/user.created.json");
    let verify = "import sys\n\
        from workos.webhooks._verification import verify_header\n\
        body = sys.stdin.buffer.read()\n\
        verify_header(event_body=body, event_signature=sys.argv[1], secret=sys.argv[2])\n\
        print('verified')";
    let signature = header(&headers, "WorkOS-Signature").to_string();
    assert_eq!(
        run("python3", &["-c", verify, &signature, secret], None, &body),
        "verified",
        "the SDK verifies send's: {signature}"
    );

    // The SDK only verifies: WorkOS's published algorithm signs (`t=<ms>, v1=<hex>`), and
    // the SDK agrees first.
    let signed = run(
        "python3",
        &[
            "-c",
            "import sys, hmac, hashlib, time\n\
             body = sys.stdin.buffer.read()\n\
             t = str(int(time.time() * 1000))\n\
             mac = hmac.new(sys.argv[1].encode(), t.encode() + b'.' + body, hashlib.sha256)\n\
             print(f't={t}, v1={mac.hexdigest()}')",
            secret,
        ],
        None,
        &body,
    );
    assert_eq!(
        run("python3", &["-c", verify, &signed, secret], None, &body),
        "verified"
    );
    let server = Server::start_in(dir.path(), &["--config", &config]);
    accepted_once(
        &server,
        "/webhooks/workos",
        &body,
        &[("WorkOS-Signature", &signed)],
        "event_01H2GNQD5B9QC2A6PQ4PVDRZSC",
        false,
    );
}

#[test]
fn paddles_sdk_verifies_what_send_signs_and_hookledger_accepts_what_it_signs() {
    let oracles = node_oracles("@paddle/paddle-node-sdk");
    if !prerequisite(
        oracles.is_some() && installed("node"),
        REQUIRE,
        "node and @paddle/paddle-node-sdk under HOOKLEDGER_ORACLES",
    ) {
        return;
    }
    let oracles = oracles.unwrap();
    let secret = "pdl_ntfset_01hv8x0000000000000000000000_oracle";
    let dir = test_dir();
    let config = config_of(dir.path(), "paddle", secret, "");
    let (headers, body) =
        sent_by_hookledger(&config, "paddle", "paddle/transaction.completed.json");
    // Paddle's SDK unmarshals (and so verifies) a notification; it does not sign, so the
    // other way is Paddle's published algorithm (`ts=<s>;h1=<hex of ts:body>`), which the
    // SDK checks first.
    let script = "import { Paddle } from '@paddle/paddle-node-sdk';\n\
        import { createHmac } from 'node:crypto';\n\
        import { readFileSync } from 'node:fs';\n\
        const body = readFileSync(0, 'utf8');\n\
        const [mode, secret, signature] = process.argv.slice(2);\n\
        const paddle = new Paddle('pdl_sdbx_apikey_01hv8x0000000000000000000000_oracle');\n\
        if (mode === 'verify') {\n\
          const event = await paddle.webhooks.unmarshal(body, secret, signature);\n\
          console.log(event.eventId);\n\
        } else {\n\
          const ts = Math.floor(Date.now() / 1000);\n\
          const h1 = createHmac('sha256', secret).update(`${ts}:${body}`).digest('hex');\n\
          console.log(`ts=${ts};h1=${h1}`);\n\
        }\n";
    let path = oracles.join(format!("oracle-paddle-{}.mjs", std::process::id()));
    std::fs::write(&path, script).unwrap();
    let node = |args: &[&str], input: &[u8]| {
        let mut all = vec![path.to_str().unwrap()];
        all.extend(args);
        run("node", &all, Some(&oracles), input)
    };
    let event_id = "evt_01hv8x2acma6x5tqpa3xvanqr7";
    let verified = node(
        &["verify", secret, header(&headers, "Paddle-Signature")],
        &body,
    );
    assert_eq!(verified, event_id, "the SDK verifies send's");

    let signed = node(&["sign", secret], &body);
    assert_eq!(node(&["verify", secret, &signed], &body), event_id);
    let server = Server::start_in(dir.path(), &["--config", &config]);
    accepted_once(
        &server,
        "/webhooks/paddle",
        &body,
        &[("Paddle-Signature", &signed)],
        event_id,
        false,
    );
    let _ = std::fs::remove_file(&path);
}
