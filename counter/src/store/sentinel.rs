//! Redis Sentinel: the master found by its name through the sentinels, and
//! found again when it stops answering or answers as a replica, so that a
//! failover is followed without a restart.

use std::sync::Mutex;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::sentinel::SentinelClient;
use redis::AsyncConnectionConfig;

use super::{script, Deciding, Pending, Reach, Storage, StoreError};
use crate::decide::Request;

pub struct SentinelStore {
    /// Asks the sentinels (one search at a time).
    client: tokio::sync::Mutex<SentinelClient>,
    /// The connection to the master last found; None: ask again.
    master: Mutex<Option<MultiplexedConnection>>,
    config: AsyncConnectionConfig,
    script: redis::Script,
    deadline: Duration,
}

impl SentinelStore {
    /// The master named `master`, through the sentinels `reach` lists;
    /// found on first use.
    pub fn open(reach: &Reach, master: String) -> Result<SentinelStore, String> {
        let sentinels = reach.target.nodes.iter().map(|(h, p)| reach.addr(h, *p));
        let mut b = redis::sentinel::SentinelClientBuilder::new(
            sentinels,
            master,
            redis::sentinel::SentinelServerType::Master,
        )
        .map_err(|e| reach.error(&e))?
        .set_client_to_redis_db(reach.target.db);
        if let Some(p) = &reach.password {
            b = b.set_client_to_redis_password(p.clone());
        }
        if let Some(u) = &reach.username {
            b = b.set_client_to_redis_username(u.clone());
        }
        if let Some((user, pass)) = &reach.sentinel_auth {
            b = b.set_client_to_sentinel_password(pass.clone());
            if let Some(u) = user {
                b = b.set_client_to_sentinel_username(u.clone());
            }
        }
        if let Some(mode) = reach.tls_mode() {
            b = b
                .set_client_to_redis_tls_mode(mode)
                .set_client_to_sentinel_tls_mode(mode);
        }
        if let Some(c) = &reach.certs {
            b = b
                .set_client_to_redis_certificates(c.clone())
                .set_client_to_sentinel_certificates(c.clone());
        }
        let client = b.build().map_err(|e| reach.error(&e))?;
        Ok(SentinelStore::new(client, reach.deadline))
    }

    pub fn new(client: SentinelClient, deadline: Duration) -> SentinelStore {
        SentinelStore {
            client: tokio::sync::Mutex::new(client),
            master: Mutex::new(None),
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(deadline)
                .set_response_timeout(deadline),
            script: redis::Script::new(script::SCRIPT),
            deadline,
        }
    }

    fn current(&self) -> Option<MultiplexedConnection> {
        self.master
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The master's connection: the one in hand, else the sentinels asked
    /// (within `deadline`) and a connection made to the master they name.
    pub async fn get(&self, deadline: Duration) -> Result<MultiplexedConnection, StoreError> {
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let found = tokio::time::timeout(deadline, async {
            let mut client = self.client.lock().await;
            // Another call may have found it while this one waited.
            if let Some(c) = self.current() {
                return Ok(c);
            }
            let master = client.async_get_client().await?;
            let c = master
                .get_multiplexed_async_connection_with_config(&self.config)
                .await?;
            *self
                .master
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(c.clone());
            Ok(c)
        })
        .await;
        match found {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(StoreError::Redis(e)),
            Err(_) => Err(StoreError::Timeout),
        }
    }

    /// After a failed call: when the failure may mean the master moved (it
    /// did not answer, its connection broke, or it answered as a replica),
    /// the next call asks the sentinels again.
    pub fn failed(&self, e: &StoreError) {
        if moved(e) {
            *self
                .master
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        }
    }
}

impl Storage for SentinelStore {
    fn name(&self) -> &'static str {
        "redis-sentinel"
    }

    fn decide<'a>(&'a self, requests: &'a [Request], _now_ms: u64) -> Deciding<'a> {
        Box::pin(async move {
            let got = async {
                let mut c = self.get(self.deadline).await?;
                let all: Vec<&Request> = requests.iter().collect();
                script::run(&mut c, &self.script, self.deadline, &all).await
            }
            .await;
            if let Err(e) = &got {
                self.failed(e);
            }
            got
        })
    }

    fn ping(&self) -> Pending<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let mut c = self.get(self.deadline).await?;
            let answer = script::ping(&mut c, self.deadline).await;
            if let Err(e) = &answer {
                self.failed(e);
            }
            answer
        })
    }

    fn fleet<'a>(
        &'a self,
        syncs: &'a [super::fleet::Sync],
    ) -> Pending<'a, Result<Option<Vec<u32>>, StoreError>> {
        Box::pin(async move {
            let got = async {
                let mut c = self.get(self.deadline).await?;
                super::fleet::sync_redis(&mut c, syncs, self.deadline).await
            }
            .await;
            if let Err(e) = &got {
                self.failed(e);
            }
            got.map(Some)
        })
    }

    #[cfg(test)]
    fn value<'a>(&'a self, key: &'a str, _now_ms: u64) -> Pending<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let mut c = self.get(self.deadline).await?;
            script::value(&mut c, key).await
        })
    }
}

/// Whether an error may mean that the master is no longer where it was.
fn moved(e: &StoreError) -> bool {
    match e {
        StoreError::Timeout => true,
        StoreError::Redis(e) => {
            e.is_io_error()
                || e.is_connection_dropped()
                || e.is_connection_refusal()
                || e.is_timeout()
                || matches!(
                    e.kind(),
                    redis::ErrorKind::ReadOnly
                        | redis::ErrorKind::BusyLoadingError
                        | redis::ErrorKind::MasterDown
                )
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sentinels_are_asked_again_when_the_master_may_have_moved() {
        let err = |k, s: &'static str| StoreError::Redis(redis::RedisError::from((k, s)));
        assert!(moved(&StoreError::Timeout));
        assert!(moved(&err(redis::ErrorKind::ReadOnly, "READONLY")));
        assert!(moved(&StoreError::Redis(redis::RedisError::from(
            std::io::Error::from(std::io::ErrorKind::ConnectionReset)
        ))));
        assert!(!moved(&err(
            redis::ErrorKind::AuthenticationFailed,
            "WRONGPASS"
        )));
        assert!(!moved(&StoreError::Shape));
    }
}
