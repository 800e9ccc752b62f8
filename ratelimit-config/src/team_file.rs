//! A team limits file as the CLI sees it: its text checked at once, every
//! problem rendered as `<file>:<line>:<col>: <path>: <message>`.
//!
//! The rules are those of [`crate::validate`], which the filter runs too;
//! what only the text shows (a syntax error's position, a key given twice)
//! is added here.

use std::fmt;

use serde_json::Value;

use crate::error::{Anchor, ConfigError};
use crate::field::{starts_with_bom, BOM_MESSAGE};
use crate::model::{Service, TeamLimits};
use crate::span::{char_column, scan, Position};
use crate::validate::{diagnose_team_limits, diagnose_team_limits_for};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Error,
    Warning,
}

/// One problem of a file, with its place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub file: String,
    pub at: Position,
    pub severity: Severity,
    pub error: ConfigError,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: ", self.file, self.at.line, self.at.column)?;
        if self.severity == Severity::Warning {
            f.write_str("warning: ")?;
        }
        write!(f, "{}", self.error)
    }
}

impl std::error::Error for Finding {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// What checking one file found.
#[derive(Clone, Debug)]
pub struct TeamFile {
    pub findings: Vec<Finding>,
    /// The document and its model, when there was no error.
    pub parsed: Option<(Value, TeamLimits)>,
}

impl TeamFile {
    pub fn errors(&self) -> usize {
        self.findings
            .iter()
            .filter(|f| f.severity == Severity::Error)
            .count()
    }
}

/// Where a serde_json syntax error is, and what it says (without the
/// position serde_json appends, in bytes).
pub fn syntax_error(text: &str, e: &serde_json::Error) -> (Position, ConfigError) {
    let at = Position {
        line: e.line(),
        column: char_column(text, e.line(), e.column()),
    };
    let full = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    let message = full.strip_suffix(&suffix).unwrap_or(&full);
    let cause = syntax_cause(text, at);
    (
        at,
        ConfigError {
            path: String::new(),
            message: format!("not valid JSON: {message}{cause}"),
        },
    )
}

/// What most likely made `text` not JSON, from the character at `at`
/// (comments, single quotes) or the look of the whole (YAML).
fn syntax_cause(text: &str, at: Position) -> &'static str {
    let here = text
        .lines()
        .nth(at.line.saturating_sub(1))
        .and_then(|l| l.chars().nth(at.column.saturating_sub(1)));
    let first = text.trim_start().chars().next();
    match (here, first) {
        (Some('/'), _) | (Some('#'), Some('{')) => {
            ": JSON has no comments; remove them (a group's purpose can go in its name)"
        }
        (Some('\''), _) => ": JSON strings and keys take double quotes (\"...\"), not single ones",
        (_, Some(c)) if c != '{' && c != '[' && c != '"' => {
            ": this looks like YAML or another format; the file is JSON (see `ratelimit-config schema`)"
        }
        _ => "",
    }
}

/// What an empty (or blank) team file gets.
pub const EMPTY_TEAM_FILE: &str = "the file is empty: a team file is one JSON object naming the tenant header and its groups, e.g. {\"x-tenant-id\": {\"default\": {\"perminute\": 60}}} (`ratelimit-config schema` prints the format)";

/// What an empty (or blank) plugin configuration gets.
pub const EMPTY_PLUGIN_CONFIG: &str = "the file is empty: a plugin configuration is one JSON object (domain, limits, rate_limit_service); `ratelimit-config generate` writes one as plugin-config.json";

/// When `doc`, given as a plugin configuration, is a team file instead
/// (it reads as one), says so.
pub fn team_file_by_mistake(doc: &Value) -> Option<ConfigError> {
    let obj = doc.as_object()?;
    let (header, _) = obj.iter().next()?;
    if obj.len() != 1 || diagnose_team_limits(doc, "").is_err() {
        return None;
    }
    Some(ConfigError {
        path: String::new(),
        message: format!(
            "this is a team file (header {}), not a plugin configuration: it is the value of \"limits\" in one; `ratelimit-config generate` writes plugin-config.json from it, and `check` takes that",
            crate::error::excerpt(header)
        ),
    })
}

/// When `doc` is not a team file but a plugin configuration (what
/// `generate` writes as plugin-config.json), says so.
fn plugin_config_by_mistake(doc: &Value) -> Option<ConfigError> {
    let obj = doc.as_object()?;
    let plugin_keys = ["domain", "limits", "rate_limit_service"];
    if obj.len() > 1 && plugin_keys.iter().filter(|k| obj.contains_key(**k)).count() >= 2 {
        return Some(ConfigError {
            path: String::new(),
            message: "this is a plugin configuration (domain, limits, rate_limit_service), not a team file: its team file is the value of \"limits\"; to check a plugin configuration against the service's rules, use `ratelimit-config check --plugin-config`".into(),
        });
    }
    None
}

/// A number too large for an integer is read as a float (`1e+23`): the
/// message shows it as written instead.
fn as_written(message: String, text: &str, at: Position) -> String {
    let Some((head, got)) = message.rsplit_once(", got ") else {
        return message;
    };
    if !got.contains(['e', '.']) || got.parse::<f64>().is_err() {
        return message;
    }
    let written: String = text
        .lines()
        .nth(at.line.saturating_sub(1))
        .map(|l| {
            l.chars()
                .skip(at.column.saturating_sub(1))
                .take_while(|c| c.is_ascii_digit() || matches!(c, '-' | '+' | '.' | 'e' | 'E'))
                .collect()
        })
        .unwrap_or_default();
    if written.is_empty() || written == got {
        return message;
    }
    format!("{head}, got {written}")
}

/// Checks the text of a team limits file; `file` names it in the findings.
pub fn check_team_file(file: &str, text: &str) -> TeamFile {
    check_team_file_for(file, text, Service::EnvoyRatelimit)
}

/// [`check_team_file`] for the service that will count its limits.
pub fn check_team_file_for(file: &str, text: &str, service: Service) -> TeamFile {
    let finding = |at: Position, severity: Severity, error: ConfigError| Finding {
        file: file.to_string(),
        at,
        severity,
        error,
    };
    if starts_with_bom(text.as_bytes()) {
        let error = ConfigError {
            path: String::new(),
            message: BOM_MESSAGE.into(),
        };
        return TeamFile {
            findings: vec![finding(Position::START, Severity::Error, error)],
            parsed: None,
        };
    }
    if text.trim().is_empty() {
        let error = ConfigError {
            path: String::new(),
            message: EMPTY_TEAM_FILE.into(),
        };
        return TeamFile {
            findings: vec![finding(Position::START, Severity::Error, error)],
            parsed: None,
        };
    }
    let doc: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            let (at, error) = syntax_error(text, &e);
            return TeamFile {
                findings: vec![finding(at, Severity::Error, error)],
                parsed: None,
            };
        }
    };
    if let Some(error) = plugin_config_by_mistake(&doc) {
        return TeamFile {
            findings: vec![finding(Position::START, Severity::Error, error)],
            parsed: None,
        };
    }
    let map = scan(text);
    let mut findings: Vec<Finding> = map
        .duplicates()
        .iter()
        .map(|d| {
            finding(
                d.at,
                Severity::Error,
                ConfigError {
                    path: d.path.clone(),
                    message: d.message(false),
                },
            )
        })
        .collect();
    let parsed = match diagnose_team_limits_for(&doc, "", service) {
        Ok((limits, warnings)) => {
            findings.extend(warnings.into_iter().map(|w| {
                let at = map.locate(&w.path, false);
                finding(at, Severity::Warning, w)
            }));
            Some((doc, limits))
        }
        Err(diagnostics) => {
            findings.extend(diagnostics.into_iter().map(|d| {
                let at = map.locate(&d.error.path, d.anchor == Anchor::Key);
                let mut error = d.error;
                error.message = as_written(error.message, text, at);
                finding(at, Severity::Error, error)
            }));
            None
        }
    };
    let ok = findings.iter().all(|f| f.severity == Severity::Warning);
    TeamFile {
        findings,
        parsed: parsed.filter(|_| ok),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        check_team_file("limits.json", text)
            .findings
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn errors_carry_file_line_and_column() {
        let text = r#"{
  "x-tenant-id": {
    "default": { "persecond": 5, "perminute": 20, "perhour": 30 },
    "group_1": { "persecond": 50, "perminute": -5, "perhour": 100,
                 "header_value": ["tenant-b"], "perfortnight": 1 }
  }
}"#;
        assert_eq!(
            lines(text),
            vec![
                "limits.json:4:48: x-tenant-id.group_1.perminute: must be a positive integer, got -5",
                "limits.json:5:48: x-tenant-id.group_1.perfortnight: unknown key \"perfortnight\", expected one of persecond, perminute, perhour, perday, perweek, permonth, peryear, per<N><unit> (such as per5minutes), shadow, window, routes, regions, header_value",
            ]
        );
    }

    #[test]
    fn counter_only_limits_are_refused_on_their_line_for_envoy_ratelimit() {
        let text = "{\"x-t\": {\"default\": {\"perhour\": 1,\n \"peryear\": 2,\n \"window\": \"sliding\"}}}";
        let found = lines(text);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[1].starts_with(
                "limits.json:3:12: x-t.default.window: sliding needs rate_limit_service.service"
            ),
            "{found:?}"
        );
        assert!(
            found[0].starts_with(
                "limits.json:2:2: x-t.default.peryear: needs rate_limit_service.service"
            ),
            "{found:?}"
        );
        let f = check_team_file_for("limits.json", text, Service::Counter);
        assert!(f.findings.is_empty(), "{:?}", f.findings);
        let (_, limits) = f.parsed.unwrap();
        assert_eq!(
            limits.default.unwrap().limits.get(crate::model::Unit::Year),
            Some(2)
        );
    }

    #[test]
    fn a_global_group_is_read_for_the_counter_and_refused_elsewhere_on_its_line() {
        let text = "{\"x-t\": {\"default\": {\"perminute\": 100,\n \"regions\": \"global\"}}}";
        let found = lines(text);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with(
                "limits.json:2:13: x-t.default.regions: global needs rate_limit_service.service \"counter\""
            ),
            "{found:?}"
        );
        let f = check_team_file_for("limits.json", text, Service::Counter);
        assert!(f.findings.is_empty(), "{:?}", f.findings);
        let (_, limits) = f.parsed.unwrap();
        assert!(limits.default.unwrap().global);
        // Local is the default, and may be said.
        let text = "{\"x-t\": {\"default\": {\"perminute\": 100, \"regions\": \"local\"}}}";
        let f = check_team_file_for("limits.json", text, Service::Counter);
        assert!(!f.parsed.unwrap().1.default.unwrap().global);
        // Anything else, and a sliding window, are refused where they are.
        let bad = |text: &str| -> Vec<String> {
            check_team_file_for("limits.json", text, Service::Counter)
                .findings
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        let found = bad("{\"x-t\": {\"default\": {\"perminute\": 1,\n \"regions\": \"world\"}}}");
        assert_eq!(
            found,
            ["limits.json:2:13: x-t.default.regions: must be \"global\" or \"local\", got string \"world\""]
        );
        let found = bad("{\"x-t\": {\"default\": {\"perminute\": 1, \"window\": \"sliding\",\n \"regions\": \"global\"}}}");
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0]
                .starts_with("limits.json:2:13: x-t.default.regions: global needs fixed windows"),
            "{found:?}"
        );
    }

    #[test]
    fn syntax_errors_and_duplicate_keys() {
        assert_eq!(
            lines("{\n  \"x-t\": {\"default\": {\"perhour\": 1,}}\n}"),
            vec!["limits.json:2:36: not valid JSON: trailing comma"]
        );
        assert_eq!(
            lines("{\"x-t\": {\"default\": {\"perhour\": 1,\n \"perhour\": 2}}}"),
            vec!["limits.json:2:2: x-t.default.perhour: duplicate key \"perhour\" (first at 1:22): JSON keeps only the last one"]
        );
    }

    #[test]
    fn what_is_not_a_team_file_says_what_it_is() {
        let out = lines(
            r#"{"domain": "d", "limits": {"x-t": {"default": {"perhour": 1}}}, "rate_limit_service": {"cluster": "c"}}"#,
        );
        assert_eq!(out.len(), 1, "{out:?}");
        assert!(out[0].contains("this is a plugin configuration"), "{out:?}");
        let out = lines("{\"x-t\": {\"default\": {\"perhour\": 99999999999999999999999}}}");
        assert!(out[0].ends_with("got 99999999999999999999999"), "{out:?}");
        let out = lines("// limits\n{\"x-t\": {}}");
        assert!(out[0].contains("JSON has no comments"), "{out:?}");
        let out = lines("{'x-t': {}}");
        assert!(out[0].contains("double quotes"), "{out:?}");
        let out = lines("x-t:\n  default: {perhour: 1}\n");
        assert!(out[0].contains("looks like YAML"), "{out:?}");
    }

    #[test]
    fn a_byte_order_mark_is_named() {
        assert_eq!(
            lines("\u{feff}{\"x-t\": {\"default\": {\"perhour\": 1}}}"),
            vec!["limits.json:1:1: starts with a UTF-8 byte order mark (BOM), which JSON does not allow: save it as UTF-8 without a BOM"]
        );
    }

    #[test]
    fn long_values_are_cut_in_messages() {
        let long = "a".repeat(1 << 20);
        let out = lines(&format!(
            "{{\"x-t\": {{\"default\": {{\"perhour\": \"{long}\", \"{long}\": 1}}}}}}"
        ));
        let a64 = "a".repeat(64);
        assert_eq!(
            out,
            vec![
                format!("limits.json:1:33: x-t.default.perhour: must be a positive integer, got string \"{a64}\"… (1048576 bytes)"),
                format!("limits.json:1:1048613: x-t.default.{a64}…: unknown key \"{a64}\"… (1048576 bytes), expected one of persecond, perminute, perhour, perday, perweek, permonth, peryear, per<N><unit> (such as per5minutes), shadow, window, routes, regions"),
            ]
        );
    }

    #[test]
    fn warnings_do_not_fail_a_file() {
        let f = check_team_file(
            "l.json",
            r#"{"x-t": {"default": {"persecond": 1, "perminute": 60}}}"#,
        );
        assert_eq!(f.errors(), 0);
        assert!(f.parsed.is_some());
        assert_eq!(
            f.findings.iter().map(ToString::to_string).collect::<Vec<_>>(),
            vec!["l.json:1:51: warning: x-t.default.perminute: can never bind: persecond 1 allows 60 per minute already"]
        );
    }
}
