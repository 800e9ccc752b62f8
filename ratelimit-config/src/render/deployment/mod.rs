//! What `render` needs besides the team file, as one tree: the deployment
//! description (`--deployment FILE`, YAML or JSON), then the command line
//! over it (`--domain`, `--namespace`, `--image`, `--sha256`,
//! `--fail-strategy`, `--set PATH=VALUE`, `--plugin PATH=VALUE`). Every
//! key is checked; a problem names its place: the file's line, or the flag.
//!
//! - [`description`]: the description's text and the flags over it, and
//!   where each value came from;
//! - [`types`]: the checked description, one type per section;
//! - [`sections`]: [`deployment`], each section read by its own function.

mod description;
mod sections;
mod types;

pub use description::{parse_assignment, read_description, set_path, DescriptionError, Sources};
pub use sections::{deployment, redis_scheme, REDIS_SCHEMES};
pub use types::*;
