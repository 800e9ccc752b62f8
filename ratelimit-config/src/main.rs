//! `ratelimit-config`: validates a team limits file and generates the
//! configurations that must agree with it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::{ArgGroup, Parser, Subcommand};
use ratelimit_config::check::{check, parse_service_config, ServiceConfig};
use ratelimit_config::envoy_rate_limits::envoy_rate_limits_yaml;
use ratelimit_config::explain::{explain, ExplainOptions};
use ratelimit_config::plugin::{
    plugin_config_json, PluginOptions, DEFAULT_DESCRIPTOR_KEY, DEFAULT_TIMEOUT_MS,
};
use ratelimit_config::schema::team_limits_schema;
use ratelimit_config::service_yaml::service_yaml;
use ratelimit_config::span::scan;
use ratelimit_config::team_file::{check_team_file, syntax_error};
use ratelimit_config::validate::{starts_with_bom, BOM_MESSAGE};
use ratelimit_config::{parse_plugin_config, PluginConfig, TeamLimits};
use serde_json::Value;

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
///
/// Problems are reported all at once, as <file>:<line>:<col>: <path>: <message>,
/// e.g. limits.json:4:48: x-tenant-id.group_1.perminute: must be a positive integer, got -5
/// Exit status: 0 when fine (warnings allowed), 1 when a problem was found, 2 on bad usage.
#[derive(Parser)]
#[command(name = "ratelimit-config", version, verbatim_doc_comment)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check team limits files; report every problem with file:line:col, exit 1 on any.
    Validate {
        /// Team limits JSON files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Write ratelimit.yaml (the service's rules), envoy-rate-limits.yaml (the
    /// rate_limits of Envoy's own filter) and plugin-config.json (the wasm filter's).
    Generate {
        /// The team limits JSON file.
        file: PathBuf,
        /// The rate-limit service domain.
        #[arg(long)]
        domain: String,
        /// Output directory (created when missing).
        #[arg(long)]
        out: PathBuf,
        /// Envoy cluster of the rate-limit service, named in the filter config.
        #[arg(long, default_value = "ratelimit")]
        cluster: String,
        /// gRPC timeout of the filter's call to the service, in milliseconds.
        #[arg(long, default_value_t = DEFAULT_TIMEOUT_MS)]
        timeout_ms: u32,
        /// Descriptor key that carries the tenant value.
        #[arg(long, default_value = DEFAULT_DESCRIPTOR_KEY)]
        descriptor_key: String,
    },
    /// Show a tenant's group, limits, descriptors and the Redis keys it is counted under.
    #[command(group(ArgGroup::new("source").required(true).args(["file", "plugin_config"])))]
    Explain {
        /// The team limits JSON file (needs --domain).
        file: Option<PathBuf>,
        /// Or a plugin-config.json: domain and descriptor key come from it.
        #[arg(long, conflicts_with_all = ["domain", "descriptor_key"])]
        plugin_config: Option<PathBuf>,
        /// The tenant value (the header's value).
        #[arg(long)]
        tenant: String,
        /// The rate-limit service domain; it is part of every Redis key, so there is no default.
        #[arg(long, required_unless_present = "plugin_config")]
        domain: Option<String>,
        /// Descriptor key that carries the tenant value.
        #[arg(long)]
        descriptor_key: Option<String>,
        /// The service's CACHE_KEY_PREFIX, if it sets one.
        #[arg(long, default_value = "")]
        key_prefix: String,
        /// The moment, in Unix seconds (default: now).
        #[arg(long)]
        at: Option<u64>,
    },
    /// Prove that every descriptor the filter can send matches a service rule
    /// with the same limit and unit; name each one that does not.
    Check {
        /// The filter's plugin-config.json.
        #[arg(long)]
        plugin_config: PathBuf,
        /// The service's config YAML (repeat for every file the service loads).
        #[arg(long, required = true)]
        service_config: Vec<PathBuf>,
    },
    /// Print a JSON Schema (draft 2020-12) of the team limits file, for editors.
    Schema,
}

fn read(path: &Path) -> Option<String> {
    match std::fs::read_to_string(path) {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!("{}: cannot read: {e}", path.display());
            None
        }
    }
}

/// Reads and checks one team file, printing its findings.
fn load_team(path: &Path) -> Option<(Value, TeamLimits)> {
    let text = read(path)?;
    let report = check_team_file(&path.display().to_string(), &text);
    for f in &report.findings {
        eprintln!("{f}");
    }
    report.parsed
}

/// Reads and parses a plugin configuration, printing its problems.
fn load_plugin(path: &Path) -> Option<PluginConfig> {
    let text = read(path)?;
    let shown = path.display();
    if starts_with_bom(text.as_bytes()) {
        eprintln!("{shown}:1:1: {BOM_MESSAGE}");
        return None;
    }
    if let Err(e) = serde_json::from_str::<Value>(&text) {
        let (at, error) = syntax_error(&text, &e);
        eprintln!("{shown}:{}:{}: {error}", at.line, at.column);
        return None;
    }
    match parse_plugin_config(text.as_bytes()) {
        Ok((config, _)) => Some(config),
        Err(errors) => {
            let map = scan(&text);
            for e in errors {
                let at = map.locate(&e.path, false);
                eprintln!("{shown}:{}:{}: {e}", at.line, at.column);
            }
            None
        }
    }
}

fn load_service(path: &Path) -> Option<ServiceConfig> {
    let text = read(path)?;
    match parse_service_config(&path.display().to_string(), &text) {
        Ok(s) => Some(s),
        Err(problems) => {
            for p in problems {
                eprintln!("{p}");
            }
            None
        }
    }
}

fn exit(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn validate(files: &[PathBuf]) -> ExitCode {
    let mut ok = true;
    for f in files {
        if load_team(f).is_some() {
            println!("{}: ok", f.display());
        } else {
            ok = false;
        }
    }
    exit(ok)
}

struct GenerateArgs {
    file: PathBuf,
    domain: String,
    out: PathBuf,
    cluster: String,
    timeout_ms: u32,
    descriptor_key: String,
}

fn generate(a: &GenerateArgs) -> ExitCode {
    let Some((doc, limits)) = load_team(&a.file) else {
        return ExitCode::FAILURE;
    };
    // Only the file name: the output must not depend on where it ran.
    let source = a
        .file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| a.file.display().to_string());
    let yaml = service_yaml(&limits, &a.domain, &a.descriptor_key, &source);
    let native = envoy_rate_limits_yaml(&limits, &a.domain, &a.descriptor_key, &source);
    let plugin = plugin_config_json(
        &doc,
        &PluginOptions {
            domain: &a.domain,
            cluster: &a.cluster,
            timeout_ms: a.timeout_ms,
            descriptor_key: &a.descriptor_key,
        },
    );
    let plugin_text = match serde_json::to_string_pretty(&plugin) {
        Ok(t) => t + "\n",
        Err(e) => {
            eprintln!("cannot serialise the plugin configuration: {e}");
            return ExitCode::FAILURE;
        }
    };
    // What is written must be what the filter accepts, and agree with the
    // service YAML: run both checks before writing anything.
    let parsed = match parse_plugin_config(plugin_text.as_bytes()) {
        Ok((p, _)) => p,
        Err(errors) => {
            for e in errors {
                eprintln!("the options give a plugin configuration the filter refuses: {e}");
            }
            return ExitCode::FAILURE;
        }
    };
    let service = match parse_service_config("ratelimit.yaml", &yaml) {
        Ok(s) => s,
        Err(problems) => {
            for p in problems {
                eprintln!("generated ratelimit.yaml is wrong (a bug): {p}");
            }
            return ExitCode::FAILURE;
        }
    };
    let report = check(&parsed, &[service]);
    if !report.problems.is_empty() {
        for p in report.problems {
            eprintln!("generated files disagree (a bug): {p}");
        }
        return ExitCode::FAILURE;
    }
    if let Err(e) = std::fs::create_dir_all(&a.out) {
        eprintln!("{}: cannot create: {e}", a.out.display());
        return ExitCode::FAILURE;
    }
    for (name, contents) in [
        ("ratelimit.yaml", &yaml),
        ("envoy-rate-limits.yaml", &native),
        ("plugin-config.json", &plugin_text),
    ] {
        let path = a.out.join(name);
        if let Err(e) = std::fs::write(&path, contents) {
            eprintln!("{}: cannot write: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("wrote {}", path.display());
    }
    ExitCode::SUCCESS
}

struct ExplainArgs {
    file: Option<PathBuf>,
    plugin_config: Option<PathBuf>,
    tenant: String,
    domain: Option<String>,
    descriptor_key: Option<String>,
    key_prefix: String,
    at: Option<u64>,
}

fn explain_cmd(a: ExplainArgs) -> ExitCode {
    let (limits, domain, descriptor_key, shadow, local) = match (&a.file, &a.plugin_config) {
        (_, Some(p)) => {
            let Some(c) = load_plugin(p) else {
                return ExitCode::FAILURE;
            };
            (
                c.limits,
                c.domain,
                c.descriptor_key,
                c.shadow,
                Some(c.local),
            )
        }
        (Some(f), None) => {
            let Some((_, limits)) = load_team(f) else {
                return ExitCode::FAILURE;
            };
            let key = a
                .descriptor_key
                .unwrap_or_else(|| DEFAULT_DESCRIPTOR_KEY.to_string());
            (limits, a.domain.unwrap_or_default(), key, false, None)
        }
        (None, None) => return ExitCode::FAILURE,
    };
    let now = a.at.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    });
    let opts = ExplainOptions {
        domain: &domain,
        descriptor_key: &descriptor_key,
        key_prefix: &a.key_prefix,
        shadow,
        local: local.as_ref(),
    };
    print!("{}", explain(&limits, &opts, &a.tenant, now));
    ExitCode::SUCCESS
}

fn check_cmd(plugin_config: &Path, service_configs: &[PathBuf]) -> ExitCode {
    let plugin = load_plugin(plugin_config);
    let services: Vec<Option<ServiceConfig>> =
        service_configs.iter().map(|s| load_service(s)).collect();
    let (Some(plugin), Some(services)) = (plugin, services.into_iter().collect::<Option<Vec<_>>>())
    else {
        return ExitCode::FAILURE;
    };
    let report = check(&plugin, &services);
    for w in &report.warnings {
        let w = w.to_string();
        // `file:line:col: warning: …`, as validate prints warnings.
        match w.split_once(": ") {
            Some((at, rest)) => eprintln!("{at}: warning: {rest}"),
            None => eprintln!("warning: {w}"),
        }
    }
    for p in &report.problems {
        eprintln!("{p}");
    }
    if report.problems.is_empty() {
        println!(
            "ok: {} descriptors of {} groups match the rules of domain {:?}",
            report.checked, report.groups, plugin.domain
        );
        if !report.shadowed.is_empty() {
            println!(
                "shadow (refusals counted, never enforced): {}",
                report.shadowed.join(", ")
            );
        }
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "{} of {} descriptors do not match",
            report.problems.len(),
            report.checked
        );
        ExitCode::FAILURE
    }
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Validate { files } => validate(&files),
        Command::Generate {
            file,
            domain,
            out,
            cluster,
            timeout_ms,
            descriptor_key,
        } => generate(&GenerateArgs {
            file,
            domain,
            out,
            cluster,
            timeout_ms,
            descriptor_key,
        }),
        Command::Explain {
            file,
            plugin_config,
            tenant,
            domain,
            descriptor_key,
            key_prefix,
            at,
        } => explain_cmd(ExplainArgs {
            file,
            plugin_config,
            tenant,
            domain,
            descriptor_key,
            key_prefix,
            at,
        }),
        Command::Check {
            plugin_config,
            service_config,
        } => check_cmd(&plugin_config, &service_config),
        Command::Schema => match serde_json::to_string_pretty(&team_limits_schema()) {
            Ok(s) => {
                println!("{s}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("cannot serialise the schema: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
