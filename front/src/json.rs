//! A small JSON reader for what the front door reads: the lock file (`{"pid":…,"socket":…}`) and
//! the daemon's one-line answer. Strict where it matters (a malformed document is `None`, never a
//! guess), small where it does not: numbers are integers (a fraction or an exponent is refused:
//! nothing the front door reads has one), strings are bytes with their escapes decoded (UTF-8 is
//! passed through unchecked: every string read is handed on as it is), and nesting is bounded.

use alloc::vec::Vec;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Json {
    Null,
    Bool(bool),
    Int(i64),
    Str(Vec<u8>),
    Arr(Vec<Json>),
    Obj(Vec<(Vec<u8>, Json)>),
}

/// Deeper documents are refused (the stack of the front door is the process's own).
const MAX_DEPTH: usize = 16;

impl Json {
    /// The member `key` of an object (the first, when a key repeats).
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(m) => m.iter().find(|(k, _)| k == key.as_bytes()).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Json::Int(n) => Some(*n),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Json::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Json]> {
        match self {
            Json::Arr(a) => Some(a),
            _ => None,
        }
    }

    /// An array of strings, every element one.
    pub fn as_strings(&self) -> Option<Vec<&[u8]>> {
        self.as_array()?.iter().map(Json::as_bytes).collect()
    }
}

/// Parses one JSON document (surrounding whitespace allowed, nothing else after it).
pub fn parse(input: &[u8]) -> Option<Json> {
    let mut p = Parser { s: input, i: 0 };
    let v = p.value(0)?;
    p.ws();
    (p.i == p.s.len()).then_some(v)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self
            .s
            .get(self.i)
            .is_some_and(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r'))
        {
            self.i += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    fn lit(&mut self, word: &[u8], v: Json) -> Option<Json> {
        self.s[self.i..].starts_with(word).then(|| {
            self.i += word.len();
            v
        })
    }

    fn value(&mut self, depth: usize) -> Option<Json> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.ws();
        match self.peek()? {
            b'n' => self.lit(b"null", Json::Null),
            b't' => self.lit(b"true", Json::Bool(true)),
            b'f' => self.lit(b"false", Json::Bool(false)),
            b'"' => self.string().map(Json::Str),
            b'[' => {
                self.i += 1;
                let mut items = Vec::new();
                self.ws();
                if self.eat(b']').is_some() {
                    return Some(Json::Arr(items));
                }
                loop {
                    items.push(self.value(depth + 1)?);
                    self.ws();
                    match self.peek()? {
                        b',' => self.i += 1,
                        b']' => {
                            self.i += 1;
                            return Some(Json::Arr(items));
                        }
                        _ => return None,
                    }
                }
            }
            b'{' => {
                self.i += 1;
                let mut members = Vec::new();
                self.ws();
                if self.eat(b'}').is_some() {
                    return Some(Json::Obj(members));
                }
                loop {
                    self.ws();
                    let k = self.string()?;
                    self.ws();
                    self.eat(b':')?;
                    let v = self.value(depth + 1)?;
                    members.push((k, v));
                    self.ws();
                    match self.peek()? {
                        b',' => self.i += 1,
                        b'}' => {
                            self.i += 1;
                            return Some(Json::Obj(members));
                        }
                        _ => return None,
                    }
                }
            }
            b'-' | b'0'..=b'9' => self.int(),
            _ => None,
        }
    }

    fn int(&mut self) -> Option<Json> {
        let neg = self.eat(b'-').is_some();
        let start = self.i;
        let mut n: i64 = 0;
        while let Some(c @ b'0'..=b'9') = self.peek() {
            n = n.checked_mul(10)?.checked_sub(i64::from(c - b'0'))?;
            self.i += 1;
        }
        let digits = self.i - start;
        if digits == 0 || (digits > 1 && self.s[start] == b'0') {
            return None;
        }
        if matches!(self.peek(), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        // Accumulated negative, so i64::MIN reads too.
        Some(Json::Int(if neg { n } else { n.checked_neg()? }))
    }

    fn hex4(&mut self) -> Option<u32> {
        let h = self.s.get(self.i..self.i + 4)?;
        self.i += 4;
        h.iter().try_fold(0u32, |acc, &c| {
            let d = match c {
                b'0'..=b'9' => c - b'0',
                b'a'..=b'f' => c - b'a' + 10,
                b'A'..=b'F' => c - b'A' + 10,
                _ => return None,
            };
            Some(acc * 16 + u32::from(d))
        })
    }

    fn string(&mut self) -> Option<Vec<u8>> {
        self.eat(b'"')?;
        let mut out = Vec::new();
        loop {
            let c = self.peek()?;
            self.i += 1;
            match c {
                b'"' => return Some(out),
                b'\\' => {
                    let e = self.peek()?;
                    self.i += 1;
                    let ch = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hi = self.hex4()?;
                            let code = if (0xd800..0xdc00).contains(&hi) {
                                self.eat(b'\\')?;
                                self.eat(b'u')?;
                                let lo = self.hex4()?;
                                if !(0xdc00..0xe000).contains(&lo) {
                                    return None;
                                }
                                0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00)
                            } else {
                                hi
                            };
                            char::from_u32(code)?
                        }
                        _ => return None,
                    };
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                }
                0..=0x1f => return None,
                _ => out.push(c),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec;

    #[test]
    fn reads_what_serde_json_writes() {
        let text = br#" {"pid":123,"socket":"/run/a\"b\\c\/d","startedAt":1796284600270,
            "neg":-5,"ok":true,"no":false,"n":null,"arr":["x","\u00e9\ud83d\ude00",[]],"o":{}} "#;
        let v = parse(text).unwrap();
        assert_eq!(v.get("pid").and_then(Json::as_i64), Some(123));
        assert_eq!(
            v.get("socket").and_then(Json::as_bytes),
            Some(&b"/run/a\"b\\c/d"[..])
        );
        assert_eq!(
            v.get("startedAt").and_then(Json::as_i64),
            Some(1796284600270)
        );
        assert_eq!(v.get("neg").and_then(Json::as_i64), Some(-5));
        assert_eq!(v.get("ok").and_then(Json::as_bool), Some(true));
        assert_eq!(v.get("no").and_then(Json::as_bool), Some(false));
        assert_eq!(v.get("n"), Some(&Json::Null));
        let arr = v.get("arr").unwrap().as_array().unwrap();
        assert_eq!(arr[1].as_bytes().unwrap(), "é😀".as_bytes());
        assert_eq!(arr[2], Json::Arr(vec![]));
        assert_eq!(v.get("o"), Some(&Json::Obj(vec![])));
        assert_eq!(v.get("missing"), None);
        assert_eq!(
            parse(br#"{"a":["x","y"]}"#)
                .unwrap()
                .get("a")
                .unwrap()
                .as_strings(),
            Some(vec![&b"x"[..], &b"y"[..]])
        );
        assert_eq!(parse(b"-9223372036854775808"), Some(Json::Int(i64::MIN)));
        assert_eq!(parse(b"9223372036854775807"), Some(Json::Int(i64::MAX)));
    }

    #[test]
    fn refuses_what_is_not_json_or_not_read_here() {
        let bad: &[&[u8]] = &[
            b"",
            b"{",
            b"{\"a\":1,}",
            b"[1 2]",
            b"\"unterminated",
            b"\"raw\ncontrol\"",
            b"\"\\x\"",
            b"\"\\ud800\"",
            b"\"\\udc00\\u0041\"",
            b"01",
            b"1.5",
            b"1e3",
            b"-",
            b"9223372036854775808",
            b"tru",
            b"{} {}",
            b"{1:2}",
        ];
        for b in bad {
            assert_eq!(
                parse(b),
                None,
                "{:?}",
                std::string::String::from_utf8_lossy(b)
            );
        }
        let deep = [b"[".repeat(18), b"]".repeat(18)].concat();
        assert_eq!(parse(&deep), None);
        let ok = [b"[".repeat(17), b"]".repeat(17)].concat();
        assert!(parse(&ok).is_some());
    }
}
