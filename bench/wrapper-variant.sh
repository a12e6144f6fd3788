#!/usr/bin/env bash
# Builds leash-wrap as of another commit (or the working tree: `HEAD`), for a before/after
# comparison in the benchmarks, and prints the `--extra-wrapper` argument that measures it:
#
#   cargo bench -- --only spawn,footprint \
#       $(bench/wrapper-variant.sh before-static <commit>) \
#       $(bench/wrapper-variant.sh now-dynamic HEAD dynamic)
#
# `dynamic` builds it without static linking (LEASH_WRAP_DYNAMIC=1, see .cargo/config.toml).
# The sources go to a scratch directory under $TMPDIR, the build to target/leash-bench/variants/;
# the release profile and .cargo/ settings are those of that commit.
set -euo pipefail

name=${1:?usage: bench/wrapper-variant.sh NAME COMMIT [dynamic]}
commit=${2:?usage: bench/wrapper-variant.sh NAME COMMIT [dynamic]}
mode=${3:-}
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
out=$repo/target/leash-bench/variants
mkdir -p "$out"

if [ "$commit" = HEAD ]; then
    src=$repo
else
    # Outside the repository: cargo would otherwise also read this checkout's .cargo/config.toml
    # (config is looked up in every parent directory), not only the commit's own.
    src=${TMPDIR:-/tmp}/leash-wrap-variant-$name
    rm -rf "$src"
    mkdir -p "$src"
    git -C "$repo" archive "$commit" | tar -x -C "$src"
fi
export CARGO_TARGET_DIR=$out/target-$name
if [ "$mode" = dynamic ]; then
    export LEASH_WRAP_DYNAMIC=1
fi
# How the wrapper is linked is invisible to cargo's fingerprints: always relink it.
rm -f "$CARGO_TARGET_DIR"/release/leash-wrap "$CARGO_TARGET_DIR"/release/deps/leash_wrap-*
(cd "$src" && cargo build --quiet --release -p leash-wrap) >&2
cp "$CARGO_TARGET_DIR/release/leash-wrap" "$out/leash-wrap-$name"
echo "--extra-wrapper $name=$out/leash-wrap-$name"
