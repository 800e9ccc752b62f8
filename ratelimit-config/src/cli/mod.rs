//! The `ratelimit-config` command: its arguments ([`args`]), why it fails
//! ([`error`]), what it reads ([`load`]), and one module per command, each
//! with `run(args) -> Result<ExitCode, CliError>`.

mod args;
mod check;
mod error;
mod explain;
mod generate;
mod load;
mod render;
mod schema;
mod validate;

use std::path::Path;
use std::process::ExitCode;

use clap::Parser;
use ratelimit_config::owned::{write_owned, Output};

use args::{Cli, Command};
use error::CliError;

/// Runs the command line; a failure is printed, with its exit status.
pub fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Validate(a) => validate::run(a),
        Command::Generate(a) => generate::run(a),
        Command::Explain(a) => explain::run(a),
        Command::Check(a) => check::run(a),
        Command::Render(a) => render::run(a),
        Command::Schema => schema::run(),
    };
    result.unwrap_or_else(|e| {
        eprintln!("{e}");
        e.exit_code()
    })
}

/// Writes an output folder as its owner ([`write_owned`]), printing what
/// was done to each file.
fn write_out(out: &Path, files: &[Output<'_>], by: &str) -> Result<(), CliError> {
    for change in write_owned(out, files, by).map_err(CliError::Owned)? {
        println!("{change}");
    }
    Ok(())
}
