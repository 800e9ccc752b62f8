//! The service YAML as a tree of nodes that remember where they start
//! (yaml-rust2's event parser; its own loader keeps no positions).

use yaml_rust2::parser::{MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};
use yaml_rust2::Event;

use crate::span::Position;

/// A YAML node with where it starts; scalars keep their text as written.
/// `block`: a literal (`|`) block scalar, whose lines are the file's lines.
#[derive(Clone, Debug)]
pub enum Node {
    Scalar {
        text: String,
        plain: bool,
        block: bool,
    },
    Map(Vec<(String, Position, Marked)>),
    Seq(Vec<Marked>),
}

#[derive(Clone, Debug)]
pub struct Marked {
    pub at: Position,
    pub node: Node,
}

enum Frame {
    Map {
        at: Position,
        entries: Vec<(String, Position, Marked)>,
        key: Option<(String, Position)>,
    },
    Seq {
        at: Position,
        items: Vec<Marked>,
    },
}

/// Why a text is not a YAML tree this reader takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum YamlError {
    /// The YAML parser's own message.
    Syntax(String),
    KeyNotString,
    Unbalanced,
    Alias,
}

impl std::fmt::Display for YamlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            YamlError::Syntax(info) => write!(f, "not valid YAML: {info}"),
            YamlError::KeyNotString => f.write_str("a key that is not a string"),
            YamlError::Unbalanced => f.write_str("unbalanced document"),
            YamlError::Alias => f.write_str("aliases (*name) are not supported here"),
        }
    }
}

impl std::error::Error for YamlError {}

#[derive(Default)]
struct Builder {
    stack: Vec<Frame>,
    root: Option<Marked>,
    /// The documents ended so far (multi-document loads).
    documents: Vec<Marked>,
    error: Option<(Position, YamlError)>,
}

fn position(m: &Marker) -> Position {
    Position {
        line: m.line(),
        column: m.col() + 1,
    }
}

impl Builder {
    fn fail(&mut self, at: Position, e: YamlError) {
        if self.error.is_none() {
            self.error = Some((at, e));
        }
    }

    fn add(&mut self, value: Marked) {
        match self.stack.last_mut() {
            None => {
                if self.root.is_none() {
                    self.root = Some(value);
                }
            }
            Some(Frame::Seq { items, .. }) => items.push(value),
            Some(Frame::Map { entries, key, .. }) => match key.take() {
                Some((k, at)) => entries.push((k, at, value)),
                None => match value.node {
                    Node::Scalar { text, .. } => *key = Some((text, value.at)),
                    _ => self.fail(value.at, YamlError::KeyNotString),
                },
            },
        }
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        let at = position(&mark);
        match ev {
            Event::Scalar(text, style, _, _) => self.add(Marked {
                at,
                node: Node::Scalar {
                    text,
                    plain: style == TScalarStyle::Plain,
                    block: style == TScalarStyle::Literal,
                },
            }),
            Event::DocumentEnd => {
                if let Some(root) = self.root.take() {
                    self.documents.push(root);
                }
            }
            Event::MappingStart(..) => self.stack.push(Frame::Map {
                at,
                entries: Vec::new(),
                key: None,
            }),
            Event::SequenceStart(..) => self.stack.push(Frame::Seq {
                at,
                items: Vec::new(),
            }),
            Event::MappingEnd | Event::SequenceEnd => match self.stack.pop() {
                Some(Frame::Map { at, entries, .. }) => self.add(Marked {
                    // A block mapping is where its first key is.
                    at: entries.first().map_or(at, |(_, k, _)| *k),
                    node: Node::Map(entries),
                }),
                Some(Frame::Seq { at, items }) => self.add(Marked {
                    at,
                    node: Node::Seq(items),
                }),
                None => self.fail(at, YamlError::Unbalanced),
            },
            Event::Alias(_) => self.fail(at, YamlError::Alias),
            _ => {}
        }
    }
}

/// Every document of a YAML stream (`---` between them), empty ones left out.
pub fn load_yaml_documents(text: &str) -> Result<Vec<Marked>, (Position, YamlError)> {
    let mut builder = Builder::default();
    let mut parser = Parser::new_from_str(text);
    parser.load(&mut builder, true).map_err(|e| {
        (
            position(e.marker()),
            YamlError::Syntax(e.info().to_string()),
        )
    })?;
    match builder.error {
        Some(e) => Err(e),
        None => Ok(builder.documents),
    }
}

pub fn load_yaml(text: &str) -> Result<Option<Marked>, (Position, YamlError)> {
    let mut builder = Builder::default();
    let mut parser = Parser::new_from_str(text);
    parser.load(&mut builder, false).map_err(|e| {
        (
            position(e.marker()),
            YamlError::Syntax(e.info().to_string()),
        )
    })?;
    match builder.error {
        Some(e) => Err(e),
        None => Ok(builder.documents.into_iter().next().or(builder.root)),
    }
}
