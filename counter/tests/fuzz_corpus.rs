//! Replays the committed fuzz corpora of the counter's targets (`fuzz/`,
//! `make fuzz`) on stable: every input must pass the same checks as under
//! the fuzzer.
// A test crate: the checks fail loudly.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

#[path = "../../fuzz/src/rls_request.rs"]
mod rls_request;

#[path = "../../fuzz/src/decision.rs"]
mod decision;

#[path = "../../fuzz/src/push.rs"]
mod push;

#[path = "../../fuzz/src/replay.rs"]
mod replay;

#[test]
fn rls_request_corpus() {
    replay::corpus("rls_request", rls_request::check);
}

#[test]
fn decision_corpus() {
    replay::corpus("decision", decision::check);
}

#[test]
fn push_corpus() {
    replay::corpus("push", push::check);
}
