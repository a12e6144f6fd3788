//! Fuzz target: the legacy command tokeniser (`leash::legacy::shell_split`), which reads command
//! lines an old gateway stored, possibly shell-quoted, to compare them token by token with a live
//! argv. Any input must give tokens or a clear error, never a panic; and the tokens must survive a
//! round trip: quoted back (POSIX single quotes) and split again, they come out the same. A
//! tokeniser that lost or merged tokens would make the legacy argv check compare the wrong thing.
#![no_main]

use leash::legacy::shell_split;
use libfuzzer_sys::fuzz_target;

/// POSIX single-quoting: everything literal, `'` written as `'\''`.
fn quote(token: &str) -> String {
    format!("'{}'", token.replace('\'', r"'\''"))
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(tokens) = shell_split(text) else {
        return;
    };
    let requoted: Vec<String> = tokens.iter().map(|t| quote(t)).collect();
    let again = shell_split(&requoted.join(" ")).expect("re-quoted tokens always split");
    assert_eq!(again, tokens, "round trip of {text:?}");
    // Whitespace outside quotes only separates: a command with no quote or backslash splits
    // exactly like split_whitespace on the shell's four separators.
    if !text.contains(['\'', '"', '\\']) {
        let plain: Vec<&str> = text
            .split([' ', '\t', '\n', '\r'])
            .filter(|t| !t.is_empty())
            .collect();
        assert_eq!(tokens, plain, "plain words of {text:?}");
    }
});
