#!/usr/bin/env bash
# Set-up for the benchmarks (`cargo bench`, see docs/benchmarks.md): installs the peers leash is
# compared with — tini (with tini-static), dumb-init and catatonit, from Debian/Ubuntu packages —
# when they are missing. Whatever cannot be installed is reported here, and the benchmarks skip
# its rows with a note; nothing else on the machine is changed.
#
# Also wanted, not installed here: node (the Node rows: the incumbent wrapper's runtime) and ps
# (procps: the process-table comparison). perf and strace are only needed to profile a miss.
set -euo pipefail

missing=()
for p in tini dumb-init catatonit; do
    command -v "$p" >/dev/null 2>&1 || missing+=("$p")
done

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
