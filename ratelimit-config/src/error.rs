//! A problem in a JSON document, located by the JSON path of the field it
//! concerns, and the collector both parsers (the team file's rules in
//! [`crate::validate`], the plugin configuration in [`crate::plugin`]) push
//! them into, so that every problem is reported, not only the first.
//! Messages quote user text through [`excerpt`]: a 1 MB value still gives
//! a short line.

use std::fmt;

/// One problem in a configuration, located by its JSON path
/// (`x-tenant-id.group_1.perminute`, `header_value[2]`, …). The message
/// is what follows the path on the line a user reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub path: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write_path(f, &self.path)?;
            write!(f, ": {}", self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

/// A limit that is legal but can never take effect.
pub type Warning = ConfigError;

/// What an error points at in the source: the value at its path, or the key
/// that names it (an unknown key, a bad header or group name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Anchor {
    Value,
    Key,
}

/// An error with what it points at, for tools that show where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    pub error: ConfigError,
    pub anchor: Anchor,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for Diagnostic {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// `base.key`, or `key` at the top.
pub(crate) fn join(base: &str, key: &str) -> String {
    if base.is_empty() {
        key.to_string()
    } else {
        format!("{base}.{key}")
    }
}

/// Collects errors while walking a document. The second field holds the
/// indices (into the first) of the errors that point at a key.
#[derive(Default)]
pub(crate) struct Errors(pub Vec<ConfigError>, pub Vec<usize>);

impl Errors {
    /// A problem with the value at `path`; `message` is a plain text or a
    /// typed error ([`crate::field::FieldError`], …), shown by its `Display`.
    pub fn push(&mut self, path: impl Into<String>, message: impl fmt::Display) {
        self.add(path.into(), &message);
    }

    // The one body behind every `push`, whatever the message's type (the
    // filter links this parser: its size counts).
    #[inline(never)]
    fn add(&mut self, path: String, message: &dyn fmt::Display) {
        self.0.push(ConfigError {
            path,
            message: message.to_string(),
        });
    }

    /// An error about the key at `path` rather than its value.
    pub fn push_key(&mut self, path: impl Into<String>, message: impl fmt::Display) {
        self.1.push(self.0.len());
        self.push(path, message);
    }

    /// `r`'s value, or None with its error recorded at `path`.
    pub fn record<T, E: fmt::Display>(&mut self, path: &str, r: Result<T, E>) -> Option<T> {
        r.map_err(|e| self.push(path, e)).ok()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn into_diagnostics(self) -> Vec<Diagnostic> {
        let keys = self.1;
        self.0
            .into_iter()
            .enumerate()
            .map(|(i, error)| Diagnostic {
                error,
                anchor: if keys.contains(&i) {
                    Anchor::Key
                } else {
                    Anchor::Value
                },
            })
            .collect()
    }
}

/// The most characters of a value (a key, a name, a string) that a message
/// shows; a longer one is cut, and the message gives its full length.
pub const EXCERPT_CHARS: usize = 64;

/// `s`, or its first [`EXCERPT_CHARS`] characters and `true` when it is longer.
pub(crate) fn cut(s: &str) -> (&str, bool) {
    match s.char_indices().nth(EXCERPT_CHARS) {
        Some((end, _)) => (s.get(..end).unwrap_or(s), true),
        None => (s, false),
    }
}

/// `s` quoted for a message (`"tenant-b"`, escapes as Rust writes them),
/// bounded: `"aaaa…"… (1048576 bytes)` for a long one, so that a 1 MB
/// value still gives a short line.
pub fn excerpt(s: &str) -> String {
    match cut(s) {
        (shown, false) => format!("{shown:?}"),
        (shown, true) => format!("{shown:?}… ({} bytes)", s.len()),
    }
}

/// A JSON path for a message: any key in it longer than [`EXCERPT_CHARS`]
/// is cut (`x-t.aaaa….perhour`).
fn write_path(f: &mut fmt::Formatter<'_>, path: &str) -> fmt::Result {
    for (i, segment) in path.split('.').enumerate() {
        if i > 0 {
            f.write_str(".")?;
        }
        let (shown, was_cut) = cut(segment);
        f.write_str(shown)?;
        if was_cut {
            f.write_str("…")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_keys_are_cut_in_paths_and_values_in_excerpts() {
        let long = "k".repeat(100);
        let e = ConfigError {
            path: format!("x-t.{long}.perhour"),
            message: excerpt(&long),
        };
        let k64 = "k".repeat(64);
        assert_eq!(
            e.to_string(),
            format!("x-t.{k64}….perhour: \"{k64}\"… (100 bytes)")
        );
        assert_eq!(excerpt("a\"b"), "\"a\\\"b\"");
    }

    #[test]
    fn an_error_at_the_top_is_its_message_alone() {
        let e = ConfigError {
            path: String::new(),
            message: "must be a JSON object, got an array".into(),
        };
        assert_eq!(e.to_string(), "must be a JSON object, got an array");
        let d = Diagnostic {
            error: e.clone(),
            anchor: Anchor::Key,
        };
        assert_eq!(d.to_string(), e.to_string());
        let source = std::error::Error::source(&d).map(ToString::to_string);
        assert_eq!(source, Some(e.to_string()));
    }

    #[test]
    fn errors_remember_which_point_at_keys() {
        let mut errors = Errors::default();
        errors.push("a", "value");
        errors.push_key("b", "key");
        assert_eq!(errors.len(), 2);
        let anchors: Vec<Anchor> = errors.into_diagnostics().iter().map(|d| d.anchor).collect();
        assert_eq!(anchors, vec![Anchor::Value, Anchor::Key]);
    }
}
