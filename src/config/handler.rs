//! [`HandlerSettings`]: a built-in handler's table of the config file, which the handler
//! decodes itself: config knows no handler's settings.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::file::without_values;
use super::ConfigError;

/// The settings of one built-in handler, as its table in the config file holds them (empty:
/// the handler's defaults). The handler decodes them into its own type when it is built, and
/// start-up checks that it can.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(transparent)]
#[non_exhaustive]
pub struct HandlerSettings(toml::Table);

impl HandlerSettings {
    /// The settings `key = value`, over any the file set (a flag, an embedding app):
    /// `settings.set("credits_per_invoice", 5)?`. A value with no TOML form
    /// (a map with keys other than strings) is refused, naming `key`.
    pub fn set(&mut self, key: &str, value: impl Serialize) -> Result<(), ConfigError> {
        let value = toml::Value::try_from(value)
            .map_err(|e| ConfigError::new(key, format!("not a setting: {e}")))?;
        self.0.insert(key.to_string(), value);
        Ok(())
    }

    /// These settings with `key = value`, as [`HandlerSettings::set`] makes it.
    pub fn with(mut self, key: &str, value: impl Serialize) -> Result<Self, ConfigError> {
        self.set(key, value)?;
        Ok(self)
    }

    /// The settings as the handler's own type (`#[serde(default, deny_unknown_fields)]`
    /// fills what is not set and refuses a key it does not know); errors name the table,
    /// `table`, never quoting a value.
    pub(crate) fn decode<T: DeserializeOwned>(&self, table: &str) -> Result<T, ConfigError> {
        toml::Value::Table(self.0.clone())
            .try_into()
            .map_err(|e: toml::de::Error| {
                ConfigError::new(table, without_values(e.message().trim_end()))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, PartialEq, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    struct Settings {
        credits: i64,
        label: String,
    }

    #[test]
    fn a_handler_decodes_its_own_settings_with_its_defaults() {
        let settings = HandlerSettings::default().with("credits", 5).unwrap();
        assert_eq!(
            settings.decode::<Settings>("h"),
            Ok(Settings {
                credits: 5,
                label: String::new()
            })
        );
        let err = HandlerSettings::default()
            .with("label", 7)
            .unwrap()
            .decode::<Settings>("h")
            .unwrap_err();
        assert_eq!(err.key, "h");
        assert!(err.message.contains("invalid type: integer"), "{err}");
        let err = HandlerSettings::default()
            .with("credit", "TOPSECRET")
            .unwrap()
            .decode::<Settings>("h")
            .unwrap_err();
        assert!(err.message.contains("unknown field `credit`"), "{err}");
        assert!(!err.message.contains("TOPSECRET"), "{err}");
    }
}
