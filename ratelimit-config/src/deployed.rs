//! What `check` reads besides the files `generate` writes: the objects as
//! they are deployed, in YAML. The plugin configuration from a WasmPlugin
//! (`spec.pluginConfig`), an EnvoyExtensionPolicy (`spec.wasm[].config`) or
//! an Envoy bootstrap or filter fragment (the wasm filter's
//! `configuration.value`, a JSON string); the service's rules from a
//! ConfigMap (each entry of `data`). Every position is the one in the file
//! read, so a mismatch is named at its line there. CLI only.

use serde_json::Value;

use crate::check::yaml_tree::{Marked, Node};
use crate::span::{scan, Position, SourceMap};
use crate::yaml_in::{at, convert, documents, text};

/// Where the text of an embedded document sits in the file: a literal
/// block scalar's lines are the file's lines (shifted by `lines`, indented
/// by `indent`); any other scalar is reported at its own start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    Block { lines: usize, indent: usize },
    At(Position),
}

impl Placement {
    pub fn map(&self, p: Position) -> Position {
        match *self {
            Placement::Block { lines, indent } => Position {
                line: p.line + lines,
                column: p.column + indent,
            },
            Placement::At(at) => at,
        }
    }

    /// Where the scalar `m` (a string holding another document) puts its
    /// text in `file_text`.
    pub fn of(file_text: &str, m: &Marked) -> Placement {
        let block = matches!(m.node, Node::Scalar { block: true, .. });
        if !block {
            return Placement::At(m.at);
        }
        // The parser marks a literal block at its first line of content
        // (the line after the `|` indicator); its lines are indented by
        // the indentation of that line.
        let first = m.at.line.saturating_sub(1);
        let indent = file_text
            .lines()
            .skip(first)
            .find(|l| !l.trim().is_empty())
            .map_or(0, |l| l.len() - l.trim_start_matches(' ').len());
        Placement::Block {
            lines: first,
            indent,
        }
    }
}

/// A plugin configuration found in a deployed object: the JSON value, what
/// it was found in, and where each of its paths is in the file.
#[derive(Debug)]
pub struct FoundPlugin {
    pub what: String,
    pub value: Value,
    pub spans: SourceMap,
    /// For a configuration held as JSON text: where that text is.
    pub placement: Option<Placement>,
    /// Problems of the YAML itself (a duplicate key).
    pub problems: Vec<(Position, String)>,
}

impl FoundPlugin {
    /// Where the plugin configuration's `path` is in the file.
    pub fn locate(&self, path: &str) -> Position {
        let p = self.spans.locate(path, false);
        match self.placement {
            Some(pl) => pl.map(p),
            None => p,
        }
    }
}

fn kind(doc: &Marked) -> Option<&str> {
    at(doc, &["kind"]).and_then(text)
}

/// The objects of a stream: each document, and each item of a `List` (what
/// `kubectl get … -o yaml` prints for more than one object).
fn objects(docs: &[Marked]) -> Vec<&Marked> {
    let mut out = Vec::new();
    for d in docs {
        match (kind(d), at(d, &["items"])) {
            (
                Some("List"),
                Some(Marked {
                    node: Node::Seq(items),
                    ..
                }),
            ) => out.extend(items.iter()),
            _ => out.push(d),
        }
    }
    out
}

/// The filter's configuration in the YAML `file_text`: the first WasmPlugin,
/// EnvoyExtensionPolicy wasm entry or Envoy wasm filter found. Err: the
/// text is not YAML, or holds none of these (the message says what it
/// holds).
pub fn plugin_config(file_text: &str) -> Result<FoundPlugin, (Position, String)> {
    let docs = documents(file_text)?;
    let mut kinds = Vec::new();
    for doc in objects(&docs) {
        match kind(doc) {
            Some("WasmPlugin") => {
                let Some(pc) = at(doc, &["spec", "pluginConfig"]) else {
                    return Err((doc.at, "a WasmPlugin without spec.pluginConfig".into()));
                };
                let c = convert(pc);
                return Ok(FoundPlugin {
                    what: "WasmPlugin spec.pluginConfig".into(),
                    value: c.value,
                    spans: c.spans,
                    placement: None,
                    problems: c.problems,
                });
            }
            Some("EnvoyExtensionPolicy") => {
                let mut i = 0;
                while let Some(w) = at(doc, &["spec", "wasm", &format!("[{i}]")]) {
                    if let Some(cfg) = at(w, &["config"]) {
                        let c = convert(cfg);
                        return Ok(FoundPlugin {
                            what: format!("EnvoyExtensionPolicy spec.wasm[{i}].config"),
                            value: c.value,
                            spans: c.spans,
                            placement: None,
                            problems: c.problems,
                        });
                    }
                    i += 1;
                }
                return Err((
                    doc.at,
                    "an EnvoyExtensionPolicy with no spec.wasm[].config".into(),
                ));
            }
            other => {
                if let Some(found) = envoy_wasm_configuration(file_text, doc) {
                    return Ok(found);
                }
                kinds.push(other.unwrap_or("a document without kind").to_string());
            }
        }
    }
    Err((
        Position::START,
        format!(
            "no plugin configuration here: found {}; give a plugin-config.json, a WasmPlugin, an EnvoyExtensionPolicy or an Envoy bootstrap with the wasm filter",
            if kinds.is_empty() {
                "no document".to_string()
            } else {
                kinds.join(", ")
            }
        ),
    ))
}

/// The first `configuration: {"@type": …StringValue, value: "<json>"}`
/// under `m` (an Envoy wasm filter's), anywhere in a bootstrap.
fn envoy_wasm_configuration(file_text: &str, m: &Marked) -> Option<FoundPlugin> {
    match &m.node {
        Node::Map(entries) => {
            for (k, _, v) in entries {
                if k == "configuration" {
                    let ty = at(v, &["@type"]).and_then(text).unwrap_or("");
                    if let (true, Some(value)) = (
                        ty.ends_with("google.protobuf.StringValue"),
                        at(v, &["value"]),
                    ) {
                        let json = text(value)?;
                        let parsed = serde_json::from_str::<Value>(json).ok()?;
                        return Some(FoundPlugin {
                            what: "the wasm filter's configuration.value".into(),
                            value: parsed,
                            spans: scan(json),
                            placement: Some(Placement::of(file_text, value)),
                            problems: Vec::new(),
                        });
                    }
                }
                if let Some(f) = envoy_wasm_configuration(file_text, v) {
                    return Some(f);
                }
            }
            None
        }
        Node::Seq(items) => items
            .iter()
            .find_map(|i| envoy_wasm_configuration(file_text, i)),
        Node::Scalar { .. } => None,
    }
}

/// The entries of the ConfigMaps in `file_text` (name, text, placement),
/// or None when it holds no ConfigMap (or is not YAML).
pub fn config_map_entries(file_text: &str) -> Option<Vec<(String, String, Placement)>> {
    let docs = documents(file_text).ok()?;
    let maps: Vec<&Marked> = objects(&docs)
        .into_iter()
        .filter(|d| kind(d) == Some("ConfigMap"))
        .collect();
    if maps.is_empty() {
        return None;
    }
    let mut out = Vec::new();
    for m in maps {
        if let Some(Marked {
            node: Node::Map(entries),
            ..
        }) = at(m, &["data"])
        {
            for (k, _, v) in entries {
                if let Some(t) = text(v) {
                    out.push((k.clone(), t.to_string(), Placement::of(file_text, v)));
                }
            }
        }
    }
    Some(out)
}

/// The Envoy routes an Envoy configuration carries (a bootstrap, an
/// `http_filters`-holding listener, or what `/config_dump` prints), each
/// with its name (None: a route without one). None when the text is not
/// YAML or JSON. A route is an object with `match` and one of `route`,
/// `redirect`, `direct_response`, wherever it sits.
pub fn route_names(file_text: &str) -> Option<Vec<Option<String>>> {
    fn walk(v: &Value, out: &mut Vec<Option<String>>) {
        match v {
            Value::Object(m) => {
                let is_route = m.contains_key("match")
                    && ["route", "redirect", "direct_response"]
                        .iter()
                        .any(|k| m.contains_key(*k));
                if is_route {
                    out.push(m.get("name").and_then(Value::as_str).map(str::to_string));
                }
                m.values().for_each(|v| walk(v, out));
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let docs = crate::yaml_in::documents(file_text).ok()?;
    let mut out = Vec::new();
    for d in &docs {
        walk(&crate::yaml_in::convert(d).value, &mut out);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wasm_plugin_is_read_with_its_positions() {
        let y = "apiVersion: extensions.istio.io/v1alpha1\nkind: WasmPlugin\nspec:\n  pluginConfig:\n    domain: d\n    limits:\n      x-t:\n        default: {perhour: 5}\n";
        let f = plugin_config(y).unwrap();
        assert_eq!(f.value["limits"]["x-t"]["default"]["perhour"], 5);
        assert_eq!(
            f.locate("domain"),
            Position {
                line: 5,
                column: 13
            }
        );
    }

    #[test]
    fn an_envoy_filter_holds_json_in_a_block() {
        let y = "name: envoy.filters.http.wasm\ntyped_config:\n  config:\n    configuration:\n      '@type': type.googleapis.com/google.protobuf.StringValue\n      value: |\n        {\n          \"domain\": \"d\"\n        }\n";
        let f = plugin_config(y).unwrap();
        assert_eq!(f.value["domain"], "d");
        assert_eq!(
            f.locate("domain"),
            Position {
                line: 8,
                column: 21
            }
        );
    }

    #[test]
    fn something_else_says_what_it_is() {
        let (_, m) = plugin_config("kind: Service\n").unwrap_err();
        assert!(m.contains("found Service"), "{m}");
    }

    #[test]
    fn config_map_entries_keep_their_lines() {
        let y = "kind: ConfigMap\ndata:\n  ratelimit.yaml: |\n    domain: d\n    descriptors: []\n";
        let e = config_map_entries(y).unwrap();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].0, "ratelimit.yaml");
        assert_eq!(
            e[0].2.map(Position { line: 1, column: 9 }),
            Position {
                line: 4,
                column: 13
            }
        );
        assert!(config_map_entries("domain: d\n").is_none());
        let list =
            "kind: List\nitems:\n- kind: ConfigMap\n  data:\n    a.yaml: |\n      domain: d\n";
        let e = config_map_entries(list).unwrap();
        assert_eq!(e[0].1, "domain: d\n");
        assert_eq!(
            e[0].2.map(Position { line: 1, column: 1 }),
            Position { line: 6, column: 7 }
        );
    }
}
