//! Every preset of the catalog as a user meets it: a source with `preset = "NAME"` and its
//! secret; the preset's real-shaped fixture, signed by `hookledger send` as that provider
//! signs, is processed, the same file again is a duplicate (its id comes from the file), and
//! one changed byte is refused with nothing claimed: a byte of the body for a scheme that signs
//! it, a byte of the credential for one that does not (`token`, `basic`), a byte of the signed
//! token in the body for `mailgun` (which signs its timestamp and token, not the event; see
//! [`tamper_at`]). A preset that signs
//! the URL is given the server's as `public_url`. The presets with a handshake answer the
//! provider's, signed as the provider signs it, and claim nothing.

use crate::util::*;

/// A secret of the right form for each scheme, as the provider shows it.
fn secret_for(scheme: &str) -> &'static str {
    match scheme {
        "stripe" => "whsec_presets_test_secret_0123456789",
        // The Standard Webhooks specification's example key.
        "standard" => "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        // A P-256 private key (PKCS#8, base64 DER), made for these tests: the source verifies
        // with its public half, and `send` can sign with it.
        "ecdsa" => SENDGRID_TEST_KEY,
        // HTTP Basic credentials.
        "basic" => "hookledger:a-password-of-some-length",
        _ => "a-shared-secret-of-some-length",
    }
}

/// A P-256 key made for the tests, never used anywhere else.
pub(crate) const SENDGRID_TEST_KEY: &str = "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgqgZ5vGpJZPjMlGX7qCUaQxDIF2xuq+qzHk1UJgMwOMqhRANCAAT2fhgDEuiz2+TIyL1exc9iPWDaPbtwWdkOZsgrjBBR8lG+qzjmyxKEtXadIhaqw3sfxDdzJOXh/2YFgGzG/Jyp";

/// Whether the preset signs the URL the provider calls (`{url}`, or scheme `twilio`): its
/// source needs `public_url`.
fn signs_url(keys: &str) -> bool {
    keys.contains("{url}") || scheme_of(keys) == "twilio"
}

fn scheme_of(keys: &str) -> String {
    let table: toml::Table = toml::from_str(keys).unwrap();
    table["scheme"].as_str().unwrap().to_string()
}

#[test]
fn every_preset_takes_its_fixture_once_and_refuses_a_changed_byte() {
    let presets = hookledger::internals::presets();
    let dir = test_dir();
    // A fixed port, so that the URL of a preset that signs it (`public_url`) is the one
    // `send` posts to.
    let listen = free_addr();
    let mut config = String::new();
    for (name, keys, _, _) in &presets {
        let secret = secret_for(&scheme_of(keys));
        config.push_str(&format!(
            "[[source]]\nname = \"{name}\"\npreset = \"{name}\"\nsecrets = [\"{secret}\"]\n"
        ));
        if signs_url(keys) {
            config.push_str(&format!(
                "public_url = \"http://{listen}/webhooks/{name}\"\n"
            ));
        }
        config.push('\n');
    }
    let config_path = dir.path().join("presets.toml");
    std::fs::write(&config_path, &config).unwrap();
    let config_arg = config_path.to_str().unwrap();
    let listen_arg = listen.to_string();
    let mut server = Server::start_in(
        dir.path(),
        &["--config", config_arg, "--listen", &listen_arg],
    );
    assert_eq!(server.addr, listen);
    for (name, keys, fixture, kind) in &presets {
        let file = fixtures_dir().join(fixture);
        assert!(file.exists(), "{name}: its fixture {fixture}");
        let url = format!("http://{}/webhooks/{name}", server.addr);
        let send = |file: &std::path::Path| {
            let mut args = vec![
                "send", "--config", config_arg, "--source", name, "--url", &url,
            ];
            if !kind.is_empty() {
                args.extend(["--type", kind]);
            }
            let file = file.to_str().unwrap();
            args.push(file);
            cli(&args)
        };
        let (code, out, err) = send(&file);
        assert_eq!(code, 0, "{name}: {out} {err}");
        assert!(
            out.starts_with("200") && out.contains("processed"),
            "{name}: {out}"
        );
        let rows = |server: &Server| {
            server.db().strings(&format!(
                "SELECT event_id FROM webhook_events WHERE source = '{name}'"
            ))
        };
        // One claim, or one per element of an array the preset splits.
        let claims = rows(&server).len();
        assert!(claims >= 1, "{name}: claimed");
        let (_, again, _) = send(&file);
        assert!(
            again.contains("duplicate") && !again.contains(r#""outcome":"processed""#),
            "{name}: the same file again: {again}"
        );
        // One byte changed after signing: `send` signs what it sends, so the change goes
        // through a proxy of our own: the signed headers of the file, another body; or, for a
        // scheme that signs no body, the body with another credential.
        let reply = tampered(&server, name, &file, config_arg, kind, keys);
        assert_eq!(reply.0, 400, "{name}: a changed byte: {}", reply.1);
        assert_eq!(rows(&server).len(), claims, "{name}: nothing more claimed");
    }
    server.keep(dir);
}

/// The header with the credential of a scheme that does not sign the body (`token`: its
/// configured header; `basic`: `Authorization`), or `None` for a scheme that signs the body.
fn credential_header(keys: &str) -> Option<String> {
    let table: toml::Table = toml::from_str(keys).unwrap();
    match table["scheme"].as_str().unwrap() {
        "token" => Some(table["token"]["header"].as_str().unwrap().to_string()),
        "basic" => Some("Authorization".into()),
        _ => None,
    }
}

/// Sends `file` to `name` with the headers `hookledger send` signs it with, one byte of its
/// body changed after signing; for a scheme that does not sign the body (see
/// [`credential_header`]), one byte of its credential instead.
fn tampered(
    server: &Server,
    name: &str,
    file: &std::path::Path,
    config: &str,
    kind: &str,
    keys: &str,
) -> (u16, String) {
    let mut args = vec!["--config", config, "--source", name];
    if !kind.is_empty() {
        args.extend(["--type", kind]);
    }
    let path = file.to_str().unwrap();
    args.push(path);
    let (mut headers, mut body) = capture_send(&args);
    match credential_header(keys) {
        Some(credential) => {
            let (_, value) = headers
                .iter_mut()
                .find(|(k, _)| k.eq_ignore_ascii_case(&credential))
                .unwrap_or_else(|| panic!("{name}: send sets {credential}"));
            let mut bytes = value.clone().into_bytes();
            let last = bytes.len() - 1;
            bytes[last] ^= 0x01;
            *value = String::from_utf8(bytes).unwrap();
        }
        None => {
            let at = tamper_at(&scheme_of(keys), &body);
            body[at] ^= 0x01;
        }
    }
    let headers: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let reply = server.post(&format!("/webhooks/{name}"), &body, &headers);
    (reply.status, reply.body)
}

/// Where a byte of the signed part of `body` is, to change it: the first byte after the first
/// `"` for a scheme that signs the whole body; for `mailgun`, which signs only the timestamp
/// and token of the body's `signature` object (a byte changed inside `event-data` verifies:
/// its replay guard is the signed time and the claim), the first byte of the token.
fn tamper_at(scheme: &str, body: &[u8]) -> usize {
    match scheme {
        "mailgun" => {
            let key = br#""token":""#;
            let at = body
                .windows(key.len())
                .position(|w| w == key)
                .expect("send writes the signature object's token");
            at + key.len()
        }
        // After the first `"` of a JSON body; the first byte of another (a form).
        _ => body.iter().position(|b| *b == b'"').map_or(0, |at| at + 1),
    }
}

/// The book's table of presets is the catalog's (`hookledger presets --markdown`).
#[test]
fn the_books_table_of_presets_is_the_catalogs() {
    let (code, table, err) = cli(&["presets", "--markdown"]);
    assert_eq!(code, 0, "{err}");
    let readme = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src/sources/presets.md"),
    )
    .unwrap();
    let begin = readme
        .find("<!-- presets:begin")
        .expect("the table's start marker");
    let begin = begin + readme[begin..].find('\n').unwrap() + 1;
    let end = readme
        .find("<!-- presets:end -->")
        .expect("the table's end marker");
    assert_eq!(
        &readme[begin..end],
        table,
        "docs/src/sources/presets.md's table: regenerate it with `hookledger presets --markdown`"
    );
    for (name, ..) in hookledger::internals::presets() {
        assert!(table.contains(&format!("| `{name}` |")), "{name}");
    }
}

/// Every preset has its page in the book (`docs/src/sources/<name>.md`, listed in SUMMARY.md),
/// which shows the preset's keys as the catalog has them and its fixture; and every page there
/// is a preset's. `scripts/preset-pages.py` writes the skeleton of a missing page.
#[test]
fn every_preset_has_its_page_in_the_book() {
    let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src");
    let summary = std::fs::read_to_string(docs.join("SUMMARY.md")).unwrap();
    let presets = hookledger::internals::presets();
    for (name, keys, fixture, _) in &presets {
        let path = docs.join("sources").join(format!("{name}.md"));
        let page = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!("{name}: no page {path:?} ({e}): run scripts/preset-pages.py and edit it")
        });
        assert!(
            summary.contains(&format!("(sources/{name}.md)")),
            "{name}: its page is not in docs/src/SUMMARY.md"
        );
        assert!(
            page.contains(&format!("preset  = \"{name}\"")),
            "{name}: the page's config names the preset"
        );
        assert!(
            page.contains(&format!("```toml\n{keys}\n```")),
            "{name}: the page shows the preset's keys as the catalog has them:\n{keys}"
        );
        assert!(
            page.contains(&format!("tests/fixtures/{fixture}")),
            "{name}: the page names its fixture {fixture}"
        );
        assert!(
            !page.contains("<!-- provider notes"),
            "{name}: the skeleton's provider notes are still to be written"
        );
    }
    for entry in std::fs::read_dir(docs.join("sources")).unwrap() {
        let file = entry.unwrap().file_name().into_string().unwrap();
        let stem = file.strip_suffix(".md").unwrap_or(&file);
        assert!(
            stem == "presets" || presets.iter().any(|(name, ..)| *name == stem),
            "docs/src/sources/{file} is no preset's page"
        );
    }
}

/// Hex HMAC-SHA256 of `parts` under `key`, computed here, apart from hookledger's code.
fn hmac_hex(key: &str, parts: &[&[u8]]) -> String {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key.as_bytes()).unwrap();
    for part in parts {
        mac.update(part);
    }
    hex::encode(mac.finalize().into_bytes())
}

/// Unix seconds as Twitch writes a time: RFC 3339 in UTC with nanoseconds.
fn twitch_time(secs: i64) -> String {
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // The civil date of a day number (Howard Hinnant's `civil_from_days`).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.634234626Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// Each preset with a handshake answers its provider's handshake request, signed as the
/// provider signs it, as the provider's docs require, and claims nothing; a handshake with a
/// wrong signature is refused unanswered.
#[test]
fn each_handshake_preset_answers_its_providers_handshake_and_claims_nothing() {
    let secret = secret_for("hmac");
    let dir = test_dir();
    let mut config = String::new();
    for name in ["slack", "zoom", "twitch"] {
        config.push_str(&format!(
            "[[source]]\nname = \"{name}\"\npreset = \"{name}\"\nsecrets = [\"{secret}\"]\n\n"
        ));
    }
    let config_path = dir.path().join("handshakes.toml");
    std::fs::write(&config_path, &config).unwrap();
    let server = Server::start_in(dir.path(), &["--config", config_path.to_str().unwrap()]);
    let t = now().to_string();

    // Slack's `url_verification` (the Events API docs' example): the challenge back.
    let body = br#"{"token":"Jhj5dZrVaK7ZwHHjRyZWjbDl","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
    let signature = format!(
        "v0={}",
        hmac_hex(secret, &[b"v0:", t.as_bytes(), b":", body])
    );
    let slack = |signature: &str| {
        server.post(
            "/webhooks/slack",
            body,
            &[
                ("X-Slack-Signature", signature),
                ("X-Slack-Request-Timestamp", &t),
                ("Content-Type", "application/json"),
            ],
        )
    };
    let reply = slack(&signature);
    assert_eq!(reply.status, 200, "slack: {}", reply.body);
    assert_eq!(
        json(&reply)["challenge"],
        "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
        "slack: {}",
        reply.body
    );
    let wrong = format!(
        "v0={}",
        hmac_hex("another-secret", &[b"v0:", t.as_bytes(), b":", body])
    );
    let reply = slack(&wrong);
    assert_eq!(reply.status, 400, "slack, wrongly signed: {}", reply.body);
    assert!(!reply.body.contains("3eZbrw1a"), "{}", reply.body);

    // Zoom's `endpoint.url_validation`: the plain token, and its hex HMAC-SHA256 under the
    // secret token.
    let body = br#"{"payload":{"plainToken":"qgg8vlvZRS6UYooatFL8Aw"},"event_ts":1654503849680,"event":"endpoint.url_validation"}"#;
    let signature = format!(
        "v0={}",
        hmac_hex(secret, &[b"v0:", t.as_bytes(), b":", body])
    );
    let reply = server.post(
        "/webhooks/zoom",
        body,
        &[
            ("x-zm-signature", &signature),
            ("x-zm-request-timestamp", &t),
            ("Content-Type", "application/json"),
        ],
    );
    assert_eq!(reply.status, 200, "zoom: {}", reply.body);
    let answer = json(&reply);
    assert_eq!(
        answer["plainToken"], "qgg8vlvZRS6UYooatFL8Aw",
        "zoom: {}",
        reply.body
    );
    assert_eq!(
        answer["encryptedToken"],
        hmac_hex(secret, &[b"qgg8vlvZRS6UYooatFL8Aw"]),
        "zoom: {}",
        reply.body
    );

    // Twitch EventSub's `webhook_callback_verification`: the challenge back, as text.
    let body = br#"{"challenge":"pogchamp-kappa-360noscope-vohiyo","subscription":{"id":"f1c2a387-161a-49f9-a165-0f21d7a4e1c4","status":"webhook_callback_verification_pending","type":"channel.follow","version":"2","cost":0,"condition":{"broadcaster_user_id":"12826","moderator_user_id":"12826"},"transport":{"method":"webhook","callback":"https://example.com/webhooks/callback"},"created_at":"2019-11-16T10:11:12.634234626Z"}}"#;
    let id = "e76c6bd4-55c9-4987-8304-da1588d8988b";
    let stamp = twitch_time(now());
    let signature = format!(
        "sha256={}",
        hmac_hex(secret, &[id.as_bytes(), stamp.as_bytes(), body])
    );
    let reply = server.post(
        "/webhooks/twitch",
        body,
        &[
            ("Twitch-Eventsub-Message-Id", id),
            ("Twitch-Eventsub-Message-Retry", "0"),
            (
                "Twitch-Eventsub-Message-Type",
                "webhook_callback_verification",
            ),
            ("Twitch-Eventsub-Message-Signature", &signature),
            ("Twitch-Eventsub-Message-Timestamp", &stamp),
            ("Twitch-Eventsub-Subscription-Type", "channel.follow"),
            ("Twitch-Eventsub-Subscription-Version", "2"),
            ("Content-Type", "application/json"),
        ],
    );
    assert_eq!(reply.status, 200, "twitch: {}", reply.body);
    assert_eq!(reply.body, "pogchamp-kappa-360noscope-vohiyo");

    assert_eq!(ledger_count(&server.db()), 0, "handshakes claim nothing");
}
