//! Replays `fuzz/corpus/<target>/` through a target's check, for the stable
//! tests (`filter/tests/fuzz_corpus.rs`, `ratelimit-config/tests/fuzz_corpus.rs`).
//! Not part of the fuzz crate's library.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

/// Inputs of `dir` (relative to `fuzz/`) for `target`, sorted by name.
fn inputs(dir: &str, target: &str) -> Vec<(String, Vec<u8>)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz")
        .join(dir)
        .join(target);
    let Ok(entries) = std::fs::read_dir(&path) else {
        return Vec::new();
    };
    let mut files: Vec<(String, Vec<u8>)> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| {
            let name = format!(
                "{dir}/{target}/{}",
                p.file_name().unwrap().to_string_lossy()
            );
            (name, std::fs::read(&p).unwrap())
        })
        .collect();
    files.sort();
    files
}

/// Runs `check` on every input of the target's corpus and names each that
/// fails; a corpus with fewer than `MIN_INPUTS` inputs is a failure too (a
/// replay of nothing would pass).
pub fn corpus(target: &str, check: fn(&[u8])) {
    const MIN_INPUTS: usize = 10;
    let corpus = inputs("corpus", target);
    assert!(
        corpus.len() >= MIN_INPUTS,
        "fuzz/corpus/{target}: {} inputs, expected at least {MIN_INPUTS}",
        corpus.len()
    );
    let failed: Vec<&str> = corpus
        .iter()
        .filter(|(_, data)| catch_unwind(AssertUnwindSafe(|| check(data))).is_err())
        .map(|(name, _)| name.as_str())
        .collect();
    assert!(failed.is_empty(), "failing inputs: {failed:?}");
}
