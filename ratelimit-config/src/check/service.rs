//! envoyproxy/ratelimit's service configuration, read as the service reads
//! it (src/config/config_impl.go), with what makes the service refuse a file.

use super::yaml_tree::{load_yaml, Marked, Node};
use crate::error::excerpt;
use crate::span::Position;

/// The keys envoyproxy/ratelimit accepts anywhere in its YAML; any other
/// makes it refuse the file.
const VALID_KEYS: &[&str] = &[
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

const SERVICE_UNITS: &[&str] = &["second", "minute", "hour", "day", "week", "month", "year"];

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleLimit {
    /// Lowercase; empty when absent.
    pub unit: String,
    pub requests_per_unit: u32,
    pub unlimited: bool,
    /// Of the `rate_limit` mapping, its `unit` value, its `requests_per_unit` value.
    pub at: Position,
    pub unit_at: Position,
    pub count_at: Position,
}

/// One descriptor rule of the service config.
#[derive(Clone, Debug)]
pub struct Rule {
    /// `key` or `key_value`: what the service matches on.
    pub composite: String,
    pub limit: Option<RuleLimit>,
    pub shadow_mode: bool,
    pub children: Vec<Rule>,
    pub at: Position,
}

/// One service config file.
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    pub file: String,
    pub domain: String,
    pub domain_at: Position,
    pub descriptors: Vec<Rule>,
}

/// A problem, at a place in one file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub file: String,
    pub at: Position,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file, self.at.line, self.at.column, self.message
        )
    }
}

impl std::error::Error for Problem {}

struct Reader<'a> {
    file: &'a str,
    problems: Vec<Problem>,
}

impl Reader<'_> {
    fn problem(&mut self, at: Position, message: impl Into<String>) {
        self.problems.push(Problem {
            file: self.file.to_string(),
            at,
            message: message.into(),
        });
    }

    fn map<'m>(&mut self, m: &'m Marked, what: &str) -> Option<&'m [(String, Position, Marked)]> {
        match &m.node {
            Node::Map(entries) => {
                for (k, at, _) in entries {
                    if !VALID_KEYS.contains(&k.as_str()) {
                        self.problem(
                            *at,
                            format!("unknown key {}: the service refuses this file", excerpt(k)),
                        );
                    }
                }
                Some(entries)
            }
            _ => {
                self.problem(m.at, format!("{what} must be a mapping"));
                None
            }
        }
    }

    /// A string field as yaml.v2 reads it into a Go string: a plain `~`,
    /// `null` or nothing is no value.
    fn string(&mut self, m: &Marked, what: &str) -> String {
        match &m.node {
            Node::Scalar {
                text, plain: true, ..
            } if matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL") => String::new(),
            Node::Scalar { text, .. } => text.clone(),
            _ => {
                self.problem(m.at, format!("{what} must be a string"));
                String::new()
            }
        }
    }

    fn boolean(&mut self, m: &Marked, what: &str) -> bool {
        match &m.node {
            Node::Scalar {
                text, plain: true, ..
            } => match text.as_str() {
                "true" | "True" | "TRUE" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" | "y"
                | "Y" => true,
                "false" | "False" | "FALSE" | "no" | "No" | "NO" | "off" | "Off" | "OFF" | "n"
                | "N" | "" | "~" | "null" => false,
                _ => {
                    self.problem(m.at, format!("{what} must be true or false"));
                    false
                }
            },
            _ => {
                self.problem(m.at, format!("{what} must be true or false"));
                false
            }
        }
    }

    fn count(&mut self, m: &Marked) -> u32 {
        match &m.node {
            Node::Scalar {
                text, plain: true, ..
            } if text.bytes().all(|b| b.is_ascii_digit()) => text.parse().unwrap_or_else(|_| {
                self.problem(m.at, "requests_per_unit does not fit in 32 bits");
                0
            }),
            _ => {
                self.problem(m.at, "requests_per_unit must be a whole number");
                0
            }
        }
    }

    fn rules(&mut self, m: &Marked, parent: &str) -> Vec<Rule> {
        let Node::Seq(items) = &m.node else {
            self.problem(m.at, "descriptors must be a list");
            return Vec::new();
        };
        let mut out: Vec<Rule> = Vec::new();
        for item in items {
            let Some(entries) = self.map(item, "a descriptor") else {
                continue;
            };
            let mut key = String::new();
            let mut value = String::new();
            let mut limit = None;
            let mut shadow_mode = false;
            let mut children_node = None;
            for (k, _, v) in entries {
                match k.as_str() {
                    "key" => key = self.string(v, "key"),
                    "value" => value = self.string(v, "value"),
                    "rate_limit" => limit = self.rate_limit(v),
                    "shadow_mode" => shadow_mode = self.boolean(v, "shadow_mode"),
                    "descriptors" => children_node = Some(v),
                    _ => {}
                }
            }
            if key.is_empty() {
                self.problem(
                    item.at,
                    "descriptor has an empty key: the service refuses this file",
                );
                continue;
            }
            let composite = if value.is_empty() {
                key
            } else {
                format!("{key}_{value}")
            };
            let full = format!("{parent}{composite}");
            if out.iter().any(|r| r.composite == composite) {
                self.problem(
                    item.at,
                    format!(
                        "duplicate descriptor {}: the service refuses this file",
                        excerpt(&full)
                    ),
                );
                continue;
            }
            let children = match children_node {
                Some(c) => self.rules(c, &format!("{full}.")),
                None => Vec::new(),
            };
            out.push(Rule {
                composite,
                limit,
                shadow_mode,
                children,
                at: item.at,
            });
        }
        out
    }

    fn rate_limit(&mut self, m: &Marked) -> Option<RuleLimit> {
        let entries = self.map(m, "rate_limit")?;
        let mut limit = RuleLimit {
            unit: String::new(),
            requests_per_unit: 0,
            unlimited: false,
            at: m.at,
            unit_at: m.at,
            count_at: m.at,
        };
        for (k, _, v) in entries {
            match k.as_str() {
                "unit" => {
                    limit.unit = self.string(v, "unit").to_ascii_lowercase();
                    limit.unit_at = v.at;
                }
                "requests_per_unit" => {
                    limit.requests_per_unit = self.count(v);
                    limit.count_at = v.at;
                }
                "unlimited" => limit.unlimited = self.boolean(v, "unlimited"),
                _ => {}
            }
        }
        let valid_unit = SERVICE_UNITS.contains(&limit.unit.as_str());
        if limit.unlimited && valid_unit {
            self.problem(
                m.at,
                "an unlimited rate_limit must not set a unit: the service refuses this file",
            );
        } else if !limit.unlimited && !valid_unit {
            self.problem(
                limit.unit_at,
                format!(
                    "invalid rate limit unit {}: the service refuses this file",
                    excerpt(&limit.unit)
                ),
            );
        }
        Some(limit)
    }
}

/// Reads one service config file (`file` names it in problems).
pub fn parse_service_config(file: &str, text: &str) -> Result<ServiceConfig, Vec<Problem>> {
    let mut r = Reader {
        file,
        problems: Vec::new(),
    };
    let root = match load_yaml(text) {
        Ok(Some(root)) => root,
        Ok(None) => {
            r.problem(Position::START, "empty: no domain and no descriptors");
            return Err(r.problems);
        }
        Err((at, e)) => {
            r.problem(at, e.to_string());
            return Err(r.problems);
        }
    };
    let mut config = ServiceConfig {
        file: file.to_string(),
        domain: String::new(),
        domain_at: root.at,
        descriptors: Vec::new(),
    };
    if let Some(entries) = r.map(&root, "the document") {
        for (k, _, v) in entries {
            match k.as_str() {
                "domain" => {
                    config.domain = r.string(v, "domain");
                    config.domain_at = v.at;
                }
                "descriptors" => {
                    let parent = format!("{}.", config.domain);
                    config.descriptors = r.rules(v, &parent);
                }
                _ => {}
            }
        }
    }
    if config.domain.is_empty() {
        r.problem(root.at, "no domain: the service refuses this file");
    }
    if r.problems.is_empty() {
        Ok(config)
    } else {
        Err(r.problems)
    }
}
