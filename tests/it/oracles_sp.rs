//! Shopify's and Polar's SDKs as independent oracles of the catalog's presets, as in
//! `oracles_b.rs`: each SDK verifies what `hookledger send` signs as the preset, and what the
//! provider's published algorithm signs (checked by the SDK first; neither SDK signs webhooks)
//! is processed, a duplicate the second time, and refused with one byte changed. They need the
//! npm package `@shopify/shopify-api` in the folder `HOOKLEDGER_ORACLES` names and the Python
//! packages `polar-sdk` and `standardwebhooks` (`.ci/run` installs them and sets
//! `HOOKLEDGER_REQUIRE_SDKS`, so in CI a missing one fails the test).

use crate::oracles::{
    accepted_once, config_with, header, node_oracles, one_byte_changed, python_has, run, REQUIRE,
};
use crate::util::*;

#[test]
fn shopifys_sdk_verifies_what_send_signs_and_hookledger_accepts_what_it_signs() {
    let oracles = node_oracles("@shopify/shopify-api");
    if !prerequisite(
        oracles.is_some() && installed("node"),
        REQUIRE,
        "node and @shopify/shopify-api under HOOKLEDGER_ORACLES",
    ) {
        return;
    }
    let oracles = oracles.unwrap();
    let secret = "shopify-app-client-secret-0123456789";
    let dir = test_dir();
    let config = config_with(dir.path(), "shop", "shopify", secret);
    let file = fixtures_dir().join("shopify/orders-create.json");
    let (headers, body) = capture_send(&[
        "--config",
        &config,
        "--source",
        "shop",
        "--type",
        "orders/create",
        file.to_str().unwrap(),
    ]);
    // The SDK's `webhooks.validate` with its Node adapter: the HMAC first, then the delivery
    // headers Shopify always sends. `hookledger send` signs the body and sends the id and
    // topic, not the shop's domain nor the API version (metadata, not signed), so those two
    // are added as Shopify would send them when absent. It does not sign: Shopify's published
    // algorithm (base64 of the HMAC-SHA256 of the raw body with the app's secret) does, and
    // the SDK checks that first.
    let script = "import '@shopify/shopify-api/adapters/node';\n\
        import { shopifyApi, ApiVersion, LogSeverity } from '@shopify/shopify-api';\n\
        import { createHmac } from 'node:crypto';\n\
        import { readFileSync } from 'node:fs';\n\
        const body = readFileSync(0, 'utf8');\n\
        const [mode, secret, sent] = process.argv.slice(2);\n\
        if (mode === 'sign') {\n\
          console.log(createHmac('sha256', secret).update(body, 'utf8').digest('base64'));\n\
          process.exit(0);\n\
        }\n\
        const shopify = shopifyApi({ apiKey: 'oracle-api-key', apiSecretKey: secret,\n\
          scopes: [], hostName: 'hooks.example.com', apiVersion: ApiVersion.October25,\n\
          isEmbeddedApp: false, logger: { level: LogSeverity.Error } });\n\
        const headers = {};\n\
        for (const [k, v] of JSON.parse(sent)) headers[k.toLowerCase()] = v;\n\
        headers['x-shopify-shop-domain'] ??= 'oracle-shop.myshopify.com';\n\
        headers['x-shopify-api-version'] ??= ApiVersion.October25;\n\
        const rawRequest = { method: 'POST', url: '/webhooks/shop', headers };\n\
        const result = await shopify.webhooks.validate({ rawBody: body, rawRequest,\n\
          rawResponse: {} });\n\
        console.log(result.valid ? `valid ${result.webhookId} ${result.topic}` : result.reason);\n";
    let path = oracles.join(format!("oracle-shopify-{}.mjs", std::process::id()));
    std::fs::write(&path, script).unwrap();
    let node = |args: &[&str], input: &[u8]| {
        let mut all = vec![path.to_str().unwrap()];
        all.extend(args);
        run("node", &all, Some(&oracles), input)
    };
    let sent = serde_json::to_string(&headers).unwrap();
    let id = header(&headers, "X-Shopify-Webhook-Id").to_string();
    assert_eq!(
        node(&["verify", secret, &sent], &body),
        format!("valid {id} ORDERS_CREATE"),
        "the SDK verifies send's: {headers:?}"
    );
    let changed = one_byte_changed(&body);
    assert_eq!(node(&["verify", secret, &sent], &changed), "invalid_hmac");

    let signed = node(&["sign", secret], &body);
    let id = "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043";
    let delivery = [
        ("X-Shopify-Hmac-Sha256", signed.as_str()),
        ("X-Shopify-Webhook-Id", id),
        ("X-Shopify-Topic", "orders/create"),
        ("X-Shopify-Shop-Domain", "oracle-shop.myshopify.com"),
        ("X-Shopify-API-Version", "2025-10"),
    ];
    let as_json: Vec<(&str, &str)> = delivery.to_vec();
    assert_eq!(
        node(
            &["verify", secret, &serde_json::to_string(&as_json).unwrap()],
            &body
        ),
        format!("valid {id} ORDERS_CREATE"),
        "the SDK verifies Shopify's algorithm"
    );
    let server = Server::start_in(dir.path(), &["--config", &config]);
    accepted_once(&server, "/webhooks/shop", &body, &delivery, id, false);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn polars_sdk_verifies_what_send_signs_and_hookledger_accepts_what_it_signs() {
    if !prerequisite(
        python_has("polar.webhooks") && python_has("standardwebhooks"),
        REQUIRE,
        "the Python polar-sdk and standardwebhooks packages \
         (python3 -m pip install polar-sdk standardwebhooks)",
    ) {
        return;
    }
    // Polar's secret as its dashboard shows it; its HMAC key is the secret's own UTF-8 bytes,
    // so hookledger's config holds `whsec_` and the secret in base64.
    let polar_secret = "polar_whs_oracle0123456789abcdefghijklmnopqrstuv";
    let secret = format!("whsec_{}", base64_of(polar_secret.as_bytes()));
    let dir = test_dir();
    let config = config_with(dir.path(), "polar", "polar", &secret);
    let file = fixtures_dir().join("polar/order.paid.json");
    let (headers, body) = capture_send(&[
        "--config",
        &config,
        "--source",
        "polar",
        file.to_str().unwrap(),
    ]);
    // The SDK's own verification, `polar.webhooks.validate_event` (which the versioned
    // `polar.v2026_10.webhooks.validate_event` calls with its typed loader): here with the
    // fixture's type and the payload as it is, since the fixture is not a full order.
    let verify = "import sys, json\n\
        from polar.webhooks import validate_event, PolarWebhookVerificationError\n\
        body = sys.stdin.buffer.read()\n\
        try:\n\
        \x20   event = validate_event(body, json.loads(sys.argv[1]), sys.argv[2], \
        frozenset({'order.paid'}), lambda data: data)\n\
        \x20   print('verified', event['type'])\n\
        except PolarWebhookVerificationError as e:\n\
        \x20   print('refused:', e)";
    let verified = |headers: &str, body: &[u8]| {
        run(
            "python3",
            &["-c", verify, headers, polar_secret],
            None,
            body,
        )
    };
    let sent: std::collections::HashMap<&str, &str> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let sent = serde_json::to_string(&sent).unwrap();
    assert_eq!(
        verified(&sent, &body),
        "verified order.paid",
        "the SDK verifies send's: {headers:?}"
    );
    let changed = one_byte_changed(&body);
    assert_eq!(
        verified(&sent, &changed),
        "refused: No matching signature found"
    );

    // Polar's SDK does not sign: the Standard Webhooks library signs as Polar does, with the
    // secret's UTF-8 bytes as the key, and the SDK agrees first.
    let id = "msg_2yZwUhtgs0Ql2nYfPMcQwnNq9Jx";
    let signed = run(
        "python3",
        &[
            "-c",
            "import sys, json, base64\n\
             from datetime import datetime, timezone\n\
             from standardwebhooks import Webhook\n\
             body = sys.stdin.buffer.read().decode()\n\
             key = base64.b64encode(sys.argv[1].encode()).decode()\n\
             now = datetime.now(tz=timezone.utc)\n\
             signature = Webhook(key).sign(sys.argv[2], now, body)\n\
             print(json.dumps({'webhook-id': sys.argv[2], \
             'webhook-timestamp': str(int(now.timestamp())), 'webhook-signature': signature}))",
            polar_secret,
            id,
        ],
        None,
        &body,
    );
    assert_eq!(verified(&signed, &body), "verified order.paid");
    let signed: std::collections::HashMap<String, String> = serde_json::from_str(&signed).unwrap();
    let delivery: Vec<(&str, &str)> = signed
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let server = Server::start_in(dir.path(), &["--config", &config]);
    accepted_once(&server, "/webhooks/polar", &body, &delivery, id, false);
}

/// Standard base64 with padding.
fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
