//! `schema`: the team file's JSON Schema, for editors.

use std::process::ExitCode;

use ratelimit_config::schema::team_limits_schema;

use super::error::CliError;

pub fn run() -> Result<ExitCode, CliError> {
    let schema = serde_json::to_string_pretty(&team_limits_schema()).map_err(|source| {
        CliError::Serialise {
            what: "schema",
            source,
        }
    })?;
    println!("{schema}");
    Ok(ExitCode::SUCCESS)
}
