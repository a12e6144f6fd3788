//! Links the front door (`leash`, src/front/main.rs) without a C library: its own `_start`, no
//! start files, no libc, a static non-PIE image (nothing to relocate at start-up, since nothing
//! would relocate it). Every other target of the package links as usual.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        for arg in ["-nostartfiles", "-nostdlib", "-static", "-no-pie"] {
            println!("cargo:rustc-link-arg-bin=leash={arg}");
        }
    }
}
