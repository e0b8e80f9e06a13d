//! [`Error`]: what the library's public functions return, and the conversions at that
//! boundary from the errors inside the crate (which are `anyhow` chains, [`ConfigError`]s and
//! [`StoreError`]s).
//!
//! [`Config::load`] is here too: it reads the file, and config is a leaf of the crate that
//! knows only its own [`ConfigError`].

use std::io;
use std::path::{Path, PathBuf};

use crate::config::{Config, ConfigError};
use crate::sql::StoreError;

/// Why hookledger could not load its config, open, serve or stop. `Display` gives the whole
/// message (with its causes); no variant holds a secret's value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A setting that cannot work. `key` names it as the config file does (`forward.url`,
    /// ``source `gh`.secrets``), or is empty when no one key is at fault.
    #[error("{}", keyed(.key, .message))]
    Config { key: String, message: String },
    /// The database could not be opened, migrated or used.
    #[error("{0}")]
    Database(String),
    /// A file, a socket or a thread could not be had; `kind` is the system's reason.
    #[error("{message}")]
    Io {
        message: String,
        kind: io::ErrorKind,
    },
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

/// `key: message`, as [`ConfigError`] shows itself.
fn keyed(key: &str, message: &str) -> String {
    ConfigError::new(key, message).to_string()
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Error {
        Error::Config {
            key: e.key,
            message: e.message,
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Error {
        Error::Io {
            message: e.to_string(),
            kind: e.kind(),
        }
    }
}

/// An error of the crate's internals, by what caused it: a config key, the database, I/O, or
/// else its text. The message keeps every layer of context.
impl From<anyhow::Error> for Error {
    fn from(e: anyhow::Error) -> Error {
        let e = match e.downcast::<Error>() {
            Ok(error) => return error,
            Err(e) => e,
        };
        let message = format!("{e:#}");
        if let Some(config) = e.downcast_ref::<ConfigError>() {
            // Context around a config error goes after the key: what was being done with it.
            let context: Vec<String> = e
                .chain()
                .take_while(|layer| !layer.is::<ConfigError>())
                .map(ToString::to_string)
                .collect();
            let message = match context.as_slice() {
                [] => config.message.clone(),
                _ => format!("{}: {}", context.join(": "), config.message),
            };
            return Error::Config {
                key: config.key.clone(),
                message,
            };
        }
        let database = e.chain().any(|layer| {
            layer.is::<StoreError>()
                || layer.is::<rusqlite::Error>()
                || postgres_error(layer)
                || layer.is::<r2d2::Error>()
        });
        if database {
            return Error::Database(message);
        }
        match e
            .chain()
            .find_map(|layer| layer.downcast_ref::<io::Error>())
        {
            Some(io) => Error::Io {
                message,
                kind: io.kind(),
            },
            None => Error::Other(message),
        }
    }
}

impl Config {
    /// Reads the config file at `path` and its secrets (`env:NAME`, `file:PATH`, relative to
    /// the file's folder). Errors name the key (and, for what is not TOML, the line). It is
    /// checked when hookledger opens with it ([`Config::validate`]).
    pub fn load(path: &Path) -> Result<Config, Error> {
        let (mut config, folder) = Config::read(path)?;
        config.resolve_secrets(&folder)?;
        Ok(config)
    }

    /// Reads the config file at `path` with its secrets still as written (`env:`, `file:`),
    /// and the folder they are relative to.
    pub(crate) fn read(path: &Path) -> Result<(Config, PathBuf), Error> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Io {
            message: format!("cannot read config file {}: {e}", path.display()),
            kind: e.kind(),
        })?;
        let folder = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        Ok((
            Config::parse(&text, &folder, &crate::source::catalog::keys())?,
            folder,
        ))
    }
}

/// Whether `layer` is the PostgreSQL client's error (never, in a build without it).
fn postgres_error(layer: &(dyn std::error::Error + 'static)) -> bool {
    #[cfg(feature = "postgres")]
    return layer.is::<tokio_postgres::Error>();
    #[cfg(not(feature = "postgres"))]
    {
        let _ = layer;
        false
    }
}

#[cfg(test)]
mod tests {
    use anyhow::Context;

    use super::*;

    #[test]
    fn internal_errors_keep_their_kind_and_every_layer_of_context() {
        let config: Error = Err::<(), _>(ConfigError::new("forward.url", "not a URL"))
            .context("checking the delivery")
            .unwrap_err()
            .into();
        assert!(
            matches!(&config, Error::Config { key, message }
                if key == "forward.url" && message == "checking the delivery: not a URL"),
            "{config:?}"
        );
        assert_eq!(
            config.to_string(),
            "forward.url: checking the delivery: not a URL"
        );
        let database: Error = Err::<(), _>(StoreError::ReadOnly("attempt to write".into()))
            .context("cannot migrate h.db")
            .unwrap_err()
            .into();
        assert!(matches!(database, Error::Database(_)), "{database:?}");
        assert!(
            database
                .to_string()
                .starts_with("cannot migrate h.db: the database cannot be written"),
            "{database}"
        );
        let io: Error = Err::<(), _>(io::Error::from(io::ErrorKind::AddrInUse))
            .context("cannot listen on 127.0.0.1:1")
            .unwrap_err()
            .into();
        assert!(
            matches!(&io, Error::Io { kind: io::ErrorKind::AddrInUse, message }
                if message.starts_with("cannot listen on 127.0.0.1:1: ")),
            "{io:?}"
        );
        let other: Error = anyhow::anyhow!("opening hookledger panicked").into();
        assert!(matches!(other, Error::Other(_)), "{other:?}");
        // One that went through anyhow and back is itself again.
        let again: Error = anyhow::Error::from(Error::from(ConfigError::new("a", "b"))).into();
        assert!(matches!(again, Error::Config { .. }), "{again:?}");
    }

    #[test]
    fn load_names_an_unreadable_file_and_a_bad_key() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.toml");
        let err = Config::load(&missing).unwrap_err();
        assert!(
            matches!(&err, Error::Io { kind: io::ErrorKind::NotFound, message }
                if message.starts_with("cannot read config file")),
            "{err:?}"
        );
        let path = dir.path().join("h.toml");
        std::fs::write(&path, "[[source]]\nname = \"gh\"\nscheme = \"github\"\nsecrets = [\"env:HOOKLEDGER_TEST_UNSET_VARIABLE_3\"]\n").unwrap();
        let err = Config::load(&path).unwrap_err();
        assert!(
            matches!(&err, Error::Config { key, .. } if key == "source `gh`.secrets"),
            "{err:?}"
        );
    }
}
