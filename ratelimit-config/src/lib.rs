//! The team limits JSON of tenant-ratelimit, in one place for the filter and
//! the CLI: the model, its validation, and generation of the configurations
//! that must agree with it (the rate-limit service YAML, the filter's plugin
//! configuration). No proxy-wasm here: everything is pure and testable natively.
//!
//! The filter depends on this crate without default features: it links the
//! model, the validation and the plugin configuration's parser, nothing
//! else. What only the `ratelimit-config` binary needs (reading files with
//! positions, writing YAML and JSON, `explain`, `check`, `schema`) sits
//! behind the `cli` feature. What the filter and `ratelimit-counter` say to
//! each other over gRPC (the RLS messages, the request marks, the unit
//! numbers) is [`rls`], behind the `rls` feature: both turn it on.

pub mod counter_keys;
pub mod error;
pub mod field;
pub mod json_text;
pub mod model;
pub mod plugin;
#[cfg(feature = "rls")]
pub mod rls;
pub mod validate;
pub mod window;

#[cfg(feature = "cli")]
pub mod check;
#[cfg(feature = "cli")]
pub mod deployed;
#[cfg(feature = "cli")]
pub mod envoy_rate_limits;
#[cfg(feature = "cli")]
pub mod explain;
#[cfg(feature = "cli")]
pub mod owned;
#[cfg(feature = "cli")]
pub mod render;
#[cfg(feature = "cli")]
pub mod schema;
#[cfg(feature = "cli")]
pub mod service_yaml;
#[cfg(feature = "cli")]
pub mod span;
#[cfg(feature = "cli")]
pub mod team_file;
#[cfg(feature = "cli")]
pub mod yaml_in;
#[cfg(feature = "cli")]
pub mod yaml_out;

pub use model::{descriptors, tenant_value, Group, Service, TeamLimits, Unit, UnitLimits, Window};
pub use plugin::{
    parse_plugin_config, BatchConfig, BreakerConfig, BucketParams, FallbackConfig, GroupLocal,
    HeaderMode, LocalConfig, MissingTenant, Mode, OnFailure, PluginConfig, Share, TenantSource,
    LEASE_TICK_MS,
};
pub use validate::{
    diagnose_team_limits, parse_team_limits, Anchor, ConfigError, Diagnostic, Warning,
};
