//! The filter's plugin configuration: the JSON that Envoy hands to the wasm
//! filter (`configuration`), parsed and validated once per VM.
//!
//! - [`defaults`]: every default and bound, written once;
//! - [`names`]: the options whose value is one of a few names;
//! - [`types`]: the configuration as the filter uses it;
//! - [`parse`]: the parser (unknown keys are errors, never silent defaults);
//! - [`write`]: what `ratelimit-config generate` writes (CLI only).

mod defaults;
mod names;
mod parse;
mod types;
#[cfg(feature = "cli")]
mod write;

pub use defaults::*;
pub use names::{HeaderMode, MissingTenant, Mode, OnFailure, Share};
pub use parse::{default_max_tenant_length, parse_plugin_config};
pub use types::{
    BatchConfig, BreakerConfig, BucketParams, CostConfig, FallbackConfig, GroupLocal, LocalConfig,
    MetricsConfig, PluginConfig, TenantSource,
};
#[cfg(feature = "cli")]
pub use write::{
    plugin_config_json, BatchJson, LocalJson, PluginConfigJson, PluginOptions, RateLimitServiceJson,
};
