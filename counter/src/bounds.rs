//! What the counter reads of a call before anything else, and refuses with
//! INVALID_ARGUMENT before any store work: hits the filter can never send,
//! and tenants longer than the filter accepts. A count kept by the store
//! then never nears what Redis's integers or the script's Lua numbers can
//! hold, and one client cannot turn a tenant into a megabyte-sized key.

use crate::decide::MAX_DESCRIPTORS;
use crate::proto::RateLimitRequest;
use ratelimit_config::rls::REQUEST_MARK;

/// The most hits one descriptor may carry: the filter's cost and its sync
/// pushes are `u32` (`filter/src/cost.rs`, `filter/src/batch.rs`).
pub const MAX_HITS_PER_DESCRIPTOR: u64 = u32::MAX as u64;

/// The most hits one call may carry in all: `MAX_DESCRIPTORS` descriptors
/// of `MAX_HITS_PER_DESCRIPTOR` each stay under it (2^44, about 1.8e13).
/// 512 such calls on one key are needed to pass 2^53, the largest
/// integer a Lua number (the script's arithmetic) holds exactly, and a
/// million to pass 2^63, Redis's INCRBY bound.
pub const MAX_HITS_PER_CALL: u64 = 1 << 44;

/// The filter's `max_tenant_length` default: the counter's
/// `--max-tenant-length` default.
pub const DEFAULT_MAX_TENANT_LENGTH: usize = 128;

/// What the service's bounds hold a call to.
#[derive(Clone, Debug)]
pub struct Bounds {
    /// The descriptor key that carries the tenant (`--descriptor-key`).
    pub descriptor_key: String,
    pub max_tenant_length: usize,
}

/// Why a call is refused.
#[derive(Debug, PartialEq, Eq)]
pub enum OutOfBounds {
    /// A descriptor's `hits_addend` above `MAX_HITS_PER_DESCRIPTOR`.
    Hits { index: usize, hits: u64 },
    /// The call's hits above `MAX_HITS_PER_CALL`.
    CallHits(u64),
    /// A tenant longer than `--max-tenant-length`.
    TenantLength {
        index: usize,
        len: usize,
        max: usize,
    },
}

impl std::fmt::Display for OutOfBounds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OutOfBounds::Hits { index, hits } => write!(
                f,
                "descriptor {index}: hits_addend {hits}; at most {MAX_HITS_PER_DESCRIPTOR} (the filter's largest cost)"
            ),
            OutOfBounds::CallHits(total) => write!(
                f,
                "{total} hits in one call; at most {MAX_HITS_PER_CALL}"
            ),
            OutOfBounds::TenantLength { index, len, max } => write!(
                f,
                "descriptor {index}: a tenant of {len} bytes; at most {max} (--max-tenant-length)"
            ),
        }
    }
}

impl Bounds {
    /// Ok when every descriptor (a push's as any other) is within bounds.
    pub fn check(&self, req: &RateLimitRequest) -> Result<(), OutOfBounds> {
        let request_hits = u64::from(req.hits_addend.max(1));
        let mut total: u64 = 0;
        for (index, d) in req.descriptors.iter().enumerate() {
            if d.entries.first().is_some_and(|e| e.key == REQUEST_MARK) {
                continue;
            }
            let hits = d.hits_addend.map_or(request_hits, |h| h.value);
            if hits > MAX_HITS_PER_DESCRIPTOR {
                return Err(OutOfBounds::Hits { index, hits });
            }
            total = total.saturating_add(hits);
            if let Some(t) = d
                .entries
                .iter()
                .find(|e| e.key == self.descriptor_key && e.value.len() > self.max_tenant_length)
            {
                return Err(OutOfBounds::TenantLength {
                    index,
                    len: t.value.len(),
                    max: self.max_tenant_length,
                });
            }
        }
        if total > MAX_HITS_PER_CALL {
            return Err(OutOfBounds::CallHits(total));
        }
        Ok(())
    }
}

// The per-call bound holds for any call the descriptor bound lets through.
const _: () = assert!((MAX_DESCRIPTORS as u64) * MAX_HITS_PER_DESCRIPTOR < MAX_HITS_PER_CALL);
const _: () = assert!(MAX_HITS_PER_CALL < (1 << 53));

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Entry, RateLimitDescriptor as Descriptor, UInt64Value};

    fn bounds() -> Bounds {
        Bounds {
            descriptor_key: "tenant".into(),
            max_tenant_length: DEFAULT_MAX_TENANT_LENGTH,
        }
    }

    fn desc(entries: &[(&str, &str)], hits: Option<u64>) -> Descriptor {
        Descriptor {
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: (*k).into(),
                    value: (*v).into(),
                })
                .collect(),
            hits_addend: hits.map(|value| UInt64Value { value }),
        }
    }

    fn call(descriptors: Vec<Descriptor>) -> RateLimitRequest {
        RateLimitRequest {
            domain: "d".into(),
            descriptors,
            hits_addend: 0,
        }
    }

    #[test]
    fn a_push_of_u64_max_is_refused_and_u32_max_is_not() {
        let push = |h| {
            call(vec![
                desc(&[(REQUEST_MARK, "push")], None),
                desc(&[("generic_key", "per_hour"), ("tenant", "pv")], Some(h)),
            ])
        };
        assert_eq!(
            bounds().check(&push(u64::MAX)),
            Err(OutOfBounds::Hits {
                index: 1,
                hits: u64::MAX
            })
        );
        assert_eq!(bounds().check(&push(u64::from(u32::MAX))), Ok(()));
    }

    #[test]
    fn a_long_tenant_is_refused() {
        let long = "x".repeat(129);
        let c = call(vec![desc(
            &[("generic_key", "per_hour"), ("tenant", &long)],
            None,
        )]);
        assert!(matches!(
            bounds().check(&c),
            Err(OutOfBounds::TenantLength { len: 129, .. })
        ));
        let ok = "x".repeat(128);
        let c = call(vec![desc(
            &[("generic_key", "per_hour"), ("tenant", &ok)],
            None,
        )]);
        assert_eq!(bounds().check(&c), Ok(()));
    }
}
