//! The description as `render` is given it: a file's text (YAML, or JSON),
//! then the command line's `--set` and `--plugin` over it, and where each
//! value came from, so that a problem names its place.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::error::ConfigError;
use crate::span::{Position, SourceMap};
use crate::yaml_in;

/// Where the description's values came from: a file (with its positions),
/// and the paths the command line set.
#[derive(Debug, Default)]
pub struct Sources {
    pub file: Option<String>,
    pub spans: SourceMap,
    /// Path → the flag that set it (`--set service.port`, `--domain`).
    pub flags: BTreeMap<String, String>,
}

/// A problem of the description, located.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescriptionError {
    /// `file:line:col` or the flag.
    pub place: String,
    pub error: ConfigError,
}

impl std::fmt::Display for DescriptionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.place, self.error)
    }
}

impl std::error::Error for DescriptionError {}

impl Sources {
    /// Where a problem at `path` is: the flag that set it (or a parent, or
    /// a key under it), else its line in the file. A path the file does
    /// not have (a key missing because of what a flag set) is blamed on the
    /// flags that set keys of the same section, not on the section's line.
    pub fn place(&self, path: &str) -> String {
        let mut p = path;
        loop {
            if let Some(flag) = self.flags.get(p) {
                return flag.clone();
            }
            match p.rfind(['.', '[']) {
                Some(i) => p = &p[..i],
                None => break,
            }
        }
        let under: Vec<&str> = self
            .flags
            .iter()
            .filter(|(k, _)| {
                k.strip_prefix(path)
                    .is_some_and(|rest| rest.starts_with('.'))
            })
            .map(|(_, flag)| flag.as_str())
            .collect();
        if !under.is_empty() {
            return under.join(", ");
        }
        let in_file = self.file.is_some() && self.spans.get(path).is_some();
        let section = path.split_once('.').map(|(s, _)| s);
        if !in_file {
            let same_section: Vec<&str> = self
                .flags
                .iter()
                .filter(|(k, _)| section.is_some_and(|s| k.split('.').next() == Some(s)))
                .map(|(_, flag)| flag.as_str())
                .collect();
            if !same_section.is_empty() {
                return same_section.join(", ");
            }
        }
        match &self.file {
            Some(f) => {
                let at = self.spans.locate(path, false);
                format!("{f}:{}:{}", at.line, at.column)
            }
            None => "the command line".into(),
        }
    }
}

/// Reads a description's text (YAML, or JSON, which YAML reads).
pub fn read_description(file: &str, text: &str) -> Result<(Value, Sources), DescriptionError> {
    let error = |at: Position, message: String| DescriptionError {
        place: format!("{file}:{}:{}", at.line, at.column),
        error: ConfigError {
            path: String::new(),
            message,
        },
    };
    let docs = yaml_in::documents(text).map_err(|(at, m)| error(at, m))?;
    let [doc] = docs.as_slice() else {
        return Err(error(
            Position::START,
            format!("{} documents, expected one", docs.len()),
        ));
    };
    let c = yaml_in::convert(doc);
    if let Some((at, m)) = c.problems.first() {
        return Err(error(*at, m.clone()));
    }
    let sources = Sources {
        file: Some(file.to_string()),
        spans: c.spans,
        flags: BTreeMap::new(),
    };
    Ok((c.value, sources))
}

/// `PATH=VALUE` of `--set` or `--plugin`: the value read as YAML (`9000`
/// a number, `true` a boolean, `[a, b]` a list, `lease` a string).
pub fn parse_assignment(arg: &str) -> Result<(String, Value), String> {
    let (path, text) = arg
        .split_once('=')
        .ok_or_else(|| format!("{arg:?}: expected PATH=VALUE, e.g. local.mode=lease"))?;
    if path.is_empty() || path.split('.').any(str::is_empty) {
        return Err(format!("{arg:?}: the path must be keys joined by dots"));
    }
    // A description file is read as Kubernetes reads YAML (1.1: `yes` is
    // true); on the command line only `true` and `false` are booleans, so
    // that a typed word never turns into one unseen.
    if matches!(yaml_in::resolve(text), Value::Bool(_)) && !matches!(text, "true" | "false") {
        return Err(format!(
            "{arg:?}: write true or false (YAML 1.1 would read {text:?} as a boolean); quote it ('{path}=\"{text}\"') for the string"
        ));
    }
    let value = match yaml_in::documents(text) {
        Ok(docs) => match docs.first() {
            Some(d) => yaml_in::convert(d).value,
            None => Value::Null,
        },
        // Not YAML on its own (`a: b` …): the text as it is.
        Err(_) => Value::String(text.to_string()),
    };
    Ok((path.to_string(), value))
}

/// Sets `path` (keys joined by dots) in `root` to `value`, creating
/// objects on the way; an existing value that is not an object is replaced.
pub fn set_path(root: &mut Value, path: &str, value: Value) {
    let mut node = root;
    for key in path.split('.') {
        if !node.is_object() {
            *node = Value::Object(Map::new());
        }
        let Value::Object(map) = node else { return };
        node = map.entry(key.to_string()).or_insert(Value::Null);
    }
    *node = value;
}
