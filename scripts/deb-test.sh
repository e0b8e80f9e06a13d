#!/usr/bin/env bash
# Builds the Debian package (cargo-deb, installed if missing), installs it with `dpkg -i`, and
# runs what it installed as its systemd unit would, without systemd: `hookledger --version`,
# then the unit's ExecStart as the `hookledger` user, on /etc/hookledger/hookledger.toml, with
# the unit's LoadCredential= files handed over in $CREDENTIALS_DIRECTORY. One Stripe event
# signed here (Python's hmac) is claimed once: the ledger row is read with sqlite3. The
# package is under 8 MB (no debug info), starts with only the shipped config's credentials
# (Stripe's secret and the admin token: a Stripe-only user edits nothing), and `dpkg --purge`
# removes the secret files. Then what the test made is removed.
# Needs root, dpkg, adduser, python3 and sqlite3. Refuses to run where hookledger is installed
# or has a database in /var/lib/hookledger. Usage: scripts/deb-test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $(id -u) -eq 0 ]] || { echo "deb-test: needs root (dpkg -i)" >&2; exit 1; }
if dpkg-query -W -f '${Status}' hookledger 2>/dev/null | grep -q installed; then
  echo "deb-test: hookledger is installed here already; not touching it" >&2
  exit 1
fi
if [[ -e /var/lib/hookledger/hookledger.db ]]; then
  echo "deb-test: /var/lib/hookledger/hookledger.db exists; not touching it" >&2
  exit 1
fi

if ! command -v cargo-deb >/dev/null; then
  cargo install --locked cargo-deb@3.8.0
fi
# The path of the .deb is the last line cargo-deb prints. `--strip`: the release build (shared
# with `cargo install` in CI), stripped by cargo-deb.
deb=$(cargo deb --locked -p hookledger --strip | tail -n 1)
[[ -f "$deb" ]] || { echo "deb-test: cargo deb made no package: $deb" >&2; exit 1; }
size=$(stat -c %s "$deb")
echo "deb-test: built $deb ($size bytes)"
(( size < 8 * 1024 * 1024 )) || { echo "deb-test: FAIL: $deb is $size bytes, not under 8 MB" >&2; exit 1; }
dpkg-deb --info "$deb" | sed -n '/Package:/,$p'
contents=$(dpkg-deb --contents "$deb")
echo "$contents"
# The socket unit beside the service (systemd holds the webhook port across restarts). The
# listing is read whole first: `grep -q` would quit early, and under pipefail the broken pipe
# it leaves dpkg-deb would fail the check.
for unit in hookledger.service hookledger.socket; do
  grep -q "/lib/systemd/system/$unit\$" <<<"$contents" ||
    { echo "deb-test: FAIL: the package has no $unit" >&2; exit 1; }
done

user_existed=$(getent passwd hookledger >/dev/null && echo yes || echo no)
WORK=$(mktemp -d)
chmod 0711 "$WORK" # the hookledger user reaches the credentials in it, as in /run/credentials
server=""
made_secrets=()
cleanup() {
  if [[ -n "$server" ]]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  dpkg --purge hookledger >/dev/null 2>&1 || true
  rm -f /var/lib/hookledger/hookledger.db /var/lib/hookledger/hookledger.db-* # -wal, -serve.lock
  rmdir /var/lib/hookledger 2>/dev/null || true
  for f in "${made_secrets[@]}"; do rm -f "$f"; done
  rmdir /etc/hookledger 2>/dev/null || true
  [[ $user_existed == yes ]] || deluser --system --quiet hookledger >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "deb-test: FAIL: $*" >&2; exit 1; }

dpkg -i "$deb"

# What the package installed.
[[ -x /usr/bin/hookledger ]] || fail "no /usr/bin/hookledger"
unit=$(dpkg -L hookledger | grep '/systemd/system/hookledger.service$') || fail "no unit"
dpkg-query -W -f '${Conffiles}\n' hookledger | grep -q '^ /etc/hookledger/hookledger.toml ' ||
  fail "/etc/hookledger/hookledger.toml is not a conffile"
getent passwd hookledger >/dev/null || fail "no hookledger user"
[[ $(stat -c '%U %a' /var/lib/hookledger) == "hookledger 700" ]] ||
  fail "/var/lib/hookledger is $(stat -c '%U %a' /var/lib/hookledger)"
version=$(/usr/bin/hookledger --version)
echo "deb-test: $version"
[[ $version == "hookledger $(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)" ]] ||
  fail "--version says $version"

# The operator's step: one root-only file per LoadCredential= of the unit. Then systemd's: a
# copy of each in a credentials directory only the service's user may read.
STRIPE_SECRET="whsec_$(head -c 24 /dev/urandom | base64)"
credentials="$WORK/credentials"
install -d -o hookledger -g hookledger -m 0500 "$credentials"
while IFS=: read -r name path; do
  case $name in
    stripe-webhook-secret) value=$STRIPE_SECRET ;;
    clerk-webhook-secret) value="whsec_$(head -c 24 /dev/urandom | base64)" ;;
    *) value=$(head -c 24 /dev/urandom | base64) ;;
  esac
  [[ ! -e $path ]] || fail "$path exists already"
  made_secrets+=("$path")
  printf '%s\n' "$value" | install -m 0600 /dev/stdin "$path"
  install -o hookledger -g hookledger -m 0400 "$path" "$credentials/$name"
done < <(sed -n 's/^LoadCredential=//p' "$unit")
[[ ${#made_secrets[@]} -gt 0 ]] || fail "the unit loads no credential"
# As shipped: Stripe's secret and the admin token, nothing else to make or edit.
[[ "${made_secrets[*]}" == "/etc/hookledger/stripe-webhook-secret /etc/hookledger/admin-token" ]] ||
  fail "the shipped unit loads: ${made_secrets[*]}"

# The unit's ExecStart, as its user, in its working directory, on free ports (the config's
# 8080 and 9090 may be taken here).
read -ra command < <(sed -n 's/^ExecStart=//p' "$unit")
workdir=$(sed -n 's/^WorkingDirectory=//p' "$unit")
(cd "$workdir" && exec setpriv --reuid=hookledger --regid=hookledger --init-groups \
  env -i PATH=/usr/bin:/bin CREDENTIALS_DIRECTORY="$credentials" \
  "${command[@]}" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
  >"$WORK/stdout" 2>"$WORK/stderr") &
server=$!
addr=""
for _ in $(seq 100); do
  # The unit logs JSON (--log-format json): the address is the line {"listen":"IP:PORT"}.
  addr=$(sed -n 's/^{"listen":"\([^"]*\)"}$/\1/p' "$WORK/stdout")
  [[ -z $addr ]] || break
  kill -0 "$server" 2>/dev/null || { cat "$WORK/stderr" >&2; fail "serve exited"; }
  sleep 0.1
done
[[ -n $addr ]] || { cat "$WORK/stderr" >&2; fail "serve did not start"; }
# The subshell became setpriv, then env, then hookledger: one process.
running_as="$(stat -c %U "/proc/$server") $(cat "/proc/$server/comm")"
echo "deb-test: serving on $addr: $running_as"
[[ $running_as == "hookledger hookledger" ]] || fail "serve runs as: $running_as"

# One invoice.paid signed as Stripe signs (HMAC-SHA256 of "t.body" with the whole secret),
# sent twice: processed, then a duplicate.
send() {
  STRIPE_SECRET=$STRIPE_SECRET python3 - "$addr" tests/fixtures/stripe/events/invoice.paid.json <<'PY'
import hashlib, hmac, os, sys, time, urllib.request, urllib.error
addr, path = sys.argv[1], sys.argv[2]
body = open(path, "rb").read()
t = str(int(time.time()))
mac = hmac.new(os.environ["STRIPE_SECRET"].encode(), t.encode() + b"." + body, hashlib.sha256)
request = urllib.request.Request(f"http://{addr}/webhooks/stripe", data=body, method="POST",
    headers={"Content-Type": "application/json", "Stripe-Signature": f"t={t},v1={mac.hexdigest()}"})
try:
    with urllib.request.urlopen(request, timeout=30) as reply:
        print(reply.status, reply.read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
PY
}
event=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' \
  tests/fixtures/stripe/events/invoice.paid.json)
first=$(send); echo "deb-test: first send: $first"
[[ $first == 200*'"processed"'* ]] || fail "the event was not processed: $first"
second=$(send); echo "deb-test: second send: $second"
[[ $second == 200*'"duplicate"'* ]] || fail "the resend was not a duplicate: $second"

db=/var/lib/hookledger/hookledger.db
[[ $(stat -c %U "$db") == hookledger ]] || fail "$db belongs to $(stat -c %U "$db")"
rows=$(sqlite3 "$db" "SELECT source, event_id, event_type FROM webhook_events")
echo "deb-test: ledger: $rows"
[[ $rows == "stripe|$event|invoice.paid" ]] || fail "the ledger holds: $rows"
if grep -qF "$STRIPE_SECRET" "$WORK/stdout" "$WORK/stderr"; then fail "the secret is in the log"; fi

kill -TERM "$server"
wait "$server" || fail "serve exited with $? on SIGTERM"
server=""

# A purge removes the secret files made for the unit (the database and the user stay).
dpkg --purge hookledger
for f in "${made_secrets[@]}"; do
  [[ ! -e $f ]] || fail "dpkg --purge left $f"
done
[[ ! -e /etc/hookledger ]] || fail "dpkg --purge left /etc/hookledger: $(ls -A /etc/hookledger)"
echo "deb-test: ok"
