#!/usr/bin/env bash
# Runs deploy/nginx.conf and deploy/Caddyfile for real, with a self-signed certificate, in
# front of a release hookledger, and sends signed Stripe events through each over HTTPS.
# Installs nginx and caddy with apt-get if missing (needs root). Usage: scripts/proxy-test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
FIXTURES=tests/fixtures/stripe/events
SECRET=whsec_proxy_test
H_PORT=18080 NGINX_PORT=18443 CADDY_PORT=18444 DOMAIN=hooks.example.com

for tool in nginx caddy openssl curl; do
  command -v "$tool" >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q nginx caddy openssl curl >/dev/null; break; }
done
cargo build --release --quiet
BIN=target/release/hookledger
WORK=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT

openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=$DOMAIN" \
  -addext "subjectAltName=DNS:$DOMAIN" -keyout "$WORK/key.pem" -out "$WORK/cert.pem" 2>/dev/null

$BIN serve --listen 127.0.0.1:$H_PORT --db "$WORK/hookledger.db" --stripe-secret $SECRET \
  >"$WORK/hookledger.out" 2>"$WORK/hookledger.log" &
pids+=($!)

# nginx: the shipped server block, with test ports and the self-signed certificate.
mkdir -p "$WORK/nginx"
sed -e "s|listen 443 ssl;|listen 127.0.0.1:$NGINX_PORT ssl;|" \
    -e "s|/etc/letsencrypt/live/$DOMAIN/fullchain.pem|$WORK/cert.pem|" \
    -e "s|/etc/letsencrypt/live/$DOMAIN/privkey.pem|$WORK/key.pem|" \
    -e "s|127.0.0.1:8080|127.0.0.1:$H_PORT|" deploy/nginx.conf >"$WORK/nginx/site.conf"
cat >"$WORK/nginx/nginx.conf" <<CONF
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log;
events {}
http {
  access_log $WORK/nginx/access.log;
  include $WORK/nginx/site.conf;
}
CONF
nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -g 'daemon off;' &
pids+=($!)

# Caddy: the shipped Caddyfile, with a test port and the self-signed certificate.
sed -e "s|^$DOMAIN {|{\n\tadmin off\n\tauto_https disable_redirects\n\tstorage file_system $WORK/caddy\n}\n\nhttps://$DOMAIN:$CADDY_PORT {\n\ttls $WORK/cert.pem $WORK/key.pem|" \
    -e "s|127.0.0.1:8080|127.0.0.1:$H_PORT|" deploy/Caddyfile >"$WORK/Caddyfile"
HOME=$WORK caddy run --config "$WORK/Caddyfile" --adapter caddyfile >"$WORK/caddy.log" 2>&1 &
pids+=($!)
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
echo "nginx $(nginx -v 2>&1 | sed 's/.*nginx\///'), caddy $(caddy version | cut -d' ' -f1): $fails failure(s)"
exit $fails
