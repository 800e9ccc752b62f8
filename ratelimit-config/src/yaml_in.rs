//! YAML read into JSON values as Kubernetes reads a manifest (Go's
//! sigs.k8s.io/yaml: YAML 1.1 scalars, then JSON), keeping where each value
//! is, so that a problem in a WasmPlugin's `pluginConfig` or an
//! EnvoyExtensionPolicy's `config` is reported at its line in the file.
//! What `check` reads deployed files with. CLI only.

use serde_json::{Map, Number, Value};

use crate::check::yaml_tree::{load_yaml_documents, Marked, Node};
use crate::error::{excerpt, join};
use crate::span::{Position, SourceMap, Span};

/// A value converted from YAML, with the position of everything under it
/// (paths relative to it, as the plugin configuration's parser names them)
/// and the problems met (a key given twice, a key that is not a string).
#[derive(Debug, Default)]
pub struct Converted {
    pub value: Value,
    pub spans: SourceMap,
    pub problems: Vec<(Position, String)>,
}

/// Converts the YAML node `m`.
pub fn convert(m: &Marked) -> Converted {
    let mut c = Converted::default();
    c.value = value(m, "", None, &mut c);
    c
}

fn value(m: &Marked, path: &str, key: Option<Position>, c: &mut Converted) -> Value {
    c.spans.insert(path.to_string(), Span { key, value: m.at });
    match &m.node {
        Node::Scalar { text, plain, .. } => {
            if *plain {
                resolve(text)
            } else {
                Value::String(text.clone())
            }
        }
        Node::Seq(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, item)| value(item, &format!("{path}[{i}]"), None, c))
                .collect(),
        ),
        Node::Map(entries) => {
            let mut out = Map::new();
            for (k, at, v) in entries {
                if out.contains_key(k) {
                    c.problems.push((
                        *at,
                        format!(
                            "{}: duplicate key {}: the API server refuses the document",
                            join(path, k),
                            excerpt(k)
                        ),
                    ));
                }
                let converted = value(v, &join(path, k), Some(*at), c);
                out.insert(k.clone(), converted);
            }
            Value::Object(out)
        }
    }
}

/// A plain scalar as YAML 1.1 reads it (what Kubernetes' YAML reader does):
/// null, a boolean (`yes`, `off`, …), an integer (decimal, `0x`, `0o`,
/// YAML 1.1's leading-zero octal), a float, else a string.
pub fn resolve(text: &str) -> Value {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            return Value::Bool(true)
        }
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            return Value::Bool(false)
        }
        _ => {}
    }
    if let Some(n) = integer(text) {
        return n;
    }
    let looks_numeric = text
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-' | b'_'))
        && text.bytes().any(|b| b.is_ascii_digit());
    if looks_numeric {
        if let Some(n) = text
            .replace('_', "")
            .parse::<f64>()
            .ok()
            .and_then(Number::from_f64)
        {
            return Value::Number(n);
        }
    }
    Value::String(text.to_string())
}

fn integer(text: &str) -> Option<Value> {
    let (negative, digits) = match text.as_bytes().first()? {
        b'-' => (true, text.get(1..)?),
        b'+' => (false, text.get(1..)?),
        _ => (false, text),
    };
    let digits = digits.replace('_', "");
    let (radix, body) = if let Some(h) = digits.strip_prefix("0x") {
        (16, h.to_string())
    } else if let Some(o) = digits.strip_prefix("0o") {
        (8, o.to_string())
    } else if let Some(b) = digits.strip_prefix("0b") {
        (2, b.to_string())
    } else if digits.len() > 1 && digits.starts_with('0') {
        (8, digits.get(1..)?.to_string())
    } else {
        (10, digits)
    };
    if body.is_empty() || !body.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    match u64::from_str_radix(&body, radix) {
        Ok(n) if !negative => Some(Value::from(n)),
        Ok(n) => i64::try_from(n).ok().map(|n| Value::from(-n)),
        // Past 64 bits: a float, as Go's reader makes it.
        Err(_) => body
            .parse::<f64>()
            .ok()
            .filter(|_| radix == 10)
            .map(|f| if negative { -f } else { f })
            .and_then(Number::from_f64)
            .map(Value::Number),
    }
}

/// The documents of a YAML stream, or where and why it is not YAML.
pub fn documents(text: &str) -> Result<Vec<Marked>, (Position, String)> {
    load_yaml_documents(text).map_err(|(at, e)| (at, e.to_string()))
}

/// The node at `path` (keys, `[i]` for items) under `m`.
pub fn at<'a>(m: &'a Marked, path: &[&str]) -> Option<&'a Marked> {
    let Some((first, rest)) = path.split_first() else {
        return Some(m);
    };
    let next = match &m.node {
        Node::Map(entries) => entries
            .iter()
            .find(|(k, _, _)| k == first)
            .map(|(_, _, v)| v),
        Node::Seq(items) => first
            .strip_prefix('[')
            .and_then(|i| i.strip_suffix(']'))
            .and_then(|i| i.parse::<usize>().ok())
            .and_then(|i| items.get(i)),
        Node::Scalar { .. } => None,
    }?;
    at(next, rest)
}

/// The text of a scalar node.
pub fn text(m: &Marked) -> Option<&str> {
    match &m.node {
        Node::Scalar { text, .. } => Some(text),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::yaml_out::document;
    use proptest::prelude::*;
    use serde_json::json;

    fn read(text: &str) -> Value {
        let docs = documents(text).unwrap();
        convert(&docs[0]).value
    }

    #[test]
    fn scalars_read_as_kubernetes_reads_them() {
        assert_eq!(
            read("a: yes\nb: 'yes'\nc: 8081\nd: 0.8\ne: ~\nf: 0x1f\ng: 010\nh: 99999999999999999999999\ni: tenant-b\nj: -5\nk: 1.5e3\nl: 1.2.3\n"),
            json!({"a": true, "b": "yes", "c": 8081, "d": 0.8, "e": null, "f": 31, "g": 8,
                   "h": 1e23, "i": "tenant-b", "j": -5, "k": 1500.0, "l": "1.2.3"})
        );
    }

    #[test]
    fn positions_and_duplicates() {
        let docs = documents("kind: A\n---\nspec:\n  x: 1\n  list:\n  - a: 1\n  x: 2\n").unwrap();
        assert_eq!(docs.len(), 2);
        let c = convert(at(&docs[1], &["spec"]).unwrap());
        assert_eq!(c.value, json!({"x": 2, "list": [{"a": 1}]}));
        assert_eq!(
            c.spans.get("list[0].a").unwrap().value,
            Position { line: 6, column: 8 }
        );
        assert_eq!(
            c.spans.get("x").unwrap().key,
            Some(Position { line: 7, column: 3 })
        );
        assert_eq!(
            c.problems,
            vec![(
                Position { line: 7, column: 3 },
                "x: duplicate key \"x\": the API server refuses the document".to_string()
            )]
        );
        assert_eq!(text(at(&docs[0], &["kind"]).unwrap()), Some("A"));
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u32>().prop_map(|n| json!(f64::from(n) / 8.0)),
            "[ -~\\n\\t\\u{e9}]{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[ -~]{0,6}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// What `render` writes reads back as the value it wrote.
        #[test]
        fn written_yaml_reads_back_as_the_same_value(v in json_value()) {
            let text = document(&v);
            let docs = documents(&text).map_err(|e| TestCaseError::fail(format!("{e:?}\n{text}")))?;
            let back = docs.first().map_or(Value::Null, |d| convert(d).value);
            // Floats with a fraction of zero read back as integers.
            let norm = |v: &Value| serde_json::from_str::<Value>(&v.to_string().replace(".0,", ",").replace(".0]", "]").replace(".0}", "}")).unwrap();
            prop_assert_eq!(norm(&back), norm(&v), "{}", text);
        }
    }
}
