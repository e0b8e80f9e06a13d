//! [`ConfigError`]: a setting that cannot work, named by its key in the config file.

use std::fmt;

/// A setting that cannot work. `key` names it as the config file does (`forward.url`,
/// `http.body_budget`, ``source `gh`.secrets``, ``delivery `send_receipt`.url``), or is empty
/// when no one key is at fault (a file that is not TOML); `message` says what is wrong and
/// what to change. Neither ever holds a secret's value.
///
/// Config errors name keys only: whoever set the value another way (the CLI's flags) names
/// its own way beside the key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConfigError {
    pub key: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError {
            key: key.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.key, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

/// Returns a [`ConfigError`] for `key`, its message formatted as by `format!`.
macro_rules! refuse {
    ($key:expr, $($message:tt)+) => {
        return Err($crate::config::ConfigError::new($key, format!($($message)+)))
    };
}
pub(crate) use refuse;

/// The key of `field` of the `[[source]]` named `name`: ``source `gh`.secrets``.
pub(crate) fn source_key(name: &str, field: &str) -> String {
    format!("source `{name}`.{field}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shows_the_key_then_the_message() {
        let err = ConfigError::new("forward.url", "not a URL");
        assert_eq!(err.to_string(), "forward.url: not a URL");
        assert_eq!(
            ConfigError::new("", "line 1, column 2: expected `=`").to_string(),
            "line 1, column 2: expected `=`"
        );
        assert_eq!(source_key("gh", "secrets"), "source `gh`.secrets");
    }
}
