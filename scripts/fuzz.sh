#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for a bounded time and prints one summary line each.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]      (default 60)
#
# cargo-fuzz needs nightly; on a stable toolchain RUSTC_BOOTSTRAP=1 lets it pass its -Z flags.
# Inputs that find new coverage are added to fuzz/corpus/<target>/, which is then minimised
# (`cargo fuzz cmin`) so it stays small enough to commit; a crash is saved in
# fuzz/artifacts/<target>/ and makes the script exit 1 (after the other targets have run).
# Logs: fuzz/target/fuzz-logs/<target>.log. Everything runs under `nice -n 19`.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
if ! [[ "$seconds" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 [SECONDS_PER_TARGET]   (a positive integer, default 60)" >&2
  exit 2
fi

export RUSTC_BOOTSTRAP=1
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "installing cargo-fuzz (once)..." >&2
  nice -n 19 cargo install cargo-fuzz --locked
fi

targets=(stripe_signature_header stripe_event verify_and_parse)
logs=fuzz/target/fuzz-logs
mkdir -p "$logs"

# One build up front, so each target's time is spent fuzzing, not compiling.
nice -n 19 cargo fuzz build

# Shrinks a target's corpus to the inputs that add coverage (`cargo fuzz cmin`), so the
# committed corpus stays small. The named seeds (anything that is not a 40-hex libFuzzer file
# name) are kept under their names whether or not they add coverage.
minimize() {
  local target=$1 log=$2 dir="fuzz/corpus/$1" seeds seed
  seeds=$(mktemp -d)
  find "$dir" -type f -regextype posix-extended ! -regex '.*/[0-9a-f]{40}' -exec cp {} "$seeds/" \;
  nice -n 19 cargo fuzz cmin "$target" "$dir" >>"$log" 2>&1
  for seed in "$seeds"/*; do
    [[ -e "$seed" ]] || continue
    rm -f "$dir/$(sha1sum "$seed" | cut -d' ' -f1)"
    cp "$seed" "$dir/"
  done
  rm -rf "$seeds"
}

failed=0
summary=()
for target in "${targets[@]}"; do
  mkdir -p "fuzz/corpus/$target"
  args=(-max_total_time="$seconds" -print_final_stats=1)
  if [[ -f "fuzz/dicts/$target.dict" ]]; then
    args+=(-dict="fuzz/dicts/$target.dict")
  fi
  log="$logs/$target.log"
  echo "fuzzing $target for ${seconds}s (log: $log)" >&2
  start=$(date +%s)
  status=0
  nice -n 19 cargo fuzz run "$target" "fuzz/corpus/$target" -- "${args[@]}" >"$log" 2>&1 || status=$?
  elapsed=$(($(date +%s) - start))
  # libFuzzer's last line on a clean finish: "Done 123456 runs in 60 second(s)".
  runs=$(sed -n 's/^Done \([0-9]*\) runs in.*/\1/p' "$log" | tail -n 1)
  fuzzed=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -n 1)
  if [[ $status -eq 0 && -n "$runs" ]]; then
    result="ok"
    minimize "$target" "$log"
  else
    if grep -q -e 'ERROR: libFuzzer' -e 'ERROR: AddressSanitizer' -e 'panicked at' "$log"; then
      result="CRASHED (exit $status; input in fuzz/artifacts/$target/, details in $log)"
    else
      result="FAILED (exit $status, no crash reported: build error? see $log)"
    fi
    runs="${runs:-?}"
    failed=1
  fi
  corpus="$(find "fuzz/corpus/$target" -type f | wc -l) files, $(du -sk "fuzz/corpus/$target" | cut -f1) KiB"
  summary+=("$(printf '%-24s %10s runs in %4ss (wall %4ss)  corpus %-20s %s' \
    "$target" "$runs" "${fuzzed:-?}" "$elapsed" "$corpus" "$result")")
done

echo
printf '%s\n' "${summary[@]}"
exit "$failed"
