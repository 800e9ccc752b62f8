//! The `ratelimit-config` binary as a user runs it: the exit statuses
//! docs/cli.md promises (0 fine, warnings allowed; 1 a problem found; 2 bad
//! usage) and the messages that tell how to fix a mistake.

// Runs the native binary: native only.
#![cfg(not(target_arch = "wasm32"))]
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const LIMITS: &str = r#"{"x-tenant-id": {"default": {"perhour": 3}}}"#;

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ratelimit-config"))
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("fixtures")
}

/// A fresh directory under the target directory, for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// Runs the binary in `dir` with no standard input.
fn run_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn status(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

#[test]
fn exit_status_is_0_when_fine_even_with_warnings() {
    let dir = scratch("exit0");
    write(&dir, "limits.json", LIMITS);
    let ok = run_in(&dir, &["validate", "limits.json"]);
    assert_eq!(status(&ok), 0, "{}", stderr(&ok));
    assert_eq!(stdout(&ok), "limits.json: ok\n");
    let warn = fixtures().join("warn");
    let o = run_in(&warn, &["validate", "longer-window-lower.json"]);
    assert_eq!(status(&o), 0, "{}", stderr(&o));
    assert!(stderr(&o).contains("warning"), "{}", stderr(&o));
}

#[test]
fn exit_status_is_1_when_a_problem_is_found() {
    let dir = scratch("exit1");
    write(
        &dir,
        "bad.json",
        r#"{"x-tenant-id": {"default": {"perhour": -5}}}"#,
    );
    for args in [
        &["validate", "bad.json"][..],
        &["generate", "bad.json", "--domain", "d", "--out", "gen"][..],
        &["explain", "bad.json", "--domain", "d", "--tenant", "a"][..],
        &[
            "render", "bad.json", "--target", "envoy", "--domain", "d", "--out", "r",
        ][..],
        &["validate", "missing.json"][..],
    ] {
        let o = run_in(&dir, args);
        assert_eq!(status(&o), 1, "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).is_empty(), "{args:?}");
    }
}

#[test]
fn exit_status_is_2_on_bad_usage() {
    let dir = scratch("exit2");
    write(&dir, "limits.json", LIMITS);
    let cases: &[(&[&str], &str)] = &[
        (&["frobnicate"], "unrecognized subcommand"),
        (&["validate"], "required"),
        (&["generate", "limits.json", "--out", "gen"], "--domain"),
        (
            &[
                "generate",
                "limits.json",
                "--domain",
                "d",
                "--out",
                "gen",
                "--timeout-ms",
                "soon",
            ],
            "--timeout-ms",
        ),
        (
            &[
                "render",
                "limits.json",
                "--target",
                "kubernetes",
                "--out",
                "r",
            ],
            "possible values: istio, envoy-gateway, envoy",
        ),
        (
            &[
                "render",
                "limits.json",
                "--target",
                "envoy",
                "--out",
                "r",
                "--fail-strategy",
                "maybe",
            ],
            "open",
        ),
        (
            &[
                "render",
                "limits.json",
                "--target",
                "envoy",
                "--out",
                "r",
                "--domain",
                "d",
                "--set",
                "nope",
            ],
            "--set \"nope\": expected PATH=VALUE",
        ),
        (
            &[
                "render",
                "limits.json",
                "--target",
                "envoy",
                "--out",
                "r",
                "--domain",
                "d",
                "--plugin",
                "=1",
            ],
            "--plugin",
        ),
        (&["explain", "--tenant", "a"], "required"),
        (
            &[
                "explain",
                "limits.json",
                "--plugin-config",
                "p.json",
                "--tenant",
                "a",
            ],
            "cannot be used with",
        ),
    ];
    for (args, says) in cases {
        let o = run_in(&dir, args);
        assert_eq!(status(&o), 2, "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
    }
    // Nothing was written by a refused command line.
    assert!(!dir.join("gen").exists() && !dir.join("r").exists());
}

#[test]
fn help_and_version_exit_0() {
    let dir = scratch("help");
    for args in [
        &["--help"][..],
        &["--version"][..],
        &["render", "--help"][..],
    ] {
        let o = run_in(&dir, args);
        assert_eq!(status(&o), 0, "{args:?}: {}", stderr(&o));
        assert!(!stdout(&o).is_empty(), "{args:?}");
    }
}

const ROUTED: &str =
    r#"{"x-tenant-id": {"default": {"perminute": 10, "routes": {"export": {"perminute": 2}}}}}"#;

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("e2e")
        .join("limits.json")
}

fn deployment_yaml() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("deploy")
        .join("deployment.yaml")
}

#[test]
fn a_number_past_64_bits_is_too_large_not_a_non_integer() {
    let dir = scratch("big");
    write(
        &dir,
        "big.json",
        r#"{"x-tenant-id": {"default": {"perday": 99999999999999999999}}}"#,
    );
    let o = run_in(&dir, &["validate", "big.json"]);
    assert_eq!(status(&o), 1);
    assert_eq!(
        stderr(&o),
        "big.json:1:40: x-tenant-id.default.perday: must be a positive integer at most 4294967295, got 99999999999999999999\n"
    );
}

#[test]
fn an_empty_file_says_it_is_empty_and_what_goes_in_it() {
    let dir = scratch("empty");
    write(&dir, "empty.json", "\n");
    let o = run_in(&dir, &["validate", "empty.json"]);
    assert_eq!(status(&o), 1);
    assert!(
        stderr(&o).starts_with("empty.json:1:1: the file is empty: a team file is one JSON object"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains(r#"{"x-tenant-id": {"default": {"perminute": 60}}}"#));
    write(&dir, "rl.yaml", "domain: d\n");
    let o = run_in(
        &dir,
        &[
            "check",
            "--plugin-config",
            "empty.json",
            "--service-config",
            "rl.yaml",
        ],
    );
    assert_eq!(status(&o), 1);
    assert!(
        stderr(&o).contains(
            "empty.json:1:1: the file is empty: a plugin configuration is one JSON object"
        ),
        "{}",
        stderr(&o)
    );
}

#[test]
fn check_given_a_team_file_as_plugin_config_says_so() {
    let dir = scratch("mixup");
    write(&dir, "limits.json", LIMITS);
    let g = run_in(
        &dir,
        &["generate", "limits.json", "--domain", "d", "--out", "gen"],
    );
    assert_eq!(status(&g), 0, "{}", stderr(&g));
    let o = run_in(
        &dir,
        &[
            "check",
            "--plugin-config",
            "limits.json",
            "--service-config",
            "gen/ratelimit.yaml",
        ],
    );
    assert_eq!(status(&o), 1);
    assert_eq!(
        stderr(&o),
        "limits.json:1:1: this is a team file (header \"x-tenant-id\"), not a plugin configuration: it is the value of \"limits\" in one; `ratelimit-config generate` writes plugin-config.json from it, and `check` takes that\n"
    );
}

#[test]
fn a_plugin_flag_is_blamed_for_what_it_causes_not_the_file() {
    let dir = scratch("blame");
    let (ex, dep) = (example(), deployment_yaml());
    let (ex, dep) = (ex.to_str().unwrap(), dep.to_str().unwrap());
    let base = [
        "render",
        ex,
        "--deployment",
        dep,
        "--target",
        "istio",
        "--out",
        "r",
    ];
    let o = run_in(
        &dir,
        &[&base[..], &["--plugin", "on_failure=local"]].concat(),
    );
    assert_eq!(status(&o), 1);
    assert!(
        stderr(&o)
            .starts_with("--plugin on_failure: plugin configuration: fallback.envoys: missing"),
        "{}",
        stderr(&o)
    );
    let o = run_in(
        &dir,
        &[&base[..], &["--plugin", "limits.x-tenant-id=1"]].concat(),
    );
    assert_eq!(status(&o), 1);
    assert!(
        stderr(&o).starts_with(
            "--plugin limits.x-tenant-id: plugin.limits: set by render: it is the team file"
        ),
        "{}",
        stderr(&o)
    );
    let o = run_in(&dir, &[&base[..], &["--plugin", "domain=other"]].concat());
    assert!(
        stderr(&o).starts_with("--plugin domain: plugin.domain: set by render"),
        "{}",
        stderr(&o)
    );
    // generate: the same flag, named the same way.
    write(&dir, "limits.json", LIMITS);
    let o = run_in(
        &dir,
        &[
            "generate",
            "limits.json",
            "--domain",
            "d",
            "--out",
            "g",
            "--plugin",
            "on_failure=local",
        ],
    );
    assert_eq!(status(&o), 1);
    assert!(
        stderr(&o)
            .starts_with("--plugin on_failure: plugin configuration: fallback.envoys: missing"),
        "{}",
        stderr(&o)
    );
    assert!(!dir.join("g").exists() && !dir.join("r").exists());
}

#[test]
fn generate_timeout_names_the_flag_and_the_range() {
    let dir = scratch("timeout");
    write(&dir, "limits.json", LIMITS);
    let o = run_in(
        &dir,
        &[
            "generate",
            "limits.json",
            "--domain",
            "d",
            "--out",
            "g",
            "--timeout-ms",
            "0",
        ],
    );
    assert_eq!(status(&o), 2);
    assert!(
        stderr(&o).contains("'--timeout-ms <TIMEOUT_MS>': 0 is not in 1..=4294967295"),
        "{}",
        stderr(&o)
    );
    let o = run_in(
        &dir,
        &[
            "generate",
            "limits.json",
            "--domain",
            "d",
            "--out",
            "g",
            "--descriptor-key",
            "",
        ],
    );
    assert_eq!(status(&o), 1);
    assert_eq!(
        stderr(&o),
        "--descriptor-key: plugin configuration: descriptor_key: must not be empty\n"
    );
}

#[test]
fn explain_a_route_no_group_limits_lists_the_known_ones() {
    let dir = scratch("route");
    write(&dir, "limits.json", ROUTED);
    let o = run_in(
        &dir,
        &[
            "explain",
            "limits.json",
            "--domain",
            "d",
            "--tenant",
            "a",
            "--route",
            "exprot",
            "--at",
            "0",
        ],
    );
    assert_eq!(status(&o), 0, "{}", stderr(&o));
    assert!(
        stdout(&o).ends_with(
            "on route \"exprot\": default sets no limits on it: only the limits above apply; no group limits a route of that name: the team file's routes are \"export\" (a route name must be Envoy's exactly)\n"
        ),
        "{}",
        stdout(&o)
    );
}

#[test]
fn explain_a_tenant_with_outer_whitespace_says_envoy_strips_it() {
    let dir = scratch("space");
    write(
        &dir,
        "limits.json",
        r#"{"x-tenant-id": {"default": {"perminute": 10}, "gold": {"perminute": 99, "header_value": ["acme"]}}}"#,
    );
    let o = run_in(
        &dir,
        &[
            "explain",
            "limits.json",
            "--domain",
            "d",
            "--tenant",
            " acme",
            "--at",
            "0",
        ],
    );
    assert_eq!(status(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("note:    Envoy strips leading and trailing whitespace from header values, so the filter never sees \" acme\": a request sending it is counted as \"acme\""),
        "{out}"
    );
    assert!(
        out.contains("group:   gold (listed in its header_value)"),
        "{out}"
    );
}

#[test]
fn render_names_the_flag_of_a_missing_workload() {
    let dir = scratch("workload");
    let ex = example();
    let o = run_in(
        &dir,
        &[
            "render",
            ex.to_str().unwrap(),
            "--target",
            "istio",
            "--out",
            "r",
            "--domain",
            "d",
            "--namespace",
            "n",
            "--image",
            "i",
            "--fail-strategy",
            "open",
        ],
    );
    assert_eq!(status(&o), 1);
    assert!(
        stderr(&o).contains("workload.name: missing: the workload the filter runs in front of (its pods get the WasmPlugin and the stats annotation) (workload: name: or --set workload.name=NAME)"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_flag_value_is_a_boolean_only_when_it_says_true_or_false() {
    let dir = scratch("yes");
    write(&dir, "limits.json", LIMITS);
    for value in ["yes", "on", "Off", "n"] {
        let arg = format!("shadow={value}");
        let o = run_in(
            &dir,
            &[
                "generate",
                "limits.json",
                "--domain",
                "d",
                "--out",
                "g",
                "--plugin",
                &arg,
            ],
        );
        assert_eq!(status(&o), 2, "{value}");
        assert!(
            stderr(&o).contains("write true or false"),
            "{value}: {}",
            stderr(&o)
        );
    }
    let o = run_in(
        &dir,
        &[
            "generate",
            "limits.json",
            "--domain",
            "d",
            "--out",
            "g",
            "--plugin",
            "shadow=\"yes\"",
        ],
    );
    assert_eq!(status(&o), 1);
    assert!(stderr(&o).contains("--plugin shadow: plugin configuration: shadow: must be true or false, got string \"yes\""), "{}", stderr(&o));
    let o = run_in(
        &dir,
        &[
            "generate",
            "limits.json",
            "--domain",
            "d",
            "--out",
            "g",
            "--plugin",
            "shadow=true",
        ],
    );
    assert_eq!(status(&o), 0, "{}", stderr(&o));
    let written = std::fs::read_to_string(dir.join("g").join("plugin-config.json")).unwrap();
    assert!(written.contains("\"shadow\": true"), "{written}");
}

#[test]
fn generate_takes_plugin_settings_and_refuses_those_its_flags_own() {
    let dir = scratch("genplugin");
    write(&dir, "limits.json", LIMITS);
    let o = run_in(
        &dir,
        &[
            "generate",
            "limits.json",
            "--domain",
            "d",
            "--out",
            "g",
            "--plugin",
            "response_cost_header=x-cost",
            "--plugin",
            "local.mode=lease",
        ],
    );
    assert_eq!(status(&o), 0, "{}", stderr(&o));
    let written: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("g").join("plugin-config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(written["response_cost_header"], "x-cost");
    assert_eq!(written["local"]["mode"], "lease");
    // Every default is still written out.
    assert_eq!(written["rate_limit_service"]["timeout_ms"], 20);
    for (path, flag) in [
        ("domain=x", "--domain"),
        ("rate_limit_service.timeout_ms=5", "--timeout-ms"),
        ("limits={}", "the team file"),
    ] {
        let o = run_in(
            &dir,
            &[
                "generate",
                "limits.json",
                "--domain",
                "d",
                "--out",
                "g",
                "--plugin",
                path,
            ],
        );
        assert_eq!(status(&o), 2, "{path}");
        assert!(
            stderr(&o).contains(&format!("set by {flag}")),
            "{path}: {}",
            stderr(&o)
        );
    }
}

#[test]
fn an_output_folder_is_owned_file_by_file() {
    let dir = scratch("owned");
    write(&dir, "routed.json", ROUTED);
    write(&dir, "plain.json", LIMITS);
    let gen = |file: &str| run_in(&dir, &["generate", file, "--domain", "d", "--out", "g"]);
    let o = gen("routed.json");
    assert_eq!(status(&o), 0, "{}", stderr(&o));
    assert!(dir.join("g/envoy-route-rate-limits.yaml").exists());
    write(&dir, "g/notes.txt", "mine");
    let o = gen("plain.json");
    assert_eq!(status(&o), 0, "{}", stderr(&o));
    assert!(
        stdout(&o).contains("removed g/envoy-route-rate-limits.yaml: an earlier run wrote it and this one does not\n"),
        "{}",
        stdout(&o)
    );
    assert!(!dir.join("g/envoy-route-rate-limits.yaml").exists());
    assert_eq!(
        std::fs::read_to_string(dir.join("g/notes.txt")).unwrap(),
        "mine"
    );

    // render: another target into the same folder removes the first one's
    // files, naming each; a file of a name it writes that it did not write
    // stops it before anything is written.
    let (ex, dep) = (example(), deployment_yaml());
    let (ex, dep) = (ex.to_str().unwrap(), dep.to_str().unwrap());
    let render = |target: &str, extra: &[&str]| {
        run_in(
            &dir,
            &[
                &[
                    "render",
                    ex,
                    "--deployment",
                    dep,
                    "--target",
                    target,
                    "--out",
                    "r",
                ][..],
                extra,
            ]
            .concat(),
        )
    };
    let o = render("istio", &[]);
    assert_eq!(status(&o), 0, "{}", stderr(&o));
    assert!(dir.join("r/wasmplugin.yaml").exists());
    let o = render("envoy", &["--set", "namespace=null"]);
    assert_eq!(status(&o), 0, "{}", stderr(&o));
    assert!(
        stdout(&o)
            .contains("removed r/wasmplugin.yaml: an earlier run wrote it and this one does not\n"),
        "{}",
        stdout(&o)
    );
    assert!(!dir.join("r/wasmplugin.yaml").exists());
    write(&dir, "r/wasmplugin.yaml", "# my own\n");
    let before = std::fs::read_to_string(dir.join("r/envoy.yaml")).unwrap();
    let o = render("istio", &[]);
    assert_eq!(status(&o), 1);
    assert!(
        stderr(&o).contains("r/wasmplugin.yaml: not written by ratelimit-config"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("r/wasmplugin.yaml")).unwrap(),
        "# my own\n"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("r/envoy.yaml")).unwrap(),
        before
    );
}

#[test]
fn render_names_its_routes_and_check_warns_of_a_route_no_envoy_route_carries() {
    let dir = scratch("routes");
    write(&dir, "limits.json", ROUTED);
    let base = [
        "render",
        "limits.json",
        "--target",
        "envoy",
        "--domain",
        "d",
        "--out",
        "r",
    ];
    let o = run_in(&dir, &base);
    assert_eq!(status(&o), 0, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("warning: envoy.routes: the team file limits route \"export\" (default) but no route of envoy.yaml is named so"),
        "{}",
        stderr(&o)
    );
    let envoy = std::fs::read_to_string(dir.join("r/envoy.yaml")).unwrap();
    assert!(envoy.contains("- name: app\n"), "{envoy}");
    let check = [
        "check",
        "--plugin-config",
        "r/envoy.yaml",
        "--service-config",
        "r/ratelimit.yaml",
    ];
    let o = run_in(&dir, &check);
    assert_eq!(status(&o), 0, "{}", stderr(&o));
    assert!(
        stderr(&o).starts_with("r/envoy.yaml: warning: limits.x-tenant-id.default.routes.export: no Envoy route there is named \"export\""),
        "{}",
        stderr(&o)
    );
    // With the route named, both say nothing.
    let o = run_in(
        &dir,
        &[&base[..], &["--set", "envoy.routes.export=/export"]].concat(),
    );
    assert_eq!(status(&o), 0, "{}", stderr(&o));
    assert_eq!(stderr(&o), "");
    let envoy = std::fs::read_to_string(dir.join("r/envoy.yaml")).unwrap();
    assert!(
        envoy.contains(
            "- name: export\n                match:\n                  prefix: /export\n"
        ),
        "{envoy}"
    );
    let o = run_in(&dir, &check);
    assert_eq!(status(&o), 0, "{}", stderr(&o));
    assert_eq!(stderr(&o), "");
    // The same check from a separate Envoy configuration.
    let o = run_in(
        &dir,
        &[
            "check",
            "--plugin-config",
            "r/http-filter.yaml",
            "--service-config",
            "r/ratelimit.yaml",
            "--envoy-config",
            "r/envoy.yaml",
        ],
    );
    assert_eq!(stderr(&o), "");
}

#[test]
fn one_version_for_the_crates_the_cli_the_images_and_the_changelog() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let read = |p: &str| std::fs::read_to_string(repo.join(p)).unwrap();
    let version = env!("CARGO_PKG_VERSION");
    // The workspace's version, which every crate takes.
    let cargo = read("Cargo.toml");
    let ws = cargo.split("[workspace.package]").nth(1).unwrap();
    assert!(ws.contains(&format!("\nversion = \"{version}\"\n")), "{ws}");
    for krate in [
        "filter/Cargo.toml",
        "ratelimit-config/Cargo.toml",
        "tools/trim-exports/Cargo.toml",
    ] {
        assert!(read(krate).contains("version.workspace = true"), "{krate}");
    }
    let o = run_in(&repo, &["--version"]);
    assert_eq!(stdout(&o), format!("ratelimit-config {version}\n"));
    // The CHANGELOG's newest section is this version's.
    let changelog = read("CHANGELOG.md");
    let newest = changelog.lines().find(|l| l.starts_with("## ")).unwrap();
    assert!(
        newest.starts_with(&format!("## {version} ")) || newest == format!("## {version}"),
        "{newest}"
    );
    // The image the example deploys is this version's.
    assert!(
        read("deploy/deployment.yaml").contains(&format!(
            "image: registry.example.com/tenant-ratelimit:{version} "
        )),
        "deploy/deployment.yaml's image is not tagged {version}"
    );
    assert!(read("LICENSE").contains("Apache License"));
    assert!(cargo.contains("license = \"Apache-2.0\""));
}

/// The `ratelimit-config ...` command lines of the user docs' code blocks
/// (continuation lines joined), with the page they are on.
fn documented_commands() -> Vec<(String, String)> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut pages = vec![repo.join("README.md")];
    for e in std::fs::read_dir(repo.join("docs")).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "md") {
            pages.push(e.path());
        }
    }
    pages.sort();
    let mut out = Vec::new();
    for page in pages {
        let text = std::fs::read_to_string(&page).unwrap();
        let name = page.file_name().unwrap().to_string_lossy().into_owned();
        let mut in_block = false;
        let mut pending: Option<String> = None;
        for line in text.lines() {
            if line.trim_start().starts_with("```") {
                in_block = !in_block;
                continue;
            }
            if !in_block {
                continue;
            }
            let line = line.trim();
            let joined = match pending.take() {
                Some(p) => format!("{p} {line}"),
                None => {
                    let l = line.strip_prefix("$ ").unwrap_or(line);
                    let Some(at) = l.find("ratelimit-config ") else {
                        continue;
                    };
                    // The command itself, or a path to the binary ending in it.
                    if !(at == 0 || l[..at].ends_with('/')) || l[..at].contains(' ') {
                        continue;
                    }
                    l[at..].to_string()
                }
            };
            match joined.strip_suffix('\\') {
                Some(head) => pending = Some(head.trim_end().to_string()),
                None => out.push((name.clone(), joined)),
            }
        }
    }
    out
}

/// The long flags a `--help` text lists.
fn help_flags(help: &str) -> Vec<String> {
    help.split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']')
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(|w| {
            w.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
                .to_string()
        })
        .map(|w| w.split(['=', '<']).next().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn every_command_the_docs_show_is_one_the_cli_takes() {
    let dir = scratch("docs");
    let commands = documented_commands();
    assert!(commands.len() >= 15, "{commands:?}");
    let mut wrong = Vec::new();
    for (page, command) in &commands {
        let words: Vec<&str> = command.split_whitespace().collect();
        let sub = words.get(1).copied().unwrap_or_default();
        let help = run_in(&dir, &[sub, "--help"]);
        if status(&help) != 0 {
            wrong.push(format!("{page}: {command}: no subcommand {sub:?}"));
            continue;
        }
        let known = help_flags(&stdout(&help));
        for w in &words[2..] {
            let flag = w.trim_start_matches('[');
            if !flag.starts_with("--") {
                continue;
            }
            let flag = flag.split(['=', ']']).next().unwrap_or_default();
            if !known.iter().any(|k| k == flag) {
                wrong.push(format!("{page}: {command}: {sub} takes no {flag}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn cli_md_names_every_flag_of_every_subcommand() {
    let dir = scratch("flags");
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cli.md"))
        .unwrap();
    let top = stdout(&run_in(&dir, &["--help"]));
    let mut missing = Vec::new();
    for sub in [
        "validate", "generate", "explain", "check", "render", "schema",
    ] {
        assert!(top.contains(&format!("  {sub}")), "--help lists no {sub}");
        assert!(
            doc.contains(&format!("ratelimit-config {sub}")),
            "cli.md shows no {sub}"
        );
        for flag in help_flags(&stdout(&run_in(&dir, &[sub, "--help"]))) {
            if flag != "--help" && !doc.contains(&flag) {
                missing.push(format!("{sub} {flag}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/cli.md does not name: {}",
        missing.join(", ")
    );
}

/// A team file only the counter counts: a sliding window and a calendar month.
const COUNTER_ONLY: &str = r#"{"x-tenant-id": {"default": {"perminute": 20, "permonth": 1000, "window": "sliding"}, "gold": {"perminute": 100, "header_value": ["a"]}}}"#;

#[test]
fn render_service_counter_writes_the_counter_and_check_accepts_it() {
    let dir = scratch("render-counter");
    write(&dir, "limits.json", COUNTER_ONLY);
    // envoyproxy/ratelimit, the default, cannot count it: render says why.
    let base = |target: &'static str| {
        vec![
            "render",
            "limits.json",
            "--target",
            target,
            "--domain",
            "payments",
            "--namespace",
            "pay",
            "--image",
            "registry.example.com/trl:1",
            "--fail-strategy",
            "open",
            "--set",
            "workload.name=api",
            "--set",
            "workload.image=registry.example.com/api:1",
            "--set",
            "envoy_gateway.route=api",
            "--set",
            "envoy_gateway.gateway=gw",
        ]
    };
    let o = run_in(&dir, &[&base("istio")[..], &["--out", "r"]].concat());
    assert_eq!(status(&o), 1, "{}", stderr(&o));
    assert!(stderr(&o).contains("sliding"), "{}", stderr(&o));
    for target in ["istio", "envoy-gateway", "envoy"] {
        let out = format!("r-{target}");
        let o = run_in(
            &dir,
            &[&base(target)[..], &["--service", "counter", "--out", &out]].concat(),
        );
        assert_eq!(status(&o), 0, "{target}: {}", stderr(&o));
        // The team file under its domain's name, not ratelimit.yaml.
        let team = std::fs::read_to_string(dir.join(&out).join("payments.json")).unwrap();
        assert!(team.contains("\"permonth\": 1000"), "{team}");
        assert!(!dir.join(&out).join("ratelimit.yaml").exists(), "{target}");
        let k = std::fs::read_to_string(dir.join(&out).join("kustomization.yaml")).unwrap();
        assert!(k.contains("- payments.json\n"), "{target}: {k}");
        // The service: the counter's image, its flags, its probes.
        let service_file = if target == "envoy" {
            "sidecar.yaml"
        } else {
            "ratelimit-service.yaml"
        };
        let svc = std::fs::read_to_string(dir.join(&out).join(service_file)).unwrap();
        for want in [
            "image: tenant-ratelimit-counter:",
            "- /bin/ratelimit-counter\n",
            "- '--limits'\n        - /etc/ratelimit-counter\n",
            "- '--store'\n        - redis://ratelimit-redis:6379\n",
            "path: /readyz\n",
            "path: /healthz\n",
        ] {
            assert!(svc.contains(want), "{target}: {want:?} not in\n{svc}");
        }
        assert!(!svc.contains("envoyproxy/ratelimit"), "{target}: {svc}");
        // The filter is told which service it calls.
        let plugin_file = match target {
            "istio" => "wasmplugin.yaml",
            "envoy-gateway" => "envoyextensionpolicy.yaml",
            _ => "envoy.yaml",
        };
        let plugin = std::fs::read_to_string(dir.join(&out).join(plugin_file)).unwrap();
        assert!(
            plugin.contains("\"service\": \"counter\"") || plugin.contains("service: counter"),
            "{target}: {plugin}"
        );
        // check accepts the pair render wrote.
        let o = run_in(
            &dir,
            &[
                "check",
                "--plugin-config",
                &format!("{out}/{plugin_file}"),
                "--service-config",
                &format!("{out}/payments.json"),
            ],
        );
        assert_eq!(status(&o), 0, "{target}: {}", stderr(&o));
        assert!(
            stdout(&o).starts_with("ok: 3 descriptors of 2 groups"),
            "{target}: {}",
            stdout(&o)
        );
    }
    // check names a counter's file of another domain, or of other limits.
    write(&dir, "other.json", COUNTER_ONLY);
    let o = run_in(
        &dir,
        &[
            "check",
            "--plugin-config",
            "r-istio/wasmplugin.yaml",
            "--service-config",
            "other.json",
        ],
    );
    assert_eq!(status(&o), 1);
    assert!(
        stderr(&o).contains("other.json:1:1: serves domain \"other\" (the file's name), not the filter's domain \"payments\""),
        "{}",
        stderr(&o)
    );
    write(&dir, "payments.json", &COUNTER_ONLY.replace("100", "90"));
    let o = run_in(
        &dir,
        &[
            "check",
            "--plugin-config",
            "r-istio/wasmplugin.yaml",
            "--service-config",
            "payments.json",
        ],
    );
    assert_eq!(status(&o), 1);
    assert!(
        stderr(&o).contains(
            "group \"gold\": the filter sends perminute 100, the counter counts perminute 90"
        ),
        "{}",
        stderr(&o)
    );
}

#[test]
fn render_keeps_envoyproxy_ratelimit_the_default_and_names_what_only_the_counter_takes() {
    let dir = scratch("render-service-kind");
    write(&dir, "limits.json", LIMITS);
    let base = [
        "render",
        "limits.json",
        "--target",
        "envoy",
        "--domain",
        "d",
        "--out",
        "r",
    ];
    let o = run_in(&dir, &base);
    assert_eq!(status(&o), 0, "{}", stderr(&o));
    assert!(dir.join("r/ratelimit.yaml").exists());
    let o = run_in(&dir, &[&base[..], &["--set", "redis.url=memory"]].concat());
    assert_eq!(status(&o), 1);
    assert!(
        stderr(&o).contains(
            "--set redis.url: redis.url: \"memory\" is for the counter (service.kind: counter)"
        ),
        "{}",
        stderr(&o)
    );
    let o = run_in(
        &dir,
        &[
            &base[..],
            &[
                "--service",
                "counter",
                "--set",
                "service.image=envoyproxy/ratelimit:3fb70258",
            ],
        ]
        .concat(),
    );
    assert_eq!(status(&o), 1);
    assert!(
        stderr(&o).contains("--set service.image: service.image: \"envoyproxy/ratelimit:3fb70258\" is envoyproxy/ratelimit's image"),
        "{}",
        stderr(&o)
    );
    let o = run_in(
        &dir,
        &[&base[..], &["--set", "service.kind=ratelimit"]].concat(),
    );
    assert_eq!(status(&o), 1);
    assert!(
        stderr(&o).contains(
            "service.kind: must be \"envoy-ratelimit\" (envoyproxy/ratelimit) or \"counter\""
        ),
        "{}",
        stderr(&o)
    );
    // The filter is told the service render deploys, never another.
    let o = run_in(
        &dir,
        &[
            &base[..],
            &["--plugin", "rate_limit_service.service=counter"],
        ]
        .concat(),
    );
    assert_eq!(status(&o), 1);
    assert!(
        stderr(&o).contains("--plugin rate_limit_service.service: plugin.rate_limit_service.service: set by render: the service it deploys (service.kind, or --service)"),
        "{}",
        stderr(&o)
    );
    // The counter's own memory: one replica, no Redis.
    let o = run_in(
        &dir,
        &[
            "render",
            "limits.json",
            "--target",
            "istio",
            "--domain",
            "d",
            "--namespace",
            "n",
            "--image",
            "i",
            "--fail-strategy",
            "open",
            "--set",
            "workload.name=w",
            "--service",
            "counter",
            "--set",
            "redis.url=memory",
            "--out",
            "m",
        ],
    );
    assert_eq!(status(&o), 0, "{}", stderr(&o));
    let svc = std::fs::read_to_string(dir.join("m/ratelimit-service.yaml")).unwrap();
    assert!(svc.contains("replicas: 1\n"), "{svc}");
    assert!(svc.contains("- '--store'\n        - memory\n"), "{svc}");
    assert!(!dir.join("m/redis.yaml").exists());
    // A domain the counter cannot take as a file name.
    let o = run_in(
        &dir,
        &[
            "render",
            "limits.json",
            "--target",
            "envoy",
            "--domain",
            "a/b",
            "--out",
            "r",
            "--service",
            "counter",
        ],
    );
    assert_eq!(status(&o), 1);
    assert!(stderr(&o).contains("<domain>.json"), "{}", stderr(&o));
}

/// `render --target istio` with the deployment example, and `extra` flags.
fn render_istio(dir: &Path, limits: &str, extra: &[&str]) -> Output {
    let dep = deployment_yaml();
    let base = [
        "render",
        limits,
        "--target",
        "istio",
        "--out",
        "r",
        "--deployment",
        dep.to_str().unwrap(),
    ];
    run_in(dir, &[&base[..], extra].concat())
}

#[test]
fn render_names_and_orders_a_second_wasmplugin_by_settings() {
    let dir = scratch("istio-second");
    let ex = example();
    let o = render_istio(&dir, ex.to_str().unwrap(), &[]);
    assert_eq!(status(&o), 0, "{}", stderr(&o));
    let plugin = std::fs::read_to_string(dir.join("r/wasmplugin.yaml")).unwrap();
    assert!(plugin.contains("\n  name: tenant-ratelimit\n"), "{plugin}");
    assert!(!plugin.contains("priority"), "{plugin}");
    let o = render_istio(
        &dir,
        ex.to_str().unwrap(),
        &[
            "--set",
            "istio.name=tenant-ratelimit-b",
            "--set",
            "istio.priority=10",
        ],
    );
    assert_eq!(status(&o), 0, "{}", stderr(&o));
    let plugin = std::fs::read_to_string(dir.join("r/wasmplugin.yaml")).unwrap();
    assert!(
        plugin.contains("\n  name: tenant-ratelimit-b\n"),
        "{plugin}"
    );
    assert!(plugin.contains("\n  priority: 10\n"), "{plugin}");
    // A bad one is named at its flag, with what it takes.
    let o = render_istio(
        &dir,
        ex.to_str().unwrap(),
        &[
            "--set",
            "istio.name=Second_Plugin",
            "--set",
            "istio.priority=high",
        ],
    );
    assert_eq!(status(&o), 1);
    let err = stderr(&o);
    assert!(
        err.contains("--set istio.name: istio.name: \"Second_Plugin\" is not a Kubernetes name (lowercase letters, digits, '-')"),
        "{err}"
    );
    assert!(
        err.contains("--set istio.priority: istio.priority: must be an integer from -2147483648 to 2147483647 (of two WasmPlugins in one phase, the higher runs first), got string \"high\""),
        "{err}"
    );
}

#[test]
fn render_runs_the_wasmplugin_on_the_sidecars_inbound_unless_told() {
    let dir = scratch("istio-mode");
    let ex = example();
    let o = render_istio(&dir, ex.to_str().unwrap(), &[]);
    assert_eq!(status(&o), 0, "{}", stderr(&o));
    let plugin = std::fs::read_to_string(dir.join("r/wasmplugin.yaml")).unwrap();
    assert!(
        plugin.contains("\n  match:\n  - mode: SERVER\n"),
        "{plugin}"
    );
    let o = render_istio(&dir, ex.to_str().unwrap(), &["--set", "istio.mode=CLIENT"]);
    assert_eq!(status(&o), 0, "{}", stderr(&o));
    let plugin = std::fs::read_to_string(dir.join("r/wasmplugin.yaml")).unwrap();
    assert!(
        plugin.contains("\n  match:\n  - mode: CLIENT\n"),
        "{plugin}"
    );
    let o = render_istio(&dir, ex.to_str().unwrap(), &["--set", "istio.mode=INBOUND"]);
    assert_eq!(status(&o), 1);
    assert!(
        stderr(&o).contains("--set istio.mode: istio.mode: must be one of SERVER, CLIENT, CLIENT_AND_SERVER (SERVER: a sidecar's inbound; CLIENT: an ingress gateway), got \"INBOUND\""),
        "{}",
        stderr(&o)
    );
}

#[test]
fn render_warns_that_a_sidecars_inbound_route_is_always_default() {
    let dir = scratch("istio-routes");
    write(&dir, "limits.json", ROUTED);
    let o = render_istio(&dir, "limits.json", &[]);
    assert_eq!(status(&o), 0, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("warning: istio.mode: the team file limits route \"export\" (default) but a sidecar's inbound route is always named \"default\" under Istio, whatever the VirtualServices say: the limit never applies there"),
        "{}",
        stderr(&o)
    );
    // On a gateway, the VirtualService names the routes.
    let o = render_istio(&dir, "limits.json", &["--set", "istio.mode=CLIENT"]);
    assert_eq!(status(&o), 0, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("note: the team file limits route \"export\": on an Istio gateway, Envoy's route name is the VirtualService's http[].name"),
        "{}",
        stderr(&o)
    );
    // A route named "default" is the one a sidecar's inbound has: no warning.
    write(
        &dir,
        "default-route.json",
        r#"{"x-tenant-id": {"default": {"perminute": 10, "routes": {"default": {"perminute": 2}}}}}"#,
    );
    let o = render_istio(&dir, "default-route.json", &[]);
    assert_eq!(status(&o), 0, "{}", stderr(&o));
    assert!(!stderr(&o).contains("warning"), "{}", stderr(&o));
}

#[test]
fn render_help_lists_every_key_and_value_the_description_reader_accepts() {
    use ratelimit_config::render::deployment::{KEYS, SECTION_KEYS, SETTING_VALUES};
    let dir = scratch("render-help");
    let help = stdout(&run_in(&dir, &["render", "--help"]));
    let deployment = help
        .split("--deployment <FILE>")
        .nth(1)
        .and_then(|h| h.split("--domain").next())
        .unwrap();
    assert!(
        deployment.contains(&KEYS.join(", ")),
        "{deployment}\nwants {KEYS:?}"
    );
    assert!(KEYS.contains(&"monitoring"), "{KEYS:?}");
    let set = help.split("--set <PATH=VALUE>").nth(1).unwrap();
    for (section, keys) in SECTION_KEYS {
        for key in *keys {
            let path = format!("{section}.{key}");
            let nested = SECTION_KEYS.iter().any(|(s, _)| *s == path);
            if !nested {
                assert!(set.contains(&path), "--set help lacks {path}:\n{set}");
            }
        }
    }
    for (path, values) in SETTING_VALUES {
        assert!(
            set.contains(&format!("{path}: {}", values.join(", "))),
            "{path}\n{set}"
        );
    }
    // Every section path the help names is one the reader takes.
    let o = render_istio(
        &dir,
        example().to_str().unwrap(),
        &[
            "--set",
            "istio.mode=CLIENT_AND_SERVER",
            "--set",
            "istio.priority=-1",
        ],
    );
    assert_eq!(status(&o), 0, "{}", stderr(&o));
}
