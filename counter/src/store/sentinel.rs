//! Redis Sentinel: the master found by its name through the sentinels, and
//! found again when it stops answering or answers as a replica, so that a
//! failover is followed without a restart.

use std::sync::Mutex;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::sentinel::SentinelClient;
use redis::AsyncConnectionConfig;

use super::StoreError;

pub struct SentinelStore {
    /// Asks the sentinels (one search at a time).
    client: tokio::sync::Mutex<SentinelClient>,
    /// The connection to the master last found; None: ask again.
    master: Mutex<Option<MultiplexedConnection>>,
    config: AsyncConnectionConfig,
}

impl SentinelStore {
    pub fn new(client: SentinelClient, deadline: Duration) -> SentinelStore {
        SentinelStore {
            client: tokio::sync::Mutex::new(client),
            master: Mutex::new(None),
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(deadline)
                .set_response_timeout(deadline),
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
