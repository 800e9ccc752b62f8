//! `ratelimit-config`: validates a team limits file and generates the
//! configurations that must agree with it.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::{ArgGroup, Args, Parser, Subcommand};
use ratelimit_config::check::{
    check, check_counter, is_counter_team_file, parse_counter_team_file, parse_service_config,
    Problem, ServiceConfig,
};
use ratelimit_config::deployed::{self, Placement};
use ratelimit_config::envoy_rate_limits::{envoy_rate_limits_yaml, envoy_route_rate_limits_yaml};
use ratelimit_config::explain::{explain, ExplainOptions};
use ratelimit_config::field::{starts_with_bom, BOM_MESSAGE};
use ratelimit_config::owned::{write_owned, Output, OwnedError};
use ratelimit_config::plugin::{
    plugin_config_json, PluginOptions, DEFAULT_DESCRIPTOR_KEY, DEFAULT_TIMEOUT_MS,
};
use ratelimit_config::render::deployment::{
    self as render_keys, deployment, parse_assignment, read_description, set_path,
    DescriptionError, Sources,
};
use ratelimit_config::render::{
    merge, render, route_notes, team_routes, FailStrategy, RenderError, Target, Team,
};
use ratelimit_config::schema::team_limits_schema;
use ratelimit_config::service_yaml::service_yaml;
use ratelimit_config::span::{scan, Position};
use ratelimit_config::team_file::{
    check_team_file_for, syntax_error, team_file_by_mistake, Finding, Severity, EMPTY_PLUGIN_CONFIG,
};
use ratelimit_config::{
    parse_plugin_config, ConfigError, PluginConfig, Service, TeamLimits, TenantSource,
};
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
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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
struct ValidateArgs {
    /// Team limits JSON files (`-`: standard input), in the format of
    /// `ratelimit-config --help` (`ratelimit-config schema` prints it as a JSON Schema).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    #[command(flatten)]
    service: ServiceArg,
}

/// `--service`: which rate-limit service will count the limits.
#[derive(Args)]
struct ServiceArg {
    /// The rate-limit service that counts: envoy-ratelimit (envoyproxy/ratelimit,
    /// fixed windows of seconds to days) or counter (ratelimit-counter, which
    /// also counts "window": "sliding" and perweek, permonth, peryear on the calendar).
    #[arg(long = "service", value_enum, default_value = "envoy-ratelimit")]
    service: ServiceName,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum ServiceName {
    EnvoyRatelimit,
    Counter,
}

impl ServiceArg {
    fn get(&self) -> Service {
        match self.service {
            ServiceName::EnvoyRatelimit => Service::EnvoyRatelimit,
            ServiceName::Counter => Service::Counter,
        }
    }
}

#[derive(Args)]
struct GenerateArgs {
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
    /// gRPC timeout of the filter's call to the service, in milliseconds (at least 1).
    #[arg(long, default_value_t = DEFAULT_TIMEOUT_MS, value_parser = clap::value_parser!(u32).range(1..))]
    timeout_ms: u32,
    /// Descriptor key that carries the tenant value.
    #[arg(long, default_value = DEFAULT_DESCRIPTOR_KEY)]
    descriptor_key: String,
    #[command(flatten)]
    service: ServiceArg,
    #[command(flatten)]
    plugin: PluginSettings,
}

/// `--plugin PATH=VALUE`, the same for `generate` and `render`.
#[derive(Args)]
struct PluginSettings {
    /// A plugin configuration setting, PATH=VALUE (VALUE read as YAML; only
    /// true and false are booleans), e.g. --plugin local.mode=lease
    /// --plugin response_cost_header=x-cost. Repeat for each setting.
    #[arg(long = "plugin", value_name = "PATH=VALUE")]
    plugin: Vec<String>,
}

impl PluginSettings {
    /// The settings as one tree, and the flag that set each path (paths
    /// under `plugin.`, as a deployment description has them). `owned`
    /// names the paths another flag sets, with that flag.
    fn read(&self, owned: &[(&str, &str)]) -> Result<(Value, BTreeMap<String, String>), CliError> {
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
struct ExplainArgs {
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
    /// An Envoy route's name: also show the tenant's limits on that route.
    #[arg(long)]
    route: Option<String>,
}

#[derive(Args)]
struct CheckArgs {
    /// The filter's configuration: a plugin-config.json, or where it is
    /// deployed: a WasmPlugin (spec.pluginConfig), an EnvoyExtensionPolicy
    /// (spec.wasm[].config), an Envoy bootstrap or http_filters entry.
    #[arg(long)]
    plugin_config: PathBuf,
    /// The service's config YAML, or a ConfigMap of them (repeat for every file the service loads);
    /// for ratelimit-counter, the team file it serves (<domain>.json, as render writes it).
    #[arg(long, required = true)]
    service_config: Vec<PathBuf>,
    /// An Envoy configuration with the routes (a bootstrap, or what the admin
    /// /config_dump prints; repeatable): warn about each team-file route that
    /// no route is named. A bootstrap given as --plugin-config is read too.
    #[arg(long, value_name = "FILE")]
    envoy_config: Vec<PathBuf>,
}

#[derive(Args)]
struct RenderArgs {
    /// The team limits JSON file (`-`: standard input).
    file: PathBuf,
    /// What to write for.
    #[arg(long)]
    target: Target,
    /// Output directory (created when missing; files an earlier render wrote there and this one does not are removed).
    #[arg(long)]
    out: PathBuf,
    // The help lists the keys the description reader accepts (one list).
    #[arg(long, value_name = "FILE", help = deployment_help())]
    deployment: Option<PathBuf>,
    #[command(flatten)]
    named: NamedSettings,
    // Short help, and the paths and values the reader accepts in the long one.
    #[arg(long = "set", value_name = "PATH=VALUE", help = SET_HELP, long_help = set_long_help())]
    set: Vec<String>,
    #[command(flatten)]
    plugin: PluginSettings,
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
struct NamedSettings {
    /// The rate-limit service domain.
    #[arg(long)]
    domain: Option<String>,
    /// The Kubernetes namespace of everything rendered.
    #[arg(long)]
    namespace: Option<String>,
    /// The filter's OCI image (the compat variant `make oci-push` pushes).
    #[arg(long)]
    image: Option<String>,
    /// The image's manifest digest (`make oci` prints it), hex or sha256:hex.
    #[arg(long)]
    sha256: Option<String>,
    /// When the filter cannot run: open (requests pass, unlimited) or closed (refused).
    #[arg(long)]
    fail_strategy: Option<FailStrategy>,
    /// The rate-limit service to deploy (service.kind): envoy-ratelimit
    /// (envoyproxy/ratelimit, the default) or counter (ratelimit-counter).
    #[arg(long = "service", value_enum)]
    service: Option<ServiceName>,
}

impl NamedSettings {
    /// (description key, value) of each flag given.
    fn given(&self) -> Vec<(&'static str, String)> {
        [
            ("domain", self.domain.clone()),
            ("namespace", self.namespace.clone()),
            ("image", self.image.clone()),
            ("sha256", self.sha256.clone()),
            ("fail_strategy", self.fail_strategy.map(FailStrategy::name)),
            (
                "service.kind",
                self.service
                    .map(|s| ServiceArg { service: s }.get().name().to_string()),
            ),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect()
    }
}

/// Why a command failed. Its `Display` is what stderr shows: one line per
/// problem, each with its file (and line and column where there is one).
#[derive(Debug)]
enum CliError {
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
    Refused(Vec<(String, ConfigError)>),
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
            CliError::Refused(errors) => {
                for (i, (place, e)) in errors.iter().enumerate() {
                    if i > 0 {
                        f.write_str("\n")?;
                    }
                    write!(f, "{place}: plugin configuration: {e}")?;
                }
                Ok(())
            }
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
    fn exit_code(&self) -> ExitCode {
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
            _ => None,
        }
    }
}

/// A file's text; `-` is standard input (read once: a second `-` is empty).
fn read(path: &Path) -> Result<String, CliError> {
    if path == Path::new("-") {
        let mut text = String::new();
        return io::Read::read_to_string(&mut io::stdin(), &mut text)
            .map(|_| text)
            .map_err(|source| CliError::Read {
                path: path.to_path_buf(),
                source,
            });
    }
    std::fs::read_to_string(path).map_err(|source| CliError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// How messages name a file: `-` is `<stdin>`.
fn shown(path: &Path) -> String {
    if path == Path::new("-") {
        "<stdin>".into()
    } else {
        path.display().to_string()
    }
}

/// A file's name for a generated header: only its name, so the output does
/// not depend on where it ran.
fn source_name(path: &Path) -> String {
    if path == Path::new("-") {
        return "stdin".into();
    }
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// Reads and checks one team file; its warnings are printed.
fn load_team(path: &Path) -> Result<(Value, TeamLimits), CliError> {
    load_team_for(path, Service::EnvoyRatelimit)
}

/// [`load_team`] for the service that will count its limits.
fn load_team_for(path: &Path, service: Service) -> Result<(Value, TeamLimits), CliError> {
    let text = read(path)?;
    let report = check_team_file_for(&shown(path), &text, service);
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
    if text.trim().is_empty() {
        let error = ConfigError {
            path: String::new(),
            message: EMPTY_PLUGIN_CONFIG.into(),
        };
        return Err(CliError::Findings(vec![found(Position::START, error)]));
    }
    let doc = match serde_json::from_str::<Value>(&text) {
        Ok(doc) => doc,
        Err(e) => {
            let (at, error) = syntax_error(&text, &e);
            // Not JSON: a deployed object in YAML (a WasmPlugin, an
            // EnvoyExtensionPolicy, an Envoy bootstrap) holding it.
            if !text.trim_start().starts_with(['{', '[']) {
                return load_deployed_plugin(&file, &text, (at, error));
            }
            return Err(CliError::Findings(vec![found(at, error)]));
        }
    };
    if let Some(error) = team_file_by_mistake(&doc) {
        return Err(CliError::Findings(vec![found(Position::START, error)]));
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

/// The plugin configuration held by a deployed object in YAML; `json_error`
/// is what is reported when the text is not YAML either.
fn load_deployed_plugin(
    file: &str,
    text: &str,
    json_error: (Position, ConfigError),
) -> Result<PluginConfig, CliError> {
    let finding = |at: Position, path: String, message: String| Finding {
        file: file.to_string(),
        at,
        severity: Severity::Error,
        error: ConfigError { path, message },
    };
    let found = match deployed::plugin_config(text) {
        Ok(f) => f,
        // Not YAML either: the JSON error says the most.
        Err(_) if ratelimit_config::yaml_in::documents(text).is_err() => {
            return Err(CliError::Findings(vec![finding(
                json_error.0,
                json_error.1.path,
                json_error.1.message,
            )]))
        }
        Err((at, message)) => {
            return Err(CliError::Findings(vec![finding(
                at,
                String::new(),
                message,
            )]))
        }
    };
    let mut findings: Vec<Finding> = found
        .problems
        .iter()
        .map(|(at, m)| finding(*at, String::new(), m.clone()))
        .collect();
    let bytes = serde_json::to_vec(&found.value).map_err(|source| CliError::Serialise {
        what: "plugin configuration",
        source,
    })?;
    match parse_plugin_config(&bytes) {
        Ok((config, _)) if findings.is_empty() => Ok(config),
        Ok(_) => Err(CliError::Findings(findings)),
        Err(errors) => {
            findings.extend(errors.into_iter().map(|e| {
                let at = found.locate(&e.path);
                let message = format!("{} ({})", e.message, found.what);
                finding(at, e.path, message)
            }));
            Err(CliError::Findings(findings))
        }
    }
}

/// A service config, or each entry of the ConfigMaps in the file. Each
/// config's `file` is unique; `places` maps it back to the file read and
/// where the entry's text is in it.
fn load_service(
    path: &Path,
    places: &mut BTreeMap<String, (String, Placement)>,
) -> Result<Vec<ServiceConfig>, CliError> {
    let text = read(path)?;
    let file = path.display().to_string();
    let Some(entries) = deployed::config_map_entries(&text) else {
        return parse_service_config(&file, &text)
            .map(|s| vec![s])
            .map_err(CliError::Service);
    };
    if entries.is_empty() {
        return Err(CliError::Service(vec![Problem {
            file,
            at: Position::START,
            message: "a ConfigMap with no entry in data: the service would load no rules".into(),
        }]));
    }
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for (key, body, placement) in entries {
        let name = format!("{file} (data.{key})");
        places.insert(name.clone(), (file.clone(), placement));
        match parse_service_config(&name, &body) {
            Ok(s) => out.push(s),
            Err(p) => problems.extend(p),
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(CliError::Service(
            problems.into_iter().map(|p| placed(p, places)).collect(),
        ))
    }
}

/// A problem in a ConfigMap's entry, at its place in the file.
fn placed(p: Problem, places: &BTreeMap<String, (String, Placement)>) -> Problem {
    match places.get(&p.file) {
        Some((file, placement)) => Problem {
            file: file.clone(),
            at: placement.map(p.at),
            message: p.message,
        },
        None => p,
    }
}

fn exit(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Checks every file, printing each one's problems.
fn validate(files: &[PathBuf], service: Service) -> ExitCode {
    let mut ok = true;
    for f in files {
        match load_team_for(f, service) {
            Ok(_) => println!("{}: ok", f.display()),
            Err(e) => {
                eprintln!("{e}");
                ok = false;
            }
        }
    }
    exit(ok)
}

fn generate(a: &GenerateArgs) -> Result<(), CliError> {
    let (doc, limits) = load_team_for(&a.file, a.service.get())?;
    let source = source_name(&a.file);
    let yaml = service_yaml(&limits, &a.domain, &a.descriptor_key, &source);
    let native = envoy_rate_limits_yaml(&limits, &a.domain, &a.descriptor_key, &source);
    let native_routes =
        envoy_route_rate_limits_yaml(&limits, &a.domain, &a.descriptor_key, &source);
    let plugin = plugin_config_json(
        &doc,
        &PluginOptions {
            domain: &a.domain,
            cluster: &a.cluster,
            service: a.service.get(),
            timeout_ms: a.timeout_ms,
            descriptor_key: &a.descriptor_key,
        },
    );
    // The paths generate's own flags set; --plugin sets any other.
    let owned = [
        ("domain", "--domain"),
        ("limits", "the team file"),
        ("rate_limit_service.cluster", "--cluster"),
        ("rate_limit_service.service", "--service"),
        ("rate_limit_service.timeout_ms", "--timeout-ms"),
        ("descriptor_key", "--descriptor-key"),
    ];
    let (settings, flags) = a.plugin.read(&owned)?;
    let sources = Sources {
        flags,
        ..Sources::default()
    };
    // A problem is the flag's that set its path (or a parent), else the
    // --plugin settings'.
    let place = |path: &str| {
        owned
            .iter()
            .find(|(p, _)| path == *p || path.starts_with(&format!("{p}.")))
            .map_or_else(
                || sources.place(&format!("plugin.{path}")),
                |(_, flag)| flag.to_string(),
            )
    };
    let mut plugin = serde_json::to_value(&plugin).map_err(|source| CliError::Serialise {
        what: "plugin configuration",
        source,
    })?;
    merge(&mut plugin, &settings);
    let plugin_text = serde_json::to_string_pretty(&plugin)
        .map(|t| t + "\n")
        .map_err(|source| CliError::Serialise {
            what: "plugin configuration",
            source,
        })?;
    // What is written must be what the filter accepts, and agree with the
    // service YAML: run both checks before writing anything.
    let (parsed, warnings) = parse_plugin_config(plugin_text.as_bytes()).map_err(|errors| {
        CliError::Refused(errors.into_iter().map(|e| (place(&e.path), e)).collect())
    })?;
    for w in warnings.iter().filter(|w| !w.path.starts_with("limits")) {
        eprintln!("{}: warning: plugin configuration: {w}", place(&w.path));
    }
    let service = parse_service_config("ratelimit.yaml", &yaml).map_err(CliError::GeneratedYaml)?;
    // For the counter, which reads the team file itself, ratelimit.yaml
    // (without the calendar units) is not what counts.
    if a.service.get() == Service::EnvoyRatelimit {
        let report = check(&parsed, &[service]);
        if !report.problems.is_empty() {
            return Err(CliError::Disagree(report.problems));
        }
    }
    let outputs: Vec<Output<'_>> = [
        ("ratelimit.yaml", Some(&yaml)),
        ("envoy-rate-limits.yaml", Some(&native)),
        ("envoy-route-rate-limits.yaml", native_routes.as_ref()),
        ("plugin-config.json", Some(&plugin_text)),
    ]
    .into_iter()
    .filter_map(|(name, text)| text.map(|text| Output { name, text }))
    .collect();
    write_out(&a.out, &outputs, "generate")
}

/// Writes an output folder as its owner ([`write_owned`]), printing what
/// was done to each file.
fn write_out(out: &Path, files: &[Output<'_>], by: &str) -> Result<(), CliError> {
    for change in write_owned(out, files, by).map_err(CliError::Owned)? {
        println!("{change}");
    }
    Ok(())
}

fn explain_cmd(a: ExplainArgs) -> Result<ExitCode, CliError> {
    let plugin = match &a.plugin_config {
        Some(p) => Some(load_plugin(p)?),
        None => None,
    };
    let (limits, domain, descriptor_key, shadow, source) = match (&a.file, &plugin) {
        (_, Some(c)) => {
            // The filter refuses a tenant longer than max_tenant_length
            // before any limit applies.
            let max = usize::try_from(c.max_tenant_length).unwrap_or(usize::MAX);
            if a.tenant.len() > max {
                println!(
                    "tenant: {} bytes, over max_tenant_length {}: the filter answers 431 (Request Header Fields Too Large), counted in tenant_too_long; no group, no limit applies",
                    a.tenant.len(),
                    c.max_tenant_length
                );
                return Ok(ExitCode::SUCCESS);
            }
            (
                c.limits.clone(),
                c.domain.clone(),
                c.descriptor_key.clone(),
                c.shadow,
                c.tenant_source.clone(),
            )
        }
        (Some(f), None) => {
            let (_, limits) = load_team(f)?;
            let key = a
                .descriptor_key
                .unwrap_or_else(|| DEFAULT_DESCRIPTOR_KEY.to_string());
            let source = TenantSource::Header;
            (limits, a.domain.unwrap_or_default(), key, false, source)
        }
        // clap requires one of them.
        (None, None) => {
            return Err(CliError::Usage(
                "give a team file or --plugin-config".into(),
            ))
        }
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
        batch: plugin.as_ref().map(|c| &c.batch),
        plugin: plugin.as_ref(),
        route: a.route.as_deref(),
        tenant_source: &source,
    };
    print!("{}", explain(&limits, &opts, &a.tenant, now));
    Ok(ExitCode::SUCCESS)
}

/// The route names of the Envoy configurations `check` was given.
struct DeployedRoutes {
    names: Vec<String>,
    /// The files that had routes, as messages name them.
    files: Vec<String>,
}

/// The route names of the Envoy configurations given (and of the plugin
/// configuration's file when it is one); None when no file carries a route.
fn deployed_routes(a: &CheckArgs) -> Result<Option<DeployedRoutes>, CliError> {
    let mut names = Vec::new();
    let mut files = Vec::new();
    let plugin_file = std::iter::once(&a.plugin_config).filter(|p| *p != Path::new("-"));
    for path in plugin_file.chain(&a.envoy_config) {
        let text = read(path)?;
        match deployed::route_names(&text) {
            Some(routes) if !routes.is_empty() => {
                names.extend(routes.into_iter().flatten());
                files.push(shown(path));
            }
            _ if a.envoy_config.contains(path) => {
                return Err(CliError::Usage(format!(
                "--envoy-config {}: no Envoy route in it (expected a bootstrap or a /config_dump)",
                shown(path)
            )))
            }
            _ => {}
        }
    }
    Ok((!files.is_empty()).then_some(DeployedRoutes { names, files }))
}

fn check_cmd(a: &CheckArgs) -> ExitCode {
    let (plugin_config, service_configs) = (&a.plugin_config, &a.service_config);
    // Every input is read, so that every one's problems are shown.
    let mut errors = Vec::new();
    let routes = deployed_routes(a)
        .map_err(|e| errors.push(e))
        .ok()
        .flatten();
    let plugin = load_plugin(plugin_config).map_err(|e| errors.push(e)).ok();
    let mut places = BTreeMap::new();
    // ratelimit-counter's team files (<domain>.json), or envoyproxy/ratelimit's YAML.
    let mut counter_files = Vec::new();
    let mut yaml_configs = Vec::new();
    for s in service_configs {
        if s == Path::new("-") {
            yaml_configs.push(s);
            continue;
        }
        match read(s) {
            Ok(text) if is_counter_team_file(&shown(s), &text) => {
                counter_files.push(parse_counter_team_file(&shown(s), &text));
            }
            Ok(_) => yaml_configs.push(s),
            Err(e) => errors.push(e),
        }
    }
    let services: Vec<ServiceConfig> = yaml_configs
        .iter()
        .filter_map(|s| {
            load_service(s, &mut places)
                .map_err(|e| errors.push(e))
                .ok()
        })
        .flatten()
        .collect();
    if !counter_files.is_empty() && !yaml_configs.is_empty() {
        errors.push(CliError::Usage(
            "--service-config: give the counter's team file (<domain>.json) or envoyproxy/ratelimit's YAML, not both".into(),
        ));
    }
    let (Some(plugin), true) = (plugin, errors.is_empty()) else {
        for e in &errors {
            eprintln!("{e}");
        }
        return ExitCode::FAILURE;
    };
    let mut report = if counter_files.is_empty() {
        check(&plugin, &services)
    } else {
        check_counter(&plugin, &counter_files)
    };
    for p in report.problems.iter_mut().chain(report.warnings.iter_mut()) {
        *p = placed(p.clone(), &places);
    }
    for w in &report.warnings {
        let w = w.to_string();
        // `file:line:col: warning: …`, as validate prints warnings.
        match w.split_once(": ") {
            Some((at, rest)) => eprintln!("{at}: warning: {rest}"),
            None => eprintln!("warning: {w}"),
        }
    }
    if let Some(DeployedRoutes { names, files }) = &routes {
        for (route, groups) in team_routes(&plugin.limits) {
            if !names.contains(&route) {
                let paths: Vec<String> = groups
                    .iter()
                    .map(|g| format!("limits.{}.{g}.routes.{route}", plugin.limits.header))
                    .collect();
                eprintln!(
                    "{}: warning: {}: no Envoy route there is named {route:?}: that limit never applies; name the route so in Envoy's configuration (docs/deploying.md#route-names)",
                    files.join(", "),
                    paths.join(", "),
                );
            }
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
        println!("tenant from: {}", report.tenant_from);
        if !report.shadowed.is_empty() {
            println!(
                "shadow (refusals counted, never enforced): {}",
                report.shadowed.join(", ")
            );
        }
        ExitCode::SUCCESS
    } else if report.checked == 0 {
        eprintln!(
            "no descriptor checked: the filter's domain {:?} is in no service config given",
            plugin.domain
        );
        ExitCode::FAILURE
    } else {
        eprintln!(
            "{} of {} descriptors do not match",
            report.problems.len(),
            report.checked
        );
        ExitCode::FAILURE
    }
}

fn render_cmd(a: &RenderArgs) -> Result<(), CliError> {
    let target = a.target;
    let (mut description, mut sources) = match &a.deployment {
        Some(path) => read_description(&shown(path), &read(path)?)
            .map_err(|e| CliError::Description(vec![e]))?,
        None => (Value::Object(Default::default()), Sources::default()),
    };
    if !description.is_object() {
        description = Value::Object(Default::default());
    }
    for (key, value) in a.named.given() {
        set_path(&mut description, key, Value::String(value));
        let flag = match key {
            "service.kind" => "--service".to_string(),
            _ => format!("--{}", key.replace('_', "-")),
        };
        sources.flags.insert(key.to_string(), flag);
    }
    for arg in &a.set {
        let (path, value) =
            parse_assignment(arg).map_err(|m| CliError::Usage(format!("--set {m}")))?;
        set_path(&mut description, &path, value);
        sources.flags.insert(path.clone(), format!("--set {path}"));
    }
    // The plugin's domain, limits and cluster are render's: the
    // description says why when --plugin sets them.
    let (settings, flags) = a.plugin.read(&[])?;
    if let Value::Object(settings) = &settings {
        if !settings.is_empty() {
            let mut plugin = description
                .get("plugin")
                .cloned()
                .unwrap_or(Value::Object(Default::default()));
            merge(&mut plugin, &Value::Object(settings.clone()));
            set_path(&mut description, "plugin", plugin);
        }
    }
    sources.flags.extend(flags);
    let dep = deployment(&description, &sources, target).map_err(CliError::Description)?;
    // The team file as the service that counts it reads it.
    let (json, limits) = load_team_for(&a.file, dep.service_kind)?;
    let source = source_name(&a.file);
    let team = Team {
        source: &source,
        json: &json,
        limits: &limits,
    };
    let place = |path: &str| sources.place(path);
    let (files, warnings) = render(&team, &dep, target, &place).map_err(CliError::Render)?;
    for w in &warnings {
        eprintln!(
            "{}: warning: plugin configuration: {w}",
            place(&format!("plugin.{}", w.path))
        );
    }
    for note in route_notes(&limits, &dep, target) {
        eprintln!("{note}");
    }
    let outputs: Vec<Output<'_>> = files
        .iter()
        .map(|f| Output {
            name: &f.name,
            text: &f.text,
        })
        .collect();
    write_out(
        &a.out,
        &outputs,
        &format!("render --target {}", target.name()),
    )
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Validate(a) => Ok(validate(&a.files, a.service.get())),
        Command::Generate(a) => generate(&a).map(|()| ExitCode::SUCCESS),
        Command::Explain(a) => explain_cmd(a),
        Command::Check(a) => Ok(check_cmd(&a)),
        Command::Render(a) => render_cmd(&a).map(|()| ExitCode::SUCCESS),
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
        e.exit_code()
    })
}
