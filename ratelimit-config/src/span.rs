//! Where each value of a JSON text is: a map from the JSON path the
//! validator uses (`x-tenant-id.group_1.perminute`, `header_value[2]`) to the
//! line and column of the value, and of the key that names it.
//!
//! `serde_json::Value` keeps no positions, so the CLI scans the text once
//! more. The scan is a pure function of the text and never panics; on text
//! that is not JSON it stops and keeps what it found (callers parse with
//! serde_json first, which reports syntax errors with their position).
//! It also finds what serde_json silently drops: a key given twice in one
//! object, of which only the last value survives.

use std::collections::HashMap;

use crate::json_text::{walk, Visit};
pub use crate::json_text::{DuplicateKey, Position, MAX_DEPTH};

/// Where a value starts, and where the key naming it starts (object
/// members only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub key: Option<Position>,
    pub value: Position,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceMap {
    spans: HashMap<String, Span>,
    duplicates: Vec<DuplicateKey>,
}

impl SourceMap {
    pub fn get(&self, path: &str) -> Option<Span> {
        self.spans.get(path).copied()
    }

    /// Records where `path` is (for texts other than JSON: `yaml_in`).
    pub fn insert(&mut self, path: String, span: Span) {
        self.spans.insert(path, span);
    }

    pub fn duplicates(&self) -> &[DuplicateKey] {
        &self.duplicates
    }

    /// Where to point for `path`: its key when `key` is asked for and it
    /// has one, else its value; for a path that is not in the text (a
    /// missing member), the nearest enclosing value; else the start.
    pub fn locate(&self, path: &str, key: bool) -> Position {
        if let Some(span) = self.spans.get(path) {
            return match (key, span.key) {
                (true, Some(k)) => k,
                _ => span.value,
            };
        }
        let mut p = path;
        while !p.is_empty() {
            p = parent(p);
            if let Some(span) = self.spans.get(p) {
                return span.value;
            }
        }
        Position::START
    }
}

/// `a.b[2]` → `a.b` → `a` → ``.
fn parent(path: &str) -> &str {
    match path.rfind(['.', '[']) {
        Some(i) => path.get(..i).unwrap_or(""),
        None => "",
    }
}

/// Scans `text` for the position of every value.
pub fn scan(text: &str) -> SourceMap {
    let mut map = SourceMap::default();
    walk(text, &mut map);
    map
}

impl Visit for SourceMap {
    fn value(&mut self, path: &str, key: Option<Position>, value: Position) {
        self.spans.insert(path.to_string(), Span { key, value });
    }

    fn duplicate(&mut self, d: DuplicateKey) {
        // serde_json keeps the last value: forget the first one's, and
        // everything under it.
        let dot = format!("{}.", d.path);
        let bracket = format!("{}[", d.path);
        self.spans
            .retain(|p, _| p != &d.path && !p.starts_with(&dot) && !p.starts_with(&bracket));
        self.duplicates.push(d);
    }
}

/// serde_json reports columns in bytes; this counts characters, as
/// [`Position`] does.
pub fn char_column(text: &str, line: usize, byte_column: usize) -> usize {
    let Some(l) = text.split('\n').nth(line.saturating_sub(1)) else {
        return byte_column;
    };
    let bytes = byte_column.saturating_sub(1).min(l.len());
    let mut end = bytes;
    while !l.is_char_boundary(end) {
        end -= 1;
    }
    l.get(..end).map_or(byte_column, |s| s.chars().count() + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::join;
    use proptest::prelude::*;
    use serde_json::Value;

    fn pos(line: usize, column: usize) -> Position {
        Position { line, column }
    }

    const SEED: &str = r#"{
  "x-tenant-id": {
    "default": { "persecond": 5,  "perminute": 20, "perhour": 30 },
    "group_1": { "persecond": 50, "perminute": -5, "perhour": 100,
                 "header_value": ["tenant-b", "tenant-c"] }
  }
}
"#;

    #[test]
    fn values_and_keys_of_the_seed() {
        let m = scan(SEED);
        assert_eq!(
            m.get(""),
            Some(Span {
                key: None,
                value: pos(1, 1)
            })
        );
        assert_eq!(
            m.get("x-tenant-id"),
            Some(Span {
                key: Some(pos(2, 3)),
                value: pos(2, 18)
            })
        );
        assert_eq!(
            m.get("x-tenant-id.group_1.perminute"),
            Some(Span {
                key: Some(pos(4, 35)),
                value: pos(4, 48)
            })
        );
        assert_eq!(
            m.get("x-tenant-id.group_1.header_value[1]"),
            Some(Span {
                key: None,
                value: pos(5, 47)
            })
        );
        assert!(m.duplicates().is_empty());
    }

    #[test]
    fn missing_paths_point_at_the_nearest_enclosing_value() {
        let m = scan(SEED);
        assert_eq!(
            m.locate("x-tenant-id.default.header_value", false),
            pos(3, 16)
        );
        assert_eq!(m.locate("x-tenant-id.group_1.perminute", true), pos(4, 35));
        assert_eq!(m.locate("x-tenant-id.group_1.perminute", false), pos(4, 48));
        assert_eq!(m.locate("nothing.here[3]", false), pos(1, 1));
        assert_eq!(m.locate("", true), pos(1, 1));
    }

    #[test]
    fn escaped_keys_are_decoded_and_columns_count_characters() {
        let m = scan("{\"x\\u002dt\u{e9}\": {\"\u{e9}\u{e9}\": [1, \"a\\\"b\", 2]}}");
        assert_eq!(m.get("x-t\u{e9}").map(|s| s.value), Some(pos(1, 15)));
        assert_eq!(
            m.get("x-t\u{e9}.\u{e9}\u{e9}[2]").map(|s| s.value),
            Some(pos(1, 34))
        );
    }

    #[test]
    fn a_duplicate_key_keeps_the_last_value_as_serde_json_does() {
        let text = "{\"g\": {\"a\": [1, 2], \"b\": 1,\n \"a\": 3}}";
        let m = scan(text);
        assert_eq!(
            m.duplicates(),
            &[DuplicateKey {
                path: "g.a".into(),
                key: "a".into(),
                at: pos(2, 2),
                first: pos(1, 8),
            }]
        );
        assert_eq!(m.get("g.a").map(|s| s.value), Some(pos(2, 7)));
        assert_eq!(m.get("g.a[0]"), None);
        let v: Value = serde_json::from_str(text).unwrap();
        assert_eq!(v["g"]["a"], 3);
    }

    #[test]
    fn text_that_is_not_json_keeps_what_was_found() {
        let m = scan("{\"a\": {\"b\": 1,, \"c\": 2}}");
        assert_eq!(m.get("a.b").map(|s| s.value), Some(pos(1, 13)));
        assert_eq!(m.get("a.c"), None);
        for bad in [
            "", "{", "[", "\"", "{\"a\"", "{\"a\":", "[1,", "{\"\\", "}", "\u{0}",
        ] {
            let _ = scan(bad);
        }
    }

    #[test]
    fn nesting_deeper_than_serde_json_accepts_stops_the_scan() {
        let deep = "[".repeat(100_000);
        let m = scan(&deep);
        assert!(m.get("").is_some());
        assert!(m.spans.len() <= MAX_DEPTH + 1);
    }

    #[test]
    fn serde_json_byte_columns_become_character_columns() {
        let text = "{\"\u{e9}\u{e9}\": x}";
        let e = serde_json::from_str::<Value>(text).unwrap_err();
        assert_eq!((e.line(), e.column()), (1, 10));
        assert_eq!(char_column(text, e.line(), e.column()), 8);
        assert_eq!(char_column(text, 9, 4), 4);
    }

    /// Every path of the parsed value is in the map, and its value position
    /// is where that value's text starts.
    fn check_positions(text: &str, v: &Value, path: &str, m: &SourceMap) {
        let span = m
            .get(path)
            .unwrap_or_else(|| panic!("no span for {path:?}"));
        let line = text.split('\n').nth(span.value.line - 1).unwrap();
        let rest: String = line.chars().skip(span.value.column - 1).collect();
        let first = rest.chars().next().unwrap();
        match v {
            Value::Object(o) => {
                assert_eq!(first, '{', "{path}");
                for (k, child) in o {
                    check_positions(text, child, &join(path, k), m);
                }
            }
            Value::Array(a) => {
                assert_eq!(first, '[', "{path}");
                for (i, child) in a.iter().enumerate() {
                    check_positions(text, child, &format!("{path}[{i}]"), m);
                }
            }
            Value::String(_) => assert_eq!(first, '"', "{path}"),
            _ => assert!(rest.starts_with(&v.to_string()), "{path}: {rest}"),
        }
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            "[a-z\u{e9}\"\\\\ ]{0,6}".prop_map(Value::String),
        ];
        leaf.prop_recursive(5, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::vec(("[a-z_.\u{e9}-]{1,5}", inner), 0..5)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn positions_of_compact_and_pretty_json(v in json_value()) {
            let compact = serde_json::to_string(&v).unwrap();
            let pretty = serde_json::to_string_pretty(&v).unwrap();
            for text in [compact, pretty] {
                let m = scan(&text);
                // A key containing '.' can make two paths the same string;
                // skip those documents, the validator's paths are ambiguous too.
                if !text.contains('.') {
                    check_positions(&text, &v, "", &m);
                }
                prop_assert!(m.duplicates().is_empty());
            }
        }

        #[test]
        fn any_text_is_scanned_without_panicking(text in "\\PC{0,64}") {
            let m = scan(&text);
            let _ = m.locate("a.b[1]", true);
        }

        #[test]
        fn truncated_json_is_scanned_without_panicking(v in json_value(), cut in 0usize..200) {
            let text = serde_json::to_string_pretty(&v).unwrap();
            let end = text.char_indices().map(|(i, _)| i).nth(cut).unwrap_or(text.len());
            let _ = scan(&text[..end]);
        }
    }
}
