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
        let mut config = Config::parse(text, folder)?;
        config.resolve_secrets(folder)?;
        Ok(config)
    }

    /// Parses a config file's `text`, resolving relative paths against `folder` (the file's);
    /// secrets stay as written (`env:`, `file:`) until [`Config::resolve_secrets`]. An error
    /// names the table (``source `gh` ``, `http`) and the line.
    pub(crate) fn parse(text: &str, folder: &Path) -> Result<Config, ConfigError> {
        let mut config: Config = toml::from_str(text).map_err(|e| {
            // The parser's own text quotes the offending line, which may hold a literal
            // secret: the message alone, with where it is.
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
        })?;
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
        if let Some(token) = &mut self.admin_token {
            *token = one_secret("admin_token", token, folder)?;
        }
        Ok(())
    }
}

/// `message` with every double-quoted value (serde quotes the value of a wrong type, which may
/// be a secret) replaced by `"…"`. Keys and variants are quoted with backticks and stay.
pub(super) fn without_values(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut parts = message.split('"');
    out.push_str(parts.next().unwrap_or_default());
    let mut inside = true;
    for part in parts {
        out.push('"');
        out.push_str(if inside { "…" } else { part });
        inside = !inside;
    }
    out
}

/// The table that contains byte `offset` of `text`, as a key: ``source `gh` `` (a
/// `[[source]]`, by its name), ``delivery `kind` ``, `effect 2` (by its place), `http` (a
/// `[table]`), or empty (the top level).
fn table_around(text: &str, offset: usize) -> String {
    let before = &text[..offset.min(text.len())];
    // The last header before `offset`: its name, whether it is `[[…]]`, where it starts and
    // where its table's lines start.
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
    let named = match name {
        "source" => field("name"),
        "delivery" => field("kind"),
        _ => None,
    };
    match named {
        Some(named) => format!("{name} `{named}`"),
        None => {
            let place = text[..start].matches(&format!("[[{name}]]")).count() + 1;
            format!("{name} {place}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            err.message
                .starts_with("line 10, column 1: unknown field `secret`"),
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
}
