//! The preset catalog as the library offers it: which providers have a preset, and a
//! [`SourceConfig`] made from one, as `preset = "…"` in a config file makes it.

use crate::config::{preset_source, ConfigError, Secret, SourceConfig};
use crate::error::Error;
use crate::source::catalog::PRESETS;

/// One provider's preset, as [`presets`] lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Preset {
    /// What `preset = "…"` and [`SourceConfig::preset`] take.
    pub name: &'static str,
    /// The provider's documentation of its webhooks' signature.
    pub docs: &'static str,
    /// What is verified (the header, the signed text, the algorithm).
    pub verifies: &'static str,
    /// How a replay of a captured request is stopped: a signed time, or the claim only.
    pub replay: &'static str,
}

/// Every preset of the catalog, by name: the list `hookledger presets` prints.
pub fn presets() -> Vec<Preset> {
    let mut presets: Vec<Preset> = PRESETS
        .iter()
        .map(|p| Preset {
            name: p.name,
            docs: p.docs,
            verifies: p.verifies,
            replay: p.replay,
        })
        .collect();
    presets.sort_by_key(|p| p.name);
    presets
}

impl SourceConfig {
    /// A source named `name` (received at `/webhooks/<name>`) for the provider `preset`, one
    /// of [`presets`], verified with `secrets` (any one may match): its scheme, headers, id,
    /// type, tolerance and handshake as the preset has them. Its other keys can be changed on
    /// the value, as a config file's keys are over the preset's.
    ///
    /// ```
    /// use hookledger::{Secret, SourceConfig};
    ///
    /// let gh = SourceConfig::preset("github", "gh", vec![Secret::new("a-long-webhook-secret")])?;
    /// assert_eq!(gh.name, "gh");
    /// assert!(SourceConfig::preset("no-such-provider", "x", vec![]).is_err());
    /// # Ok::<(), hookledger::Error>(())
    /// ```
    pub fn preset(
        preset: &str,
        name: impl Into<String>,
        secrets: Vec<Secret>,
    ) -> Result<SourceConfig, Error> {
        let name = name.into();
        let Some(found) = PRESETS.iter().find(|p| p.name == preset) else {
            let known: Vec<&str> = presets().iter().map(|p| p.name).collect();
            return Err(ConfigError::new(
                crate::config::source_key(&name, "preset"),
                format!("not a preset; the presets are: {}", known.join(", ")),
            )
            .into());
        };
        Ok(preset_source(preset, found.keys, &name, secrets)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_makes_a_source_as_the_config_file_does() {
        for preset in presets() {
            let made = SourceConfig::preset(preset.name, "p", vec![Secret::new("x")]).unwrap();
            let text = format!(
                "[[source]]\nname = \"p\"\npreset = \"{}\"\nsecrets = [\"x\"]\n",
                preset.name
            );
            let file = crate::config::Config::parse(
                &text,
                std::path::Path::new("/"),
                &crate::source::catalog::keys(),
            )
            .unwrap();
            assert_eq!(
                format!("{made:?}"),
                format!("{:?}", file.sources[0]),
                "{}",
                preset.name
            );
        }
    }
}
