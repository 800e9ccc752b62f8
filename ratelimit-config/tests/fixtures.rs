//! One file per invalid team file, each with its exact expected output, in
//! the style of envoyproxy/ratelimit's test/config:
//! tests/fixtures/bad/<case>.json + <case>.expected (errors),
//! tests/fixtures/warn/<case>.json + <case>.expected (warnings only).
//! `UPDATE_FIXTURES=1 cargo test` rewrites the .expected files.
//!
//! The filter parses the same team JSON inside its plugin configuration
//! (`limits`); it must refuse each bad file with the same messages, its
//! paths prefixed with `limits.`.
// A test crate: helpers outside #[test] functions may fail loudly too.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use std::fs;
use std::path::{Path, PathBuf};

use ratelimit_config::parse_plugin_config;
use ratelimit_config::team_file::{check_team_file, Severity, TeamFile};
use ratelimit_config::ConfigError;
use serde_json::{json, Value};

/// Not JSON: the filter refuses them on its own text (a BOM in the middle
/// of a configuration is no BOM; `plugin.rs` tests one at its start).
const NOT_JSON: &[&str] = &["malformed-json", "bom"];

/// The plugin configuration's text with `team` in it verbatim, as `limits`:
/// its lines are the team file's, and its first line is shifted by
/// `LIMITS_COLUMN - 1` columns.
fn as_plugin_config_text(team: &str) -> Vec<u8> {
    format!("{{\"limits\": {team},\n\"domain\": \"d\", \"rate_limit_service\": {{\"cluster\": \"c\"}}}}")
        .into_bytes()
}
const LIMITS_COLUMN: usize = 11;

fn cases(dir: &str) -> Vec<(String, String, String)> {
    // Relative to the package: cargo runs tests there, natively and under
    // the wasm runner (which opens the current directory to the test).
    let dir = Path::new("tests/fixtures").join(dir);
    let mut names: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|p| {
            let case = p.file_stem().unwrap().to_string_lossy().into_owned();
            let text = fs::read_to_string(&p).unwrap();
            let expected_path = p.with_extension("expected");
            let expected = fs::read_to_string(&expected_path).unwrap_or_default();
            (case, text, expected)
        })
        .collect()
}

fn rendered(report: &TeamFile) -> String {
    report.findings.iter().map(|f| format!("{f}\n")).collect()
}

fn run(dir: &str, severity: Severity, min_cases: usize) {
    let update = std::env::var_os("UPDATE_FIXTURES").is_some();
    let all = cases(dir);
    assert!(all.len() >= min_cases, "only {} cases in {dir}", all.len());
    for (case, text, expected) in all {
        let report = check_team_file(&format!("{case}.json"), &text);
        let got = rendered(&report);
        if update {
            fs::write(format!("tests/fixtures/{dir}/{case}.expected"), &got).unwrap();
            continue;
        }
        assert_eq!(got, expected, "{dir}/{case}");
        assert!(!got.is_empty(), "{dir}/{case}: no finding");
        assert!(
            report.findings.iter().any(|f| f.severity == severity),
            "{dir}/{case}"
        );
        assert_eq!(
            report.parsed.is_some(),
            severity == Severity::Warning,
            "{dir}/{case}"
        );
    }
}

#[test]
fn bad_files_give_their_exact_errors() {
    run("bad", Severity::Error, 30);
}

#[test]
fn warnings_alone_do_not_fail_a_file() {
    run("warn", Severity::Warning, 2);
}

fn as_plugin_config(limits: Value) -> Vec<u8> {
    json!({"domain": "d", "limits": limits, "rate_limit_service": {"cluster": "c"}})
        .to_string()
        .into_bytes()
}

#[test]
fn the_filter_refuses_every_bad_file_with_the_same_messages() {
    let mut compared = 0;
    for (case, text, _) in cases("bad") {
        if NOT_JSON.contains(&case.as_str()) {
            continue;
        }
        let cli: Vec<ConfigError> = check_team_file("x.json", &text)
            .findings
            .into_iter()
            .map(|f| {
                let mut message = f.error.message;
                // The filter's log line has no place of its own: a duplicate
                // key's message carries it (in the plugin configuration).
                if message.starts_with("duplicate key ") {
                    let column = f.at.column + if f.at.line == 1 { LIMITS_COLUMN - 1 } else { 0 };
                    message = message.replacen(
                        " (first at",
                        &format!(" at {}:{column} (first at", f.at.line),
                        1,
                    );
                }
                ConfigError {
                    path: if f.error.path.is_empty() {
                        "limits".into()
                    } else {
                        format!("limits.{}", f.error.path)
                    },
                    message,
                }
            })
            .collect();
        let filter = parse_plugin_config(&as_plugin_config_text(&text)).unwrap_err();
        assert_eq!(filter, cli, "{case}");
        // Re-serialised (duplicates gone), the same document gives the same
        // errors but the duplicates'.
        let doc: Value = serde_json::from_str(&text).unwrap();
        let rest: Vec<ConfigError> = cli
            .into_iter()
            .filter(|e| !e.message.starts_with("duplicate key "))
            .collect();
        match parse_plugin_config(&as_plugin_config(doc)) {
            Ok(_) => assert!(rest.is_empty(), "{case}"),
            Err(e) => assert_eq!(e, rest, "{case}"),
        }
        compared += 1;
    }
    assert!(compared >= 30, "{compared}");
}

#[test]
fn the_filter_refuses_duplicate_keys_at_their_place() {
    let (_, text, _) = cases("bad")
        .into_iter()
        .find(|c| c.0 == "duplicate-key")
        .unwrap();
    let errors: Vec<String> = parse_plugin_config(&as_plugin_config_text(&text))
        .unwrap_err()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        errors,
        vec!["limits.x-tenant-id.group_1: duplicate key \"group_1\" at 6:5 (first at 4:5): JSON keeps only the last one"]
    );
}

#[test]
fn the_warnings_are_the_filters_too() {
    for (case, text, _) in cases("warn") {
        let doc: Value = serde_json::from_str(&text).unwrap();
        let (_, filter) = parse_plugin_config(&as_plugin_config(doc)).unwrap();
        let cli: Vec<String> = check_team_file("x.json", &text)
            .findings
            .iter()
            .map(|f| format!("limits.{}", f.error))
            .collect();
        let filter: Vec<String> = filter.iter().map(ToString::to_string).collect();
        assert_eq!(filter, cli, "{case}");
    }
}
