#!/usr/bin/env bash
# CI's check that no test makes cgroups under the default cgroup root: the one a real gateway
# takes without LEASH_CGROUP_ROOT (<cgroup2 mount>/leash as root in the root cgroup, else this
# process's own cgroup). Each test makes a root of its own and removes it.
#
#   default-cgroup-root.sh snapshot FILE   the directories under the default root, into FILE
#   default-cgroup-root.sh check FILE      fails when a directory gained since FILE is a test's
#
# The default root is shared with every other leash on the host (a `leash serve` left running,
# another checkout's CI), so a gained directory counts only when it is of a state root the tests
# made: leash names its cgroups <root>/<gateway id>/<lease id>, and tests/common records the
# gateway id of every state root in a test's scratch directory into $LEASH_TEST_GATEWAYS (one
# per line) when the directory is removed. Directories of other gateway ids are listed as
# another leash's and pass. LEASH_CI_CGROUP_ROOT names the root to look at instead of the
# default (tests/ci_default_cgroup_root.rs runs this script against a root of its own).
set -euo pipefail

default_cgroup_root() {
  local mount own
  if [ -n "${LEASH_CI_CGROUP_ROOT:-}" ]; then
    echo "$LEASH_CI_CGROUP_ROOT"
    return 0
  fi
  mount=$(awk -F' - ' '$2 ~ /^cgroup2 / { split($1, f, " "); print f[5]; exit }' /proc/self/mountinfo)
  [ -n "$mount" ] || return 0
  own=$(sed -n 's/^0:://p' /proc/self/cgroup)
  own=${own%/leash-daemon}
  if [ -z "$own" ] || [ "$own" = "/" ]; then echo "$mount/leash"; else echo "$mount$own"; fi
}

# The directories under the root, relative to it, sorted.
root_dirs() {
  local root=$1
  if [ -n "$root" ] && [ -d "$root" ]; then
    find "$root" -mindepth 1 -type d -printf '%P\n' | LC_ALL=C sort
  fi
}

root=$(default_cgroup_root)
case ${1:-} in
  snapshot)
    root_dirs "$root" >"$2"
    ;;
  check)
    gained=$(root_dirs "$root" | LC_ALL=C comm -13 "$2" -)
    ours=""
    theirs=""
    if [ -n "$gained" ]; then
      while read -r dir; do
        gateway=${dir%%/*}
        if [ -n "${LEASH_TEST_GATEWAYS:-}" ] && [ -f "$LEASH_TEST_GATEWAYS" ] &&
          grep -qxF -- "$gateway" "$LEASH_TEST_GATEWAYS"; then
          ours+="$root/$dir"$'\n'
        else
          theirs+="$root/$dir"$'\n'
        fi
      done <<<"$gained"
    fi
    if [ -n "$theirs" ]; then
      echo "default cgroup root $root: directories of gateways no test made (another leash on this host), not counted:"
      printf '%s' "$theirs"
    fi
    if [ -n "$ours" ]; then
      echo "the tests made cgroups under the default cgroup root $root instead of roots of their own:"
      printf '%s' "$ours"
      exit 1
    fi
    echo "default cgroup root $root: no directory of the tests' state roots gained during the tests"
    ;;
  *)
    echo "usage: $0 snapshot|check FILE" >&2
    exit 2
    ;;
esac
