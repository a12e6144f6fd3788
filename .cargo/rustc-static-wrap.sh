#!/usr/bin/env bash
# Cargo runs every rustc invocation of this workspace through this script (`build.rustc-wrapper`
# in .cargo/config.toml): "$1" is the compiler (or clippy-driver), the rest its arguments.
#
# It adds `-C target-feature=+crt-static` to exactly two compilations: the `leash-wrap` and the
# `leash` binaries on a linux-gnu target. One wrapper runs per session; linking it statically
# saves the dynamic loader's work (about 0.5 ms per start) and 0.65-0.85 MB of RSS per wrapper
# (measured in docs/benchmarks.md). `leash` runs once per `leash exec`, and its start is part of
# every session start: statically linked it skips loading libgcc_s, libm and libc, their
# relocations and libgcc_s's own CPU probe (about 1 ms per start on the benchmark VM, where
# `cpuid` traps; docs/benchmarks.md, Host scale). Release artifacts are these static binaries.
# leash resolves no users, hosts or services through NSS, so glibc's static-linking caveats do
# not reach it. Cargo's fingerprints do not see this flag: after changing how a binary is linked,
# `cargo clean -p leash-wrap` (or `-p leash`).
# Why not a rustflag: `[target.<triple>] rustflags` without `--target` also
# reach proc-macro crates, which cannot be built with crt-static on gnu ("cannot produce
# proc-macro ... does not support these crate types"); `[build] target = ...` would move every
# artifact to target/<triple>/ and pin one architecture; per-profile and per-package rustflags are
# nightly-only. LEASH_WRAP_DYNAMIC=1 opts out (both binaries); without glibc's static libraries
# (libc.a, e.g. the glibc-static package on Fedora) they are linked dynamically, with a warning.
#
# bash, not sh: dash drops environment variables whose names are not shell identifiers from
# what it executes, and cargo passes `CARGO_BIN_EXE_leash-wrap` to the wrapper's tests that way.
set -eu

crate= kind= target= test=
prev=
for a in "$@"; do
    case "$prev" in
        --crate-name) crate=$a ;;
        --crate-type) kind=$a ;;
        --target) target=$a ;;
    esac
    case "$a" in
        --test) test=1 ;;
        --target=*) target=${a#--target=} ;;
    esac
    prev=$a
done

if { [ "$crate" = leash_wrap ] || [ "$crate" = leash ]; } && [ "$kind" = bin ] && [ -z "$test" ] \
    && [ "${LEASH_WRAP_DYNAMIC:-0}" != 1 ]; then
    case "${target:-$(uname -s)}" in
        *-linux-gnu* | Linux)
            # A host that is not glibc-based (musl) links statically by default already; this
            # check only stops a gnu host without libc.a from failing to link.
            libc_a=$("${CC:-cc}" -print-file-name=libc.a 2>/dev/null || true)
            if [ -f "$libc_a" ]; then
                exec "$@" -C target-feature=+crt-static
            fi
            echo "warning: $crate: glibc's static libc.a not found; linking it dynamically (slower start, more RSS: see docs/benchmarks.md)" >&2
            ;;
    esac
fi
exec "$@"
