//! Which build of leash this program is: the package version, and a build marker a packager (or
//! a test) may set in the binary itself. The marker is a fixed-length field in the binary's data,
//! [`MARKER_PREFIX`] followed by [`MARKER_LEN`] bytes (NUL-padded), that a copy of the binary
//! can have replaced byte for byte without a rebuild: `status` then names that copy apart from
//! the program it was copied from, which is how the handoff tests tell the programs they
//! upgrade between apart.

/// What precedes the marker in the binary (found once in it).
pub const MARKER_PREFIX: &[u8] = b"LEASH-BUILD-MARKER:";

/// The marker's length in bytes, after the prefix.
pub const MARKER_LEN: usize = 32;

#[used]
static MARKER: [u8; 19 + MARKER_LEN] =
    *b"LEASH-BUILD-MARKER:\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0";

/// The build marker, if one was set (printable ASCII up to the first NUL).
pub fn marker() -> Option<String> {
    // Through `black_box`: the bytes are read from the binary's data at run time, never folded
    // into the code as the constant they are at build time.
    let bytes: [u8; 19 + MARKER_LEN] = *std::hint::black_box(&MARKER);
    let m: Vec<u8> = bytes[MARKER_PREFIX.len()..]
        .iter()
        .copied()
        .take_while(|&b| b != 0)
        .filter(|b| b.is_ascii_graphic())
        .collect();
    (!m.is_empty()).then(|| String::from_utf8_lossy(&m).into_owned())
}

/// The version `status` reports: the package's, with the build marker after a `+`.
pub fn version() -> String {
    match marker() {
        Some(m) => format!("{}+{m}", env!("CARGO_PKG_VERSION")),
        None => env!("CARGO_PKG_VERSION").to_owned(),
    }
}
