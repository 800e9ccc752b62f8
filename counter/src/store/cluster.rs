//! A Redis Cluster (`redis-cluster://`, `rediss-cluster://`): a call's
//! requests grouped by hash tag (one tenant's slot), one script call per
//! group, concurrently.

use std::collections::BTreeMap;

use redis::cluster_async::ClusterConnection;

use super::{script, Deciding, Lazy, Pending, Reach, Storage, StoreError};
use crate::decide::{Decision, Request};

pub struct ClusterStore {
    connection: Lazy<ClusterConnection>,
    script: redis::Script,
    deadline: std::time::Duration,
}

impl ClusterStore {
    /// The Cluster `reach` names one or more nodes of; the connection is
    /// made on first use.
    pub fn open(reach: &Reach) -> Result<ClusterStore, String> {
        let nodes: Vec<redis::ConnectionInfo> = reach
            .target
            .nodes
            .iter()
            .map(|(h, p)| redis::ConnectionInfo {
                addr: reach.addr(h, *p),
                redis: redis::RedisConnectionInfo::default(),
            })
            .collect();
        let mut b = redis::cluster::ClusterClientBuilder::new(nodes)
            .connection_timeout(reach.deadline)
            .response_timeout(reach.deadline);
        if let Some(p) = &reach.password {
            b = b.password(p.clone());
        }
        if let Some(u) = &reach.username {
            b = b.username(u.clone());
        }
        if let Some(mode) = reach.tls_mode() {
            b = b.tls(mode);
        }
        if let Some(c) = &reach.certs {
            b = b.certs(c.clone());
        }
        let client = b.build().map_err(|e| reach.error(&e))?;
        Ok(ClusterStore {
            connection: Lazy::new(Box::new(move || {
                let client = client.clone();
                Box::pin(async move { client.get_async_connection().await })
            })),
            script: redis::Script::new(script::SCRIPT),
            deadline: reach.deadline,
        })
    }
}

impl Storage for ClusterStore {
    fn name(&self) -> &'static str {
        "redis-cluster"
    }

    fn decide<'a>(&'a self, requests: &'a [Request], _now_ms: u64) -> Deciding<'a> {
        Box::pin(async move {
            let c = self.connection.get(self.deadline).await?;
            // The requests of each hash tag, with their places in the call.
            let mut by_tag: BTreeMap<&str, (Vec<usize>, Vec<&Request>)> = BTreeMap::new();
            for (i, r) in requests.iter().enumerate() {
                let tag = r.checks.first().map_or("", |c| c.tag.as_str());
                let (places, chosen) = by_tag.entry(tag).or_default();
                places.push(i);
                chosen.push(r);
            }
            let calls = by_tag.into_values().map(|(places, chosen)| {
                let mut c = c.clone();
                async move {
                    let got = script::run(&mut c, &self.script, self.deadline, &chosen).await;
                    (places, got)
                }
            });
            let mut decided: Vec<Option<Decision>> = vec![None; requests.len()];
            for (places, got) in futures_util::future::join_all(calls).await {
                for (i, d) in places.into_iter().zip(got?) {
                    if let Some(place) = decided.get_mut(i) {
                        *place = Some(d);
                    }
                }
            }
            // Every place is filled: each request is in one group.
            Ok(decided.into_iter().map(Option::unwrap_or_default).collect())
        })
    }

    fn ping(&self) -> Pending<'_, Result<(), StoreError>> {
        Box::pin(self.connection.ping(self.deadline))
    }

    fn fleet<'a>(
        &'a self,
        syncs: &'a [super::fleet::Sync],
    ) -> Pending<'a, Result<Option<Vec<u32>>, StoreError>> {
        Box::pin(async move {
            let mut c = self.connection.get(self.deadline).await?;
            super::fleet::sync_redis(&mut c, syncs, self.deadline)
                .await
                .map(Some)
        })
    }

    #[cfg(test)]
    fn value<'a>(&'a self, key: &'a str, _now_ms: u64) -> Pending<'a, Result<u64, StoreError>> {
        Box::pin(self.connection.value(key, self.deadline))
    }
}
