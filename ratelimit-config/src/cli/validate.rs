//! `validate`: checks team files, each one's problems on stderr.

use std::process::ExitCode;

use super::args::ValidateArgs;
use super::error::CliError;
use super::load::load_team_for;

/// Checks every file, printing each one's problems; exit 1 when one has any.
pub fn run(a: ValidateArgs) -> Result<ExitCode, CliError> {
    let mut ok = true;
    for f in &a.files {
        match load_team_for(f, a.service.service) {
            Ok(_) => println!("{}: ok", f.display()),
            Err(e) => {
                eprintln!("{e}");
                ok = false;
            }
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
