//! `ratelimit-config`: validates a team limits file and generates the
//! configurations that must agree with it.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::{ArgGroup, Parser, Subcommand};
use ratelimit_config::check::{check, parse_service_config, Problem, ServiceConfig};
use ratelimit_config::envoy_rate_limits::envoy_rate_limits_yaml;
use ratelimit_config::explain::{explain, ExplainOptions};
use ratelimit_config::field::{starts_with_bom, BOM_MESSAGE};
use ratelimit_config::plugin::{
    plugin_config_json, PluginOptions, DEFAULT_DESCRIPTOR_KEY, DEFAULT_TIMEOUT_MS,
};
use ratelimit_config::schema::team_limits_schema;
use ratelimit_config::service_yaml::service_yaml;
use ratelimit_config::span::{scan, Position};
use ratelimit_config::team_file::{check_team_file, syntax_error, Finding, Severity};
use ratelimit_config::{parse_plugin_config, ConfigError, PluginConfig, TeamLimits};
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

/// Why a command failed. Its `Display` is what stderr shows: one line per
/// problem, each with its file (and line and column where there is one).
#[derive(Debug)]
enum CliError {
    Read {
        path: PathBuf,
        source: io::Error,
    },
    Create {
        path: PathBuf,
        source: io::Error,
    },
    Write {
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
    /// `generate`'s options make a plugin configuration the filter refuses.
    Refused(Vec<ConfigError>),
    /// The generated ratelimit.yaml does not read back: a bug.
    GeneratedYaml(Vec<Problem>),
    /// The generated files disagree with each other: a bug.
    Disagree(Vec<Problem>),
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
            CliError::Create { path, source } => {
                write!(f, "{}: cannot create: {source}", path.display())
            }
            CliError::Write { path, source } => {
                write!(f, "{}: cannot write: {source}", path.display())
            }
            CliError::Serialise { what, source } => {
                write!(f, "cannot serialise the {what}: {source}")
            }
            CliError::Findings(findings) => lines(f, "", findings),
            CliError::Service(problems) => lines(f, "", problems),
            CliError::Refused(errors) => lines(
                f,
                "the options give a plugin configuration the filter refuses: ",
                errors,
            ),
            CliError::GeneratedYaml(problems) => {
                lines(f, "generated ratelimit.yaml is wrong (a bug): ", problems)
            }
            CliError::Disagree(problems) => {
                lines(f, "generated files disagree (a bug): ", problems)
            }
        }
    }
}

impl std::error::Error for CliError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CliError::Read { source, .. }
            | CliError::Create { source, .. }
            | CliError::Write { source, .. } => Some(source),
            CliError::Serialise { source, .. } => Some(source),
            _ => None,
        }
    }
}

fn read(path: &Path) -> Result<String, CliError> {
    std::fs::read_to_string(path).map_err(|source| CliError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads and checks one team file; its warnings are printed.
fn load_team(path: &Path) -> Result<(Value, TeamLimits), CliError> {
    let text = read(path)?;
    let report = check_team_file(&path.display().to_string(), &text);
    match report.parsed {
        Some(parsed) => {
            for warning in &report.findings {
                eprintln!("{warning}");
            }
            Ok(parsed)
        }
        None => Err(CliError::Findings(report.findings)),
    }
}

/// Reads and parses a plugin configuration.
fn load_plugin(path: &Path) -> Result<PluginConfig, CliError> {
    let text = read(path)?;
    let file = path.display().to_string();
    let found = |at: Position, error: ConfigError| Finding {
        file: file.clone(),
        at,
        severity: Severity::Error,
        error,
    };
    if starts_with_bom(text.as_bytes()) {
        let error = ConfigError {
            path: String::new(),
            message: BOM_MESSAGE.into(),
        };
        return Err(CliError::Findings(vec![found(Position::START, error)]));
    }
    if let Err(e) = serde_json::from_str::<Value>(&text) {
        let (at, error) = syntax_error(&text, &e);
        return Err(CliError::Findings(vec![found(at, error)]));
    }
    match parse_plugin_config(text.as_bytes()) {
        Ok((config, _)) => Ok(config),
        Err(errors) => {
            let map = scan(&text);
            let findings = errors
                .into_iter()
                .map(|e| found(map.locate(&e.path, false), e))
                .collect();
            Err(CliError::Findings(findings))
        }
    }
}

fn load_service(path: &Path) -> Result<ServiceConfig, CliError> {
    let text = read(path)?;
    parse_service_config(&path.display().to_string(), &text).map_err(CliError::Service)
}

fn exit(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Checks every file, printing each one's problems.
fn validate(files: &[PathBuf]) -> ExitCode {
    let mut ok = true;
    for f in files {
        match load_team(f) {
            Ok(_) => println!("{}: ok", f.display()),
            Err(e) => {
                eprintln!("{e}");
                ok = false;
            }
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

fn generate(a: &GenerateArgs) -> Result<(), CliError> {
    let (doc, limits) = load_team(&a.file)?;
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
    let plugin_text = serde_json::to_string_pretty(&plugin)
        .map(|t| t + "\n")
        .map_err(|source| CliError::Serialise {
            what: "plugin configuration",
            source,
        })?;
    // What is written must be what the filter accepts, and agree with the
    // service YAML: run both checks before writing anything.
    let (parsed, _) = parse_plugin_config(plugin_text.as_bytes()).map_err(CliError::Refused)?;
    let service = parse_service_config("ratelimit.yaml", &yaml).map_err(CliError::GeneratedYaml)?;
    let report = check(&parsed, &[service]);
    if !report.problems.is_empty() {
        return Err(CliError::Disagree(report.problems));
    }
    std::fs::create_dir_all(&a.out).map_err(|source| CliError::Create {
        path: a.out.clone(),
        source,
    })?;
    for (name, contents) in [
        ("ratelimit.yaml", &yaml),
        ("envoy-rate-limits.yaml", &native),
        ("plugin-config.json", &plugin_text),
    ] {
        let path = a.out.join(name);
        if let Err(source) = std::fs::write(&path, contents) {
            return Err(CliError::Write { path, source });
        }
        println!("wrote {}", path.display());
    }
    Ok(())
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

fn explain_cmd(a: ExplainArgs) -> Result<ExitCode, CliError> {
    let plugin = match &a.plugin_config {
        Some(p) => Some(load_plugin(p)?),
        None => None,
    };
    let (limits, domain, descriptor_key, shadow) = match (&a.file, &plugin) {
        (_, Some(c)) => (
            c.limits.clone(),
            c.domain.clone(),
            c.descriptor_key.clone(),
            c.shadow,
        ),
        (Some(f), None) => {
            let (_, limits) = load_team(f)?;
            let key = a
                .descriptor_key
                .unwrap_or_else(|| DEFAULT_DESCRIPTOR_KEY.to_string());
            (limits, a.domain.unwrap_or_default(), key, false)
        }
        // clap requires one of them.
        (None, None) => return Ok(ExitCode::FAILURE),
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
        local: plugin.as_ref().map(|c| &c.local),
        plugin: plugin.as_ref(),
    };
    print!("{}", explain(&limits, &opts, &a.tenant, now));
    Ok(ExitCode::SUCCESS)
}

fn check_cmd(plugin_config: &Path, service_configs: &[PathBuf]) -> ExitCode {
    // Every input is read, so that every one's problems are shown.
    let mut errors = Vec::new();
    let plugin = load_plugin(plugin_config).map_err(|e| errors.push(e)).ok();
    let services: Vec<ServiceConfig> = service_configs
        .iter()
        .filter_map(|s| load_service(s).map_err(|e| errors.push(e)).ok())
        .collect();
    let (Some(plugin), true) = (plugin, errors.is_empty()) else {
        for e in &errors {
            eprintln!("{e}");
        }
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
    let result = match Cli::parse().command {
        Command::Validate { files } => Ok(validate(&files)),
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
        })
        .map(|()| ExitCode::SUCCESS),
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
        } => Ok(check_cmd(&plugin_config, &service_config)),
        Command::Schema => serde_json::to_string_pretty(&team_limits_schema())
            .map(|s| {
                println!("{s}");
                ExitCode::SUCCESS
            })
            .map_err(|source| CliError::Serialise {
                what: "schema",
                source,
            }),
    };
    result.unwrap_or_else(|e| {
        eprintln!("{e}");
        ExitCode::FAILURE
    })
}
