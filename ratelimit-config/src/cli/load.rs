//! Reading what the commands are given: team files, plugin
//! configurations (or the deployed objects holding one), service configs;
//! `-` is standard input.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use ratelimit_config::check::{parse_service_config, Problem, ServiceConfig};
use ratelimit_config::deployed::{self, Placement};
use ratelimit_config::field::{starts_with_bom, BOM_MESSAGE};
use ratelimit_config::span::{scan, Position};
use ratelimit_config::team_file::{
    check_team_file_for, syntax_error, team_file_by_mistake, Finding, Severity, EMPTY_PLUGIN_CONFIG,
};
use ratelimit_config::yaml_in;
use ratelimit_config::{parse_plugin_config, ConfigError, PluginConfig, Service, TeamLimits};
use serde_json::Value;

use super::error::CliError;

/// A file's text; `-` is standard input (read once: a second `-` is empty).
pub fn read(path: &Path) -> Result<String, CliError> {
    if path == Path::new("-") {
        let mut text = String::new();
        return io::Read::read_to_string(&mut io::stdin(), &mut text)
            .map(|_| text)
            .map_err(|source| CliError::Read {
                path: path.to_path_buf(),
                source,
            });
    }
    std::fs::read_to_string(path).map_err(|source| CliError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// How messages name a file: `-` is `<stdin>`.
pub fn shown(path: &Path) -> String {
    if path == Path::new("-") {
        "<stdin>".into()
    } else {
        path.display().to_string()
    }
}

/// A file's name for a generated header: only its name, so the output does
/// not depend on where it ran.
pub fn source_name(path: &Path) -> String {
    if path == Path::new("-") {
        return "stdin".into();
    }
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// Reads and checks one team file for the service that will count its
/// limits; its warnings are printed.
pub fn load_team_for(path: &Path, service: Service) -> Result<(Value, TeamLimits), CliError> {
    let text = read(path)?;
    let report = check_team_file_for(&shown(path), &text, service);
    match report.parsed {
        Some(parsed) => {
            for warning in &report.findings {
                eprintln!("{warning}");
            }
            Ok(parsed)
        }
        None => Err(CliError::Findings(report.findings)),
    }
}

/// Reads and parses a plugin configuration.
pub fn load_plugin(path: &Path) -> Result<PluginConfig, CliError> {
    let text = read(path)?;
    let file = path.display().to_string();
    let found = |at: Position, error: ConfigError| Finding {
        file: file.clone(),
        at,
        severity: Severity::Error,
        error,
    };
    if starts_with_bom(text.as_bytes()) {
        let error = ConfigError {
            path: String::new(),
            message: BOM_MESSAGE.into(),
        };
        return Err(CliError::Findings(vec![found(Position::START, error)]));
    }
    if text.trim().is_empty() {
        let error = ConfigError {
            path: String::new(),
            message: EMPTY_PLUGIN_CONFIG.into(),
        };
        return Err(CliError::Findings(vec![found(Position::START, error)]));
    }
    let doc = match serde_json::from_str::<Value>(&text) {
        Ok(doc) => doc,
        Err(e) => {
            let (at, error) = syntax_error(&text, &e);
            // Not JSON: a deployed object in YAML (a WasmPlugin, an
            // EnvoyExtensionPolicy, an Envoy bootstrap) holding it.
            if !text.trim_start().starts_with(['{', '[']) {
                return load_deployed_plugin(&file, &text, (at, error));
            }
            return Err(CliError::Findings(vec![found(at, error)]));
        }
    };
    if let Some(error) = team_file_by_mistake(&doc) {
        return Err(CliError::Findings(vec![found(Position::START, error)]));
    }
    match parse_plugin_config(text.as_bytes()) {
        Ok((config, _)) => Ok(config),
        Err(errors) => {
            let map = scan(&text);
            let findings = errors
                .into_iter()
                .map(|e| found(map.locate(&e.path, false), e))
                .collect();
            Err(CliError::Findings(findings))
        }
    }
}

/// The plugin configuration held by a deployed object in YAML; `json_error`
/// is what is reported when the text is not YAML either.
fn load_deployed_plugin(
    file: &str,
    text: &str,
    json_error: (Position, ConfigError),
) -> Result<PluginConfig, CliError> {
    let finding = |at: Position, path: String, message: String| Finding {
        file: file.to_string(),
        at,
        severity: Severity::Error,
        error: ConfigError { path, message },
    };
    let found = match deployed::plugin_config(text) {
        Ok(f) => f,
        // Not YAML either: the JSON error says the most.
        Err(_) if yaml_in::documents(text).is_err() => {
            return Err(CliError::Findings(vec![finding(
                json_error.0,
                json_error.1.path,
                json_error.1.message,
            )]))
        }
        Err((at, message)) => {
            return Err(CliError::Findings(vec![finding(
                at,
                String::new(),
                message,
            )]))
        }
    };
    let mut findings: Vec<Finding> = found
        .problems
        .iter()
        .map(|(at, m)| finding(*at, String::new(), m.clone()))
        .collect();
    let bytes = serde_json::to_vec(&found.value).map_err(|source| CliError::Serialise {
        what: "plugin configuration",
        source,
    })?;
    match parse_plugin_config(&bytes) {
        Ok((config, _)) if findings.is_empty() => Ok(config),
        Ok(_) => Err(CliError::Findings(findings)),
        Err(errors) => {
            findings.extend(errors.into_iter().map(|e| {
                let at = found.locate(&e.path);
                let message = format!("{} ({})", e.message, found.what);
                finding(at, e.path, message)
            }));
            Err(CliError::Findings(findings))
        }
    }
}

/// A service config, or each entry of the ConfigMaps in the file. Each
/// config's `file` is unique; `places` maps it back to the file read and
/// where the entry's text is in it.
pub fn load_service(
    path: &Path,
    places: &mut BTreeMap<String, (String, Placement)>,
) -> Result<Vec<ServiceConfig>, CliError> {
    let text = read(path)?;
    let file = path.display().to_string();
    let Some(entries) = deployed::config_map_entries(&text) else {
        return parse_service_config(&file, &text)
            .map(|s| vec![s])
            .map_err(CliError::Service);
    };
    if entries.is_empty() {
        return Err(CliError::Service(vec![Problem {
            file,
            at: Position::START,
            message: "a ConfigMap with no entry in data: the service would load no rules".into(),
        }]));
    }
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for (key, body, placement) in entries {
        let name = format!("{file} (data.{key})");
        places.insert(name.clone(), (file.clone(), placement));
        match parse_service_config(&name, &body) {
            Ok(s) => out.push(s),
            Err(p) => problems.extend(p),
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(CliError::Service(
            problems.into_iter().map(|p| placed(p, places)).collect(),
        ))
    }
}

/// A problem in a ConfigMap's entry, at its place in the file.
pub fn placed(p: Problem, places: &BTreeMap<String, (String, Placement)>) -> Problem {
    match places.get(&p.file) {
        Some((file, placement)) => Problem {
            file: file.clone(),
            at: placement.map(p.at),
            message: p.message,
        },
        None => p,
    }
}
