//! Strict parsing of a request line into a JSON value: an object with the same key twice is
//! refused instead of "last one wins".
//!
//! serde_json keeps the last of two equal keys, so `{"op":"reap","dryRun":true,"dryRun":false}`
//! would run a real reap while a careful reader (or a proxy that checked the first value) saw a
//! dry run. Which value a duplicate means is not ours to guess, so the whole request is refused.
//! Pure: no I/O; a fuzz target can call [`parse`] on any text.

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use std::fmt;

/// Parses `text` as one JSON value, refusing duplicate object keys at any depth. The error is
/// serde_json's message (it names the line and column).
pub fn parse(text: &str) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let v = StrictSeed.deserialize(&mut de)?;
    de.end()?;
    Ok(v)
}

struct StrictSeed;

impl<'de> DeserializeSeed<'de> for StrictSeed {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(StrictSeed)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                // Shown shortened: the key is the sender's and may be any length.
                return Err(de::Error::custom(format!(
                    "duplicate key {}: send each field once",
                    leash_core::limits::show_key(&key)
                )));
            }
            let v = map.next_value_seed(StrictSeed)?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn duplicate_keys_are_refused_at_any_depth() {
        let e = parse(r#"{"op":"reap","dryRun":true,"dryRun":false}"#).unwrap_err();
        assert!(e.to_string().contains("duplicate key \"dryRun\""), "{e}");
        assert!(parse(r#"{"id":1,"id":2}"#).is_err());
        assert!(parse(r#"{"a":[{"b":1,"b":1}]}"#).is_err());
        assert!(parse(r#"{"env":{"X":"1","X":"2"}}"#).is_err());
        let long = "k".repeat(100_000);
        let e = parse(&format!(r#"{{"{long}":1,"{long}":2}}"#)).unwrap_err();
        assert!(
            e.to_string().len() < 300,
            "the message echoes the key whole"
        );
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(parse(&deep).is_err());
        let deep = "{\"a\":".repeat(100_000);
        assert!(parse(&deep).is_err());
    }

    #[test]
    fn ordinary_json_parses_as_serde_json_does() {
        for text in [
            r#"{"id":1,"op":"status"}"#,
            r#"{"a":[1,-2,3.5,"x",null,true,{"b":{}}],"c":18446744073709551615}"#,
            r#"[]"#,
            r#""s""#,
        ] {
            assert_eq!(
                parse(text).unwrap(),
                serde_json::from_str::<Value>(text).unwrap()
            );
        }
        assert!(parse(r#"{"a":1} x"#).is_err(), "trailing garbage");
        assert_eq!(parse(r#"{"a":{"a":1}}"#).unwrap(), json!({"a":{"a":1}}));
    }
}
