//! One Redis server (`redis://`, `rediss://`): every request of a call
//! decided by one script call.

use redis::aio::ConnectionManager;

use super::{script, Deciding, Lazy, Pending, Reach, Storage, StoreError};
use crate::decide::Request;

pub struct RedisStore {
    connection: Lazy<ConnectionManager>,
    script: redis::Script,
    deadline: std::time::Duration,
}

impl RedisStore {
    /// The server `reach` names; the connection is made on first use.
    pub fn open(reach: &Reach) -> Result<RedisStore, String> {
        let (host, port) = reach
            .target
            .nodes
            .first()
            .ok_or_else(|| format!("{}: no HOST:PORT", reach.shown))?;
        let info = redis::ConnectionInfo {
            addr: reach.addr(host, *port),
            redis: redis::RedisConnectionInfo {
                db: reach.target.db,
                username: reach.username.clone(),
                password: reach.password.clone(),
                ..Default::default()
            },
        };
        let client = match &reach.certs {
            Some(c) => redis::Client::build_with_tls(info, c.clone()),
            None => redis::Client::open(info),
        }
        .map_err(|e| reach.error(&e))?;
        Ok(RedisStore {
            connection: manager(client, reach.deadline),
            script: redis::Script::new(script::SCRIPT),
            deadline: reach.deadline,
        })
    }
}

impl Storage for RedisStore {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn decide<'a>(&'a self, requests: &'a [Request], _now_ms: u64) -> Deciding<'a> {
        Box::pin(async move {
            let mut c = self.connection.get(self.deadline).await?;
            let all: Vec<&Request> = requests.iter().collect();
            script::run(&mut c, &self.script, self.deadline, &all).await
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

/// One Redis server's connection, made on first use.
fn manager(client: redis::Client, deadline: std::time::Duration) -> Lazy<ConnectionManager> {
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(deadline)
        .set_response_timeout(deadline)
        .set_number_of_retries(1)
        .set_max_delay(200);
    Lazy::new(Box::new(move || {
        let (client, config) = (client.clone(), config.clone());
        Box::pin(async move {
            // One attempt first, so that the reason (a refused password,
            // a refused connection) is reported at once, not after the
            // manager's retries have outlasted the deadline.
            let once = redis::AsyncConnectionConfig::new()
                .set_connection_timeout(deadline)
                .set_response_timeout(deadline);
            drop(
                client
                    .get_multiplexed_async_connection_with_config(&once)
                    .await?,
            );
            ConnectionManager::new_with_config(client, config).await
        })
    }))
}
