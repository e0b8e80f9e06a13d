//! Independent oracles: the providers' own SDKs, not hookledger's code, check what `hookledger
//! send` signs, and sign what hookledger must accept. Each needs the SDK installed (`.ci/run`
//! installs them and sets `HOOKLEDGER_REQUIRE_SDKS`, so in CI a missing one fails the test):
//! the Python `stripe` package, and the npm package `@octokit/webhooks-methods` in the folder
//! `HOOKLEDGER_ORACLES` names (its `node_modules`).

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::util::*;

pub const REQUIRE: &str = "HOOKLEDGER_REQUIRE_SDKS";

/// Runs `script` with `program` (in `dir`), `input` on its stdin; its stdout, or the test's
/// failure with its stderr.
pub fn run(program: &str, args: &[&str], dir: Option<&PathBuf>, input: &[u8]) -> String {
    let mut command = Command::new(program);
    command.args(args);
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{program}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> &'a str {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {name} header"))
}

pub fn python_has(module: &str) -> bool {
    Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The folder `HOOKLEDGER_ORACLES` names, if it has the npm `package` in its `node_modules`.
pub fn node_oracles(package: &str) -> Option<PathBuf> {
    let dir = PathBuf::from(std::env::var_os("HOOKLEDGER_ORACLES")?);
    dir.join("node_modules")
        .join(package)
        .exists()
        .then_some(dir)
}

/// A config with one source of `preset`, its secret in the file.
pub fn config_with(dir: &std::path::Path, name: &str, preset: &str, secret: &str) -> String {
    let path = dir.join("oracle.toml");
    std::fs::write(
        &path,
        format!("[[source]]\nname = \"{name}\"\npreset = \"{preset}\"\nsecrets = [\"{secret}\"]\n"),
    )
    .unwrap();
    path.to_str().unwrap().to_string()
}

/// `body` with one byte (in its middle) changed: what a signature over it must refuse.
pub fn one_byte_changed(body: &[u8]) -> Vec<u8> {
    let mut changed = body.to_vec();
    let at = changed.len() / 2;
    changed[at] ^= 0x01;
    changed
}

/// `body` posted to `path` with `headers` is processed as `event_id` (one more claim), then a
/// duplicate; with one byte changed, refused, and nothing more is claimed. `batch`: the reply
/// lists the events of a split body, the first of which is `event_id`.
pub fn accepted_once(
    server: &Server,
    path: &str,
    body: &[u8],
    headers: &[(&str, &str)],
    event_id: &str,
    batch: bool,
) {
    let claims = || ledger_count(&server.db());
    let before = claims();
    for outcome in ["processed", "duplicate"] {
        let reply = server.post(path, body, headers);
        if batch {
            assert_eq!(reply.status, 200, "{}", reply.body);
            let event = &json(&reply)["events"][0];
            assert_eq!(event["event_id"], event_id, "{}", reply.body);
            assert_eq!(event["outcome"], outcome, "{}", reply.body);
        } else {
            assert_outcome(&reply, event_id, outcome);
        }
    }
    let claimed = claims();
    if !batch {
        assert_eq!(claimed, before + 1, "one claim");
    }
    let reply = server.post(path, &one_byte_changed(body), headers);
    assert_eq!(reply.status, 400, "one changed byte: {}", reply.body);
    assert_eq!(claims(), claimed, "nothing more claimed");
}

#[test]
fn stripes_sdk_verifies_what_send_signs_and_hookledger_accepts_what_it_signs() {
    if !prerequisite(
        python_has("stripe"),
        REQUIRE,
        "the Python stripe package (python3 -m pip install stripe)",
    ) {
        return;
    }
    let secret = "whsec_oracle_test_secret_0123456789";
    let dir = test_dir();
    let config = config_with(dir.path(), "stripe", "stripe", secret);
    let file = fixtures_dir().join("stripe/events/invoice.paid.json");
    let (headers, body) = capture_send(&[
        "--config",
        &config,
        "--source",
        "stripe",
        file.to_str().unwrap(),
    ]);
    // Stripe's SDK: construct_event raises unless the signature and its age are right.
    let verified = run(
        "python3",
        &[
            "-c",
            "import sys, stripe\n\
             payload = sys.stdin.buffer.read()\n\
             event = stripe.Webhook.construct_event(payload, sys.argv[1], sys.argv[2])\n\
             print(event['id'])",
            header(&headers, "Stripe-Signature"),
            secret,
        ],
        None,
        &body,
    );
    assert_eq!(verified, "evt_1Pgci1B7WZ01zgkWrMGF0FaA");

    // The other way: the SDK signs (its own computation of the v1 signature), hookledger takes it.
    let server = Server::start_in(dir.path(), &["--config", &config]);
    let signed = run(
        "python3",
        &[
            "-c",
            "import sys, time, stripe\n\
             payload = sys.stdin.buffer.read().decode()\n\
             t = int(time.time())\n\
             v1 = stripe.WebhookSignature._compute_signature(f'{t}.{payload}', sys.argv[1])\n\
             print(f't={t},v1={v1}')",
            secret,
        ],
        None,
        &body,
    );
    accepted_once(
        &server,
        "/webhooks/stripe",
        &body,
        &[("Stripe-Signature", &signed)],
        "evt_1Pgci1B7WZ01zgkWrMGF0FaA",
        false,
    );
}

#[test]
fn octokits_methods_verify_what_send_signs_and_hookledger_accepts_what_they_sign() {
    let oracles = node_oracles("@octokit/webhooks-methods");
    if !prerequisite(
        oracles.is_some() && installed("node"),
        REQUIRE,
        "node and @octokit/webhooks-methods under HOOKLEDGER_ORACLES",
    ) {
        return;
    }
    let oracles = oracles.unwrap();
    let secret = "a-github-webhook-secret-0123456789";
    let dir = test_dir();
    let config = config_with(dir.path(), "gh", "github", secret);
    let file = fixtures_dir().join("github/push.json");
    let (headers, body) = capture_send(&[
        "--config",
        &config,
        "--source",
        "gh",
        "--type",
        "push",
        file.to_str().unwrap(),
    ]);
    let script = "import { sign, verify } from '@octokit/webhooks-methods';\n\
        import { readFileSync } from 'node:fs';\n\
        const payload = readFileSync(0, 'utf8');\n\
        const [mode, secret, signature] = process.argv.slice(2);\n\
        if (mode === 'verify') {\n\
          console.log(await verify(secret, payload, signature));\n\
        } else {\n\
          console.log(await sign(secret, payload));\n\
        }\n";
    let path = oracles.join(format!("oracle-{}.mjs", std::process::id()));
    std::fs::write(&path, script).unwrap();
    let node = |args: &[&str], input: &[u8]| {
        let mut all = vec![path.to_str().unwrap()];
        all.extend(args);
        run("node", &all, Some(&oracles), input)
    };
    let verified = node(
        &["verify", secret, header(&headers, "X-Hub-Signature-256")],
        &body,
    );
    assert_eq!(verified, "true", "octokit verifies send's signature");

    let signature = node(&["sign", secret], &body);
    assert!(signature.starts_with("sha256="), "{signature}");
    let server = Server::start_in(dir.path(), &["--config", &config]);
    accepted_once(
        &server,
        "/webhooks/gh",
        &body,
        &[
            ("X-Hub-Signature-256", &signature),
            ("X-GitHub-Delivery", "d-oracle-1"),
            ("X-GitHub-Event", "push"),
        ],
        "d-oracle-1",
        false,
    );
    let _ = std::fs::remove_file(&path);
}
