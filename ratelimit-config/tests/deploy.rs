//! deploy/ is what `ratelimit-config render` writes for the example
//! (e2e/limits.json, deploy/deployment.yaml), byte for byte, target by
//! target, and nothing else: a stale file, a hand edit or a file render no
//! longer writes fails here. `make deploy-render` renders them again.
// Native only: it reads deploy/ and e2e/, outside the crate, which the
// wasm runner (it opens only the crate's directory) cannot reach.
#![cfg(not(target_arch = "wasm32"))]
// A test crate: helpers outside #[test] functions may fail loudly too.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use std::path::{Path, PathBuf};

use ratelimit_config::render::deployment::{deployment, read_description};
use ratelimit_config::render::{render, File, Target, Team};
use ratelimit_config::team_file::check_team_file;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn rendered(target: Target) -> Vec<File> {
    let limits_path = repo().join("e2e/limits.json");
    let f = check_team_file(
        "limits.json",
        &std::fs::read_to_string(limits_path).unwrap(),
    );
    let (json, limits) = f.parsed.unwrap();
    let text = std::fs::read_to_string(repo().join("deploy/deployment.yaml")).unwrap();
    let (description, sources) = read_description("deployment.yaml", &text).unwrap();
    let dep = deployment(&description, &sources, target).unwrap();
    let team = Team {
        source: "limits.json",
        json: &json,
        limits: &limits,
    };
    let (files, warnings) = render(&team, &dep, target, &|p| sources.place(p)).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    files
}

#[test]
fn deploy_is_what_render_writes_for_the_example() {
    let mut stale = Vec::new();
    for &target in Target::all() {
        let dir = repo().join("deploy").join(target.name());
        let files = rendered(target);
        for f in &files {
            let path = dir.join(&f.name);
            if std::fs::read_to_string(&path).ok().as_deref() != Some(f.text.as_str()) {
                stale.push(format!("deploy/{}/{}", target.name(), f.name));
            }
        }
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name != ratelimit_config::owned::MANIFEST && !files.iter().any(|f| f.name == name) {
                stale.push(format!(
                    "deploy/{}/{name} (render no longer writes it)",
                    target.name()
                ));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "not what `ratelimit-config render` writes: {}; run `make deploy-render` and commit",
        stale.join(", ")
    );
}

#[test]
fn rendering_twice_gives_the_same_bytes() {
    for &target in Target::all() {
        assert_eq!(rendered(target), rendered(target), "{}", target.name());
    }
}
