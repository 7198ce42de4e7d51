#!/usr/bin/env bash
# Breaks each promise of docs/promises.md on purpose and checks that the test named for it
# fails. Each line of crash-tests/promises/list.tsv is, tab-separated: a patch file (in this
# folder), the test command that must fail once the patch is applied, and a piece of the
# failure message that says the promise broke (a failure for another reason, a build error,
# a missing binary, is not a catch). The patches are applied one at a time to a scratch
# worktree of HEAD (the checkout you are in is never touched); the `broca` binary is built
# before each test runs.
#
#   crash-tests/promises/check.sh [NAME...]   # every promise, or those whose patch name matches
#
# Exit 0 when every break was caught; 1 when a break was not caught or a patch no longer
# applies (the code moved: update the patch, docs/promises.md with it).
# Environment: BROCA_PROMISES_DIR (scratch worktree, default /tmp/broca-promises),
# CARGO_TARGET_DIR (default /tmp/broca-promises-target: kept between runs, so only the
# patched crates rebuild).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel)
work=${BROCA_PROMISES_DIR:-/tmp/broca-promises}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/tmp/broca-promises-target}
mkdir -p "$CARGO_TARGET_DIR" || exit 1
git -C "$root" worktree remove --force "$work" >/dev/null 2>&1 || rm -rf "$work"
git -C "$root" worktree add --detach "$work" HEAD >/dev/null || exit 1
trap 'git -C "$root" worktree remove --force "$work" >/dev/null 2>&1' EXIT
(cd "$work" && npm ci --prefix tests/peers --no-audit --no-fund --loglevel=error >/dev/null)
failed=0
caught=0
while IFS=$'\t' read -r patch cmd expect; do
  case "$patch" in ''|'#'*) continue ;; esac
  if [ $# -gt 0 ]; then
    keep=0
    for want in "$@"; do case "$patch" in *"$want"*) keep=1 ;; esac; done
    [ $keep = 1 ] || continue
  fi
  git -C "$work" checkout --quiet -- .
  if ! git -C "$work" apply "$here/$patch"; then
    echo "STALE      $patch: the patch no longer applies; update it"
    failed=1
    continue
  fi
  log="$CARGO_TARGET_DIR/promise-${patch%.patch}.log"
  start=$(date +%s)
  (cd "$work" && cargo build --quiet -p broca --bin broca && timeout 1500 bash -c "$cmd") </dev/null >"$log" 2>&1
  rc=$?
  took=$(( $(date +%s) - start ))
  if [ $rc -eq 0 ]; then
    echo "NOT CAUGHT $patch: \`$cmd\` passed with the promise broken (${took} s; $log)"
    failed=1
  elif ! grep -q "test result: FAILED" "$log" || ! grep -qF -- "$expect" "$log"; then
    # A build error, a timeout or a failure for another reason is not a catch.
    echo "ERROR      $patch: \`$cmd\` did not fail with \"$expect\" (exit $rc, ${took} s; $log)"
    failed=1
  else
    first=$(grep -m1 -F -- "$expect" "$log" | cut -c1-200)
    echo "caught     $patch: \`$cmd\` failed (${took} s): $first"
    caught=$((caught + 1))
  fi
done < "$here/list.tsv"
git -C "$work" checkout --quiet -- .
echo "$caught breaks caught"
exit $failed
