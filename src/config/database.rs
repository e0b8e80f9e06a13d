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

/// How a PostgreSQL URL is reached: directly (or through a session pooler), or through a
/// transaction pooler (PgBouncer's `pool_mode = transaction`), where consecutive transactions
/// may run on different server connections: nothing may outlive a transaction there (no
/// named prepared statement, no session setting, no lease named by a server process).
#[cfg(feature = "postgres")]
#[derive(Debug, Clone)]
pub(crate) struct PgUrl {
    pub(crate) config: tokio_postgres::Config,
    pub(crate) pooler: bool,
}

/// The connection settings of a PostgreSQL `url`, checked without showing it (it may hold a
/// password), with hookledger's own `pooler` parameter taken out (`pooler=transaction`:
/// through a transaction pooler). The PostgreSQL store connects with them; validation calls
/// it so that a bad URL stops start-up before anything is opened.
#[cfg(feature = "postgres")]
pub(crate) fn parse_postgres(url: &str) -> Result<PgUrl, ConfigError> {
    let (url, pooler) = without_pooler(url)?;
    let config = url.parse::<tokio_postgres::Config>().map_err(|e| {
        ConfigError::new(
            "database",
            format!(
                "not a valid PostgreSQL URL ({}): {e}",
                Database::Postgres(url.to_string())
            ),
        )
    })?;
    Ok(PgUrl { config, pooler })
}

/// `url` without its `pooler` query parameter, and whether that said `transaction`.
#[cfg(feature = "postgres")]
fn without_pooler(url: &str) -> Result<(String, bool), ConfigError> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_string(), false));
    };
    let mut pooler = false;
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("pooler", "transaction")) => pooler = true,
            Some(("pooler", "session" | "none")) => {}
            Some(("pooler", other)) => {
                return Err(ConfigError::new(
                    "database",
                    format!(
                        "pooler={other}: must be `transaction` (through a transaction pooler, \
                         such as PgBouncer's pool_mode = transaction) or `session`"
                    ),
                ))
            }
            _ => kept.push(pair),
        }
    }
    Ok(match kept.is_empty() {
        true => (base.to_string(), pooler),
        false => (format!("{base}?{}", kept.join("&")), pooler),
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

    #[test]
    #[cfg(feature = "postgres")]
    fn pooler_transaction_is_hookledgers_own_parameter() {
        for (url, stripped, pooler) in [
            ("postgres://h/db", "postgres://h/db", false),
            (
                "postgres://h/db?pooler=transaction",
                "postgres://h/db",
                true,
            ),
            (
                "postgres://h1,h2/db?target_session_attrs=read-write&pooler=transaction",
                "postgres://h1,h2/db?target_session_attrs=read-write",
                true,
            ),
            (
                "postgres://h/db?pooler=session&sslmode=disable",
                "postgres://h/db?sslmode=disable",
                false,
            ),
        ] {
            assert_eq!(
                without_pooler(url).unwrap(),
                (stripped.to_string(), pooler),
                "{url}"
            );
        }
        let err = without_pooler("postgres://h/db?pooler=statement").unwrap_err();
        assert_eq!(err.key, "database");
        assert!(
            err.message
                .contains("pooler=statement: must be `transaction`"),
            "{err}"
        );
    }
}
