//! A UUID's text and the time it carries: how `plan::plan_strays` reads a stray cgroup's name as
//! a lease id (leash names every lease id as a UUID v7, whose first 48 bits are its Unix time in
//! milliseconds). Written here so the core depends on serde alone; it reads exactly what the
//! `uuid` crate's `Uuid::parse_str` and `get_timestamp` read (the tests compare the two over
//! random UUIDs in every form, and over their near misses).

/// The 16 bytes of a UUID, in any of the four forms `Uuid::parse_str` accepts: 32 hex digits;
/// 36 with hyphens at 8, 13, 18 and 23 (the canonical form leash writes); that in braces; or that
/// after `urn:uuid:` (in any case). Hex digits may be of either case. `None` for anything else.
pub fn parse(text: &str) -> Option<[u8; 16]> {
    let s = text.as_bytes();
    let hyphenated = match s.len() {
        32 => return decode_hex(s.iter().copied()),
        36 => s,
        38 if s[0] == b'{' && s[37] == b'}' => &s[1..37],
        45 if s[..9].eq_ignore_ascii_case(b"urn:uuid:") => &s[9..],
        _ => return None,
    };
    if [8, 13, 18, 23].iter().any(|&i| hyphenated[i] != b'-') {
        return None;
    }
    decode_hex(
        hyphenated
            .iter()
            .enumerate()
            .filter(|(i, _)| ![8, 13, 18, 23].contains(i))
            .map(|(_, b)| *b),
    )
}

/// 32 hex digits (the caller has checked their count) as 16 bytes.
fn decode_hex(digits: impl Iterator<Item = u8>) -> Option<[u8; 16]> {
    let mut out = [0u8; 16];
    for (i, d) in digits.enumerate() {
        let v = char::from(d).to_digit(16)? as u8;
        out[i / 2] |= if i % 2 == 0 { v << 4 } else { v };
    }
    Some(out)
}

/// What `Uuid::get_timestamp` followed by `to_unix` gives, in milliseconds since the Unix epoch:
/// by the version nibble (the high 4 bits of byte 6, the variant not looked at), a v7's 48-bit
/// millisecond prefix; a v1's or v6's 60-bit count of 100 ns since 1582-10-15 (wrapping, as uuid
/// does, for a count before 1970); `None` for any other version.
pub fn time_ms(uuid: &[u8; 16]) -> Option<i64> {
    /// 100 ns ticks from 1582-10-15 to 1970-01-01.
    const TICKS_BETWEEN_EPOCHS: u64 = 0x01B2_1DD2_1381_4000;
    let b = uuid.map(u64::from);
    let ticks = match uuid[6] >> 4 {
        7 => {
            let ms = b[0] << 40 | b[1] << 32 | b[2] << 24 | b[3] << 16 | b[4] << 8 | b[5];
            return Some(ms as i64);
        }
        1 => {
            (b[6] & 0xf) << 56
                | b[7] << 48
                | b[4] << 40
                | b[5] << 32
                | b[0] << 24
                | b[1] << 16
                | b[2] << 8
                | b[3]
        }
        6 => {
            b[0] << 52
                | b[1] << 44
                | b[2] << 36
                | b[3] << 28
                | b[4] << 20
                | b[5] << 12
                | (b[6] & 0xf) << 8
                | b[7]
        }
        _ => return None,
    };
    let since_unix = ticks.wrapping_sub(TICKS_BETWEEN_EPOCHS);
    let (secs, nanos) = (since_unix / 10_000_000, (since_unix % 10_000_000) * 100);
    Some(secs as i64 * 1000 + nanos as i64 / 1_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The same reading done by the `uuid` crate: what this module must agree with.
    fn by_uuid(text: &str) -> Option<([u8; 16], Option<i64>)> {
        let u = ::uuid::Uuid::parse_str(text).ok()?;
        let ms = u.get_timestamp().map(|t| {
            let (s, n) = t.to_unix();
            (s as i64) * 1000 + (n as i64) / 1_000_000
        });
        Some((*u.as_bytes(), ms))
    }

    fn ours(text: &str) -> Option<([u8; 16], Option<i64>)> {
        parse(text).map(|b| (b, time_ms(&b)))
    }

    /// The four forms uuid writes, in lower, upper and mixed case.
    fn forms(bytes: [u8; 16]) -> Vec<String> {
        let u = ::uuid::Uuid::from_bytes(bytes);
        let mut out = vec![
            u.hyphenated().to_string(),
            u.simple().to_string(),
            u.braced().to_string(),
            u.urn().to_string(),
        ];
        let upper: Vec<String> = out.iter().map(|s| s.to_ascii_uppercase()).collect();
        let mixed: Vec<String> = out
            .iter()
            .map(|s| {
                s.chars()
                    .enumerate()
                    .map(|(i, c)| {
                        if i % 3 == 0 {
                            c.to_ascii_uppercase()
                        } else {
                            c
                        }
                    })
                    .collect()
            })
            .collect();
        out.extend(upper);
        out.extend(mixed);
        out
    }

    #[test]
    fn a_lease_id_and_its_time() {
        // A v7 made at 2025-01-01T00:00:00Z (1735689600000 ms).
        let id = "01941f29-7c00-7abc-8def-0123456789ab";
        assert_eq!(ours(id), by_uuid(id));
        assert_eq!(time_ms(&parse(id).unwrap()), Some(1_735_689_600_000));
        // A v4 carries no time; a name that is no UUID parses to nothing.
        let v4 = "0b5c1e6a-2f1d-4c3b-9a8e-7d6c5b4a3f2e";
        assert_eq!(time_ms(&parse(v4).unwrap()), None);
        for bad in [
            "",
            "lease",
            "01941f29-7c00-7abc-8def-0123456789a",
            "01941f29_7c00-7abc-8def-0123456789ab",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
            assert_eq!(by_uuid(bad), None, "{bad:?}");
        }
    }

    proptest! {
        /// Any UUID, in any form and case, with any version nibble: the bytes and the time uuid
        /// read.
        #[test]
        fn reads_what_uuid_reads(mut bytes in any::<[u8; 16]>(), version in 0u8..16) {
            bytes[6] = (bytes[6] & 0x0f) | (version << 4);
            for text in forms(bytes) {
                prop_assert_eq!(ours(&text), by_uuid(&text), "{}", text);
            }
        }

        /// Near misses: one character of a valid form replaced by a hex digit, a hyphen, a brace,
        /// a letter of the URN prefix or something else; a character cut or added.
        #[test]
        fn refuses_what_uuid_refuses(
            bytes in any::<[u8; 16]>(),
            form in 0usize..12,
            at in any::<usize>(),
            with in proptest::sample::select(vec!['0', 'f', 'F', 'g', '-', '{', '}', ':', 'u', 'N', ' ', 'é']),
            edit in 0u8..3,
        ) {
            let mut chars: Vec<char> = forms(bytes)[form].chars().collect();
            let at = at % chars.len();
            match edit {
                0 => chars[at] = with,
                1 => { chars.remove(at); }
                _ => chars.insert(at, with),
            }
            let text: String = chars.into_iter().collect();
            prop_assert_eq!(ours(&text), by_uuid(&text), "{}", text);
        }
    }
}
