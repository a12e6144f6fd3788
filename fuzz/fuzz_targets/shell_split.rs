//! Fuzz target: the legacy command tokeniser (`leash_core::legacy::shell_split`, the core's own
//! POSIX word splitter), which reads command lines an old gateway stored, possibly shell-quoted,
//! to compare them token by token with a live argv. Differential: whatever the input, it gives
//! the words `shlex::split` gives (the crate leash used before), or refuses where shlex refuses.
//! Any input must give tokens or a clear error, never a panic; and the tokens must survive a
//! round trip: quoted back (POSIX single quotes, and shlex's quoter) and split again, they come
//! out the same. A tokeniser that lost or merged tokens would make the legacy argv check compare
//! the wrong thing.
#![no_main]

use leash_core::legacy::shell_split;
use libfuzzer_sys::fuzz_target;

/// POSIX single-quoting: everything literal, `'` written as `'\''`.
fn quote(token: &str) -> String {
    format!("'{}'", token.replace('\'', r"'\''"))
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let ours = shell_split(text);
    assert_eq!(ours.clone().ok(), shlex::split(text), "split of {text:?}");
    let Ok(tokens) = ours else {
        return;
    };
    let requoted: Vec<String> = tokens.iter().map(|t| quote(t)).collect();
    let again = shell_split(&requoted.join(" ")).expect("re-quoted tokens always split");
    assert_eq!(again, tokens, "round trip of {text:?}");
    // The crate's quoter (it refuses NUL, which no shell word can hold).
    if let Ok(joined) = shlex::try_join(tokens.iter().map(String::as_str)) {
        let again = shell_split(&joined).expect("shlex-quoted tokens always split");
        assert_eq!(again, tokens, "shlex round trip of {text:?}");
    }
    // Whitespace outside quotes only separates: a command with no quote, backslash or comment
    // splits exactly like a split on the shell's three separators.
    if !text.contains(['\'', '"', '\\', '#']) {
        let plain: Vec<&str> = text
            .split([' ', '\t', '\n'])
            .filter(|t| !t.is_empty())
            .collect();
        assert_eq!(tokens, plain, "plain words of {text:?}");
    }
});
