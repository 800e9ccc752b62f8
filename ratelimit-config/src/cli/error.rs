//! Why a command failed, and the exit status that says so.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::process::ExitCode;

use ratelimit_config::check::Problem;
use ratelimit_config::owned::OwnedError;
use ratelimit_config::render::deployment::DescriptionError;
use ratelimit_config::render::{Refused, RenderError};
use ratelimit_config::team_file::Finding;

/// Why a command failed. Its `Display` is what stderr shows: one line per
/// problem, each with its file (and line and column where there is one).
#[derive(Debug)]
pub enum CliError {
    Read {
        path: PathBuf,
        source: io::Error,
    },
    /// serde_json could not write a document (`what` names it).
    Serialise {
        what: &'static str,
        source: serde_json::Error,
    },
    /// The problems of a team file or a plugin configuration (with the
    /// warnings found before them).
    Findings(Vec<Finding>),
    /// The problems of a service config.
    Service(Vec<Problem>),
    /// `generate`'s options make a plugin configuration the filter refuses;
    /// each error with the flag that set it.
    Refused(Refused),
    /// An output folder holds a file this tool did not write, or cannot be written.
    Owned(OwnedError),
    /// The generated ratelimit.yaml does not read back: a bug.
    GeneratedYaml(Vec<Problem>),
    /// The generated files disagree with each other: a bug.
    Disagree(Vec<Problem>),
    /// A bad command-line value.
    Usage(String),
    /// The deployment description's problems.
    Description(Vec<DescriptionError>),
    /// What `render` refused.
    Render(RenderError),
}

/// Each of `items` on a line of its own, after `prefix`.
fn lines<T: fmt::Display>(f: &mut fmt::Formatter<'_>, prefix: &str, items: &[T]) -> fmt::Result {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            f.write_str("\n")?;
        }
        write!(f, "{prefix}{item}")?;
    }
    Ok(())
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Read { path, source } => {
                write!(f, "{}: cannot read: {source}", path.display())
            }
            CliError::Serialise { what, source } => {
                write!(f, "cannot serialise the {what}: {source}")
            }
            CliError::Findings(findings) => lines(f, "", findings),
            CliError::Service(problems) => lines(f, "", problems),
            CliError::Refused(refused) => refused.fmt(f),
            CliError::Owned(e) => e.fmt(f),
            CliError::GeneratedYaml(problems) => {
                lines(f, "generated ratelimit.yaml is wrong (a bug): ", problems)
            }
            CliError::Disagree(problems) => {
                lines(f, "generated files disagree (a bug): ", problems)
            }
            CliError::Usage(message) => f.write_str(message),
            CliError::Description(errors) => lines(f, "", errors),
            CliError::Render(e) => e.fmt(f),
        }
    }
}

impl CliError {
    /// The exit status the docs promise: 2 for a command line that cannot
    /// be read (as clap's own usage errors), 1 for a problem found.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            CliError::Usage(_) => ExitCode::from(USAGE_EXIT),
            _ => ExitCode::FAILURE,
        }
    }
}

/// The exit status of bad usage, clap's own.
const USAGE_EXIT: u8 = 2;

impl std::error::Error for CliError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CliError::Read { source, .. } => Some(source),
            CliError::Serialise { source, .. } => Some(source),
            CliError::Refused(refused) => Some(refused),
            CliError::Owned(e) => Some(e),
            CliError::Render(e) => Some(e),
            _ => None,
        }
    }
}
