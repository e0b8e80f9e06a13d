//! The library as an embedding app uses it: configs made with the constructors (the config
//! types are `#[non_exhaustive]`: no struct literals outside the crate), and the typed
//! [`hookledger::Error`] a config that cannot work is refused with, naming the key.

use std::time::Duration;

use hookledger::{
    Config, Database, DeliveryConfig, EffectConfig, Error, ForwardConfig, HandlerSettings,
    HmacConfig, HmacEncoding, Hookledger, Locator, ReconcileConfig, Refresh, RunningServer,
    SchemeName, Secret, SourceConfig,
};

use crate::util::*;

/// The constructors make what the config file says.
#[test]
fn a_config_made_in_code_is_the_one_its_file_describes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hookledger.toml");
    std::fs::write(
        &path,
        format!(
            r#"
database = "{db}"

[stripe_billing]
credits_per_invoice = 7

[[source]]
name = "stripe"
scheme = "stripe"
secrets = ["{SECRET}"]
handlers = ["stripe-billing"]
tolerance = "1m"
api_key = "sk_test_key_0123456789"
api_base = "http://127.0.0.1:1"
reconcile = {{ every = "1h", since = "3d" }}
refresh = "always"

[[source]]
name = "acme"
scheme = "hmac"
secrets = ["acme_secret_0123456789"]
max_body = 4096
hmac = {{ header = "X-Acme-Signature", encoding = "base64", prefix = "sha256=" }}
id = {{ header = "X-Acme-Delivery" }}
type = {{ json = "/type" }}

[forward]
url = "http://127.0.0.1:1/hooks"
secret = "{FORWARD_SECRET}"
schedule = ["5s", "1m"]
timeout = "3s"

[[delivery]]
kind = "send_receipt"
url = "http://127.0.0.1:1/receipts"
timeout = "2s"

[[effect]]
source = "acme"
on = ["order.*"]
sql = "SELECT 1"
"#,
            db = dir.path().join("h.db").display()
        ),
    )
    .unwrap();
    let from_file = Config::load(&path).unwrap();

    let mut config = Config::new(dir.path().join("h.db"), Vec::new());
    config.sources.clear();
    config.stripe_billing = HandlerSettings::default()
        .with("credits_per_invoice", 7)
        .unwrap();
    let config = config
        .with_source(
            SourceConfig::stripe(vec![secret()])
                .with_tolerance(Duration::from_secs(60))
                .with_api_key(Secret::new("sk_test_key_0123456789"))
                .with_api_base("http://127.0.0.1:1")
                .with_reconcile(ReconcileConfig::new(
                    Duration::from_secs(3600),
                    Duration::from_secs(3 * 86_400),
                ))
                .with_refresh(Refresh::Always),
        )
        .with_source(
            SourceConfig::hmac(
                "acme",
                vec![Secret::new("acme_secret_0123456789")],
                HmacConfig::new("X-Acme-Signature")
                    .with_encoding(HmacEncoding::Base64)
                    .with_prefix("sha256="),
                Locator::Header("X-Acme-Delivery".into()),
                Locator::Json("/type".into()),
            )
            .with_max_body(4096),
        )
        .with_forward(
            ForwardConfig::new("http://127.0.0.1:1/hooks", Secret::new(FORWARD_SECRET))
                .with_schedule(vec![Duration::from_secs(5), Duration::from_secs(60)])
                .with_timeout(Duration::from_secs(3)),
        )
        .with_delivery(
            DeliveryConfig::new("send_receipt", "http://127.0.0.1:1/receipts")
                .with_timeout(Duration::from_secs(2)),
        )
        .with_effect(EffectConfig::new("acme", ["order.*"], "SELECT 1"));
    // `Debug` shows every setting (secrets redacted, so the secrets are compared apart).
    assert_eq!(format!("{config:?}"), format!("{from_file:?}"));
    for (made, read) in config.sources.iter().zip(&from_file.sources) {
        assert_eq!(made.secrets, read.secrets);
        assert_eq!(made.api_key, read.api_key);
    }
    assert_eq!(
        config.forward.as_ref().map(|f| &f.secret),
        from_file.forward.as_ref().map(|f| &f.secret)
    );
    config.validate().unwrap();
    let plain = SourceConfig::new(
        "gh",
        SchemeName::Github,
        vec![Secret::new("gh_secret_0123")],
    );
    assert!(plain.handlers.is_empty() && plain.tolerance.is_none());
}

/// A config that cannot work is refused with a [`Error::Config`] naming the key, before the
/// database is created.
#[test]
fn a_config_that_cannot_work_is_refused_with_its_key_before_anything_is_created() {
    fn forward() -> ForwardConfig {
        ForwardConfig::new("http://127.0.0.1:1/hooks", Secret::new(FORWARD_SECRET))
    }
    /// A change to a good config, the key the refusal names and how its message begins.
    type Case = (fn(Config) -> Config, &'static str, &'static str);
    let cases: [Case; 4] = [
        (
            |c| c.with_forward(forward().with_timeout(Duration::ZERO)),
            "forward.timeout",
            "must be more than 0",
        ),
        (
            |c| {
                c.with_forward(ForwardConfig::new(
                    "ftp://app/hooks",
                    Secret::new(FORWARD_SECRET),
                ))
            },
            "forward.url",
            "must be an http:// or https:// URL",
        ),
        (
            |c| {
                c.with_forward(forward()).with_delivery(
                    DeliveryConfig::new("send_receipt", "http://127.0.0.1:1/r")
                        .with_schedule(Vec::new()),
                )
            },
            "delivery `send_receipt`.schedule",
            "needs at least one delay",
        ),
        (
            |c| {
                c.with_source(
                    SourceConfig::new(
                        "gh",
                        SchemeName::Github,
                        vec![Secret::new("gh_secret_0123")],
                    )
                    .with_handler("stripe-billing"),
                )
            },
            "source `gh`.handlers",
            "`stripe-billing` needs scheme stripe, not github",
        ),
    ];
    for (i, (setup, expected_key, expected)) in cases.into_iter().enumerate() {
        let dir = test_dir();
        let config = setup(Config::new(
            Database::parse(&db_arg_in(dir.path())),
            vec![secret()],
        ));
        // Both ways in: the builder and `open`.
        let refused = if i % 2 == 0 {
            Hookledger::builder().config(config).build().err()
        } else {
            Hookledger::open(config).err()
        };
        let err = refused.expect("refused");
        let Error::Config { key, message } = &err else {
            panic!("{expected_key}: not a config error: {err:?}");
        };
        assert_eq!(key, expected_key, "{err}");
        assert!(message.starts_with(expected), "{err}");
        assert_eq!(err.to_string(), format!("{key}: {message}"));
        assert!(!database_created(dir.path()), "{expected_key}: created");
    }
    let err = Config::load(std::path::Path::new("/nonexistent/hookledger.toml")).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Io {
                kind: std::io::ErrorKind::NotFound,
                ..
            }
        ),
        "{err:?}"
    );
}

/// A config made in code serves: an event in, its claim and credits in the ledger, and a
/// clean stop.
#[test]
fn a_server_started_from_a_config_made_in_code_serves_and_stops() {
    let dir = test_dir();
    let db = db_arg_in(dir.path());
    let mut config = Config::new(Database::parse(&db), vec![secret()]);
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.admin_listen = None;
    config.stripe_billing = HandlerSettings::default()
        .with("credits_per_invoice", 7)
        .unwrap();
    let server = RunningServer::start(config).unwrap();
    let client = hookledger::internals::Client::new(Duration::from_secs(10));
    let url = format!("http://{}/webhooks/stripe", server.addr);
    let reply = client
        .send(&url, &paid("evt_api"), &secret(), now())
        .unwrap();
    assert_eq!(reply.status, 200, "{}", reply.body);
    server.stop().unwrap();
    let conn = Db::open(&db);
    assert_eq!(ledger_count(&conn), 1);
    assert_eq!(credits(&conn, "acct_1"), 7);
}
