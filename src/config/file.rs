//! The config file: TOML, read once at start-up. Relative paths in it (`database`, `file:`
//! secrets) are relative to its folder; `env:` and `file:` secrets are read here, so what
//! comes out holds the secrets themselves.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};

use super::source::one_secret;
use super::{Config, Database};

impl Config {
    /// Reads and checks the config file at `path`, its secrets read. Errors name the file,
    /// the line, the source and the key where they can.
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let (mut config, folder) = Config::read(path)?;
        config
            .resolve_secrets(&folder)
            .with_context(|| format!("config file {}", path.display()))?;
        Ok(config)
    }

    /// Reads the config file at `path` with its secrets still as written (`env:`, `file:`),
    /// and the folder they are relative to.
    pub(crate) fn read(path: &Path) -> anyhow::Result<(Config, PathBuf)> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        let folder = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        let config = Config::parse(&text, &folder)
            .with_context(|| format!("config file {}", path.display()))?;
        Ok((config, folder))
    }

    /// Parses a config file's `text` and reads its secrets, relative paths against `folder`.
    #[cfg(test)]
    pub(crate) fn from_toml(text: &str, folder: &Path) -> anyhow::Result<Config> {
        let mut config = Config::parse(text, folder)?;
        config.resolve_secrets(folder)?;
        Ok(config)
    }

    /// Parses `text`, resolving relative paths against `folder`; secrets stay as written.
    fn parse(text: &str, folder: &Path) -> anyhow::Result<Config> {
        let mut config: Config = toml::from_str(text).map_err(|e| {
            // The parser's own text quotes the offending line, which may hold a literal
            // secret: the message alone, with where it is.
            let (source, place) = match e.span() {
                Some(span) => {
                    let before = &text[..span.start.min(text.len())];
                    let line = before.matches('\n').count() + 1;
                    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                    let source = source_around(text, span.start)
                        .map(|name| format!("source `{name}`: "))
                        .unwrap_or_default();
                    (source, format!("line {line}, column {column}: "))
                }
                None => (String::new(), String::new()),
            };
            anyhow!("{source}{place}{}", without_values(e.message().trim_end()))
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

    /// Reads every `env:` and `file:` secret.
    fn resolve_secrets(&mut self, folder: &Path) -> anyhow::Result<()> {
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
fn without_values(message: &str) -> String {
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

/// The `name` of the `[[source]]` table that contains byte `offset` of `text`, if any.
fn source_around(text: &str, offset: usize) -> Option<String> {
    let before = &text[..offset.min(text.len())];
    let start = before.rfind("[[source]]")?;
    // Another table header between the source and the offset ends the source.
    let after_header = start + "[[source]]".len();
    if before[after_header..]
        .lines()
        .any(|l| l.trim_start().starts_with('['))
    {
        return None;
    }
    let block_end = text[after_header..]
        .find("\n[")
        .map_or(text.len(), |i| after_header + i);
    text[start..block_end].lines().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        (key.trim() == "name").then(|| value.trim().trim_matches('"').to_string())
    })
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
        let text = format!("{err:#}");
        assert!(text.contains("source `gh`"), "{text}");
        assert!(text.contains("unknown field `secret`"), "{text}");
        assert!(text.contains("line 10"), "{text}");
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
        assert!(
            format!("{err:#}").contains(
                "source `gh`: secrets: environment variable HOOKLEDGER_TEST_UNSET_VARIABLE_1 is not set"
            ),
            "{err:#}"
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
            format!("{err:#}").contains("source `gh`: secrets: cannot read"),
            "{err:#}"
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
        assert!(
            format!("{err:#}").contains(
                "admin_token: environment variable HOOKLEDGER_TEST_UNSET_VARIABLE_2 is not set"
            ),
            "{err:#}"
        );
        std::fs::write(dir.path().join("admin.token"), "short-token\n").unwrap();
        let err = Config::from_toml(text, dir.path())
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("(admin_token): the token is shorter than 16")
                && !err.to_string().contains("short-token"),
            "{err}"
        );
    }

    #[test]
    fn stripe_api_settings_that_cannot_work_are_refused_naming_the_key() {
        let stripe = "[[source]]\nname = \"stripe\"\nscheme = \"stripe\"\n\
                      secrets = [\"whsec_test_secret_0123\"]\nhandlers = [\"stripe-billing\"]\n";
        let key = "api_key = \"sk_test_literal_key_0123\"\n";
        for (extra, expected) in [
            (
                "reconcile = { every = \"1h\", since = \"3d\" }\n".to_string(),
                "source `stripe`: reconcile needs api_key",
            ),
            (
                format!("{key}reconcile = {{ every = \"1h\", since = \"31d\" }}\n"),
                "source `stripe`: reconcile.since must be more than 0 and at most 30d",
            ),
            (
                format!("{key}reconcile = {{ every = \"0s\", since = \"3d\" }}\n"),
                "source `stripe`: reconcile.every must be at least 1s",
            ),
            (
                format!("{key}api_base = \"ftp://example.com\"\n"),
                "source `stripe`: api_base must be an http:// or https:// URL",
            ),
            (
                "refresh = \"always\"\n".to_string(),
                "source `stripe`: refresh = \"always\" needs api_key and the stripe-billing",
            ),
        ] {
            let config = Config::from_toml(&format!("{stripe}{extra}"), Path::new(".")).unwrap();
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains(expected), "{extra}: {err}");
        }
        let github = "[[source]]\nname = \"gh\"\nscheme = \"github\"\n\
                      secrets = [\"gh_literal_secret_123\"]\n";
        let config = Config::from_toml(&format!("{github}{key}"), Path::new(".")).unwrap();
        let err = config.validate().unwrap_err().to_string();
        assert!(
            err.contains("source `gh`: api_key applies to scheme stripe only, not github"),
            "{err}"
        );
        let fine = format!("{stripe}{key}reconcile = {{ every = \"1h\", since = \"30d\" }}\n");
        Config::from_toml(&fine, Path::new("."))
            .unwrap()
            .validate()
            .unwrap();
    }
}
