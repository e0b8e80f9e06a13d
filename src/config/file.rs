//! The config file: TOML, read once at start-up. Relative paths in it (`database`, `file:`
//! secrets) are relative to its folder; `env:` and `file:` secrets are read here, so what
//! comes out holds the secrets themselves. (Reading the file itself is `Config::load`'s, at
//! the library's boundary: config does no I/O of its own but the secrets'.)

use std::path::Path;

use super::{one_secret, Config, ConfigError, Database};

impl Config {
    /// Parses a config file's `text` and reads its secrets, relative paths against `folder`.
    #[cfg(test)]
    pub(crate) fn from_toml(text: &str, folder: &Path) -> Result<Config, ConfigError> {
        let mut config = Config::parse(text, folder, &[])?;
        config.resolve_secrets(folder)?;
        Ok(config)
    }

    /// Parses a config file's `text`, resolving relative paths against `folder` (the file's);
    /// secrets stay as written (`env:`, `file:`) until [`Config::resolve_secrets`]. A source's
    /// `preset = "NAME"` takes its keys from `presets` (name, the preset's TOML), the file's
    /// own keys over them. An error names the table (``source `gh` ``, `http`) and, for a file
    /// without presets, the line.
    pub(crate) fn parse(
        text: &str,
        folder: &Path,
        presets: &[(&str, &str)],
    ) -> Result<Config, ConfigError> {
        let mut config = match with_presets(text, presets)? {
            None => toml::from_str(text).map_err(|e| parse_error(text, &e))?,
            Some(merged) => from_table(merged)?,
        };
        if let Database::Sqlite(path) = &mut config.database {
            if path.is_relative() {
                *path = folder.join(&*path);
            }
        }
        if let Some(migrations) = &mut config.schema.migrations {
            if migrations.is_relative() {
                *migrations = folder.join(&*migrations);
            }
        }
        Ok(config)
    }

    /// Reads every `env:` and `file:` secret (`file:` paths relative to `folder`).
    pub(crate) fn resolve_secrets(&mut self, folder: &Path) -> Result<(), ConfigError> {
        for source in &mut self.sources {
            source.resolve_secrets(folder)?;
        }
        if let Some(forward) = &mut self.forward {
            forward.secret = one_secret("forward.secret", &forward.secret, folder)?;
        }
        for delivery in &mut self.deliveries {
            if let Some(secret) = &mut delivery.secret {
                let key = format!("delivery `{}`.secret", delivery.kind);
                *secret = one_secret(&key, secret, folder)?;
            }
            let kind = delivery.kind.clone();
            if let Some((way, url)) = delivery.broker_url_mut() {
                let key = format!("delivery `{kind}`.{way}.url");
                *url = one_secret(&key, url, folder)?;
            }
        }
        for (i, alert) in self.alerts.iter_mut().enumerate() {
            let key = alert.key(i + 1, "secret");
            if let Some(secret) = &mut alert.secret {
                *secret = one_secret(&key, secret, folder)?;
            }
        }
        if let Some(token) = &mut self.admin_token {
            *token = one_secret("admin_token", token, folder)?;
        }
        Ok(())
    }
}

/// The TOML parser's or serde's error on `text`, without the line it quotes (which may hold a
/// literal secret): the message alone, with where it is.
fn parse_error(text: &str, e: &toml::de::Error) -> ConfigError {
    let (key, place) = match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            (
                table_around(text, span.start),
                format!("line {line}, column {column}: "),
            )
        }
        None => (String::new(), String::new()),
    };
    ConfigError::new(
        key,
        format!("{place}{}", without_values(e.message().trim_end())),
    )
}

/// A source named `name` with `secrets`, its other keys those of the preset `preset` (its
/// keys as a config file writes them, `keys`): what `preset = "…"` in a file gives.
pub(crate) fn preset_source(
    preset: &str,
    keys: &str,
    name: &str,
    secrets: Vec<super::Secret>,
) -> Result<super::SourceConfig, ConfigError> {
    use serde::Deserialize;
    let mut table: toml::Table =
        toml::from_str(keys).expect("the catalog's presets are valid TOML");
    table.insert("name".into(), name.into());
    table.insert("preset".into(), preset.into());
    // Secrets are set after: they never pass through TOML (a value in an error message).
    table.insert("secrets".into(), toml::Value::Array(Vec::new()));
    let mut source = super::SourceConfig::deserialize(toml::Value::Table(table))
        .map_err(|e| ConfigError::new(super::source_key(name, "preset"), e.message().trim_end()))?;
    source.secrets = secrets;
    Ok(source)
}

/// `text` as a table with each source's `preset` filled in (the preset's keys under the
/// source's own, tables merged key by key), or `None` when no source names a preset. The
/// `preset` key stays, so the source shows where its keys came from.
fn with_presets(text: &str, presets: &[(&str, &str)]) -> Result<Option<toml::Table>, ConfigError> {
    if !text.contains("preset") {
        return Ok(None);
    }
    let mut doc: toml::Table = toml::from_str(text).map_err(|e| parse_error(text, &e))?;
    let Some(toml::Value::Array(sources)) = doc.get_mut("source") else {
        return Ok(None);
    };
    let mut any = false;
    for (i, source) in sources.iter_mut().enumerate() {
        let toml::Value::Table(table) = source else {
            continue;
        };
        let Some(wanted) = table.get("preset") else {
            continue;
        };
        let key = match table.get("name").and_then(toml::Value::as_str) {
            Some(name) if is_name(name) => super::source_key(name, "preset"),
            _ => format!("source {}.preset", i + 1),
        };
        let wanted = wanted.as_str().filter(|w| is_name(w));
        let Some(preset) = wanted.and_then(|w| presets.iter().find(|(name, _)| *name == w)) else {
            let known: Vec<&str> = presets.iter().map(|(name, _)| *name).collect();
            return Err(ConfigError::new(
                key,
                format!("not a preset; the presets are: {}", known.join(", ")),
            ));
        };
        let mut merged: toml::Table =
            toml::from_str(preset.1).expect("the catalog's presets are valid TOML");
        merge(&mut merged, std::mem::take(table));
        *table = merged;
        any = true;
    }
    Ok(any.then_some(doc))
}

/// `over`'s keys into `under`: a table in both is merged key by key, anything else in `over`
/// replaces `under`'s.
fn merge(under: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (under.get_mut(&key), value) {
            (Some(toml::Value::Table(below)), toml::Value::Table(above)) => merge(below, above),
            (_, value) => {
                under.insert(key, value);
            }
        }
    }
}

/// The config of a file whose presets were filled in: no line to show (the table is not the
/// file's text), so an error about a source names it.
fn from_table(doc: toml::Table) -> Result<Config, ConfigError> {
    use serde::Deserialize;
    if let Some(toml::Value::Array(sources)) = doc.get("source") {
        for (i, source) in sources.iter().enumerate() {
            if let Err(e) = super::SourceConfig::deserialize(source.clone()) {
                let key = match source.get("name").and_then(toml::Value::as_str) {
                    Some(name) if is_name(name) => format!("source `{name}`"),
                    _ => format!("source {}", i + 1),
                };
                return Err(ConfigError::new(
                    key,
                    without_values(e.message().trim_end()),
                ));
            }
        }
    }
    Config::deserialize(toml::Value::Table(doc))
        .map_err(|e| ConfigError::new(String::new(), without_values(e.message().trim_end())))
}

/// `message` (serde's or the TOML parser's) without the value it quotes. serde names the
/// offending value first, quoted (`string "…"`, Debug-escaped) or in backticks (`integer
/// `5``, `unknown field `…``, `unknown variant `…``), before `, expected …`: a string, a
/// number, a key or a variant the file holds, any of which may be a pasted secret. That value
/// becomes `…`, from its first quote to the last one before `, expected` (so an escaped `"`
/// or a backtick inside it ends nothing). What `expected` lists is the schema's own (the keys
/// and variants it knows) and stays, as do the names serde gives a missing or duplicate field.
pub(super) fn without_values(message: &str) -> String {
    if message.starts_with("missing field `") || message.starts_with("duplicate field `") {
        return message.to_string();
    }
    if let Some(rest) = message.strip_prefix("unknown field `") {
        // A misspelt key is named (the user must find it), unless it could be a pasted secret.
        let end = rest
            .rfind("`, expected ")
            .or_else(|| rest.rfind('`'))
            .unwrap_or(rest.len());
        let (key, expected) = (&rest[..end], rest[end..].trim_start_matches('`'));
        return if looks_like_a_key(key) {
            format!("unknown field `{key}`{expected}")
        } else {
            format!("unknown field (not shown: it looks like a secret){expected}")
        };
    }
    let (told, expected) = message.split_at(message.rfind(", expected ").unwrap_or(message.len()));
    let quote = |c: char| c == '"' || c == '`';
    let Some(first) = told.find(quote) else {
        return message.to_string();
    };
    let mark = &told[first..=first];
    let after = match told.rfind(quote) {
        Some(last) if last > first => &told[last + 1..],
        // A quote that does not close: nothing after it is kept.
        _ => "",
    };
    format!("{}{mark}…{mark}{after}{expected}", &told[..first])
}

/// Whether `key`, a key a config file holds that the schema does not know, reads as a key
/// (a misspelling, to be named) rather than a value pasted in a key's place: short, of the
/// characters keys are made of, no provider's secret prefix, no long run without a `_` or
/// `-`, few digits, not mixed case with digits.
fn looks_like_a_key(key: &str) -> bool {
    const SECRET_PREFIXES: [&str; 12] = [
        "whsec",
        "sk_",
        "rk_",
        "pk_",
        "sk-",
        "ghp_",
        "gho_",
        "ghs_",
        "github_pat",
        "xox",
        "shp",
        "akia",
    ];
    let lower = key.to_ascii_lowercase();
    let digits = key.chars().filter(char::is_ascii_digit).count();
    let mixed =
        key.chars().any(|c| c.is_ascii_uppercase()) && key.chars().any(|c| c.is_ascii_lowercase());
    !key.is_empty()
        && key.len() <= 32
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !SECRET_PREFIXES.iter().any(|p| lower.starts_with(p))
        && key.split(['_', '-']).all(|word| word.len() <= 16)
        && digits <= 3
        && !(mixed && digits > 0)
}

/// The table that contains byte `offset` of `text`, as a key: ``source `gh` `` (a
/// `[[source]]`, by its name), ``delivery `kind` ``, `effect 2` (by its place), `http` (a
/// `[table]`), or empty (the top level).
fn table_around(text: &str, offset: usize) -> String {
    // Through the end of `offset`'s line: an error in a flattened table's keys (a lane's)
    // points at the table's header itself.
    let offset = offset.min(text.len());
    let end = text[offset..]
        .find('\n')
        .map_or(text.len(), |i| offset + i + 1);
    let before = &text[..end];
    // The last header up to `offset`'s line: its name, whether it is `[[…]]`, where it starts
    // and where its table's lines start.
    let mut header = None;
    let mut at = 0;
    for line in before.split_inclusive('\n') {
        let start = at;
        at += line.len();
        let line = line.trim();
        if let Some(inside) = line.strip_prefix('[') {
            let array = inside.starts_with('[');
            let name = inside
                .trim_start_matches('[')
                .split(']')
                .next()
                .unwrap_or("");
            header = Some((name.trim(), array, start, at));
        }
    }
    let Some((name, array, start, body)) = header else {
        return String::new();
    };
    if !array {
        return name.to_string();
    }
    let block = &text[body..];
    let block = &block[..block.find("\n[").unwrap_or(block.len())];
    let field = |wanted: &str| {
        block.lines().find_map(|line| {
            let (key, value) = line.split_once('=')?;
            (key.trim() == wanted).then(|| value.trim().trim_matches('"').to_string())
        })
    };
    // Only a value that is a name (a source's, a delivery kind's) names the table: anything
    // else in its place may be a pasted secret, and the table is named by its place instead.
    let named = match name {
        "source" => field("name"),
        "delivery" => field("kind"),
        _ => None,
    }
    .filter(|named| is_name(named));
    match named {
        Some(named) => format!("{name} `{named}`"),
        None => {
            let place = text[..start].matches(&format!("[[{name}]]")).count() + 1;
            format!("{name} {place}")
        }
    }
}

/// 1 to 64 letters, digits, `-`, `_` or `.`: a name, not a value that may be a secret's.
fn is_name(text: &str) -> bool {
    (1..=64).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRESETS: &[(&str, &str)] = &[(
        "acme",
        "scheme = \"hmac\"\nmax_body = 1000\nid = { header = \"X-Acme-Id\" }\ntype = { header = \"X-Acme-Type\" }\nhmac = { header = \"X-Acme-Signature\", prefix = \"sha256=\" }",
    )];

    #[test]
    fn a_preset_fills_in_keys_and_the_files_own_keys_win_table_by_table() {
        let text = r#"
[[source]]
name = "shop"
preset = "acme"
secrets = ["s3cret-of-some-length"]
max_body = 2000
hmac = { encoding = "base64" }
"#;
        let config = Config::parse(text, Path::new("."), PRESETS).unwrap();
        let source = &config.sources[0];
        assert_eq!(source.preset.as_deref(), Some("acme"));
        assert_eq!(source.scheme, super::super::SchemeName::Hmac);
        assert_eq!(source.max_body, Some(2000), "the file's key wins");
        let hmac = source.hmac.as_ref().unwrap();
        assert_eq!(hmac.header, "X-Acme-Signature", "the preset's, merged in");
        assert_eq!(hmac.prefix, "sha256=");
        assert_eq!(
            hmac.encoding,
            super::super::HmacEncoding::Base64,
            "the file's"
        );
    }

    #[test]
    fn an_unknown_preset_is_refused_naming_the_key_and_the_presets() {
        let text = "[[source]]\nname = \"shop\"\npreset = \"acmee\"\n";
        let err = Config::parse(text, Path::new("."), PRESETS).unwrap_err();
        assert_eq!(err.key, "source `shop`.preset");
        assert!(err.message.contains("the presets are: acme"), "{err}");
        // A value that is not a name is not repeated (it may be a pasted secret).
        let text = "[[source]]\nname = \"shop\"\npreset = \"whsec_x y\"\n";
        let err = Config::parse(text, Path::new("."), PRESETS).unwrap_err();
        assert!(!err.to_string().contains("whsec"), "{err}");
        // A key the preset does not know is an error about the source.
        let text = "[[source]]\nname = \"shop\"\npreset = \"acme\"\nsecret = [\"x\"]\n";
        let err = Config::parse(text, Path::new("."), PRESETS).unwrap_err();
        assert_eq!(err.key, "source `shop`");
        assert!(err.message.contains("unknown field `secret`"), "{err}");
    }

    #[test]
    fn an_unknown_key_is_named_unless_it_looks_like_a_secret() {
        let github = "[[source]]\nname = \"gh\"\nscheme = \"github\"\nsecrets = [\"x\"]\n";
        let err = Config::from_toml(&format!("{github}secert = 1\n"), Path::new(".")).unwrap_err();
        assert_eq!(err.key, "source `gh`");
        assert!(
            err.message
                .contains("unknown field `secert`, expected one of"),
            "{err}"
        );
        for key in [
            "claim_days",
            "max-body",
            "breaker_failures",
            "payload_days2",
            "Secrets",
        ] {
            assert!(looks_like_a_key(key), "{key}");
        }
        for key in [
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "sk_live_abc",
            "ghp_abcdef",
            "9f8a7b6c5d4e3f2a1b0c",
            "qzxkvbwplmrtyhgfdsa",
            "aB3dEfGh",
            "has space",
            "",
        ] {
            assert!(!looks_like_a_key(key), "{key}");
            let text = format!("{github}\"{key}\" = 1\n");
            let err = format!(
                "{:#}",
                Config::from_toml(&text, Path::new(".")).unwrap_err()
            );
            assert!(
                err.contains("unknown field (not shown: it looks like a secret)"),
                "{err}"
            );
            assert!(key.is_empty() || !err.contains(key), "{err}");
        }
    }

    const TWO_SOURCES: &str = r#"
[[source]]
name = "stripe"
scheme = "stripe"
secrets = ["whsec_a_secret_of_some_length"]

[[source]]
name = "gh"
scheme = "github"
secret = ["oops"]
"#;

    #[test]
    fn a_parse_error_names_the_source_the_key_and_the_line() {
        let err = Config::from_toml(TWO_SOURCES, Path::new(".")).unwrap_err();
        assert_eq!(err.key, "source `gh`");
        assert!(
            err.message.starts_with(
                "line 10, column 1: unknown field `secret`, expected one of `name`, `scheme`, `secrets`"
            ),
            "{err}"
        );
    }

    #[test]
    fn a_parse_error_elsewhere_names_its_table() {
        for (text, key) in [
            ("[http]\nport = 1\n", "http"),
            ("listen = \"127.0.0.1:1\"\nlisten_on = 2\n", ""),
            (
                "[[delivery]]\nkind = \"receipt\"\nurl = \"http://a/\"\ntimeout = 5\n",
                "delivery `receipt`",
            ),
            (
                "[[effect]]\nsource = \"a\"\non = \"*\"\nsql = \"SELECT 1\"\n\n\
                 [[effect]]\nsource = \"a\"\non = \"*\"\nsql = 1\n",
                "effect 2",
            ),
        ] {
            let err = Config::from_toml(text, Path::new(".")).unwrap_err();
            assert_eq!(err.key, key, "{text}: {err}");
            assert!(err.message.starts_with("line "), "{text}: {err}");
        }
    }

    #[test]
    fn a_parse_error_does_not_quote_a_literal_secret() {
        let text =
            "[[source]]\nname = \"gh\"\nscheme = \"github\"\nsecret = [\"gh_TOPSECRET_literal\"]\n";
        let err = format!("{:#}", Config::from_toml(text, Path::new(".")).unwrap_err());
        assert!(
            err.contains("unknown field `secret`") && err.contains("line 4"),
            "{err}"
        );
        assert!(!err.contains("TOPSECRET"), "{err}");
        let text =
            "[[source]]\nname = \"gh\"\nscheme = \"github\"\nsecrets = \"gh_TOPSECRET_literal\"\n";
        let err = format!("{:#}", Config::from_toml(text, Path::new(".")).unwrap_err());
        assert!(
            err.contains("invalid type") && !err.contains("TOPSECRET"),
            "{err}"
        );
    }

    /// A secret pasted anywhere a value or a key goes, or a number where a string goes: the
    /// error names the table, the line and what was expected, never what the file holds.
    #[test]
    fn a_parse_error_quotes_no_value_of_the_file() {
        let source = "[[source]]\nname = \"gh\"\n";
        let github = format!("{source}scheme = \"github\"\n");
        for (text, key, line, says) in [
            // A string secret with an escaped quote: nothing after the quote either.
            (
                format!("{github}secrets = \"gh_TOP\\\"SECRET_tail`x\"\n"),
                "source `gh`",
                4,
                "invalid type: string \"…\", expected a sequence",
            ),
            (
                format!("{github}secrets = [4242424242424242]\n"),
                "source `gh`",
                4,
                "invalid type: integer `…`, expected a string",
            ),
            (
                format!("{source}scheme = \"whsec_TOPSECRET\"\n"),
                "source `gh`",
                3,
                "unknown variant `…`, expected one of `stripe`, `standard`",
            ),
            (
                format!("{github}secrets = [\"x\"]\nhandlers = \"whsec_TOPSECRET\"\n"),
                "source `gh`",
                5,
                "invalid type: string \"…\", expected a sequence",
            ),
            // Pasted as a key, bare or quoted.
            (
                format!("{github}whsec_TOPSECRET = 1\n"),
                "source `gh`",
                4,
                "unknown field (not shown: it looks like a secret), expected one of `name`",
            ),
            (
                format!("{github}\"whsec` TOP\\\"SECRET\" = 1\n"),
                "source `gh`",
                4,
                "unknown field (not shown: it looks like a secret), expected one of `name`",
            ),
            (
                "[writer]\nbatch_max = 4242424242424242424242\n".to_string(),
                "writer",
                2,
                "invalid type: integer `…`",
            ),
            (
                "[http]\nread_timeout = \"TOPSECRET\"\n".to_string(),
                "http",
                2,
                "not a duration",
            ),
            (
                "[retention]\nclaim_days = \"TOPSECRET\"\n".to_string(),
                "retention",
                2,
                "must be a number of days or never",
            ),
            (
                "admin_listen = \"TOPSECRET\"\n".to_string(),
                "",
                1,
                "is not an address",
            ),
            (
                "[http]\nmax_body = -4242424242\n".to_string(),
                "http",
                2,
                "invalid value: integer `…`, expected usize",
            ),
        ] {
            let err = Config::from_toml(&text, Path::new(".")).unwrap_err();
            let shown = format!("{err} {err:?}");
            assert_eq!(err.key, key, "{text}: {shown}");
            assert!(
                err.message.starts_with(&format!("line {line}, column ")),
                "{text}: {shown}"
            );
            assert!(err.message.contains(says), "{text}: {shown}");
            for value in ["TOP", "SECRET", "4242"] {
                assert!(!shown.contains(value), "{text}: {shown}");
            }
        }
    }

    #[test]
    fn env_and_file_secrets_are_read_relative_to_the_config_folder() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("gh.secret"),
            "# from the dashboard\ngh_secret_from_a_file\n",
        )
        .unwrap();
        let text = r#"
[[source]]
name = "gh"
scheme = "github"
secrets = ["file:gh.secret", "env:HOOKLEDGER_TEST_UNSET_VARIABLE_1"]
"#;
        let err = Config::from_toml(text, dir.path()).unwrap_err();
        assert_eq!(err.key, "source `gh`.secrets");
        assert_eq!(
            err.message,
            "environment variable HOOKLEDGER_TEST_UNSET_VARIABLE_1 is not set"
        );
        let text = text.replace(", \"env:HOOKLEDGER_TEST_UNSET_VARIABLE_1\"", "");
        let config = Config::from_toml(&text, dir.path()).unwrap();
        assert_eq!(
            config.sources[0].secrets[0].expose(),
            "gh_secret_from_a_file"
        );
        let missing = text.replace("gh.secret", "nope.secret");
        let err = Config::from_toml(&missing, dir.path()).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("source `gh`.secrets: cannot read"),
            "{err}"
        );
    }

    #[test]
    fn the_admin_token_is_read_from_its_file_and_must_be_long_enough() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("admin.token"), "0123456789abcdef0123\n").unwrap();
        let text = "admin_token = \"file:admin.token\"\n[[source]]\nname = \"gh\"\n\
                    scheme = \"github\"\nsecrets = [\"gh_literal_secret_123\"]\n";
        let config = Config::from_toml(text, dir.path()).unwrap();
        assert_eq!(
            config.admin_token.as_ref().map(|t| t.expose()),
            Some("0123456789abcdef0123")
        );
        config.validate().unwrap();
        let unset = text.replace("file:admin.token", "env:HOOKLEDGER_TEST_UNSET_VARIABLE_2");
        let err = Config::from_toml(&unset, dir.path()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "admin_token: environment variable HOOKLEDGER_TEST_UNSET_VARIABLE_2 is not set"
        );
        std::fs::write(dir.path().join("admin.token"), "short-token\n").unwrap();
        let err = Config::from_toml(text, dir.path())
            .unwrap()
            .validate()
            .unwrap_err();
        assert_eq!(err.key, "admin_token");
        assert!(
            err.message.starts_with("the token is shorter than 16")
                && !err.to_string().contains("short-token"),
            "{err}"
        );
    }

    /// The only test that sets `CREDENTIALS_DIRECTORY` (the process's environment is shared by
    /// the tests running alongside).
    #[test]
    fn credential_secrets_are_read_from_systemd_s_credentials_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("gh-webhook-secret"),
            "gh_secret_from_a_credential
gh_old_secret_in_rotation
",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("admin-token"),
            "0123456789abcdef0123
",
        )
        .unwrap();
        let text = "admin_token = \"credential:admin-token\"\n[[source]]\nname = \"gh\"\n\
                    scheme = \"github\"\nsecrets = [\"credential:gh-webhook-secret\"]\n";

        std::env::remove_var(super::super::source::CREDENTIALS_DIRECTORY);
        let err = Config::from_toml(text, Path::new("/nonexistent")).unwrap_err();
        assert_eq!(err.key, "source `gh`.secrets");
        assert!(
            err.message
                .starts_with("credential:gh-webhook-secret needs CREDENTIALS_DIRECTORY"),
            "{err}"
        );

        std::env::set_var(super::super::source::CREDENTIALS_DIRECTORY, dir.path());
        let config = Config::from_toml(text, Path::new("/nonexistent")).unwrap();
        let secrets: Vec<&str> = config.sources[0]
            .secrets
            .iter()
            .map(|s| s.expose())
            .collect();
        assert_eq!(
            secrets,
            ["gh_secret_from_a_credential", "gh_old_secret_in_rotation"]
        );
        assert_eq!(
            config.admin_token.as_ref().map(|t| t.expose()),
            Some("0123456789abcdef0123")
        );

        // A delivery's signing key from a credential too, as a source's secret is.
        let key = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        std::fs::write(dir.path().join("receipts-key"), format!("{key}\n")).unwrap();
        let delivery = |secret: &str| {
            format!(
                "[[delivery]]\nkind = \"receipts\"\nurl = \"http://127.0.0.1:1/r\"\n\
                 secret = \"credential:{secret}\"\n"
            )
        };
        let config = Config::from_toml(&delivery("receipts-key"), Path::new("/nonexistent"));
        assert_eq!(
            config.unwrap().deliveries[0]
                .secret
                .as_ref()
                .unwrap()
                .expose(),
            key
        );
        let err = Config::from_toml(&delivery("nope"), dir.path()).unwrap_err();
        assert_eq!(err.key, "delivery `receipts`.secret", "{err}");
        assert!(err.message.contains("/nope"), "{err}");

        let missing = text.replace("credential:gh-webhook-secret", "credential:nope");
        let err = Config::from_toml(&missing, dir.path()).unwrap_err();
        assert_eq!(err.key, "source `gh`.secrets");
        assert!(err.message.starts_with("cannot read "), "{err}");
        assert!(err.message.contains("/nope"), "{err}");

        for bad in ["", ".", "..", "../admin-token", "sub/admin-token"] {
            let text = text.replace("credential:gh-webhook-secret", &format!("credential:{bad}"));
            let err = Config::from_toml(&text, dir.path()).unwrap_err();
            assert_eq!(err.key, "source `gh`.secrets", "{bad}");
            assert!(
                err.message.contains("is not a credential name"),
                "{bad}: {err}"
            );
        }

        std::fs::write(dir.path().join("empty"), "# nothing yet\n").unwrap();
        let empty = text.replace("credential:admin-token", "credential:empty");
        let err = Config::from_toml(&empty, dir.path()).unwrap_err();
        assert_eq!(err.key, "admin_token");
        assert!(err.message.ends_with("holds no secret"), "{err}");
        std::env::remove_var(super::super::source::CREDENTIALS_DIRECTORY);
    }
}
