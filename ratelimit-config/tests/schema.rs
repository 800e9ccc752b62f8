//! The JSON Schema that `ratelimit-config schema` prints accepts the good
//! files and refuses the bad ones, except the few a schema cannot see.
#![cfg(not(target_arch = "wasm32"))]
// A test crate: helpers outside #[test] functions may fail loudly too.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use std::fs;

use ratelimit_config::schema::{team_limits_schema, SCHEMA_ID};
use serde_json::Value;

/// What a JSON Schema cannot express: uniqueness across groups, and keys
/// given twice (gone once the text is parsed). Not JSON at all.
const SCHEMA_BLIND: &[&str] = &["tenant-in-two-groups", "duplicate-key", "duplicate-unit"];

fn validator() -> (boon::Schemas, boon::SchemaIndex) {
    let mut schemas = boon::Schemas::new();
    let mut compiler = boon::Compiler::new();
    compiler
        .add_resource(SCHEMA_ID, team_limits_schema())
        .unwrap();
    let index = compiler.compile(SCHEMA_ID, &mut schemas).unwrap();
    (schemas, index)
}

fn files(dir: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for entry in fs::read_dir(format!("tests/{dir}")).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|x| x == "json") {
            let case = p.file_stem().unwrap().to_string_lossy().into_owned();
            if let Ok(v) = serde_json::from_str(&fs::read_to_string(&p).unwrap()) {
                out.push((case, v));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn the_schema_is_draft_2020_12() {
    let s = team_limits_schema();
    assert_eq!(s["$schema"], "https://json-schema.org/draft/2020-12/schema");
}

#[test]
fn good_files_pass() {
    let (schemas, index) = validator();
    let good = files("golden");
    assert!(!good.is_empty());
    for (case, v) in good.iter().filter(|(c, _)| c == "limits") {
        assert!(schemas.validate(v, index).is_ok(), "{case}");
    }
    for (case, v) in files("fixtures/warn") {
        assert!(schemas.validate(&v, index).is_ok(), "{case}");
    }
}

#[test]
fn bad_files_fail_except_what_a_schema_cannot_see() {
    let (schemas, index) = validator();
    let bad = files("fixtures/bad");
    assert!(bad.len() >= 30);
    for (case, v) in bad {
        let valid = schemas.validate(&v, index).is_ok();
        assert_eq!(valid, SCHEMA_BLIND.contains(&case.as_str()), "{case}");
    }
}
