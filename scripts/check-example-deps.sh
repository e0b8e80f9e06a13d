#!/usr/bin/env bash
# Checks that the examples build with their normal dependencies only: every package that
# `cargo build --example NAME` compiles must be in the examples' own dependency tree without
# dev-dependencies (`cargo tree -e no-dev`: the normal ones and their build scripts'). The dev
# profile: which packages are compiled does not depend on it, and after the tests' build it
# takes seconds (measured: 12 s for both examples, where the release profile's fat LTO took
# 4 min 4 s).
# A dev-dependency of hookledger (headless_chrome, proptest, tempfile) compiled for an example
# fails it. Usage: scripts/check-example-deps.sh [EXAMPLE...] (default: fake_stripe embed
# jetstream_worker)
set -euo pipefail
cd "$(dirname "$0")/.."
examples=("$@")
[[ ${#examples[@]} -gt 0 ]] || examples=(fake_stripe embed jetstream_worker)

# "name version" of each package in the tree of the examples' package, without dev-dependencies.
allowed=$(cargo tree --locked -e no-dev -p hookledger-examples --prefix none --format '{p}' |
  awk '{print $1, $2}' | sort -u)
status=0
for example in "${examples[@]}"; do
  # "name version" of each package compiled (or found fresh) for the example.
  compiled=$(cargo build --locked --example "$example" --message-format=json |
    python3 -c '
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("reason") == "compiler-message":
        sys.stderr.write(msg["message"]["rendered"] or "")
    if msg.get("reason") != "compiler-artifact":
        continue
    # registry+https://...#name@1.2.3, or path+file:///.../name#1.2.3 when the name is the last part
    url, _, spec = msg["package_id"].rpartition("#")
    name, _, version = spec.rpartition("@")
    print(name or url.rstrip("/").rsplit("/", 1)[-1], "v" + version)
' | sort -u)
  extra=$(comm -23 <(echo "$compiled") <(echo "$allowed"))
  if [[ -n "$extra" ]]; then
    echo "example $example compiled packages outside its normal dependencies:" >&2
    echo "$extra" | sed 's/^/  /' >&2
    status=1
  else
    echo "example $example: $(echo "$compiled" | wc -l) packages compiled, all normal dependencies"
  fi
done
exit $status
