//! `ratelimit-config`: validates a team limits file and generates the
//! configurations that must agree with it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ratelimit_config::plugin::{
    plugin_config_json, PluginOptions, DEFAULT_DESCRIPTOR_KEY, DEFAULT_TIMEOUT_MS,
};
use ratelimit_config::service_yaml::service_yaml;
use ratelimit_config::{parse_team_limits, TeamLimits};
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
/// Units are persecond, perminute, perhour and perday; a unit left out is not
/// limited. "default" applies to every tenant not listed in a named group's
/// header_value; each tenant has its own counter either way.
#[derive(Parser)]
#[command(name = "ratelimit-config", version, verbatim_doc_comment)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check team limits files; report every problem, exit non-zero on any.
    Validate {
        /// Team limits JSON files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Write ratelimit.yaml (service config) and plugin-config.json (filter config).
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
}

/// Reads and validates one team file, printing its problems.
fn load(path: &Path) -> Option<(Value, TeamLimits)> {
    let shown = path.display();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{shown}: cannot read: {e}");
            return None;
        }
    };
    let doc: Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("{shown}:{}:{}: not valid JSON: {e}", e.line(), e.column());
            return None;
        }
    };
    match parse_team_limits(&doc, "") {
        Ok((limits, warnings)) => {
            for w in warnings {
                eprintln!("{shown}: warning: {w}");
            }
            Some((doc, limits))
        }
        Err(errors) => {
            for e in errors {
                eprintln!("{shown}: {e}");
            }
            None
        }
    }
}

fn write(path: &Path, contents: &str) -> bool {
    match std::fs::write(path, contents) {
        Ok(()) => true,
        Err(e) => {
            eprintln!("{}: cannot write: {e}", path.display());
            false
        }
    }
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Validate { files } => {
            let bad = files.iter().filter(|f| load(f).is_none()).count();
            if bad == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Command::Generate {
            file,
            domain,
            out,
            cluster,
            timeout_ms,
            descriptor_key,
        } => {
            let Some((doc, limits)) = load(&file) else {
                return ExitCode::FAILURE;
            };
            if let Err(e) = std::fs::create_dir_all(&out) {
                eprintln!("{}: cannot create: {e}", out.display());
                return ExitCode::FAILURE;
            }
            let source = file
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| file.display().to_string());
            let yaml = service_yaml(&limits, &domain, &descriptor_key, &source);
            let plugin = plugin_config_json(
                &doc,
                &PluginOptions {
                    domain: &domain,
                    cluster: &cluster,
                    timeout_ms,
                    descriptor_key: &descriptor_key,
                },
            );
            let plugin_text = match serde_json::to_string_pretty(&plugin) {
                Ok(t) => t + "\n",
                Err(e) => {
                    eprintln!("cannot serialise the plugin configuration: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let ok = write(&out.join("ratelimit.yaml"), &yaml)
                && write(&out.join("plugin-config.json"), &plugin_text);
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
