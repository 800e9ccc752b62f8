//! JSON values written as block-style YAML, the way Kubernetes manifests
//! are written by hand: what `render` writes. Every scalar reads back as
//! the same JSON value in a YAML 1.1 reader (Go's yaml.v2, which Kubernetes
//! and envoyproxy/ratelimit use) and a YAML 1.2 one: a string that could be
//! taken for anything else (`yes`, `007`, `null`, `8081`) is quoted, a
//! string of several lines is a literal block (`|`), whose lines are the
//! file's lines. Deterministic: keys in the order of the value.

use serde_json::{Map, Value};

/// `v` as one YAML document, ending with a newline.
pub fn document(v: &Value) -> String {
    let mut out = String::new();
    match v {
        Value::Object(m) if !m.is_empty() => map(&mut out, m, 0, false),
        Value::Array(a) if !a.is_empty() => seq(&mut out, a, 0),
        other => {
            out.push_str(&inline(other));
            out.push('\n');
        }
    }
    out
}

/// Several documents, `---` between them; `comment` lines (without `#`)
/// first.
pub fn stream(comment: &[&str], docs: &[Value]) -> String {
    let mut out = String::new();
    for line in comment {
        if line.is_empty() {
            out.push_str("#\n");
        } else {
            out.push_str("# ");
            out.push_str(line);
            out.push('\n');
        }
    }
    for (i, d) in docs.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        out.push_str(&document(d));
    }
    out
}

fn pad(out: &mut String, indent: usize) {
    out.extend(std::iter::repeat_n(' ', indent));
}

/// The entries of `m` at `indent`; the first on the current line when
/// `first_inline` (after a sequence's `- `).
fn map(out: &mut String, m: &Map<String, Value>, indent: usize, first_inline: bool) {
    for (i, (k, v)) in m.iter().enumerate() {
        if i > 0 || !first_inline {
            pad(out, indent);
        }
        out.push_str(&string(k));
        out.push(':');
        after_key(out, v, indent);
    }
}

/// A value after `key:` (a key at `indent`).
fn after_key(out: &mut String, v: &Value, indent: usize) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            out.push('\n');
            map(out, m, indent + 2, false);
        }
        // Kubernetes' style: a sequence under a key at the key's indent.
        Value::Array(a) if !a.is_empty() => {
            out.push('\n');
            seq(out, a, indent);
        }
        Value::String(s) if is_block(s) => block(out, s, indent + 2),
        other => {
            out.push(' ');
            out.push_str(&inline(other));
            out.push('\n');
        }
    }
}

fn seq(out: &mut String, a: &[Value], indent: usize) {
    for item in a {
        pad(out, indent);
        out.push('-');
        match item {
            Value::Object(m) if !m.is_empty() => {
                out.push(' ');
                map(out, m, indent + 2, true);
            }
            Value::Array(inner) if !inner.is_empty() => {
                out.push('\n');
                seq(out, inner, indent + 2);
            }
            Value::String(s) if is_block(s) => block(out, s, indent + 2),
            other => {
                out.push(' ');
                out.push_str(&inline(other));
                out.push('\n');
            }
        }
    }
}

/// Whether a string is written as a literal block: several lines, nothing
/// a block cannot hold, and a first line that does not start with a space
/// (that would need an indentation indicator).
fn is_block(s: &str) -> bool {
    s.trim_end_matches('\n').contains('\n')
        && !s.starts_with([' ', '\n'])
        && s.chars().all(|c| c == '\n' || c == '\t' || !c.is_control())
}

/// ` |` (one final newline kept), ` |-` (none) or ` |+` (all), then the
/// lines at `indent`.
fn block(out: &mut String, s: &str, indent: usize) {
    let body = s.trim_end_matches('\n');
    let trailing = s.len() - body.len();
    out.push_str(match trailing {
        0 => " |-\n",
        1 => " |\n",
        _ => " |+\n",
    });
    for line in body.split('\n') {
        if !line.is_empty() {
            pad(out, indent);
            out.push_str(line);
        }
        out.push('\n');
    }
    for _ in 1..trailing {
        out.push('\n');
    }
}

/// A scalar, or an empty collection, on one line.
fn inline(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => string(s),
        Value::Array(a) if a.is_empty() => "[]".into(),
        Value::Object(m) if m.is_empty() => "{}".into(),
        // Not reached: collections are written as blocks.
        other => other.to_string(),
    }
}

/// A string as a YAML scalar: plain when no reader can take it for
/// anything else, else single-quoted (no escapes), else (control
/// characters) double-quoted with JSON's escapes, which YAML shares.
pub fn string(s: &str) -> String {
    if plain(s) {
        s.to_string()
    } else if s.chars().all(|c| !c.is_control()) {
        format!("'{}'", s.replace('\'', "''"))
    } else {
        Value::String(s.to_string()).to_string()
    }
}

/// Plain: starts with a letter or `/`, only letters, digits and
/// `-_./:|@=+~%`, no `:` at the end, and not one of the words YAML 1.1
/// reads as a boolean or null. A first digit is quoted: `8081`, `1e3`,
/// `0x1f`, `1:30` (a YAML 1.1 integer) are all numbers to some reader.
fn plain(s: &str) -> bool {
    const WORDS: &[&str] = &["y", "n", "yes", "no", "on", "off", "true", "false", "null"];
    s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '/')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:|@=+~%".contains(c))
        && !s.ends_with(':')
        && !WORDS.contains(&s.to_ascii_lowercase().as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn manifests_are_written_as_people_write_them() {
        let v = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "x", "labels": {"app.kubernetes.io/name": "ratelimit"}},
            "spec": {"ports": [{"name": "grpc", "port": 8081}], "empty": {}, "none": []},
            "data": {"ratelimit.yaml": "domain: d\ndescriptors:\n  - key: a\n"}
        });
        assert_eq!(
            document(&v),
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n  labels:\n    app.kubernetes.io/name: ratelimit\nspec:\n  ports:\n  - name: grpc\n    port: 8081\n  empty: {}\n  none: []\ndata:\n  ratelimit.yaml: |\n    domain: d\n    descriptors:\n      - key: a\n"
        );
    }

    #[test]
    fn strings_that_read_as_something_else_are_quoted() {
        for (s, want) in [
            ("tenant-b", "tenant-b"),
            (
                "registry.example.com/tenant-ratelimit:0.1.0",
                "registry.example.com/tenant-ratelimit:0.1.0",
            ),
            (
                "outbound|8081||ratelimit.my-api.svc.cluster.local",
                "outbound|8081||ratelimit.my-api.svc.cluster.local",
            ),
            ("yes", "'yes'"),
            ("Off", "'Off'"),
            ("null", "'null'"),
            ("8081", "'8081'"),
            ("1:30", "'1:30'"),
            ("@type", "'@type'"),
            ("a b", "'a b'"),
            ("it's", "'it''s'"),
            ("", "''"),
            ("key:", "'key:'"),
            (
                "^wasmcustom\\.x(([^.]+)\\.)",
                "'^wasmcustom\\.x(([^.]+)\\.)'",
            ),
            ("tab\there", "\"tab\\there\""),
        ] {
            assert_eq!(string(s), want, "{s:?}");
        }
    }

    #[test]
    fn blocks_keep_their_final_newlines() {
        let v = json!({"a": "x\ny", "b": "x\ny\n\n", "c": [" lead\nx", "one\n"]});
        assert_eq!(
            document(&v),
            "a: |-\n  x\n  y\nb: |+\n  x\n  y\n\nc:\n- \" lead\\nx\"\n- \"one\\n\"\n"
        );
        assert_eq!(document(&json!([["a"], {"k": 1}])), "-\n  - a\n- k: 1\n");
    }
}
