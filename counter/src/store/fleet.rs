//! The fleet's sizes in Redis (`crate::fleet`): a sorted set per domain,
//! member an Envoy id, score when it last called, which every replica
//! writes what it heard to and reads the size from, in one pipeline.

use std::time::Duration;

use super::StoreError;

/// The sorted set of a domain's Envoys in Redis. One hash tag for every
/// domain: a Redis Cluster keeps them in one slot, so that one pipeline
/// serves them all.
pub fn key(domain: &str) -> String {
    format!("{{trl_fleet}}_{domain}")
}

/// What a replica writes to Redis for one domain, and reads back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sync {
    pub domain: String,
    /// (Envoy id, when it last called): each id at most once per sync.
    pub heard: Vec<(String, u64)>,
    /// Members called last at or before this go.
    pub older_than_ms: u64,
    /// The set expires after this long untouched (no replica hears the
    /// domain any more).
    pub expire_ms: u64,
}

/// One pipeline for every domain of `syncs`: the ids heard added (or their
/// time moved), the members older than the interval dropped, the set's
/// size read, its expiry set. The sizes, in `syncs`' order.
pub async fn sync_redis<C: redis::aio::ConnectionLike>(
    con: &mut C,
    syncs: &[Sync],
    deadline: Duration,
) -> Result<Vec<u32>, StoreError> {
    if syncs.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    for s in syncs {
        let key = key(&s.domain);
        if !s.heard.is_empty() {
            let members: Vec<(u64, &str)> =
                s.heard.iter().map(|(id, at)| (*at, id.as_str())).collect();
            pipe.zadd_multiple(&key, &members).ignore();
        }
        pipe.cmd("ZREMRANGEBYSCORE")
            .arg(&key)
            .arg("-inf")
            .arg(s.older_than_ms)
            .ignore();
        pipe.zcard(&key);
        pipe.pexpire(&key, i64::try_from(s.expire_ms).unwrap_or(i64::MAX))
            .ignore();
    }
    let sizes: Vec<u64> = match tokio::time::timeout(deadline, pipe.query_async(con)).await {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => return Err(StoreError::Redis(e)),
        Err(_) => return Err(StoreError::Timeout),
    };
    if sizes.len() != syncs.len() {
        return Err(StoreError::Shape);
    }
    Ok(sizes
        .into_iter()
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
        .collect())
}
