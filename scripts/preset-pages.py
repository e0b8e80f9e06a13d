#!/usr/bin/env python3
"""Writes a skeleton page docs/src/sources/<preset>.md for every preset of the catalog
(src/source/catalog.rs) that has none, and prints the SUMMARY.md lines of all of them (to paste under "Preset catalog").

An existing page is never overwritten: the skeleton is a start, each page is then edited by
hand (how to set the source up at the provider). Run it after adding a preset to the catalog;
scripts/check-links.py and the test presets::every_preset_has_its_page_in_the_book fail while a
preset has no page.

    python3 scripts/preset-pages.py
"""
import sys
import tomllib

sys.dont_write_bytecode = True  # no __pycache__ in the work tree
from preset_catalog import ROOT, presets

PAGES = ROOT / "docs" / "src" / "sources"

# What each scheme reads when the preset's keys do not say (src/source/*.rs).
SCHEME_ID = {
    "stripe": ("the body's `id`", "the body's `type`"),
    "standard": ("the `webhook-id` header (`svix-id` for Svix senders)", "the body's `type`"),
    "github": ("the `X-GitHub-Delivery` header", "the `X-GitHub-Event` header, then `.` and the body's `action` when it has one"),
    "shopify": ("the `X-Shopify-Webhook-Id` header, else `X-Shopify-Event-Id`", "the `X-Shopify-Topic` header"),
    "ecdsa": ("the SHA-256 of the body (hex)", "`batch`"),
    "mailgun": ("the body's `event-data.id`", "the body's `event-data.event`"),
    "twilio": ("the `I-Twilio-Idempotency-Token` header, else `MessageSid`/`CallSid`/`SmsSid` and `.` and the status, else the body's `sid`",
               "`message.<MessageStatus>`, `call.<CallStatus>`, else `twilio`"),
}
# Schemes whose signature carries a time checked against `tolerance` by default.
TIMED = {"stripe", "standard", "mailgun"}
# A secret of the right form to try the source with (tests/it/presets.rs uses the same).
TRY_SECRET = {
    "stripe": "whsec_test_secret",
    "standard": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    "basic": "hookledger:a-password-of-some-length",
}
# How to set the secret to try a scheme whose secret is a key made for the test.
TRY_EXPORT = {
    "ecdsa": "# A P-256 private key made for the test (base64 PKCS#8): the source verifies with its public\n"
    "# half, and send signs with it.\n"
    'export {env}="$(openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 |\n'
    '  openssl pkcs8 -topk8 -nocrypt -outform DER | base64 -w0)"',
}


# How each provider writes its own name (the page's title).
DISPLAY = {
    "github": "GitHub", "gitlab": "GitLab", "hubspot": "HubSpot", "lemonsqueezy": "Lemon Squeezy",
    "sendgrid": "SendGrid", "workos": "WorkOS", "svix": "Svix", "bitbucket": "Bitbucket Cloud",
}


def display(name):
    return DISPLAY.get(name, name.capitalize())


def locate(loc):
    if "header" in loc:
        return f"the `{loc['header']}` header"
    if "json" in loc:
        return f"the body's `{loc['json']}` (a JSON pointer)"
    if loc.get("body_sha256"):
        return "the SHA-256 of the exact body (no id is sent: only the same bytes again are a duplicate)"
    return str(loc)


def page(p):
    name = p["name"]
    title = display(name)
    keys = tomllib.loads(p["keys"])
    scheme = keys["scheme"]
    env = name.upper() + "_WEBHOOK_SECRET"
    signs_url = "{url}" in p["keys"] or scheme == "twilio"
    default_id, default_type = SCHEME_ID.get(scheme, ("", ""))
    where_id = locate(keys["id"]) if "id" in keys else default_id
    where_type = locate(keys["type"]) if "type" in keys else default_type
    if "split" in keys:
        where_id += f", read in each element of the array at `{keys['split']}`"
    hmac = keys.get("hmac", {})
    if "tolerance" in keys:
        window = f"`{keys['tolerance']}` either way (the preset's `tolerance`; a `tolerance` on the source is over it)"
    elif scheme in TIMED or "timestamp" in hmac:
        window = "`5m` either way (the default `tolerance`; set `tolerance` on the source to change it)"
    elif scheme == "ecdsa":
        window = "none unless `tolerance` is set on the source (the signed timestamp is then checked)"
    else:
        window = "none: nothing signed carries a time, so the ledger's claim is the only replay guard"
    cap = "25 MiB (the `github` scheme's default)" if scheme == "github" else "1 MiB (`[http] max_body`, `--max-body`)"
    url_line = f'public_url = "https://your.host/webhooks/{name}"   # the URL the provider calls: it is signed\n' if signs_url else ""
    try_url = f'public_url = "http://127.0.0.1:8080/webhooks/{name}"\n' if signs_url else ""
    export = TRY_EXPORT.get(scheme, "export {env}='{secret}'").format(
        env=env, secret=TRY_SECRET.get(scheme, "a-shared-secret-of-some-length"))
    send = f"hookledger send --config hookledger.toml --source {name}"
    if p["fixture_type"]:
        send += f" --type '{p['fixture_type']}'"
    send += f" tests/fixtures/{p['fixture']}"
    extra = ""
    if p["handshake"]:
        extra += (f"\n## Handshake\n\nBefore it delivers, {title} posts a challenge; hookledger answers it as "
                  f"`handshake = \"{p['handshake']}\"` says, once its signature verifies, and claims nothing "
                  "(counted as `outcome=\"challenge\"`).\n")
    if p["batch"]:
        extra += (f"\n## Several events in one request\n\n{p['batch']}: each element is claimed and applied on its own, "
                  "all in one transaction; the answer is `{\"events\":[…]}` with each element's outcome. If one "
                  "fails, the answer is 500 and the provider resends the whole array, whose committed elements are "
                  "then duplicates.\n")
    return f"""# {title} (`{name}`)

Provider's documentation: <{p['docs']}>

## Configure

In {title}'s webhook settings, set the endpoint URL to `https://your.host/webhooks/{name}` (the
path is `/webhooks/` and the source's `name`), and take its secret as below. Then:

```toml
[[source]]
name    = "{name}"
preset  = "{name}"
secrets = ["env:{env}"]
{url_line}```

<!-- provider notes: where the provider shows the secret, anything particular to it -->

The preset stands for these keys (from the catalog, `src/source/catalog.rs`; a key written on
the source is over the preset's):

```toml
{p['keys']}
```

## Signature

{p['verifies']}. Scheme: `{scheme}` (see [Sources](../sources.md)).

## Event id and type

- Event id (the ledger claims `(source, id)`): {where_id}.
- Type (what `[[effect]] on` matches): {where_type}.

## Replay window and retention

- Replay: {p['replay']}.
- Signed-time window: {window}.
- Claims are kept for `[retention] claim_days` (400 days by default): a resend within them is a
  `duplicate`. Payloads are kept for `payload_days` (30). See [Operations](../operations.md).

## Body cap

{cap}; set `max_body = <bytes>` on the source for larger bodies. A proxy in front must allow
at least as much (see [Deploying behind a proxy](../deploy.md)).
{extra}
## Try it with the fixture

From a clone of the repository, `tests/fixtures/{p['fixture']}` is a real-shaped event that
`hookledger send` signs as {title} does:

```sh
cat > hookledger.toml <<'EOF'
[[source]]
name    = "{name}"
preset  = "{name}"
secrets = ["env:{env}"]
{try_url}EOF
{export}
hookledger serve --config hookledger.toml &
{send}
```

It answers `200` with `"outcome":"processed"`; the same file again is a `duplicate` (its id comes
from the file), `--new-id` makes a fresh one where the scheme sends the id in a header. Tested by
`presets::every_preset_takes_its_fixture_once_and_refuses_a_changed_byte`.
"""


def main():
    PAGES.mkdir(parents=True, exist_ok=True)
    made = 0
    for p in presets():
        path = PAGES / f"{p['name']}.md"
        if not path.exists():
            path.write_text(page(p))
            made += 1
            print(f"wrote {path.relative_to(ROOT)}", file=sys.stderr)
        print(f"    - [{display(p['name'])}](sources/{p['name']}.md)")
    print(f"{made} new page(s)", file=sys.stderr)


if __name__ == "__main__":
    main()
