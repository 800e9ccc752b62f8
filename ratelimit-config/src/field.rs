//! Reading one JSON value for a configuration field, the same way in the
//! team file and in the plugin configuration: a short description of what
//! was found, the checks both share (positive integers, booleans, strings,
//! objects, keys, header names), and their typed errors. Each error's
//! `Display` is the message shown after the field's path.

use std::fmt;

use serde_json::{Map, Value};

use crate::error::{cut, excerpt};

/// What a text that starts with a UTF-8 byte order mark is told; serde_json
/// would say "expected value at line 1 column 1".
pub const BOM_MESSAGE: &str = "starts with a UTF-8 byte order mark (BOM), which JSON does not allow: save it as UTF-8 without a BOM";

/// Whether `bytes` start with the UTF-8 byte order mark (EF BB BF).
pub fn starts_with_bom(bytes: &[u8]) -> bool {
    bytes.starts_with(b"\xEF\xBB\xBF")
}

/// A short description of a JSON value for error messages: `0`, `true`,
/// `string "9"`, `an array`; a long string is cut.
pub fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => {
            let (shown, cut) = cut(s);
            // JSON's quoting, of the string alone: a `Value`'s would link
            // serde_json's serialiser of every kind of value into the filter.
            let quoted = serde_json::to_string(shown).unwrap_or_default();
            match cut {
                false => format!("string {quoted}"),
                true => format!("string {quoted}… ({} bytes)", s.len()),
            }
        }
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// Why a JSON value is not what its field takes. `got` fields hold the
/// value as [`describe`] shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldError {
    /// 0, a negative number, a fraction, or not a number at all.
    NotPositiveInteger {
        got: String,
    },
    /// A positive integer that does not fit in 32 bits.
    AboveU32 {
        got: String,
    },
    /// A positive integer above the field's maximum; `unit` names what it
    /// counts when the number alone does not say.
    AboveMax {
        max: u32,
        got: u32,
        unit: Option<&'static str>,
    },
    /// A positive integer outside the field's range.
    OutOfRange {
        min: u32,
        max: u32,
        got: u32,
    },
    NotABool {
        got: String,
    },
    NotAString {
        got: String,
    },
    /// An empty string where a name is needed.
    Empty,
    /// A required key left out; says what it is for.
    Missing(&'static str),
    NotAnObject {
        got: String,
    },
    /// A key the object does not take.
    UnknownKey {
        key: String,
        expected: &'static [&'static str],
    },
    /// A string that is none of the field's names.
    NotOneOf {
        expected: Vec<&'static str>,
        got: String,
    },
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FieldError::NotPositiveInteger { got } => {
                write!(f, "must be a positive integer, got {got}")
            }
            FieldError::AboveU32 { got } => write!(
                f,
                "must be a positive integer at most {}, got {got}",
                u32::MAX
            ),
            FieldError::AboveMax { max, got, unit } => {
                write!(f, "must be at most {max}")?;
                if let Some(unit) = unit {
                    write!(f, " ({unit})")?;
                }
                write!(f, ", got {got}")
            }
            FieldError::OutOfRange { min, max, got } => {
                write!(f, "must be from {min} to {max}, got {got}")
            }
            FieldError::NotABool { got } => write!(f, "must be true or false, got {got}"),
            FieldError::NotAString { got } => write!(f, "must be a string, got {got}"),
            FieldError::Empty => f.write_str("must not be empty"),
            FieldError::Missing(what) => write!(f, "missing: {what}"),
            FieldError::NotAnObject { got } => write!(f, "must be an object, got {got}"),
            FieldError::UnknownKey { key, expected } => write!(
                f,
                "unknown key {}, expected one of {}",
                excerpt(key),
                expected.join(", ")
            ),
            FieldError::NotOneOf { expected, got } => {
                f.write_str("must be one of ")?;
                for (i, name) in expected.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{name:?}")?;
                }
                write!(f, ", got {got}")
            }
        }
    }
}

impl std::error::Error for FieldError {}

/// A positive integer that fits in u32.
pub fn positive_u32(v: &Value) -> Result<u32, FieldError> {
    match v.as_u64() {
        Some(n) if n > 0 => {
            u32::try_from(n).map_err(|_| FieldError::AboveU32 { got: n.to_string() })
        }
        // A whole number past 64 bits reads as a float: too large, not "not
        // an integer".
        None if v
            .as_f64()
            .is_some_and(|f| f.fract() == 0.0 && f > f64::from(u32::MAX)) =>
        {
            Err(FieldError::AboveU32 { got: describe(v) })
        }
        _ => Err(FieldError::NotPositiveInteger { got: describe(v) }),
    }
}

/// A positive integer of at most `max`.
pub fn positive_u32_at_most(v: &Value, max: u32) -> Result<u32, FieldError> {
    match positive_u32(v)? {
        n if n <= max => Ok(n),
        got => Err(FieldError::AboveMax {
            max,
            got,
            unit: None,
        }),
    }
}

/// A positive integer from `min` to `max`.
pub fn positive_u32_in(v: &Value, min: u32, max: u32) -> Result<u32, FieldError> {
    match positive_u32(v)? {
        n if (min..=max).contains(&n) => Ok(n),
        got => Err(FieldError::OutOfRange { min, max, got }),
    }
}

pub fn boolean(v: &Value) -> Result<bool, FieldError> {
    v.as_bool()
        .ok_or_else(|| FieldError::NotABool { got: describe(v) })
}

pub fn string(v: &Value) -> Result<&str, FieldError> {
    v.as_str()
        .ok_or_else(|| FieldError::NotAString { got: describe(v) })
}

pub fn non_empty_string(v: &Value) -> Result<&str, FieldError> {
    match string(v)? {
        "" => Err(FieldError::Empty),
        s => Ok(s),
    }
}

pub fn object(v: &Value) -> Result<&Map<String, Value>, FieldError> {
    v.as_object()
        .ok_or_else(|| FieldError::NotAnObject { got: describe(v) })
}

/// The keys of `obj` that are not in `allowed`, each with its error.
pub fn unknown_keys<'a>(
    obj: &'a Map<String, Value>,
    allowed: &'static [&'static str],
) -> impl Iterator<Item = (&'a String, FieldError)> + 'a {
    obj.keys()
        .filter(move |key| !allowed.contains(&key.as_str()))
        .map(move |key| {
            let e = FieldError::UnknownKey {
                key: key.clone(),
                expected: allowed,
            };
            (key, e)
        })
}

/// Why a string is not a header name Envoy can match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeaderNameError {
    Empty,
    /// Envoy matches header names in lowercase: this one could never match.
    Uppercase(String),
    /// Not made of RFC 9110 token characters.
    NotAToken(String),
}

impl fmt::Display for HeaderNameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderNameError::Empty => f.write_str("the header name is empty"),
            HeaderNameError::Uppercase(name) => write!(
                f,
                "header name {} must be lowercase (Envoy matches header names in lowercase)",
                excerpt(name)
            ),
            HeaderNameError::NotAToken(name) => write!(
                f,
                "header name {} is not a valid HTTP header name",
                excerpt(name)
            ),
        }
    }
}

impl std::error::Error for HeaderNameError {}

/// RFC 9110 token characters, lowercase only.
pub fn header_name(name: &str) -> Result<(), HeaderNameError> {
    if name.is_empty() {
        return Err(HeaderNameError::Empty);
    }
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(HeaderNameError::Uppercase(name.to_string()));
    }
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if !name.bytes().all(tchar) {
        return Err(HeaderNameError::NotAToken(name.to_string()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn shown<T: fmt::Debug>(r: Result<T, FieldError>) -> Result<T, String> {
        r.map_err(|e| e.to_string())
    }

    #[test]
    fn positive_integers_say_what_they_got() {
        assert_eq!(shown(positive_u32(&json!(7))), Ok(7));
        for (v, got) in [
            (json!(0), "0"),
            (json!(-5), "-5"),
            (json!(2.5), "2.5"),
            (json!("9"), "string \"9\""),
            (json!(null), "null"),
            (json!([1]), "an array"),
        ] {
            assert_eq!(
                shown(positive_u32(&v)),
                Err(format!("must be a positive integer, got {got}"))
            );
        }
        assert_eq!(
            shown(positive_u32(&json!(4_294_967_296u64))),
            Err("must be a positive integer at most 4294967295, got 4294967296".into())
        );
        // Past 64 bits serde_json holds a float: still "too large" (the CLI
        // shows the number as written).
        assert_eq!(
            shown(positive_u32(&json!(1e20))),
            Err("must be a positive integer at most 4294967295, got 1e+20".into())
        );
        assert_eq!(
            shown(positive_u32_at_most(&json!(11), 10)),
            Err("must be at most 10, got 11".into())
        );
        assert_eq!(
            shown(positive_u32_in(&json!(5), 10, 20)),
            Err("must be from 10 to 20, got 5".into())
        );
        assert_eq!(shown(positive_u32_in(&json!(20), 10, 20)), Ok(20));
    }

    #[test]
    fn strings_are_shown_quoted_as_json_quotes_them() {
        assert_eq!(
            describe(&json!("a\"b\u{1}\u{e9}")),
            "string \"a\\\"b\\u0001\u{e9}\""
        );
        let long = "x".repeat(100);
        assert_eq!(
            describe(&json!(long)),
            format!("string \"{}\"… (100 bytes)", "x".repeat(64))
        );
    }

    #[test]
    fn typed_values_say_what_they_got() {
        assert_eq!(
            shown(boolean(&json!("yes"))),
            Err("must be true or false, got string \"yes\"".into())
        );
        assert_eq!(
            shown(non_empty_string(&json!(""))),
            Err("must not be empty".into())
        );
        assert_eq!(
            shown(non_empty_string(&json!(7))),
            Err("must be a string, got 7".into())
        );
        assert_eq!(
            shown(object(&json!([]))).map(|_| ()),
            Err("must be an object, got an array".into())
        );
        let got = FieldError::NotOneOf {
            expected: vec!["a", "b"],
            got: describe(&json!("c")),
        };
        assert_eq!(
            got.to_string(),
            "must be one of \"a\", \"b\", got string \"c\""
        );
        let obj = json!({"a": 1, "zz": 2});
        let unknown: Vec<String> = unknown_keys(obj.as_object().unwrap(), &["a", "b"])
            .map(|(k, e)| format!("{k}: {e}"))
            .collect();
        assert_eq!(
            unknown,
            vec!["zz: unknown key \"zz\", expected one of a, b"]
        );
    }

    #[test]
    fn header_names_are_lowercase_tokens() {
        assert_eq!(header_name("x-tenant-id"), Ok(()));
        assert_eq!(
            header_name("").unwrap_err().to_string(),
            "the header name is empty"
        );
        assert_eq!(
            header_name("X-T").unwrap_err().to_string(),
            "header name \"X-T\" must be lowercase (Envoy matches header names in lowercase)"
        );
        assert_eq!(
            header_name("x t").unwrap_err().to_string(),
            "header name \"x t\" is not a valid HTTP header name"
        );
    }
}
