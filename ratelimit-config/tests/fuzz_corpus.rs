//! Replays the committed fuzz corpora of the configuration targets
//! (`fuzz/`, `make fuzz`) on stable: every input must pass the same checks
//! as under the fuzzer. Native only: the wasm test runner opens only the
//! package directory, and the corpora are beside it.
#![cfg(not(target_arch = "wasm32"))]
// A test crate: the checks fail loudly.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

#[path = "../../fuzz/src/plugin_config.rs"]
mod plugin_config;
#[path = "../../fuzz/src/team_file.rs"]
mod team_file;

#[path = "../../fuzz/src/replay.rs"]
mod replay;

#[test]
fn plugin_config_corpus() {
    replay::corpus("plugin_config", plugin_config::check);
}

#[test]
fn team_file_corpus() {
    replay::corpus("team_file", team_file::check);
}
