//! The command line: the commands, their arguments and the settings
//! several commands share (`--service`, `--plugin`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::{ArgGroup, Args, Parser, Subcommand};
use ratelimit_config::plugin::{DEFAULT_DESCRIPTOR_KEY, DEFAULT_TIMEOUT_MS};
use ratelimit_config::render::deployment::{self as render_keys, parse_assignment, set_path};
use ratelimit_config::render::{FailStrategy, Target};
use ratelimit_config::Service;
use serde_json::Value;

use super::error::CliError;

/// Per-tenant rate limits for Envoy, from one small JSON file.
///
/// The team file maps one request header to groups of limits:
///
///   {"x-tenant-id": {
///      "default": {"persecond": 5, "perminute": 20, "perhour": 30},
///      "group_1": {"persecond": 50, "perminute": 70, "perhour": 100,
///                  "header_value": ["tenant-b", "tenant-c"]}}}
///
/// - Exactly one key at the top: the header carrying the tenant (lowercase).
/// - "default" applies to every tenant not listed in a named group; it takes
///   no header_value. Each tenant has its own counter either way.
/// - A named group (letters, digits, '_', '-') lists its tenants in a
///   non-empty "header_value"; a tenant may be in only one group.
/// - Units: persecond, perminute, perhour, perday, each a positive integer
///   up to 4294967295; a unit left out is not limited; a group needs one.
/// - "routes" (optional, in any group): limits per Envoy route name, on top
///   of the group's, e.g. "routes": {"reports": {"perminute": 5}}.
/// - "shadow": true (optional, in any group): the group's refusals are
///   counted and logged but not enforced, to roll a limit out safely.
///
/// Problems are reported all at once, as <file>:<line>:<col>: <path>: <message>,
/// e.g. limits.json:4:48: x-tenant-id.group_1.perminute: must be a positive integer, got -5
/// Exit status: 0 when fine (warnings allowed), 1 when a problem was found, 2 on bad usage.
#[derive(Parser)]
#[command(name = "ratelimit-config", version, verbatim_doc_comment)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Check team limits files; report every problem with file:line:col, exit 1 on any.
    Validate(ValidateArgs),
    /// Write ratelimit.yaml (the service's rules), envoy-rate-limits.yaml (the
    /// rate_limits of Envoy's own filter), plugin-config.json (the wasm filter's),
    /// and, when a group limits routes, envoy-route-rate-limits.yaml (those
    /// routes' rate_limits for Envoy's own filter).
    Generate(GenerateArgs),
    /// Show a tenant's group, limits, descriptors and the Redis keys it is counted under.
    Explain(ExplainArgs),
    /// Prove that every descriptor the filter can send matches a service rule
    /// with the same limit and unit; name each one that does not.
    Check(CheckArgs),
    /// Print a JSON Schema (draft 2020-12) of the team limits file, for editors.
    Schema,
    /// Write every deployment artifact of one target from the team file:
    /// istio (WasmPlugin), envoy-gateway (EnvoyExtensionPolicy, EnvoyProxy),
    /// envoy (bootstrap pieces; with --namespace, the sidecar Deployment);
    /// each with the rate-limit service, its Redis and NetworkPolicies.
    ///
    /// Settings come from --deployment FILE (YAML or JSON), then the flags.
    /// Plugin settings: `plugin:` in the file or --plugin PATH=VALUE
    /// (e.g. --plugin local.mode=lease --plugin shadow=true
    /// --plugin 'metrics.groups=[gold, silver]'); any other key:
    /// --set PATH=VALUE (e.g. --set service.port=9000).
    #[command(verbatim_doc_comment)]
    Render(RenderArgs),
}

#[derive(Args)]
pub struct ValidateArgs {
    /// Team limits JSON files (`-`: standard input), in the format of
    /// `ratelimit-config --help` (`ratelimit-config schema` prints it as a JSON Schema).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    #[command(flatten)]
    pub service: ServiceArg,
}

/// `--service`: which rate-limit service will count the limits.
#[derive(Args)]
pub struct ServiceArg {
    /// The rate-limit service that counts: envoy-ratelimit (envoyproxy/ratelimit,
    /// fixed windows of seconds to days) or counter (ratelimit-counter, which
    /// also counts "window": "sliding" and perweek, permonth, peryear on the calendar).
    #[arg(long = "service", value_enum, default_value = "envoy-ratelimit")]
    pub service: Service,
}

#[derive(Args)]
pub struct GenerateArgs {
    /// The team limits JSON file.
    pub file: PathBuf,
    /// The rate-limit service domain.
    #[arg(long)]
    pub domain: String,
    /// Output directory (created when missing).
    #[arg(long)]
    pub out: PathBuf,
    /// Envoy cluster of the rate-limit service, named in the filter config.
    #[arg(long, default_value = "ratelimit")]
    pub cluster: String,
    /// gRPC timeout of the filter's call to the service, in milliseconds (at least 1).
    #[arg(long, default_value_t = DEFAULT_TIMEOUT_MS, value_parser = clap::value_parser!(u32).range(1..))]
    pub timeout_ms: u32,
    /// Descriptor key that carries the tenant value.
    #[arg(long, default_value = DEFAULT_DESCRIPTOR_KEY)]
    pub descriptor_key: String,
    #[command(flatten)]
    pub service: ServiceArg,
    #[command(flatten)]
    pub plugin: PluginSettings,
}

/// `--plugin PATH=VALUE`, the same for `generate` and `render`.
#[derive(Args)]
pub struct PluginSettings {
    /// A plugin configuration setting, PATH=VALUE (VALUE read as YAML; only
    /// true and false are booleans), e.g. --plugin local.mode=lease
    /// --plugin response_cost_header=x-cost. Repeat for each setting.
    #[arg(long = "plugin", value_name = "PATH=VALUE")]
    pub plugin: Vec<String>,
}

impl PluginSettings {
    /// The settings as one tree, and the flag that set each path (paths
    /// under `plugin.`, as a deployment description has them). `owned`
    /// names the paths another flag sets, with that flag.
    pub fn read(
        &self,
        owned: &[(&str, &str)],
    ) -> Result<(Value, BTreeMap<String, String>), CliError> {
        let mut tree = Value::Object(Default::default());
        let mut flags = BTreeMap::new();
        for arg in &self.plugin {
            let (path, value) =
                parse_assignment(arg).map_err(|m| CliError::Usage(format!("--plugin {m}")))?;
            if let Some((_, flag)) = owned
                .iter()
                .find(|(p, _)| path == *p || path.starts_with(&format!("{p}.")))
            {
                return Err(CliError::Usage(format!(
                    "--plugin {path}: set by {flag}; give {flag} instead"
                )));
            }
            set_path(&mut tree, &path, value);
            flags.insert(format!("plugin.{path}"), format!("--plugin {path}"));
        }
        Ok((tree, flags))
    }
}

#[derive(Args)]
#[command(group(ArgGroup::new("source").required(true).args(["file", "plugin_config"])))]
pub struct ExplainArgs {
    /// The team limits JSON file (needs --domain).
    pub file: Option<PathBuf>,
    /// Or a plugin-config.json: domain, descriptor key and service come from it.
    #[arg(long, conflicts_with_all = ["domain", "descriptor_key"])]
    pub plugin_config: Option<PathBuf>,
    /// The tenant value (the header's value).
    #[arg(long)]
    pub tenant: String,
    /// The rate-limit service domain; it is part of every Redis key, so there is no default.
    #[arg(long, required_unless_present = "plugin_config")]
    pub domain: Option<String>,
    /// Descriptor key that carries the tenant value.
    #[arg(long)]
    pub descriptor_key: Option<String>,
    /// The service's CACHE_KEY_PREFIX, if it sets one (envoyproxy/ratelimit's).
    #[arg(long, default_value = "")]
    pub key_prefix: String,
    /// The rate-limit service that counts: envoy-ratelimit (envoyproxy/ratelimit)
    /// or counter (ratelimit-counter: its windows and Redis keys). Default: the
    /// plugin configuration's rate_limit_service.service, else envoy-ratelimit;
    /// given, it wins over the plugin configuration's.
    #[arg(long = "service", value_enum)]
    pub service: Option<Service>,
    /// The moment, in Unix seconds (default: now).
    #[arg(long)]
    pub at: Option<u64>,
    /// An Envoy route's name: also show the tenant's limits on that route.
    #[arg(long)]
    pub route: Option<String>,
}

#[derive(Args)]
pub struct CheckArgs {
    /// The filter's configuration: a plugin-config.json, or where it is
    /// deployed: a WasmPlugin (spec.pluginConfig), an EnvoyExtensionPolicy
    /// (spec.wasm[].config), an Envoy bootstrap or http_filters entry.
    #[arg(long)]
    pub plugin_config: PathBuf,
    /// The service's config YAML, or a ConfigMap of them (repeat for every file the service loads);
    /// for ratelimit-counter, the team file it serves (<domain>.json, as render writes it).
    #[arg(long, required = true)]
    pub service_config: Vec<PathBuf>,
    /// An Envoy configuration with the routes (a bootstrap, or what the admin
    /// /config_dump prints; repeatable): warn about each team-file route that
    /// no route is named. A bootstrap given as --plugin-config is read too.
    #[arg(long, value_name = "FILE")]
    pub envoy_config: Vec<PathBuf>,
    /// What is deployed on each side of the hop from Envoy to the service
    /// (repeatable): Envoy's bootstrap, bootstrap-fragment.yaml or
    /// envoyproxy.yaml, and the service's Deployment or the counter's
    /// systemd unit and .env: their TLS must agree.
    #[arg(long, value_name = "FILE")]
    pub deployed: Vec<PathBuf>,
}

#[derive(Args)]
pub struct RenderArgs {
    /// The team limits JSON file (`-`: standard input).
    pub file: PathBuf,
    /// What to write for.
    #[arg(long)]
    pub target: Target,
    /// Output directory (created when missing; files an earlier render wrote there and this one does not are removed).
    #[arg(long)]
    pub out: PathBuf,
    // The help lists the keys the description reader accepts (one list).
    #[arg(long, value_name = "FILE", help = deployment_help())]
    pub deployment: Option<PathBuf>,
    #[command(flatten)]
    pub named: NamedSettings,
    // Short help, and the paths and values the reader accepts in the long one.
    #[arg(long = "set", value_name = "PATH=VALUE", help = SET_HELP, long_help = set_long_help())]
    pub set: Vec<String>,
    #[command(flatten)]
    pub plugin: PluginSettings,
}

/// `render --deployment`'s help: the description's keys, as the reader
/// accepts them (`render::deployment::KEYS`).
fn deployment_help() -> String {
    format!(
        "A deployment description (YAML or JSON): {}. See docs/deploying.md.",
        render_keys::KEYS.join(", ")
    )
}

const SET_HELP: &str =
    "A description setting, PATH=VALUE (VALUE read as YAML; only true and false are booleans).";

/// `render --set`'s long help: every path of a section with fixed keys,
/// and the names a setting takes, as the reader accepts them.
fn set_long_help() -> String {
    fn paths(path: &str) -> Vec<String> {
        match render_keys::SECTION_KEYS.iter().find(|(s, _)| *s == path) {
            Some((_, keys)) => keys
                .iter()
                .flat_map(|k| paths(&format!("{path}.{k}")))
                .collect(),
            None => vec![path.to_string()],
        }
    }
    let (sections, scalars): (Vec<&str>, Vec<&str>) = render_keys::KEYS
        .iter()
        .partition(|k| **k == "plugin" || render_keys::SECTION_KEYS.iter().any(|(s, _)| s == *k));
    let mut out = format!(
        "{SET_HELP}\nE.g. --set service.port=9000 --set istio.mode=CLIENT.\nPaths:\n  {}",
        scalars.join(", ")
    );
    for section in sections {
        match section {
            "plugin" => out += "\n  plugin.PATH (or --plugin PATH=VALUE)",
            _ => out += &format!("\n  {}", paths(section).join(", ")),
        }
    }
    for (path, values) in render_keys::SETTING_VALUES {
        out += &format!("\n{path}: {}", values.join(", "));
    }
    out
}

/// The description's settings that have a flag of their own; each flag is
/// named after its key (`--fail-strategy` sets `fail_strategy`).
#[derive(Args)]
pub struct NamedSettings {
    /// The rate-limit service domain.
    #[arg(long)]
    pub domain: Option<String>,
    /// The Kubernetes namespace of everything rendered.
    #[arg(long)]
    pub namespace: Option<String>,
    /// The filter's OCI image (the compat variant `make oci-push` pushes).
    #[arg(long)]
    pub image: Option<String>,
    /// The image's manifest digest (`make oci` prints it), hex or sha256:hex.
    #[arg(long)]
    sha256: Option<String>,
    /// When the filter cannot run: open (requests pass, unlimited) or closed (refused).
    #[arg(long)]
    pub fail_strategy: Option<FailStrategy>,
    /// The rate-limit service to deploy (service.kind): envoy-ratelimit
    /// (envoyproxy/ratelimit, the default) or counter (ratelimit-counter).
    #[arg(long = "service", value_enum)]
    pub service: Option<Service>,
}

impl NamedSettings {
    /// (description key, value) of each flag given.
    pub fn given(&self) -> Vec<(&'static str, String)> {
        [
            ("domain", self.domain.clone()),
            ("namespace", self.namespace.clone()),
            ("image", self.image.clone()),
            ("sha256", self.sha256.clone()),
            ("fail_strategy", self.fail_strategy.map(FailStrategy::name)),
            ("service.kind", self.service.map(|s| s.name().to_string())),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect()
    }
}
