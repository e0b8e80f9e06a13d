#!/usr/bin/env bash
# Runs deploy/nginx.conf and deploy/Caddyfile for real, with a self-signed certificate, in
# front of a release hookledger, and sends signed Stripe events through each over HTTPS. Then
# deploy/nginx-instances.conf and deploy/Caddyfile.instances in front of three instances on one
# PostgreSQL database (a scratch database on the server at HOOKLEDGER_TEST_POSTGRES, as for the
# tests; that part is skipped, saying so, without a server or psql), one of them stopped midway.
# Installs nginx and caddy with apt-get if missing (needs root). Usage: scripts/proxy-test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
FIXTURES=tests/fixtures/stripe/events
SECRET=whsec_proxy_test
H_PORT=18080 NGINX_PORT=18443 CADDY_PORT=18444 DOMAIN=hooks.example.com
NGINX_I_PORT=18445 CADDY_I_PORT=18446 # the instances: 18081, 18082, 18083
PG=${HOOKLEDGER_TEST_POSTGRES:-postgres://hookledger:hookledger@127.0.0.1:5432/postgres}

for tool in nginx caddy openssl curl; do
  command -v "$tool" >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q nginx caddy openssl curl >/dev/null; break; }
done
cargo build --release --quiet
BIN=target/release/hookledger
WORK=$(mktemp -d)
pids=()
pg_db=""
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  [[ -z "$pg_db" ]] || psql "$PG" -qc "DROP DATABASE IF EXISTS $pg_db WITH (FORCE)" >/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=$DOMAIN" \
  -addext "subjectAltName=DNS:$DOMAIN" -keyout "$WORK/key.pem" -out "$WORK/cert.pem" 2>/dev/null

$BIN serve --listen 127.0.0.1:$H_PORT --admin-listen off --db "$WORK/hookledger.db" --stripe-secret $SECRET \
  >"$WORK/hookledger.out" 2>"$WORK/hookledger.log" &
pids+=($!)

# nginx: the shipped server block, with test ports and the self-signed certificate.
mkdir -p "$WORK/nginx"
sed -e "s|listen 443 ssl;|listen 127.0.0.1:$NGINX_PORT ssl;|" \
    -e "s|/etc/letsencrypt/live/$DOMAIN/fullchain.pem|$WORK/cert.pem|" \
    -e "s|/etc/letsencrypt/live/$DOMAIN/privkey.pem|$WORK/key.pem|" \
    -e "s|127.0.0.1:8080|127.0.0.1:$H_PORT|" deploy/nginx.conf >"$WORK/nginx/site.conf"
# Three instances on one scratch PostgreSQL database, if there is a server.
if command -v psql >/dev/null && psql "$PG" -Atqc 'SELECT 1' >/dev/null 2>&1; then
  pg_db="hl_proxy_$$"
  psql "$PG" -qc "CREATE DATABASE $pg_db" >/dev/null
  PG_DB=$(sed -e "s|/[^/]*\$|/$pg_db|" <<<"$PG")
  declare -A instance
  # The first one creates the tables; the others start once it listens.
  for n in 1 2 3; do
    HOOKLEDGER_DATABASE=$PG_DB $BIN serve --listen 127.0.0.1:1808$n --admin-listen 127.0.0.1:1909$n --stripe-secret $SECRET \
      >"$WORK/instance$n.out" 2>"$WORK/instance$n.log" &
    pids+=($!)
    instance[$n]=$!
    for _ in $(seq 100); do grep -q 'listening on' "$WORK/instance$n.out" && break; sleep 0.1; done
    grep -q 'listening on' "$WORK/instance$n.out" || { cat "$WORK/instance$n.log"; exit 1; }
  done
  sed -e "s|listen 443 ssl;|listen 127.0.0.1:$NGINX_I_PORT ssl;|" \
      -e "s|/etc/letsencrypt/live/$DOMAIN/fullchain.pem|$WORK/cert.pem|" \
      -e "s|/etc/letsencrypt/live/$DOMAIN/privkey.pem|$WORK/key.pem|" \
      -e "s|127.0.0.1:808\([123]\)|127.0.0.1:1808\1|" deploy/nginx-instances.conf >"$WORK/nginx/instances.conf"
else
  echo "skipped: the instances configs need a PostgreSQL server at HOOKLEDGER_TEST_POSTGRES and psql"
  : >"$WORK/nginx/instances.conf"
fi
cat >"$WORK/nginx/nginx.conf" <<CONF
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log;
events {}
http {
  # Which instance(s) each request went to: a resend shows as "a, b".
  log_format upstreams '\$status \$upstream_addr';
  access_log $WORK/nginx/access.log upstreams;
  include $WORK/nginx/site.conf;
  include $WORK/nginx/instances.conf;
}
CONF
nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -g 'daemon off;' &
pids+=($!)

# Caddy: the shipped Caddyfile, with a test port and the self-signed certificate.
sed -e "s|^$DOMAIN {|{\n\tadmin off\n\tauto_https disable_redirects\n\tstorage file_system $WORK/caddy\n}\n\nhttps://$DOMAIN:$CADDY_PORT {\n\ttls $WORK/cert.pem $WORK/key.pem|" \
    -e "s|127.0.0.1:8080|127.0.0.1:$H_PORT|" deploy/Caddyfile >"$WORK/Caddyfile"
HOME=$WORK caddy run --config "$WORK/Caddyfile" --adapter caddyfile >"$WORK/caddy.log" 2>&1 &
pids+=($!)
if [[ -n "$pg_db" ]]; then
  mkdir -p "$WORK/caddy-instances"
  sed -e "s|^$DOMAIN {|{\n\tadmin off\n\tauto_https disable_redirects\n\tstorage file_system $WORK/caddy-instances\n}\n\nhttps://$DOMAIN:$CADDY_I_PORT {\n\ttls $WORK/cert.pem $WORK/key.pem|" \
      -e "s|127.0.0.1:808\([123]\)|127.0.0.1:1808\1|g" deploy/Caddyfile.instances >"$WORK/Caddyfile.instances"
  HOME=$WORK caddy run --config "$WORK/Caddyfile.instances" --adapter caddyfile >"$WORK/caddy-instances.log" 2>&1 &
  pids+=($!)
fi
sleep 2

# POSTs a file through a proxy port, signed now; prints "<status> <body>".
send() { # port file [secret]
  local t sig
  t=$(date +%s)
  sig=$( { printf '%s.' "$t"; cat "$2"; } | openssl dgst -sha256 -hmac "${3:-$SECRET}" -hex | sed 's/^.*= //')
  : >"$WORK/body"
  # HTTP/1.1, as Stripe sends webhooks.
  curl -sS --http1.1 --resolve "$DOMAIN:$1:127.0.0.1" --cacert "$WORK/cert.pem" -o "$WORK/body" -w '%{http_code}' \
    -H 'Content-Type: application/json' -H "Stripe-Signature: t=$t,v1=$sig" \
    --data-binary @"$2" "https://$DOMAIN:$1/webhooks/stripe"
  echo " $(cat "$WORK/body")"
}
fails=0
expect() { # name expected actual
  if [[ "$3" == $2* ]]; then echo "ok   $1: $3"; else echo "FAIL $1: expected $2, got $3"; fails=$((fails+1)); fi
}
big="$WORK/big.json"; head -c 1100000 /dev/zero | tr '\0' 'x' >"$big"

for proxy in "nginx $NGINX_PORT" "caddy $CADDY_PORT"; do
  set -- $proxy
  name=$1 port=$2
  expect "$name invoice.paid" "200" "$(send "$port" $FIXTURES/invoice.paid.json)"
  expect "$name customer.subscription.created" "200" "$(send "$port" $FIXTURES/customer.subscription.created.json)"
  expect "$name wrong secret" "400" "$(send "$port" $FIXTURES/invoice.paid.json whsec_wrong)"
  expect "$name body over 1 MiB" "413" "$(send "$port" "$big")"
  expect "$name other path" "404" "$(curl -sS --resolve "$DOMAIN:$port:127.0.0.1" --cacert "$WORK/cert.pem" -o /dev/null -w '%{http_code}' "https://$DOMAIN:$port/admin")"
done
# The second proxy's copies were duplicates: the ledger holds each event once.
rows=$($BIN events list --json --db "$WORK/hookledger.db" | grep -c '"event_id"')
expect "ledger rows (2 distinct events through 2 proxies)" "2" "$rows"
grep -q 'invoice.paid duplicate' "$WORK/hookledger.log" && echo "ok   second delivery was a duplicate" || { echo "FAIL no duplicate logged"; fails=$((fails+1)); }

if [[ -n "$pg_db" ]]; then
  for proxy in "nginx-instances $NGINX_I_PORT" "caddy-instances $CADDY_I_PORT"; do
    set -- $proxy
    name=$1 port=$2
    expect "$name invoice.paid" "200" "$(send "$port" $FIXTURES/invoice.paid.json)"
    expect "$name customer.subscription.created" "200" "$(send "$port" $FIXTURES/customer.subscription.created.json)"
    for i in 1 2 3; do
      expect "$name invoice.paid again" '200 {"event_id":"evt_1Pgci1B7WZ01zgkWrMGF0FaA","outcome":"duplicate"}' "$(send "$port" $FIXTURES/invoice.paid.json)"
    done
    expect "$name wrong secret" "400" "$(send "$port" $FIXTURES/invoice.paid.json whsec_wrong)"
    expect "$name body over 1 MiB" "413" "$(send "$port" "$big")"
    expect "$name /healthz not exposed" "404" "$(curl -sS --resolve "$DOMAIN:$port:127.0.0.1" --cacert "$WORK/cert.pem" -o /dev/null -w '%{http_code}' "https://$DOMAIN:$port/healthz")"
  done
  for n in 1 2 3; do
    grep -q 'stripe evt_' "$WORK/instance$n.log" && echo "ok   instance $n took events" || { echo "FAIL instance $n took no event"; fails=$((fails+1)); }
  done

  # Instance 2 stops (SIGTERM: its listener closes, it finishes what it has). nginx resends
  # to the next instance at once; Caddy, which does not resend a body, leaves it out after
  # its next health check.
  kill "${instance[2]}"; wait "${instance[2]}" || true
  for f in invoice.payment_succeeded invoice.payment_failed customer.subscription.updated invoice.paid invoice.paid invoice.paid; do
    expect "nginx-instances, instance 2 stopped: $f" "200" "$(send "$NGINX_I_PORT" $FIXTURES/$f.json)"
  done
  grep -q '^200 127.0.0.1:18082, ' "$WORK/nginx/access.log" && echo "ok   nginx resent a POST from the stopped instance to the next" || { echo "FAIL nginx never resent a POST"; fails=$((fails+1)); }
  sleep 6 # Caddy's health_interval is 5 s
  for f in invoice.payment_succeeded invoice.payment_failed customer.subscription.updated invoice.paid invoice.paid invoice.paid; do
    expect "caddy-instances, instance 2 stopped: $f" "200" "$(send "$CADDY_I_PORT" $FIXTURES/$f.json)"
  done
  rows=$($BIN events list --json --db "$PG_DB" | grep -c '"event_id"')
  expect "ledger rows (5 distinct events through 3 instances and 2 proxies)" "5" "$rows"
fi
echo "nginx $(nginx -v 2>&1 | sed 's/.*nginx\///'), caddy $(caddy version | cut -d' ' -f1): $fails failure(s)"
exit $fails
