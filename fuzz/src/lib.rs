//! The checks of the fuzz targets, one module per target, each a
//! `check(data: &[u8])` that must never panic. The stable corpus replays
//! (`filter/tests/fuzz_corpus.rs`, `ratelimit-config/tests/fuzz_corpus.rs`,
//! `counter/tests/fuzz_corpus.rs`)
//! include these same files with `#[path]`.

pub mod decision;
pub mod plugin_config;
pub mod push;
pub mod rls_request;
pub mod slot;
pub mod team_file;
pub mod verdict;
