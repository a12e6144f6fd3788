#!/usr/bin/env bash
# Set-up for the benchmarks (`cargo bench`, see docs/benchmarks.md): installs the peers leash is
# compared with — tini (with tini-static), dumb-init and catatonit, from Debian/Ubuntu packages —
# when they are missing. Whatever cannot be installed is reported here, and the benchmarks skip
# its rows with a note; nothing else on the machine is changed.
#
# Also builds bench/issue-floor.c (the issue's own floor under `leash exec`, one static program;
# execfloor times it) into target/issue-floor/, with musl-gcc (musl-tools, installed here when
# missing) and the SQLite amalgamation rusqlite bundles; without them that row is skipped.
#
# Also wanted, not installed here: node (the Node rows: the incumbent wrapper's runtime) and ps
# (procps: the process-table comparison). perf and strace are only needed to profile a miss.
set -euo pipefail

missing=()
for p in tini dumb-init catatonit; do
    command -v "$p" >/dev/null 2>&1 || missing+=("$p")
done
command -v musl-gcc >/dev/null 2>&1 || missing+=(musl-tools)

if ((${#missing[@]})); then
    if command -v apt-get >/dev/null 2>&1; then
        sudo=()
        [ "$(id -u)" -eq 0 ] || sudo=(sudo)
        echo "bench/setup.sh: installing ${missing[*]}"
        if ! "${sudo[@]}" apt-get install -y "${missing[@]}"; then
            # Stale package lists are the usual cause; refresh once and retry.
            "${sudo[@]}" apt-get update && "${sudo[@]}" apt-get install -y "${missing[@]}" ||
                echo "bench/setup.sh: note: could not install ${missing[*]}; their rows are skipped"
        fi
    else
        echo "bench/setup.sh: note: no apt-get here; install ${missing[*]} with your package" \
            "manager, or their rows are skipped"
    fi
fi

for p in tini tini-static dumb-init catatonit node ps; do
    if command -v "$p" >/dev/null 2>&1; then
        printf 'bench/setup.sh: %-11s %s\n' "$p" "$(command -v "$p")"
    else
        printf 'bench/setup.sh: %-11s missing: its rows are skipped\n' "$p"
    fi
done

# The issue's floor: the amalgamation of the libsqlite3-sys that Cargo.lock names.
here=$(cd "$(dirname "$0")/.." && pwd)
target=$(cd "$here" && cargo metadata --format-version 1 --no-deps 2>/dev/null |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p') || true
target=${target:-$here/target}
# (`|| true`: no cargo metadata, or no match, is reported below, not an exit of this script.)
sqlite=$(cd "$here" && cargo metadata --format-version 1 2>/dev/null |
    grep -o '"manifest_path":"[^"]*/libsqlite3-sys-[^"]*/Cargo.toml"' | sed -n '1s/"manifest_path":"\(.*\)\/Cargo.toml"/\1/p') || true
out=$target/issue-floor/issue-floor
if ! command -v musl-gcc >/dev/null 2>&1; then
    echo "bench/setup.sh: issue-floor missing: no musl-gcc; its rows are skipped"
elif [ -z "$sqlite" ] || [ ! -f "$sqlite/sqlite3/sqlite3.c" ]; then
    echo "bench/setup.sh: issue-floor missing: no SQLite amalgamation found (cargo fetch first?)"
elif [ ! -x "$out" ] || [ "$here/bench/issue-floor.c" -nt "$out" ]; then
    mkdir -p "$(dirname "$out")"
    if musl-gcc -O2 -static -s -DSQLITE_THREADSAFE=0 -DSQLITE_OMIT_LOAD_EXTENSION \
        -I"$sqlite/sqlite3" -o "$out.tmp" "$here/bench/issue-floor.c" "$sqlite/sqlite3/sqlite3.c"; then
        mv "$out.tmp" "$out"
        printf 'bench/setup.sh: %-11s %s (built)\n' issue-floor "$out"
    else
        rm -f "$out.tmp"
        echo "bench/setup.sh: issue-floor missing: its build failed (above); its rows are skipped"
    fi
else
    printf 'bench/setup.sh: %-11s %s\n' issue-floor "$out"
fi
