//! The team limits JSON of tenant-ratelimit, in one place for the filter and
//! the CLI: the model, its validation, and generation of the configurations
//! that must agree with it (the rate-limit service YAML, the filter's plugin
//! configuration). No proxy-wasm here: everything is pure and testable natively.

#[cfg(feature = "cli")]
pub mod check;
pub mod envoy_rate_limits;
pub mod explain;
pub mod model;
pub mod plugin;
pub mod schema;
pub mod service_yaml;
pub mod span;
pub mod team_file;
pub mod validate;

pub use model::{descriptors, Group, TeamLimits, Unit, UnitLimits};
pub use plugin::{
    parse_plugin_config, BucketParams, HeaderMode, LocalConfig, MissingTenant, PluginConfig,
};
pub use validate::{
    diagnose_team_limits, parse_team_limits, Anchor, ConfigError, Diagnostic, Warning,
};
