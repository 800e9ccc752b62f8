//! The `ratelimit-config` binary as a user runs it: the exit statuses
//! docs/cli.md promises (0 fine, warnings allowed; 1 a problem found; 2 bad
//! usage) and the messages that tell how to fix a mistake.

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
