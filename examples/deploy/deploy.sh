#!/bin/sh
# Deploys on a GitHub push, run by hookledger as a `[[delivery]]` command (see
# docs/src/commands.md). hookledger runs it without a shell around it, in `workdir`, with
# the push's JSON on stdin and only these variables set: HOOKLEDGER_SOURCE,
# HOOKLEDGER_EVENT_ID, HOOKLEDGER_EVENT_TYPE, HOOKLEDGER_KIND, HOOKLEDGER_KEY,
# HOOKLEDGER_ATTEMPT, and those named in the delivery's `env` (PATH, HOME, ...).
#
# Exit 0: done. Exit 3 (in the example's `give_up_exit`): dead at once, a retry would change
# nothing. Any other exit: retried on the delivery's schedule. The last 4 KiB of what it
# prints are kept on the outbox row (`hookledger outbox show ID`).
set -eu

# The push, from stdin: which commit, on which branch.
payload=$(cat)
after=$(printf '%s' "$payload" | python3 -c 'import json,sys; print(json.load(sys.stdin)["after"])')
ref=$(printf '%s' "$payload" | python3 -c 'import json,sys; print(json.load(sys.stdin)["ref"])')

if [ "$ref" != "refs/heads/main" ]; then
    echo "not main ($ref): nothing to deploy"
    exit 0
fi
case "$after" in
    *[!0-9a-f]* | "") echo "not a commit id: $after" >&2; exit 3 ;;
esac

echo "deploying $after (delivery $HOOKLEDGER_EVENT_ID, attempt $HOOKLEDGER_ATTEMPT)"
git fetch --quiet origin
git checkout --quiet --detach "$after"
# Build and restart here, for example:
# make release && systemctl --user restart myapp
echo "deployed $after"
