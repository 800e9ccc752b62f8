//! One walk over a JSON text, for what `serde_json::Value` does not keep:
//! where each value is (the CLI's [`crate::span`]) and a key given twice in
//! one object, which serde_json silently resolves by keeping the last value.
//! The filter runs it on its plugin configuration to refuse duplicates, so
//! the walk is small and does nothing else.

use std::collections::HashMap;

use crate::error::{excerpt, join};

/// A place in the text: 1-based line, and 1-based column counted in
/// characters (a tab is one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    pub line: usize,
    pub column: usize,
}

impl Position {
    pub const START: Position = Position { line: 1, column: 1 };
}

/// A key given a second time in the same object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DuplicateKey {
    /// JSON path of the member.
    pub path: String,
    pub key: String,
    /// The later occurrence, the one serde_json keeps.
    pub at: Position,
    /// The earlier occurrence, the one serde_json drops.
    pub first: Position,
}

impl DuplicateKey {
    /// What is wrong, for a line that already says where (`at` is shown
    /// only when `with_place`).
    pub fn message(&self, with_place: bool) -> String {
        let at = if with_place {
            format!(" at {}:{}", self.at.line, self.at.column)
        } else {
            String::new()
        };
        format!(
            "duplicate key {}{at} (first at {}:{}): JSON keeps only the last one",
            excerpt(&self.key),
            self.first.line,
            self.first.column
        )
    }
}

/// Deeper than this the walk stops (serde_json refuses past 128 levels too).
pub const MAX_DEPTH: usize = 128;

/// What a walk over a JSON text reports.
pub(crate) trait Visit {
    /// A value at `path` starts at `value`; `key` is where the key that
    /// names it starts (object members only).
    fn value(&mut self, _path: &str, _key: Option<Position>, _value: Position) {}
    /// A key given a second time; called before the walk enters its value.
    fn duplicate(&mut self, d: DuplicateKey);
}

/// Walks `text` once, reporting to `v`. Never panics; on text that is not
/// JSON it stops where the text stops being JSON.
pub(crate) fn walk<V: Visit>(text: &str, v: &mut V) {
    let mut s = Scanner {
        text,
        pos: 0,
        line: 1,
        column: 1,
        visit: v,
    };
    let _ = s.value("", None, 0);
}

impl Visit for Vec<DuplicateKey> {
    fn duplicate(&mut self, d: DuplicateKey) {
        self.push(d);
    }
}

/// Every key given twice in one object, at any depth, in text order.
pub fn duplicate_keys(text: &str) -> Vec<DuplicateKey> {
    let mut found = Vec::new();
    walk(text, &mut found);
    found
}

struct Scanner<'a, V> {
    text: &'a str,
    pos: usize,
    line: usize,
    column: usize,
    visit: &'a mut V,
}

impl<V: Visit> Scanner<'_, V> {
    fn peek(&self) -> Option<char> {
        self.text.get(self.pos..)?.chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        if c == '\n' {
            self.line += 1;
            self.column = 1;
        } else {
            self.column += 1;
        }
        Some(c)
    }

    fn here(&self) -> Position {
        Position {
            line: self.line,
            column: self.column,
        }
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(' ' | '\t' | '\n' | '\r')) {
            self.bump();
        }
    }

    fn eat(&mut self, c: char) -> Option<()> {
        if self.peek() == Some(c) {
            self.bump();
            Some(())
        } else {
            None
        }
    }

    /// Scans one value at `path`; `None` when the text is not JSON.
    fn value(&mut self, path: &str, key: Option<Position>, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.skip_ws();
        let value = self.here();
        self.visit.value(path, key, value);
        match self.peek()? {
            '{' => self.object(path, depth),
            '[' => self.array(path, depth),
            '"' => self.string().map(drop),
            _ => {
                let start = self.pos;
                while self.peek().is_some_and(|c| {
                    !matches!(c, ',' | ']' | '}' | ':' | '"') && !c.is_whitespace()
                }) {
                    self.bump();
                }
                (self.pos > start).then_some(())
            }
        }
    }

    fn object(&mut self, path: &str, depth: usize) -> Option<()> {
        self.eat('{')?;
        self.skip_ws();
        if self.eat('}').is_some() {
            return Some(());
        }
        // Key → index into `firsts` (the same map type as the model's, so
        // the .wasm carries one copy of its code).
        let mut keys: HashMap<String, usize> = HashMap::new();
        let mut firsts: Vec<Position> = Vec::new();
        loop {
            self.skip_ws();
            let at = self.here();
            let key = self.string()?;
            self.skip_ws();
            self.eat(':')?;
            let child = join(path, &key);
            match keys.get(&key).and_then(|&i| firsts.get(i)) {
                Some(&first) => self.visit.duplicate(DuplicateKey {
                    path: child.clone(),
                    key,
                    at,
                    first,
                }),
                None => {
                    keys.insert(key, firsts.len());
                    firsts.push(at);
                }
            }
            self.value(&child, Some(at), depth + 1)?;
            self.skip_ws();
            match self.bump()? {
                ',' => continue,
                '}' => return Some(()),
                _ => return None,
            }
        }
    }

    fn array(&mut self, path: &str, depth: usize) -> Option<()> {
        self.eat('[')?;
        self.skip_ws();
        if self.eat(']').is_some() {
            return Some(());
        }
        let mut i = 0usize;
        loop {
            self.value(&format!("{path}[{i}]"), None, depth + 1)?;
            i += 1;
            self.skip_ws();
            match self.bump()? {
                ',' => continue,
                ']' => return Some(()),
                _ => return None,
            }
        }
    }

    /// A string literal, decoded exactly as serde_json decodes it.
    fn string(&mut self) -> Option<String> {
        let start = self.pos;
        self.eat('"')?;
        loop {
            match self.bump()? {
                '\\' => {
                    self.bump()?;
                }
                '"' => break,
                _ => {}
            }
        }
        // Through `Value`, the one type the filter already deserializes: a
        // `String` target would link serde's type-mismatch errors, and with
        // them float formatting (17 KB of .wasm).
        let literal = self.text.get(start..self.pos)?.as_bytes();
        match serde_json::from_slice(literal).ok()? {
            serde_json::Value::String(s) => Some(s),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(line: usize, column: usize) -> Position {
        Position { line, column }
    }

    #[test]
    fn duplicates_at_every_level_with_both_places() {
        let text = "{\"a\": 1, \"b\": {\"c\": [{\"d\": 1,\n \"d\": 2}], \"c\": 0},\n\"a\": 3}";
        let d = duplicate_keys(text);
        assert_eq!(
            d,
            vec![
                DuplicateKey {
                    path: "b.c[0].d".into(),
                    key: "d".into(),
                    at: pos(2, 2),
                    first: pos(1, 23)
                },
                DuplicateKey {
                    path: "b.c".into(),
                    key: "c".into(),
                    at: pos(2, 12),
                    first: pos(1, 16)
                },
                DuplicateKey {
                    path: "a".into(),
                    key: "a".into(),
                    at: pos(3, 1),
                    first: pos(1, 2)
                },
            ]
        );
        assert_eq!(
            d[2].message(true),
            "duplicate key \"a\" at 3:1 (first at 1:2): JSON keeps only the last one"
        );
        // A third occurrence points back at the first.
        assert_eq!(
            duplicate_keys("{\"k\":1,\"k\":2,\"k\":3}")[1].first,
            pos(1, 2)
        );
    }

    #[test]
    fn keys_are_compared_decoded_and_per_object() {
        assert_eq!(duplicate_keys("{\"a\": 1, \"\\u0061\": 2}").len(), 1);
        assert!(duplicate_keys("{\"a\": {\"a\": 1}, \"b\": {\"a\": 1}}").is_empty());
        assert!(duplicate_keys("[{\"a\": 1}, {\"a\": 1}]").is_empty());
    }
}
