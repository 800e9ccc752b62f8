//! Target `push`: a sync push (`trl.request=push`) as the counter reads it,
//! over arbitrary bytes: the `RateLimitRequest` decoder, a push mark put
//! first, the service's bounds (hits, tenant length), then the plan and the
//! memory store's decision, twice.
//!
//! Input: the message's bytes, as gRPC hands them over.
//!
//! Checks: it never panics; the bounds refuse exactly the calls with a
//! descriptor's hits over 2^32−1, a call's hits over 2^44 or a tenant over
//! 128 bytes; a call within them is answered with one status per
//! descriptor, every push admitted, and no count the store holds past what
//! the two calls added (so never near 2^53).

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use prost::Message;
use ratelimit_config::rls::{PUSH, REQUEST_MARK};
use ratelimit_counter::bounds::{
    Bounds, OutOfBounds, DEFAULT_MAX_TENANT_LENGTH, MAX_HITS_PER_CALL, MAX_HITS_PER_DESCRIPTOR,
};
use ratelimit_counter::decide::{answer, plan};
use ratelimit_counter::proto::{Entry, RateLimitDescriptor, RateLimitRequest};
use ratelimit_counter::store::Store;

use crate::rls_request;

/// The future's answer when it is ready at once (the memory store's is).
fn now_or_never<F: Future>(f: F) -> Option<F::Output> {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

pub fn check(data: &[u8]) {
    let Ok(mut req) = RateLimitRequest::decode(data) else {
        return;
    };
    req.descriptors.insert(
        0,
        RateLimitDescriptor {
            entries: vec![Entry {
                key: REQUEST_MARK.into(),
                value: PUSH.into(),
            }],
            hits_addend: None,
        },
    );
    let bounds = Bounds {
        descriptor_key: "tenant".into(),
        max_tenant_length: DEFAULT_MAX_TENANT_LENGTH,
    };
    let request_hits = u64::from(req.hits_addend.max(1));
    let counted = || {
        req.descriptors
            .iter()
            .filter(|d| d.entries.first().is_none_or(|e| e.key != REQUEST_MARK))
    };
    let hits = |d: &RateLimitDescriptor| d.hits_addend.map_or(request_hits, |h| h.value);
    let too_long = |d: &RateLimitDescriptor| {
        d.entries
            .iter()
            .any(|e| e.key == "tenant" && e.value.len() > DEFAULT_MAX_TENANT_LENGTH)
    };
    match bounds.check(&req) {
        Err(OutOfBounds::Hits { hits: h, .. }) => {
            assert!(h > MAX_HITS_PER_DESCRIPTOR);
            return;
        }
        Err(OutOfBounds::CallHits(total)) => {
            assert!(total > MAX_HITS_PER_CALL);
            return;
        }
        Err(OutOfBounds::TenantLength { len, max, .. }) => {
            assert!(len > max);
            return;
        }
        Ok(()) => {
            assert!(counted().all(|d| hits(d) <= MAX_HITS_PER_DESCRIPTOR && !too_long(d)));
            let total = counted().fold(0u64, |t, d| t.saturating_add(hits(d)));
            assert!(total <= MAX_HITS_PER_CALL);
        }
    }
    let d = rls_request::domain();
    let Ok(planned) = plan(d.as_ref(), &req, rls_request::NOW_MS) else {
        return;
    };
    let store = Store::memory(10_000);
    for round in 1..=2u64 {
        let decided = now_or_never(store.decide(&planned.requests, rls_request::NOW_MS));
        assert!(decided.is_some(), "the memory store answers at once");
        let Some(decided) = decided else {
            return;
        };
        // Full (past its keys): refused whole, nothing more to check.
        let Ok(decided) = decided else {
            return;
        };
        assert_eq!(decided.requests.len(), planned.requests.len());
        for (r, dec) in planned.requests.iter().zip(&decided.requests) {
            assert!(!r.push || dec.admitted, "a push is always counted");
            for c in &dec.counts {
                // What this call's earlier requests and the earlier
                // rounds added, at most.
                assert!(c.current <= round * MAX_HITS_PER_CALL);
                assert!(c.current < 1 << 53);
            }
        }
        let (response, _) = answer(&planned, &decided.requests, rls_request::NOW_MS);
        assert_eq!(response.statuses.len(), req.descriptors.len());
    }
}
