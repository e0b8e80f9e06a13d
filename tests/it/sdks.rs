//! The providers' own libraries as independent oracles, run through `python3`: the official
//! `svix` library (what Clerk, Resend and every Svix sender sign with) and SendGrid's
//! `sendgrid` library with `cryptography` (how SendGrid signs its Event Webhook). Each signs
//! what hookledger must accept, and verifies what hookledger's own signer (`hookledger send`)
//! makes. `.ci/run` installs them and sets HOOKLEDGER_REQUIRE_PYTHON_SDKS, so that there a
//! missing library fails the tests; elsewhere they are skipped with a message.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use hookledger::internals::Reply;

use crate::util::*;

/// The Standard Webhooks vector's secret, as a Clerk endpoint's signing secret.
const CLERK_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// SendGrid's verification key for the tests that post no SendGrid request: the test key all
/// SendGrid SDKs share.
/// An ed25519 public key for the tests that post no `v1a` signature (seed: the bytes 0 to 31).
const ED25519_TEST_KEY: &str = "whpk_A6EHv/POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg=";
const SDK_TEST_KEY: &str = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEEDr2LjtURuePQzplybdC+u4CwrqDqBaWjcMMsTbhdbcwHBcepxo7yAQGhHPTnlvFYPAZFceEu/1FwCM/QmGUhA==";

/// Whether python3 can import `module`; if not, skip (or fail where required).
fn python_has(module: &str) -> bool {
    let available = Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .status()
        .is_ok_and(|s| s.success());
    prerequisite(
        available,
        "HOOKLEDGER_REQUIRE_PYTHON_SDKS",
        &format!("python {module} not installed (python3 -m pip install svix sendgrid)"),
    )
}

/// Runs a Python `script` with `args` and `stdin`; its standard output, trimmed.
fn python(script: &str, args: &[&str], stdin: &[u8]) -> String {
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A config with a Clerk source (scheme standard, an HMAC secret and an ed25519 public key, as
/// in a rotation from one to the other) and a SendGrid one (scheme ecdsa), their keys read
/// from the environment.
fn write_config(dir: &Path) -> String {
    let path = dir.join("hookledger.toml");
    std::fs::write(
        &path,
        r#"
[[source]]
name    = "clerk"
scheme  = "standard"
secrets = ["env:CLERK_WEBHOOK_SECRET", "env:CLERK_PUBLIC_KEY"]

[[source]]
name    = "sendgrid"
scheme  = "ecdsa"
secrets = ["env:SENDGRID_VERIFICATION_KEY"]
"#,
    )
    .unwrap();
    path.to_str().unwrap().to_string()
}

/// A server on that config, with the Clerk secret and public key `clerk_key` (`whpk_`), and
/// SendGrid's public key `sendgrid_key`.
fn start(clerk_key: &str, sendgrid_key: &str) -> Server {
    let dir = test_dir();
    let config = write_config(dir.path());
    let mut server = Server::start_with_env(
        dir.path(),
        &["--config", &config],
        &[
            ("RUST_LOG", "info"),
            ("CLERK_WEBHOOK_SECRET", CLERK_SECRET),
            ("CLERK_PUBLIC_KEY", clerk_key),
            ("SENDGRID_VERIFICATION_KEY", sendgrid_key),
        ],
    );
    server.keep(dir);
    server
}

fn post(server: &Server, source: &str, body: &[u8], headers: &[(String, String)]) -> Reply {
    let headers: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    server.post(&format!("/webhooks/{source}"), body, &headers)
}

/// The ledger row of `source` and `id`: its type and event time.
fn claimed(server: &Server, source: &str, id: &str) -> Option<(String, Option<i64>)> {
    server.db().opt(
        "SELECT event_type, created FROM webhook_events WHERE source = $1 AND event_id = $2",
        &[&source, &id],
    )
}

/// A P-256 key pair made by Python's `cryptography`: (PKCS#8 private key, SubjectPublicKeyInfo
/// public key), each base64 DER; the public one as SendGrid shows its verification key.
fn sendgrid_key_pair() -> (String, String) {
    let script = r#"
import base64
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives import serialization as s
key = ec.generate_private_key(ec.SECP256R1())
private = key.private_bytes(s.Encoding.DER, s.PrivateFormat.PKCS8, s.NoEncryption())
public = key.public_key().public_bytes(s.Encoding.DER, s.PublicFormat.SubjectPublicKeyInfo)
print(base64.b64encode(private).decode(), base64.b64encode(public).decode())
"#;
    let out = python(script, &[], b"");
    let (private, public) = out.split_once(' ').unwrap();
    (private.to_string(), public.to_string())
}

/// A SendGrid Event Webhook batch, in the shape of SendGrid's documented example events.
const SENDGRID_BATCH: &[u8] = br#"[{"email":"jane.doe@example.com","timestamp":1796022000,"smtp-id":"<14c5d75ce93.dfd.64b469@ismtpd-555>","event":"processed","category":["welcome"],"sg_event_id":"rbtnWrG1DVDGGGFHFyun0A==","sg_message_id":"14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.0"},{"email":"jane.doe@example.com","timestamp":1796022003,"smtp-id":"<14c5d75ce93.dfd.64b469@ismtpd-555>","event":"delivered","category":["welcome"],"sg_event_id":"rWVYmVk90MjZJ9iohOBa3w==","sg_message_id":"14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.0","response":"250 OK"}]"#;

/// Clerk's `user.created` signed by the official `svix` library and sent with Svix's headers:
/// processed once with its ledger row, then a duplicate; one changed byte is refused and
/// claims nothing.
#[test]
fn a_clerk_event_signed_by_the_svix_library_is_claimed_once() {
    if !python_has("svix") {
        return;
    }
    let server = start(ED25519_TEST_KEY, SDK_TEST_KEY);
    let body = std::fs::read(fixtures_dir().join("clerk/user.created.json")).unwrap();
    let id = "msg_2pLqRsTuVwXyZaBcDeFgHiJkLm";
    let t = now().to_string();
    let script = r#"
import sys, datetime
from svix.webhooks import Webhook
secret, msg_id, t = sys.argv[1:4]
body = sys.stdin.buffer.read().decode()
print(Webhook(secret).sign(msg_id, datetime.datetime.fromtimestamp(int(t), tz=datetime.timezone.utc), body))
"#;
    let signature = python(script, &[CLERK_SECRET, id, &t], &body);
    assert!(signature.starts_with("v1,"), "{signature}");
    let headers = vec![
        ("svix-id".to_string(), id.to_string()),
        ("svix-timestamp".to_string(), t),
        ("svix-signature".to_string(), signature),
    ];
    assert_outcome(&post(&server, "clerk", &body, &headers), id, "processed");
    assert_eq!(
        claimed(&server, "clerk", id),
        Some(("user.created".into(), Some(1_796_022_000)))
    );
    assert_outcome(&post(&server, "clerk", &body, &headers), id, "duplicate");
    let rows = ledger_count(&server.db());
    let mut changed = body.clone();
    let at = changed.len() / 2;
    changed[at] ^= 1;
    assert_error(
        &post(&server, "clerk", &changed, &headers),
        400,
        "invalid_signature",
    );
    assert_eq!(ledger_count(&server.db()), rows, "nothing claimed");
}

/// `hookledger send` (the standard scheme's signer) signs as a Svix sender would: the `svix`
/// library's `Webhook.verify` accepts the request it sends.
#[test]
fn the_svix_library_verifies_what_hookledger_send_signs() {
    if !python_has("svix") {
        return;
    }
    let dir = test_dir();
    let config = write_config(dir.path());
    let app = FakeApp::start(&[]);
    let file = fixtures_dir().join("clerk/user.created.json");
    let (code, out, err) = cli(&[
        "send",
        "--config",
        &config,
        "--source",
        "clerk",
        "--secret",
        CLERK_SECRET,
        "--id",
        "msg_sent_by_hookledger",
        "--url",
        &app.url(),
        file.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let d = app
        .wait_delivered(1, std::time::Duration::from_secs(10))
        .remove(0);
    let script = r#"
import sys, json
from svix.webhooks import Webhook
secret, headers = sys.argv[1], json.loads(sys.argv[2])
Webhook(secret).verify(sys.stdin.buffer.read(), headers)
print(headers["webhook-id"])
"#;
    let headers = serde_json::to_string(&d.headers).unwrap();
    assert_eq!(
        python(script, &[CLERK_SECRET, &headers], &d.body),
        "msg_sent_by_hookledger"
    );
    // And the library refuses it with another secret (the check is real).
    let refused = Command::new("python3")
        .args([
            "-c",
            script,
            "whsec_dGhpcyBpcyBub3QgdGhlIHNlY3JldCBhdCBhbGw=",
            &headers,
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!refused.status.success());
}

/// A SendGrid batch signed as SendGrid signs (ECDSA P-256, SHA-256, DER, over timestamp and
/// body, by Python's `cryptography`): processed once with a ledger row keyed by the body's
/// SHA-256, then a duplicate; one changed byte is refused and claims nothing.
#[test]
fn a_sendgrid_batch_signed_with_cryptography_is_claimed_once() {
    if !python_has("cryptography") {
        return;
    }
    let (private, public) = sendgrid_key_pair();
    let server = start(ED25519_TEST_KEY, &public);
    let t = now().to_string();
    let script = r#"
import sys, base64
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
key = serialization.load_der_private_key(base64.b64decode(sys.argv[1]), None)
signed = sys.argv[2].encode() + sys.stdin.buffer.read()
print(base64.b64encode(key.sign(signed, ec.ECDSA(hashes.SHA256()))).decode())
"#;
    let signature = python(script, &[&private, &t], SENDGRID_BATCH);
    let headers = vec![
        (
            "X-Twilio-Email-Event-Webhook-Signature".to_string(),
            signature,
        ),
        ("X-Twilio-Email-Event-Webhook-Timestamp".to_string(), t),
    ];
    let id = sha256_hex(SENDGRID_BATCH);
    assert_outcome(
        &post(&server, "sendgrid", SENDGRID_BATCH, &headers),
        &id,
        "processed",
    );
    assert_eq!(
        claimed(&server, "sendgrid", &id),
        Some(("batch".into(), None))
    );
    assert_outcome(
        &post(&server, "sendgrid", SENDGRID_BATCH, &headers),
        &id,
        "duplicate",
    );
    let rows = ledger_count(&server.db());
    let mut changed = SENDGRID_BATCH.to_vec();
    changed[20] ^= 1;
    assert_error(
        &post(&server, "sendgrid", &changed, &headers),
        400,
        "invalid_signature",
    );
    let reply = post(&server, "sendgrid", SENDGRID_BATCH, &headers[1..]);
    assert_error(&reply, 400, "invalid_signature");
    assert!(reply.body.contains("missing"), "{}", reply.body);
    assert_eq!(ledger_count(&server.db()), rows, "nothing claimed");
}

/// What the ecdsa scheme's signer makes (`hookledger send` with a private key as `--secret`)
/// is accepted by the `sendgrid` library's `EventWebhook.verify_signature`, with the public key
/// as SendGrid shows it; and the `hookledger send` of a public key alone says it cannot sign.
#[test]
fn the_sendgrid_library_verifies_what_hookledger_send_signs() {
    if !python_has("sendgrid") {
        return;
    }
    let (private, public) = sendgrid_key_pair();
    let dir = test_dir();
    let config = write_config(dir.path());
    let file = dir.path().join("batch.json");
    std::fs::write(&file, SENDGRID_BATCH).unwrap();
    let app = FakeApp::start(&[]);
    let send = |secret: &str| {
        cli(&[
            "send",
            "--config",
            &config,
            "--source",
            "sendgrid",
            "--secret",
            secret,
            "--url",
            &app.url(),
            file.to_str().unwrap(),
        ])
    };
    let (code, out, err) = send(&public);
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("cannot sign"), "{err}");
    assert!(!err.contains(&public), "the key is not quoted: {err}");
    let (code, out, err) = send(&private);
    assert_eq!(code, 0, "{out}{err}");
    let d = app
        .wait_delivered(1, std::time::Duration::from_secs(10))
        .remove(0);
    let header = |name: &str| {
        d.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {name} in {:?}", d.headers))
    };
    let script = r#"
import sys
from sendgrid.helpers.eventwebhook import EventWebhook
public_key, signature, timestamp = sys.argv[1:4]
payload = sys.stdin.buffer.read().decode()
print(EventWebhook(public_key).verify_signature(payload, signature, timestamp))
"#;
    let signature = header("X-Twilio-Email-Event-Webhook-Signature");
    let timestamp = header("X-Twilio-Email-Event-Webhook-Timestamp");
    assert_eq!(
        python(script, &[&public, &signature, &timestamp], &d.body),
        "True"
    );
    let mut changed = d.body.clone();
    changed[20] ^= 1;
    assert_eq!(
        python(script, &[&public, &signature, &timestamp], &changed),
        "False"
    );
}

/// A `v1a` (ed25519) signature made by Python's `cryptography` over the Standard Webhooks
/// content, with a key whose `whpk_` form is configured beside the HMAC secret: processed,
/// then a duplicate; one changed byte is refused and claims nothing.
#[test]
fn a_v1a_signature_made_with_cryptography_is_accepted_beside_a_whsec_secret() {
    if !python_has("cryptography") {
        return;
    }
    let script = r#"
import sys, base64
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives import serialization as s
msg_id, t = sys.argv[1:3]
key = Ed25519PrivateKey.generate()
public = key.public_key().public_bytes(s.Encoding.Raw, s.PublicFormat.Raw)
signed = f"{msg_id}.{t}.".encode() + sys.stdin.buffer.read()
print("whpk_" + base64.b64encode(public).decode(), "v1a," + base64.b64encode(key.sign(signed)).decode())
"#;
    let body = std::fs::read(fixtures_dir().join("clerk/user.created.json")).unwrap();
    let id = "msg_asymmetric_1";
    let t = now().to_string();
    let out = python(script, &[id, &t], &body);
    let (public, signature) = out.split_once(' ').unwrap();
    let server = start(public, SDK_TEST_KEY);
    let headers = vec![
        ("webhook-id".to_string(), id.to_string()),
        ("webhook-timestamp".to_string(), t),
        ("webhook-signature".to_string(), signature.to_string()),
    ];
    assert_outcome(&post(&server, "clerk", &body, &headers), id, "processed");
    assert_outcome(&post(&server, "clerk", &body, &headers), id, "duplicate");
    let rows = ledger_count(&server.db());
    let mut changed = body.clone();
    changed[10] ^= 1;
    assert_error(
        &post(&server, "clerk", &changed, &headers),
        400,
        "invalid_signature",
    );
    assert_eq!(ledger_count(&server.db()), rows, "nothing claimed");
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}
