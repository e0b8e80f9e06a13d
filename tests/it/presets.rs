//! Every preset of the catalog as a user meets it: a source with `preset = "NAME"` and its
//! secret; the preset's real-shaped fixture, signed by `hookledger send` as that provider
//! signs, is processed, the same file again is a duplicate (its id comes from the file), and
//! one changed byte is refused with nothing claimed (wrong credentials, for the schemes that
//! do not sign the body). A preset that signs the URL is given the server's as `public_url`.

use crate::util::*;

/// A secret of the right form for each scheme, as the provider shows it.
fn secret_for(scheme: &str) -> &'static str {
    match scheme {
        "stripe" => "whsec_presets_test_secret_0123456789",
        // The Standard Webhooks specification's example key.
        "standard" => "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        // HTTP Basic credentials.
        "basic" => "hookledger:a-password-of-some-length",
        _ => "a-shared-secret-of-some-length",
    }
}

/// Whether the scheme signs the body (else a changed byte is no test of it: wrong credentials
/// are).
fn signs_body(scheme: &str) -> bool {
    !matches!(scheme, "token" | "basic")
}

/// Whether the preset signs the URL the provider calls (`{url}`): its source needs
/// `public_url`.
fn signs_url(keys: &str) -> bool {
    keys.contains("{url}")
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
        assert_eq!(rows(&server).len(), 1, "{name}: one claim");
        let (_, again, _) = send(&file);
        assert!(
            again.contains("duplicate"),
            "{name}: the same file again: {again}"
        );
        if signs_body(&scheme_of(keys)) {
            // One byte changed after signing: `send` signs what it sends, so the change goes
            // through a proxy of our own: the signed headers of the file, another body.
            let reply = tampered(&server, name, &file, config_arg, kind);
            assert_eq!(reply.0, 400, "{name}: a changed byte: {}", reply.1);
        } else {
            // Nothing signs the body: wrong credentials are refused instead.
            let mut args = vec![
                "send",
                "--config",
                config_arg,
                "--source",
                name,
                "--url",
                &url,
                "--secret",
                "hookledger:a-wrong-password",
            ];
            if !kind.is_empty() {
                args.extend(["--type", kind]);
            }
            args.push(file.to_str().unwrap());
            let (_, out, _) = cli(&args);
            assert!(out.starts_with("400"), "{name}: wrong credentials: {out}");
        }
        assert_eq!(rows(&server).len(), 1, "{name}: nothing more claimed");
    }
    server.keep(dir);
}

/// Sends `file` to `name` with the headers `hookledger send` signs it with, one byte of its
/// body changed after signing.
fn tampered(
    server: &Server,
    name: &str,
    file: &std::path::Path,
    config: &str,
    kind: &str,
) -> (u16, String) {
    let mut args = vec!["--config", config, "--source", name];
    if !kind.is_empty() {
        args.extend(["--type", kind]);
    }
    let path = file.to_str().unwrap();
    args.push(path);
    let (headers, mut body) = capture_send(&args);
    let at = body.iter().position(|b| *b == b'"').expect("a JSON body");
    body[at + 1] ^= 0x01;
    let headers: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let reply = server.post(&format!("/webhooks/{name}"), &body, &headers);
    (reply.status, reply.body)
}

/// The README's table of presets is the catalog's (`hookledger presets --markdown`).
#[test]
fn the_readmes_table_of_presets_is_the_catalogs() {
    let (code, table, err) = cli(&["presets", "--markdown"]);
    assert_eq!(code, 0, "{err}");
    let readme =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
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
        "README's table: regenerate it with `hookledger presets --markdown`"
    );
    for (name, ..) in hookledger::internals::presets() {
        assert!(table.contains(&format!("| `{name}` |")), "{name}");
    }
}
