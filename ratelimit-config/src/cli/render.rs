//! `render`: every deployment artifact of one target, from the team file
//! and the deployment description.

use std::process::ExitCode;

use ratelimit_config::owned::Output;
use ratelimit_config::render::deployment::{
    deployment, parse_assignment, read_description, set_path, Sources,
};
use ratelimit_config::render::{merge, render, route_notes, Team};
use serde_json::Value;

use super::args::RenderArgs;
use super::error::CliError;
use super::load::{load_team_for, read, shown, source_name};
use super::write_out;

/// Writes every artifact of one target.
pub fn run(a: RenderArgs) -> Result<ExitCode, CliError> {
    let target = a.target;
    let (mut description, mut sources) = match &a.deployment {
        Some(path) => read_description(&shown(path), &read(path)?)
            .map_err(|e| CliError::Description(vec![e]))?,
        None => (Value::Object(Default::default()), Sources::default()),
    };
    if !description.is_object() {
        description = Value::Object(Default::default());
    }
    for (key, value) in a.named.given() {
        set_path(&mut description, key, Value::String(value));
        let flag = match key {
            "service.kind" => "--service".to_string(),
            _ => format!("--{}", key.replace('_', "-")),
        };
        sources.flags.insert(key.to_string(), flag);
    }
    for arg in &a.set {
        let (path, value) =
            parse_assignment(arg).map_err(|m| CliError::Usage(format!("--set {m}")))?;
        set_path(&mut description, &path, value);
        sources.flags.insert(path.clone(), format!("--set {path}"));
    }
    // The plugin's domain, limits and cluster are render's: the
    // description says why when --plugin sets them.
    let (settings, flags) = a.plugin.read(&[])?;
    if let Value::Object(settings) = &settings {
        if !settings.is_empty() {
            let mut plugin = description
                .get("plugin")
                .cloned()
                .unwrap_or(Value::Object(Default::default()));
            merge(&mut plugin, &Value::Object(settings.clone()));
            set_path(&mut description, "plugin", plugin);
        }
    }
    sources.flags.extend(flags);
    let dep = deployment(&description, &sources, target).map_err(CliError::Description)?;
    // The team file as the service that counts it reads it.
    let (json, limits) = load_team_for(&a.file, dep.service.kind)?;
    let source = source_name(&a.file);
    let team = Team {
        source: &source,
        json: &json,
        limits: &limits,
    };
    let place = |path: &str| sources.place(path);
    let (files, warnings) = render(&team, &dep, target, &place).map_err(CliError::Render)?;
    for w in &warnings {
        eprintln!(
            "{}: warning: plugin configuration: {w}",
            place(&format!("plugin.{}", w.path))
        );
    }
    for note in route_notes(&limits, &dep, target) {
        eprintln!("{note}");
    }
    let outputs: Vec<Output<'_>> = files
        .iter()
        .map(|f| Output {
            name: &f.name,
            text: &f.text,
        })
        .collect();
    write_out(
        &a.out,
        &outputs,
        &format!("render --target {}", target.name()),
    )?;
    Ok(ExitCode::SUCCESS)
}
