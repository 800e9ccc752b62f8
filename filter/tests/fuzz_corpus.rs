//! Replays the committed fuzz corpora of the filter's targets (`fuzz/`,
//! `make fuzz`) on stable: every input must pass the same checks as under
//! the fuzzer. Native only: the wasm test runner opens only the package
//! directory, and the corpora are beside it.
#![cfg(not(target_arch = "wasm32"))]
// A test crate: the checks fail loudly.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

#[path = "../../fuzz/src/slot.rs"]
mod slot;
#[path = "../../fuzz/src/verdict.rs"]
mod verdict;

#[path = "../../fuzz/src/replay.rs"]
mod replay;

#[test]
fn verdict_corpus() {
    replay::corpus("verdict", verdict::check);
}

#[test]
fn slot_corpus() {
    replay::corpus("slot", slot::check);
}
