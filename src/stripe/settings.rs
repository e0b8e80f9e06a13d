//! What the Stripe wing needs of the config, which names no provider: the defaults of Stripe's
//! API, the rules its settings follow on a source (`api_key`, `api_base`, `reconcile`,
//! `refresh`, the `stripe-billing` handler), checked at start-up by [`check`] after
//! [`Config::validate`], before anything is opened.

use std::time::Duration;

use crate::config::{refuse, source_key, Config, ConfigError, Refresh, SchemeName, SourceConfig};
use crate::recover::check_api_base;

/// Stripe's API.
pub(crate) const STRIPE_API_BASE: &str = "https://api.stripe.com";

/// Stripe keeps events for 30 days: a reconcile cannot look further back.
pub(crate) const MAX_RECONCILE_SINCE: Duration = Duration::from_secs(30 * 86_400);

/// The handler of Stripe's billing events (`stripe/billing.rs`), as a source's `handlers`
/// names it.
pub(crate) const BILLING: &str = "stripe-billing";

/// The handlers hookledger has built in.
const HANDLERS: &[&str] = &[BILLING];

/// Refuses what the config's own checks leave to the Stripe wing, naming the key: unknown
/// handlers, `stripe-billing` on another scheme, the API settings on a source whose scheme
/// has no API client (all but stripe), a reconcile further back than Stripe keeps events,
/// `refresh = "always"` with nothing to refresh, and `[stripe_billing]` settings the handler
/// cannot read.
pub(crate) fn check(config: &Config) -> Result<(), ConfigError> {
    for source in &config.sources {
        check_source(source)?;
        // GitLab lists a hook's last 7 days whatever the run's horizon: claims kept less long
        // would be applied again.
        let gitlab_days = crate::recover::gitlab::MAX_SINCE.as_secs() / 86_400;
        if crate::recover::gitlab::is_gitlab(source)
            && source.hook.is_some()
            && config.retention.claim_days < gitlab_days
        {
            refuse!(
                "retention.claim_days",
                "must be at least {gitlab_days} with source `{}`'s hook: GitLab lists a hook's \
                 last {gitlab_days} days, and an event whose claim was pruned would be applied \
                 again",
                source.name
            );
        }
    }
    super::billing::BillingSettings::of(&config.stripe_billing)?;
    Ok(())
}

fn check_source(source: &SourceConfig) -> Result<(), ConfigError> {
    let key = |field: &str| source_key(&source.name, field);
    let scheme = source.scheme.as_str();
    for handler in &source.handlers {
        if !HANDLERS.contains(&handler.as_str()) {
            refuse!(
                key("handlers"),
                "unknown handler (built in: {}); the file's value is not repeated",
                HANDLERS.join(", ")
            );
        }
        if handler == BILLING && source.scheme != SchemeName::Stripe {
            refuse!(
                key("handlers"),
                "`{BILLING}` needs scheme stripe, not {scheme}"
            );
        }
    }
    let gitlab = crate::recover::gitlab::is_gitlab(source);
    if source.scheme != SchemeName::Github {
        for (field, set, on_gitlab) in [
            ("hook", source.hook.is_some(), true),
            ("mode", source.mode.is_some(), true),
            ("app_id", source.app_id.is_some(), false),
            ("private_key", source.private_key.is_some(), false),
        ] {
            if set && !(gitlab && on_gitlab) {
                let also = if on_gitlab { " and preset gitlab" } else { "" };
                refuse!(
                    key(field),
                    "applies to scheme github{also} only, not {scheme}"
                );
            }
        }
    }
    if !source.event_types.is_empty() && !crate::recover::workos::is_workos(source) {
        refuse!(key("event_types"), "applies to preset workos only");
    }
    // `refresh` fetches a Stripe object: no other scheme has one.
    let stripe_refresh = || match source.refresh != Refresh::default() {
        true => Err(ConfigError::new(
            key("refresh"),
            format!("applies to scheme stripe only, not {scheme}"),
        )),
        false => Ok(()),
    };
    if source.scheme == SchemeName::Github {
        stripe_refresh()?;
        return crate::recover::github::check_source(source);
    }
    if gitlab {
        stripe_refresh()?;
        return crate::recover::gitlab::check_source(source);
    }
    if crate::recover::paddle::is_paddle(source) {
        stripe_refresh()?;
        return crate::recover::paddle::check_source(source);
    }
    if crate::recover::workos::is_workos(source) {
        stripe_refresh()?;
        return crate::recover::workos::check_source(source);
    }
    if source.scheme != SchemeName::Stripe {
        for (field, set) in [
            ("api_key", source.api_key.is_some()),
            ("api_base", source.api_base.is_some()),
            ("reconcile", source.reconcile.is_some()),
        ] {
            if set {
                refuse!(
                    key(field),
                    "applies to scheme stripe, github (with hook) and presets gitlab (with \
                     hook), paddle and workos only, not {scheme}"
                );
            }
        }
        return stripe_refresh();
    }
    if let Some(base) = &source.api_base {
        check_api_base(&key("api_base"), base)?;
    }
    if let Some(reconcile) = &source.reconcile {
        if reconcile.since > MAX_RECONCILE_SINCE {
            refuse!(
                key("reconcile.since"),
                "must be at most 30d (Stripe keeps events for 30 days)"
            );
        }
    }
    if source.refresh == Refresh::Always && !source.refreshes() {
        refuse!(
            key("refresh"),
            "\"always\" needs api_key and the {BILLING} handler (it fetches subscriptions for \
             {BILLING}'s snapshot)"
        );
    }
    Ok(())
}

/// Stripe's rule on a source, beside the config's own methods.
impl SourceConfig {
    /// Whether subscription events may queue a fetch of the current subscription: a stripe
    /// source with stripe-billing and an API key, and `refresh` not off.
    pub(crate) fn refreshes(&self) -> bool {
        self.api_key.is_some()
            && self.refresh != Refresh::Off
            && self.handlers.iter().any(|h| h == BILLING)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// `text` as a config file, checked as start-up checks it.
    fn checked(text: &str) -> Result<(), ConfigError> {
        let config = Config::from_toml(text, Path::new("."))?;
        config.validate()?;
        check(&config)
    }

    #[test]
    fn stripe_api_settings_that_cannot_work_are_refused_naming_the_key() {
        let stripe = "[[source]]\nname = \"stripe\"\nscheme = \"stripe\"\n\
                      secrets = [\"whsec_test_secret_0123\"]\nhandlers = [\"stripe-billing\"]\n";
        let key = "api_key = \"sk_test_literal_key_0123\"\n";
        for (extra, expected) in [
            (
                "reconcile = { every = \"1h\", since = \"3d\" }\n".to_string(),
                "source `stripe`.reconcile: needs api_key",
            ),
            (
                format!("{key}reconcile = {{ every = \"1h\", since = \"31d\" }}\n"),
                "source `stripe`.reconcile.since: must be at most 30d",
            ),
            (
                format!("{key}reconcile = {{ every = \"1h\", since = \"0s\" }}\n"),
                "source `stripe`.reconcile.since: must be more than 0",
            ),
            (
                format!("{key}reconcile = {{ every = \"0s\", since = \"3d\" }}\n"),
                "source `stripe`.reconcile.every: must be at least 1s",
            ),
            (
                format!("{key}api_base = \"ftp://example.com\"\n"),
                "source `stripe`.api_base: must be an http:// or https:// URL",
            ),
            (
                "refresh = \"always\"\n".to_string(),
                "source `stripe`.refresh: \"always\" needs api_key and the stripe-billing",
            ),
        ] {
            let err = checked(&format!("{stripe}{extra}"))
                .unwrap_err()
                .to_string();
            assert!(err.starts_with(expected), "{extra}: {err}");
        }
        let github = "[[source]]\nname = \"gh\"\nscheme = \"github\"\n\
                      secrets = [\"gh_literal_secret_123\"]\n";
        // On github, the API settings are the recovery's: a key without the hook it reads.
        let err = checked(&format!("{github}{key}")).unwrap_err();
        assert_eq!(err.key, "source `gh`.api_key");
        assert!(err.message.starts_with("needs hook = "), "{}", err.message);
        let shopify = "[[source]]\nname = \"shop\"\nscheme = \"shopify\"\n\
                       secrets = [\"shop_literal_secret_123\"]\n";
        let err = checked(&format!("{shopify}{key}")).unwrap_err();
        assert_eq!(err.key, "source `shop`.api_key");
        assert_eq!(
            err.message,
            "applies to scheme stripe, github (with hook) and presets gitlab (with hook), paddle \
             and workos only, not shopify"
        );
        let err = checked(&format!("{github}handlers = [\"stripe-billing\"]\n")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "source `gh`.handlers: `stripe-billing` needs scheme stripe, not github"
        );
        let err = checked(&format!("{github}handlers = [\"stripe-biling\"]\n")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "source `gh`.handlers: unknown handler (built in: stripe-billing); the file's value is \
             not repeated"
        );
        checked(&format!(
            "{stripe}{key}reconcile = {{ every = \"1h\", since = \"30d\" }}\n"
        ))
        .unwrap();
    }

    /// A secret pasted into `handlers` is refused naming the key, never repeated.
    #[test]
    fn an_unknown_handler_is_refused_without_its_value() {
        let err = checked(
            "[[source]]\nname = \"stripe\"\nscheme = \"stripe\"\n\
             secrets = [\"whsec_test_secret_0123\"]\nhandlers = [\"whsec_TOPSECRET_0123\"]\n",
        )
        .unwrap_err();
        assert_eq!(err.key, "source `stripe`.handlers");
        assert!(err.message.starts_with("unknown handler"), "{err}");
        assert!(!format!("{err} {err:?}").contains("TOPSECRET"), "{err:?}");
    }

    /// The API key goes in every request to `api_base`: http to another host is refused.
    #[test]
    fn an_api_base_in_clear_to_another_host_is_refused() {
        let stripe = "[[source]]\nname = \"stripe\"\nscheme = \"stripe\"\n\
                      secrets = [\"whsec_test_secret_0123\"]\napi_key = \"sk_test_literal_0123\"\n";
        for base in [
            "http://api.example.com",
            "http://10.1.2.3:12111",
            "http://[2001:db8::1]/",
            "http://localhost.example.com",
            "http://0.0.0.0:80",
        ] {
            let err = checked(&format!("{stripe}api_base = \"{base}\"\n")).unwrap_err();
            assert_eq!(err.key, "source `stripe`.api_base", "{base}: {err}");
            assert!(err.message.starts_with("must be an https:// URL"), "{err}");
            assert!(!err.to_string().contains(&base[7..]), "{err}");
        }
        for base in [
            "https://api.stripe.com",
            "https://10.1.2.3:12111",
            "http://127.0.0.1:12111",
            "http://127.9.8.7/",
            "http://[::1]:12111",
            "http://localhost:12111",
            "http://LOCALHOST",
        ] {
            checked(&format!("{stripe}api_base = \"{base}\"\n")).unwrap();
        }
        assert!(check_api_base("--api-base", "http://api.example.com").is_err());
    }

    #[test]
    fn billing_settings_the_handler_cannot_read_are_refused_naming_the_table() {
        let stripe = "[[source]]\nname = \"stripe\"\nscheme = \"stripe\"\n\
                      secrets = [\"whsec_test_secret_0123\"]\n";
        checked(&format!(
            "{stripe}[stripe_billing]\ncredits_per_invoice = 5\n"
        ))
        .unwrap();
        for (settings, expected) in [
            (
                "credit_per_invoice = 5",
                "unknown field `credit_per_invoice`, expected `credits_per_invoice`",
            ),
            ("credits_per_invoice = \"5\"", "invalid type: string"),
        ] {
            // With no source that runs the handler too: the file is wrong either way.
            let err = checked(&format!("{stripe}[stripe_billing]\n{settings}\n")).unwrap_err();
            assert_eq!(err.key, "stripe_billing", "{err}");
            assert!(err.message.contains(expected), "{err}");
        }
    }
}
