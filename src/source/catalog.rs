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
    Preset {
        name: "gitlab",
        docs: "https://docs.gitlab.com/user/project/integrations/webhooks/",
        keys: r#"scheme = "token"
token = { header = "X-Gitlab-Token" }
id = [{ header = "Idempotency-Key" }, { header = "X-Gitlab-Event-UUID" }]
type = { header = "X-Gitlab-Event" }"#,
        verifies: "the secret token in `X-Gitlab-Token` (the body is not signed)",
        replay: "claim only (`Idempotency-Key`, kept across resends; else `X-Gitlab-Event-UUID`)",
        handshake: "",
        batch: "",
        fixture: ("gitlab/push-hook.json", "Push Hook"),
    },
    Preset {
        name: "bitbucket",
        docs: "https://support.atlassian.com/bitbucket-cloud/docs/manage-webhooks/",
        keys: r#"scheme = "hmac"
hmac = { header = "X-Hub-Signature", prefix = "sha256=" }
id = { header = "X-Request-UUID" }
type = { header = "X-Event-Key" }"#,
        verifies: "Bitbucket Cloud: HMAC-SHA256 of the body in `X-Hub-Signature` (`sha256=`)",
        replay: "claim only (`X-Request-UUID`)",
        handshake: "",
        batch: "",
        fixture: ("bitbucket/repo-push.json", "repo:push"),
    },
    Preset {
        name: "gitea",
        docs: "https://docs.gitea.com/usage/webhooks",
        keys: r#"scheme = "hmac"
hmac = { header = "X-Gitea-Signature" }
id = { header = "X-Gitea-Delivery" }
type = { header = "X-Gitea-Event" }"#,
        verifies: "HMAC-SHA256 of the body, hex, in `X-Gitea-Signature`",
        replay: "claim only (`X-Gitea-Delivery`)",
        handshake: "",
        batch: "",
        fixture: ("gitea/push.json", "push"),
    },
    Preset {
        name: "slack",
        docs: "https://docs.slack.dev/authentication/verifying-requests-from-slack/",
        keys: r#"scheme = "hmac"
hmac = { header = "X-Slack-Signature", prefix = "v0=", signed = "v0:{timestamp}:{body}", timestamp = { header = "X-Slack-Request-Timestamp" } }
tolerance = "5m"
id = { json = "/event_id" }
type = { json = "/event/type" }
handshake = "slack""#,
        verifies: "Events API: HMAC-SHA256 of `v0:{timestamp}:{body}` in `X-Slack-Signature` (`v0=`)",
        replay: "signed time (5 min)",
        handshake: "slack",
        batch: "",
        fixture: ("slack/event_callback.json", ""),
    },
    Preset {
        name: "zoom",
        docs: "https://developers.zoom.us/docs/api/webhooks/",
        // Zoom sends no delivery id: the event id is the body's SHA-256 (a retry of the same
        // bytes is a duplicate).
        keys: r#"scheme = "hmac"
hmac = { header = "x-zm-signature", prefix = "v0=", signed = "v0:{timestamp}:{body}", timestamp = { header = "x-zm-request-timestamp" } }
id = { body_sha256 = true }
type = { json = "/event" }
handshake = "zoom""#,
        verifies: "HMAC-SHA256 of `v0:{timestamp}:{body}` in `x-zm-signature` (`v0=`); no delivery id: the id is the body's SHA-256",
        replay: "signed time (5 min)",
        handshake: "zoom",
        batch: "",
        fixture: ("zoom/meeting.started.json", ""),
    },
    Preset {
        name: "twitch",
        docs: "https://dev.twitch.tv/docs/eventsub/handling-webhook-events/",
        // Twitch asks receivers to refuse messages older than 10 minutes.
        keys: r#"scheme = "hmac"
hmac = { header = "Twitch-Eventsub-Message-Signature", prefix = "sha256=", signed = "{id}{timestamp}{body}", timestamp = { header = "Twitch-Eventsub-Message-Timestamp", unit = "rfc3339" } }
tolerance = "10m"
id = { header = "Twitch-Eventsub-Message-Id" }
type = { header = "Twitch-Eventsub-Subscription-Type" }
handshake = "twitch""#,
        verifies: "EventSub: HMAC-SHA256 of `{id}{timestamp}{body}` (RFC 3339 timestamp) in `Twitch-Eventsub-Message-Signature` (`sha256=`)",
        replay: "signed time (10 min)",
        handshake: "twitch",
        batch: "",
        fixture: ("twitch/channel.follow.json", "channel.follow"),
    },
    Preset {
        name: "linear",
        docs: "https://linear.app/developers/webhooks",
        keys: r#"scheme = "hmac"
hmac = { header = "Linear-Signature" }
id = { header = "Linear-Delivery" }
type = { header = "Linear-Event" }"#,
        verifies: "HMAC-SHA256 of the body, hex, in `Linear-Signature`",
        // Linear also signs a `webhookTimestamp` (ms) in the body and asks for it to be within a
        // minute; a time inside the body is not one the hmac scheme can check.
        replay: "claim only (`Linear-Delivery`; the body's `webhookTimestamp` is not checked)",
        handshake: "",
        batch: "",
        fixture: ("linear/issue.create.json", "Issue"),
    },
    Preset {
        name: "vercel",
        docs: "https://vercel.com/docs/webhooks/webhooks-api",
        keys: r#"scheme = "hmac"
hmac = { header = "x-vercel-signature", algorithm = "sha1" }
id = { json = "/id" }
type = { json = "/type" }"#,
        verifies: "HMAC-SHA1 of the body, hex, in `x-vercel-signature`",
        replay: "claim only (the body's `id`)",
        handshake: "",
        batch: "",
        fixture: ("vercel/deployment.created.json", ""),
    },
    Preset {
        name: "intercom",
        docs: "https://developers.intercom.com/intercom-api-reference/v1.0/reference/signed-notifications",
        keys: r#"scheme = "hmac"
hmac = { header = "X-Hub-Signature", algorithm = "sha1", prefix = "sha1=" }
id = { json = "/id" }
type = { json = "/topic" }"#,
        verifies: "HMAC-SHA1 of the body in `X-Hub-Signature` (`sha1=`)",
        replay: "claim only (the body's `id`)",
        handshake: "",
        batch: "",
        fixture: ("intercom/conversation.user.created.json", ""),
    },
    Preset {
        name: "typeform",
        docs: "https://www.typeform.com/developers/webhooks/secure-your-webhooks/",
        keys: r#"scheme = "hmac"
hmac = { header = "Typeform-Signature", encoding = "base64", prefix = "sha256=" }
id = { json = "/event_id" }
type = { json = "/event_type" }"#,
        verifies: "HMAC-SHA256 of the body, base64, in `Typeform-Signature` (`sha256=`)",
        replay: "claim only (the body's `event_id`)",
        handshake: "",
        batch: "",
        fixture: ("typeform/form_response.json", ""),
    },
    Preset {
        name: "paddle",
        docs: "https://developer.paddle.com/webhooks/signature-verification",
        keys: r#"scheme = "hmac"
tolerance = "5s"
hmac = { header = "Paddle-Signature", separator = ";", prefix = "h1=", signed = "{timestamp}:{body}", timestamp = { part = "ts" } }
id = { json = "/event_id" }
type = { json = "/event_type" }"#,
        verifies: "HMAC-SHA256 of `{ts}:{body}` in `Paddle-Signature` (`ts=…;h1=…`); the key is the notification destination's secret key as shown",
        replay: "signed time (5 s, the tolerance of Paddle's SDKs)",
        handshake: "",
        batch: "",
        fixture: ("paddle/transaction.completed.json", ""),
    },
    Preset {
        name: "lemonsqueezy",
        docs: "https://docs.lemonsqueezy.com/help/webhooks/signing-requests",
        keys: r#"scheme = "hmac"
hmac = { header = "X-Signature" }
id = { body_sha256 = true }
type = { json = "/meta/event_name" }"#,
        verifies: "HMAC-SHA256 of the body, hex, in `X-Signature`",
        replay: "claim only (the body's SHA-256: no event id is sent, so only the same bytes again are a duplicate)",
        handshake: "",
        batch: "",
        fixture: ("lemonsqueezy/order_created.json", ""),
    },
    Preset {
        name: "calendly",
        docs: "https://developer.calendly.com/api-docs/4c305798a61d3-webhook-signatures",
        keys: r#"scheme = "hmac"
tolerance = "3m"
hmac = { header = "Calendly-Webhook-Signature", separator = ",", prefix = "v1=", signed = "{timestamp}.{body}", timestamp = { part = "t" } }
id = { body_sha256 = true }
type = { json = "/event" }"#,
        verifies: "HMAC-SHA256 of `{t}.{body}` in `Calendly-Webhook-Signature` (`t=…,v1=…`), the subscription's signing key",
        replay: "signed time (3 min, as in Calendly's docs); the claim is of the body's SHA-256 (no delivery id is sent)",
        handshake: "",
        batch: "",
        fixture: ("calendly/invitee.created.json", ""),
    },
    Preset {
        name: "workos",
        docs: "https://workos.com/docs/events/data-syncing/webhooks",
        keys: r#"scheme = "hmac"
tolerance = "3m"
hmac = { header = "WorkOS-Signature", separator = ", ", prefix = "v1=", signed = "{timestamp}.{body}", timestamp = { part = "t", unit = "ms" } }
id = { json = "/id" }
type = { json = "/event" }"#,
        verifies: "HMAC-SHA256 of `{t}.{body}` in `WorkOS-Signature` (`t=<ms>, v1=…`)",
        replay: "signed time (3 min, the default of WorkOS's SDKs)",
        handshake: "",
        batch: "",
        fixture: ("workos/user.created.json", ""),
    },
    Preset {
        name: "postmark",
        docs: "https://postmarkapp.com/developer/webhooks/webhooks-overview#protecting-your-webhook",
        keys: r#"scheme = "basic"
id = { json = "/MessageID" }
type = { json = "/RecordType" }"#,
        verifies: "HTTP Basic credentials set in the webhook's URL (the body is not signed); each secret is `user:password`",
        replay: "claim only (`MessageID`)",
        handshake: "",
        batch: "",
        fixture: ("postmark/delivery.json", ""),
    },
    Preset {
        name: "square",
        docs: "https://developer.squareup.com/docs/webhooks/step3validate",
        keys: r#"scheme = "hmac"
hmac = { header = "x-square-hmacsha256-signature", encoding = "base64", signed = "{url}{body}" }
id = { json = "/event_id" }
type = { json = "/type" }"#,
        verifies: "HMAC-SHA256 of the notification URL then the body, base64, in `x-square-hmacsha256-signature` (set `public_url` to the subscription's URL)",
        replay: "claim only (`event_id`)",
        handshake: "",
        batch: "",
        fixture: ("square/payment.updated.json", ""),
    },
    Preset {
        name: "hubspot",
        docs: "https://developers.hubspot.com/docs/api/webhooks/validating-requests",
        keys: r#"scheme = "hmac"
tolerance = "5m"
hmac = { header = "X-HubSpot-Signature-v3", encoding = "base64", signed = "POST{url}{body}{timestamp}", timestamp = { header = "X-HubSpot-Request-Timestamp", unit = "ms" } }
split = "/"
id = { json = "/eventId" }
type = { json = "/subscriptionType" }"#,
        verifies: "v3: HMAC-SHA256 of `POST`, the URL, the body and `X-HubSpot-Request-Timestamp`, base64, in `X-HubSpot-Signature-v3`, the app's client secret (set `public_url` to the target URL)",
        replay: "signed time (5 min, as HubSpot's docs require)",
        handshake: "",
        batch: "array at `/`, id `/eventId`, type `/subscriptionType`",
        fixture: ("hubspot/contact.creation.json", ""),
    },
    Preset {
        name: "polar",
        docs: "https://docs.polar.sh/integrate/webhooks/delivery",
        keys: r#"scheme = "standard""#,
        verifies: "Standard Webhooks (`webhook-*` headers); Polar's key is the secret's own UTF-8 bytes, so write it as `whsec_` and the secret in base64",
        replay: "signed time (5 min)",
        handshake: "",
        batch: "",
        fixture: ("polar/order.paid.json", ""),
    },
    Preset {
        name: "mailgun",
        docs: "https://documentation.mailgun.com/docs/mailgun/user-manual/events/webhooks/",
        keys: r#"scheme = "mailgun""#,
        verifies: "HMAC-SHA256 of `{timestamp}{token}` from the body's `signature` object (the event itself is not signed)",
        replay: "signed time (5 min), the claim (`event-data.id`) and the token, used once",
        handshake: "",
        batch: "",
        fixture: ("mailgun/delivered.json", ""),
    },
    Preset {
        name: "twilio",
        docs: "https://www.twilio.com/docs/usage/webhooks/webhooks-security",
        keys: r#"scheme = "twilio""#,
        verifies: "HMAC-SHA1, base64, of `public_url`, the query and the sorted form parameters in `X-Twilio-Signature` (a JSON body: its SHA-256 in the signed query's `bodySHA256`); needs `public_url`",
        replay: "claim only (`I-Twilio-Idempotency-Token`, else the sid and status)",
        handshake: "",
        batch: "",
        fixture: ("twilio/message-status.txt", ""),
    },
];

/// The catalog as a Markdown table (the book's, docs/src/sources/presets.md, which a test keeps equal to this).
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
