//! The preset catalog: `preset = "NAME"` on a source fills in its scheme, header names, where
//! its id, type and time are, its tolerance, handshake and batch rules, from the entries here
//! (data, not code paths). Any key written in the config file is over the preset's. Each entry
//! names the provider's documentation of what it sends and signs, and has a real-shaped
//! fixture under `tests/fixtures/<provider>/` that `hookledger send` can sign.

/// One provider's preset.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Preset {
    pub(crate) name: &'static str,
    /// The provider's documentation of its webhooks' signature (where the facts come from).
    pub(crate) docs: &'static str,
    /// The source's keys, as a config file would write them.
    pub(crate) keys: &'static str,
    /// What is verified, for the catalog table.
    pub(crate) verifies: &'static str,
    /// How a replay of a captured request is stopped: a signed time, or the claim only.
    pub(crate) replay: &'static str,
    /// The handshake the provider needs answered before it delivers, if any.
    pub(crate) handshake: &'static str,
    /// How a request with several events is taken apart, if the provider sends those.
    pub(crate) batch: &'static str,
    /// The fixture under `tests/fixtures/`, and the event type to send it as where the scheme
    /// sends the type in a header.
    pub(crate) fixture: (&'static str, &'static str),
}

/// The catalog, by name.
pub(crate) const PRESETS: &[Preset] = &[
    Preset {
        name: "stripe",
        docs: "https://docs.stripe.com/webhooks#verify-manually",
        keys: r#"scheme = "stripe""#,
        verifies: "HMAC-SHA256 of `{t}.{body}` in `Stripe-Signature` (`v1=`), any of several",
        replay: "signed time (5 min)",
        handshake: "",
        batch: "",
        fixture: ("stripe/events/invoice.paid.json", ""),
    },
    Preset {
        name: "github",
        docs: "https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries",
        keys: r#"scheme = "github""#,
        verifies: "HMAC-SHA256 of the body in `X-Hub-Signature-256`",
        replay: "claim only (`X-GitHub-Delivery`)",
        handshake: "",
        batch: "",
        fixture: ("github/push.json", "push"),
    },
    Preset {
        name: "shopify",
        docs: "https://shopify.dev/docs/apps/build/webhooks/subscribe/https#step-2-validate-the-origin-of-your-webhook-to-ensure-its-coming-from-shopify",
        keys: r#"scheme = "shopify""#,
        verifies: "HMAC-SHA256 of the body, base64, in `X-Shopify-Hmac-Sha256`",
        replay: "claim only (`X-Shopify-Webhook-Id`)",
        handshake: "",
        batch: "",
        fixture: ("shopify/orders-create.json", "orders/create"),
    },
    Preset {
        name: "sendgrid",
        docs: "https://www.twilio.com/docs/sendgrid/for-developers/tracking-events/getting-started-event-webhook-security-features",
        keys: r#"scheme = "ecdsa"
split = "/"
id = { json = "/sg_event_id" }
type = { json = "/event" }"#,
        verifies: "ECDSA P-256 (SHA-256) of `{timestamp}{body}` in `X-Twilio-Email-Event-Webhook-Signature`, with SendGrid's public key",
        replay: "claim only (each `sg_event_id`); the signed timestamp is checked only with a `tolerance`",
        handshake: "",
        batch: "array at `/`, id `/sg_event_id`, type `/event`",
        fixture: ("sendgrid/events.json", ""),
    },
    Preset {
        name: "svix",
        docs: "https://docs.svix.com/receiving/verifying-payloads/how-manual",
        keys: r#"scheme = "standard""#,
        verifies: "Standard Webhooks: HMAC-SHA256 of `{id}.{timestamp}.{body}` (`svix-*` or `webhook-*` headers)",
        replay: "signed time (5 min)",
        handshake: "",
        batch: "",
        fixture: ("svix/invoice.paid.json", ""),
    },
    Preset {
        name: "clerk",
        docs: "https://clerk.com/docs/webhooks/sync-data",
        keys: r#"scheme = "standard""#,
        verifies: "Standard Webhooks through Svix (`svix-*` headers)",
        replay: "signed time (5 min)",
        handshake: "",
        batch: "",
        fixture: ("clerk/user.created.json", ""),
    },
    Preset {
        name: "resend",
        docs: "https://resend.com/docs/dashboard/webhooks/verify-webhooks-requests",
        keys: r#"scheme = "standard""#,
        verifies: "Standard Webhooks through Svix (`svix-*` headers)",
        replay: "signed time (5 min)",
        handshake: "",
        batch: "",
        fixture: ("resend/email.delivered.json", ""),
    },
];

/// The catalog as a Markdown table (the README's, which a test keeps equal to this).
pub(crate) fn markdown() -> String {
    let dash = |s: &str| {
        if s.is_empty() {
            "—".to_string()
        } else {
            s.to_string()
        }
    };
    let mut out = String::from(
        "| preset | verifies | replay stopped by | handshake | batch | provider's docs |\n\
         | --- | --- | --- | --- | --- | --- |\n",
    );
    for p in PRESETS {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | <{}> |\n",
            p.name,
            p.verifies,
            p.replay,
            dash(p.handshake),
            dash(p.batch),
            p.docs
        ));
    }
    out
}

/// The catalog as the config file's reader takes it: each preset's name and keys.
pub(crate) fn keys() -> Vec<(&'static str, &'static str)> {
    PRESETS.iter().map(|p| (p.name, p.keys)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_parses_names_its_docs_and_has_a_unique_name() {
        let mut names = std::collections::HashSet::new();
        for preset in PRESETS {
            assert!(names.insert(preset.name), "{} twice", preset.name);
            assert!(
                preset.docs.starts_with("https://"),
                "{}: its documentation",
                preset.name
            );
            let keys: Result<toml::Table, _> = toml::from_str(preset.keys);
            assert!(keys.is_ok(), "{}: {keys:?}", preset.name);
        }
    }
}
