#!/usr/bin/env bash
# Prints the skip summary of one test pass: `skipped: N (reason: count, …)` and, when N > 0, each
# skipped test with its reason. The tests record a skip by appending `<binary>::<test>\t<reason>`
# to a file in DIR (tests/common `skip`); .ci/run clears DIR before each pass, so a green pass
# cannot hide tests that skipped themselves. Usage: .ci/skips.sh DIR PASS-NAME
set -euo pipefail
dir=$1
pass=$2
records=$(cat "$dir"/*.txt 2>/dev/null || true)
if [ -z "$records" ]; then
  echo "$pass: skipped: 0"
  exit 0
fi
n=$(printf '%s\n' "$records" | wc -l)
reasons=$(printf '%s\n' "$records" | cut -f2- | sort | uniq -c | sort -rn |
  awk '{ c = $1; sub(/^ *[0-9]+ /, ""); printf "%s%s: %d", sep, $0, c; sep = ", " }')
echo "$pass: skipped: $n ($reasons)"
printf '%s\n' "$records" | sort | sed 's/^/  skipped /; s/\t/: /'
