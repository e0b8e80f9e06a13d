//! [`Database`]: which store holds the ledger, from `--db` or `database = …`.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::ConfigError;

/// Where the ledger lives: a SQLite file (the default, one machine) or a PostgreSQL database
/// (several instances on one ledger). A value that starts with `postgres://` or
/// `postgresql://` is PostgreSQL; anything else is a file path.
///
/// `Display` and `Debug` never show a PostgreSQL password.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Database {
    /// A SQLite database file, created on first start.
    Sqlite(PathBuf),
    /// A PostgreSQL connection URL, e.g. `postgres://hookledger:…@db.internal:5432/hookledger`.
    Postgres(String),
}

impl Database {
    pub fn parse(value: &str) -> Database {
        if value.starts_with("postgres://") || value.starts_with("postgresql://") {
            Database::Postgres(value.to_string())
        } else {
            Database::Sqlite(PathBuf::from(value))
        }
    }

    /// The file, for a SQLite database.
    pub fn sqlite_path(&self) -> Option<&Path> {
        match self {
            Database::Sqlite(path) => Some(path),
            Database::Postgres(_) => None,
        }
    }
}

impl std::str::FromStr for Database {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Database::parse(s))
    }
}

impl From<PathBuf> for Database {
    fn from(path: PathBuf) -> Self {
        Database::Sqlite(path)
    }
}

impl From<&Path> for Database {
    fn from(path: &Path) -> Self {
        Database::Sqlite(path.to_path_buf())
    }
}

impl From<&PathBuf> for Database {
    fn from(path: &PathBuf) -> Self {
        Database::Sqlite(path.clone())
    }
}

impl From<&str> for Database {
    fn from(value: &str) -> Self {
        Database::parse(value)
    }
}

impl<'de> Deserialize<'de> for Database {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Database::parse(&String::deserialize(d)?))
    }
}

impl fmt::Display for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Database::Sqlite(path) => write!(f, "{}", path.display()),
            Database::Postgres(url) => f.write_str(&redacted(url)),
        }
    }
}

impl fmt::Debug for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The connection settings of a PostgreSQL `url`, checked without showing it (it may hold a
/// password). The PostgreSQL store connects with them; validation calls it so that a bad URL
/// stops start-up before anything is opened.
#[cfg(feature = "postgres")]
pub(crate) fn parse_postgres(url: &str) -> Result<tokio_postgres::Config, ConfigError> {
    url.parse::<tokio_postgres::Config>().map_err(|e| {
        ConfigError::new(
            "database",
            format!(
                "not a valid PostgreSQL URL ({}): {e}",
                Database::Postgres(url.to_string())
            ),
        )
    })
}

/// Why a PostgreSQL database is refused by a build without the `postgres` feature.
#[cfg(not(feature = "postgres"))]
pub(crate) const WITHOUT_POSTGRES: &str = "a PostgreSQL URL, but this hookledger was built \
     without PostgreSQL (the `postgres` cargo feature, on by default; built with \
     --no-default-features): use a SQLite file, or a build with the feature";

/// A build without the `postgres` feature: a PostgreSQL `url` is refused, naming the reason.
#[cfg(not(feature = "postgres"))]
pub(crate) fn parse_postgres(_url: &str) -> Result<(), ConfigError> {
    Err(ConfigError::new("database", WITHOUT_POSTGRES))
}

/// `url` with its password (in the authority or a `password=` query parameter) replaced.
fn redacted(url: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(url) else {
        return "postgres://(a URL that does not parse)".to_string();
    };
    if parsed.password().is_some() {
        let _ = parsed.set_password(Some("***"));
    }
    if parsed.query().is_some() {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(k, v)| {
                let v = if k == "password" {
                    "***".into()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_postgres_and_everything_else_is_a_file() {
        assert_eq!(
            Database::parse("postgresql://h/db"),
            Database::Postgres("postgresql://h/db".into())
        );
        assert_eq!(
            Database::parse("./postgres.db"),
            Database::Sqlite("./postgres.db".into())
        );
    }

    #[test]
    fn a_password_is_never_shown() {
        let db =
            Database::parse("postgres://app:s3cr3t-pw@db:5432/hl?password=other&sslmode=disable");
        let shown = format!("{db} {db:?}");
        assert!(
            !shown.contains("s3cr3t-pw") && !shown.contains("other"),
            "{shown}"
        );
        assert!(shown.contains("postgres://app:***@db:5432/hl"), "{shown}");
        assert!(shown.contains("sslmode=disable"), "{shown}");
        let bad = format!("{}", Database::parse("postgres://app:pw@[bad"));
        assert!(!bad.contains("pw"), "{bad}");
        #[cfg(feature = "postgres")]
        let err = parse_postgres("postgres://app:s3cr3t-pw@db:5432/hl?sslmode=nope").unwrap_err();
        #[cfg(not(feature = "postgres"))]
        let err = ConfigError::new("database", "not a valid PostgreSQL URL");
        assert_eq!(err.key, "database");
        assert!(
            err.message.contains("not a valid PostgreSQL URL") && !err.message.contains("s3cr3t"),
            "{err}"
        );
    }
}
