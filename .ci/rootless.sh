#!/usr/bin/env bash
# CI's rootless pass: the lifecycle tests (exec, close, reap of an env-less setsid escapee, the
# daemon and its SIGKILL, parent death) run as an ordinary user inside a cgroup delegated to it the
# way systemd's `Delegate=yes` does it (the directory and its cgroup.procs, cgroup.threads and
# cgroup.subtree_control chowned to the user), with containment on: the tests' helpers make their
# cgroups under the process's own, delegated cgroup (tests/common `cgroup_parent`), and
# tests/containment_own_cgroup.rs runs leash and its daemon with no cgroup root given, so they
# find the delegated subtree from their own cgroup. Fails when fewer than MIN_TESTS tests pass,
# or when any test skipped (or ran uncontained) for lack of containment.
#
# Run as root (it makes the user and the cgroup). Idempotent: the user is made once and kept;
# the cgroup and the scratch directory are removed on every exit (trap), and those of an earlier
# run that died are removed at the start. Only what this script made is killed or removed.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

user=${LEASH_ROOTLESS_USER:-leash-rootless}
# The focused set: the lifecycle and containment tests that make sense for a delegated user.
tests=(close_and_cancel parent_death wrapper_sigkill reap_startup_orphans containment_escapee
  containment_own_cgroup containment_modes daemon_containment daemon_leaf_cgroup
  daemon_sigkill_stale_socket daemon_wrapper_sigkill_settles daemon_reconcile_strays ps_resource_view
  wrapper_cgroup_removed report_dir)
min_tests=35
started=$(date +%s)

if [ "$(id -u)" -ne 0 ]; then
  echo "rootless: run this as root: it creates the user $user and delegates a cgroup to it" >&2
  exit 1
fi
mount=$(awk '{ for (i = 1; i <= NF; i++) if ($i == "-") { if ($(i + 1) == "cgroup2") { print $5; exit } break } }' \
  /proc/self/mountinfo)
if [ -z "$mount" ]; then
  echo "rootless: no cgroup2 hierarchy in /proc/self/mountinfo; cannot delegate a subtree" >&2
  exit 1
fi

# Kills every process in the cgroup tree at $1 (made by this script), waits until it is empty,
# and removes it deepest first.
remove_tree() {
  local root=$1 d i
  [ -d "$root" ] || return 0
  while read -r d; do
    echo 1 >"$d/cgroup.kill" 2>/dev/null || true
  done < <(find "$root" -depth -type d)
  while read -r d; do
    for i in $(seq 200); do
      grep -qx 'populated 1' "$d/cgroup.events" 2>/dev/null || break
      sleep 0.05
    done
    rmdir "$d" 2>/dev/null || echo "rootless: cannot remove $d" >&2
  done < <(find "$root" -depth -type d)
}

# Left-overs of an earlier run that died before its trap (its pid is in the names; a scratch
# directory is only ever removed with the marker this script puts in it).
for old in "$mount"/leash-rootless-* /tmp/lr-*; do
  [ -e "$old" ] || continue
  pid=${old##*-}
  if [ -d "/proc/$pid" ]; then continue; fi
  case $old in
    "$mount"/*) remove_tree "$old" ;;
    *) if [ -f "$old/.leash-rootless" ]; then rm -rf "$old"; fi ;;
  esac
done

cg="$mount/leash-rootless-$$"
# Short: the daemon tests' socket paths under TMPDIR must stay within 107 bytes.
work="/tmp/lr-$$"
cleanup() {
  remove_tree "$cg"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The tests' executables, built as root by the README's test command (after it in .ci/run this
# only checks that everything is fresh): the same build of leash and of the wrapper beside it.
executables=$(cargo test --workspace --no-run --message-format=json |
  jq -r 'select(.reason == "compiler-artifact" and .profile.test == true and .executable != null
                and .target.kind == ["test"])
         | "\(.target.name)\t\(.executable)"')
target_dir=$(cargo metadata --format-version 1 --no-deps | jq -r .target_directory)

if ! id -u "$user" >/dev/null 2>&1; then
  useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$user"
fi
uid=$(id -u "$user")
gid=$(id -g "$user")

# What the user reaches: copies of the binaries (the checkout may be under a directory only
# root can enter; the tests find leash through LEASH_TEST_BIN_DIR), and a scratch TMPDIR and
# skip directory of its own.
mkdir -m 0755 "$work" "$work/bin"
touch "$work/.leash-rootless"
cp "$target_dir/debug/leash" "$target_dir/debug/leash-wrap" "$work/bin/"
for t in "${tests[@]}"; do
  exe=$(printf '%s\n' "$executables" | awk -F '\t' -v t="$t" '$1 == t { print $2; exit }')
  if [ -z "$exe" ]; then
    echo "rootless: cargo built no test binary named $t" >&2
    exit 1
  fi
  cp "$exe" "$work/bin/test-$t"
done
install -d -m 0700 -o "$uid" -g "$gid" "$work/t" "$work/skips"

# The delegation, as systemd does it for a unit with Delegate=yes.
mkdir "$cg"
chown "$uid:$gid" "$cg" "$cg/cgroup.procs" "$cg/cgroup.threads" "$cg/cgroup.subtree_control"

# The shell moves itself into the delegated cgroup as root, then setpriv drops to the user and
# execs the command: the same process, so the tests and all they start run there.
as_user() {
  /bin/sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" \
    setpriv --reuid="$uid" --regid="$gid" --clear-groups --no-new-privs --reset-env -- \
    env TMPDIR="$work/t" LEASH_TEST_BIN_DIR="$work/bin" LEASH_TEST_SKIPS_DIR="$work/skips" "$@"
}
seen=$(as_user /bin/sh -c 'echo "$(id -u) $(sed -n "s/^0:://p" /proc/self/cgroup)"')
if [ "$seen" != "$uid ${cg#"$mount"}" ]; then
  echo "rootless: the tests would run as '$seen', not as uid $uid in ${cg#"$mount"}" >&2
  exit 1
fi

passed=0
failed=0
tests_started=$(date +%s)
log="$work/test.log"
for t in "${tests[@]}"; do
  echo "rootless: $t as $user (uid $uid) in ${cg#"$mount"}"
  if ! as_user "$work/bin/test-$t" --test-threads=2 >"$log" 2>&1; then
    failed=$((failed + 1))
    cat "$log"
    echo "rootless: $t FAILED"
    continue
  fi
  grep -E '^test result:' "$log" || true
  n=$(sed -nE 's/^test result: ok\. ([0-9]+) passed.*/\1/p' "$log" | awk '{ s += $1 } END { print s + 0 }')
  passed=$((passed + n))
done

.ci/skips.sh "$work/skips" rootless
uncontained=$(cat "$work/skips"/*.txt 2>/dev/null | grep -c $'\tcontainment' || true)
echo "rootless: $passed tests passed, $failed binaries failed, $uncontained skipped for lack of containment, as uid $uid in a delegated cgroup (tests $(($(date +%s) - tests_started)) s, with the build $(($(date +%s) - started)) s)"
if [ "$failed" -ne 0 ]; then
  exit 1
fi
if [ "$uncontained" -ne 0 ]; then
  echo "rootless: containment was not on for the delegated user (see the skips above)" >&2
  exit 1
fi
if [ "$passed" -lt "$min_tests" ]; then
  echo "rootless: only $passed tests passed; expected at least $min_tests" >&2
  exit 1
fi
