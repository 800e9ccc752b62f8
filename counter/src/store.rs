//! Where the counts live: in this process (`memory`), or in Redis (one
//! server or a Cluster), where one Lua script decides all of a call's
//! requests that share a slot, atomically.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;

use crate::decide::{Counts, MemoryCounts, Request};

/// The script: for each request, reads its windows, decides it as a whole
/// and, when admitted, adds its hits (PEXPIRE on a counter's first hit).
/// ARGV: the number of requests, then per request the number of its
/// checks and per check: sliding (0/1), limit, hits, weight (millionths),
/// ttl (ms), the index of its key, the index of the previous window's key
/// (0: none), and the hits of every check of the request on that key.
/// Returns per request: admitted (0/1), then per check the
/// current count and the previous one, as read before adding.
pub const SCRIPT: &str = r"
local out = {}
local a = 2
for q = 1, tonumber(ARGV[1]) do
  local n = tonumber(ARGV[a]); a = a + 1
  local first = a
  local ok = 1
  local at = #out + 1
  out[at] = 0
  for i = 1, n do
    local limit = tonumber(ARGV[a + 1]); local hits = tonumber(ARGV[a + 7])
    local w = tonumber(ARGV[a + 3]); local k = tonumber(ARGV[a + 5]); local pk = tonumber(ARGV[a + 6])
    local cur = tonumber(redis.call('GET', KEYS[k]) or '0')
    local prev = 0
    if pk > 0 then prev = tonumber(redis.call('GET', KEYS[pk]) or '0') end
    local est = cur
    if prev > 0 then est = cur + math.floor((prev * w + 999999) / 1000000) end
    if (hits == 0 and est >= limit) or (hits > 0 and est + hits > limit) then ok = 0 end
    out[#out + 1] = cur
    out[#out + 1] = prev
    a = a + 8
  end
  out[at] = ok
  if ok == 1 then
    local b = first
    for i = 1, n do
      local hits = tonumber(ARGV[b + 2])
      if hits > 0 then
        local k = KEYS[tonumber(ARGV[b + 5])]
        if redis.call('INCRBY', k, ARGV[b + 2]) == hits then
          redis.call('PEXPIRE', k, ARGV[b + 4])
        end
      end
      b = b + 8
    end
  end
end
return out
";

pub enum Backend {
    Memory(Mutex<MemoryCounts>),
    Redis(ConnectionManager),
    Cluster(ClusterConnection),
}

pub struct Store {
    pub backend: Backend,
    pub script: redis::Script,
    /// Every Redis call is bounded by this.
    pub deadline: Duration,
}

#[derive(Debug)]
pub enum StoreError {
    Timeout,
    Redis(redis::RedisError),
    /// The script answered something else than it returns.
    Shape,
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Timeout => f.write_str("Redis did not answer within the deadline"),
            StoreError::Redis(e) => write!(f, "Redis: {e}"),
            StoreError::Shape => f.write_str("the script's answer has an unexpected shape"),
        }
    }
}

/// Each request's counts and whether it was admitted, in the plan's order.
pub type Decided = (Vec<Vec<Counts>>, Vec<bool>);

impl Store {
    pub fn memory(deadline: Duration) -> Store {
        Store {
            backend: Backend::Memory(Mutex::new(MemoryCounts::default())),
            script: redis::Script::new(SCRIPT),
            deadline,
        }
    }

    pub fn name(&self) -> &'static str {
        match self.backend {
            Backend::Memory(_) => "memory",
            Backend::Redis(_) => "redis",
            Backend::Cluster(_) => "redis-cluster",
        }
    }

    /// Decides every request of a call at `now_ms`.
    pub async fn decide(&self, requests: &[Request], now_ms: u64) -> Result<Decided, StoreError> {
        match &self.backend {
            Backend::Memory(m) => {
                let mut m = m.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let (counts, admitted) = requests.iter().map(|r| m.apply(r, now_ms)).unzip();
                Ok((counts, admitted))
            }
            Backend::Redis(c) => {
                let all: Vec<usize> = (0..requests.len()).collect();
                let mut c = c.clone();
                let got = self.run(&mut c, requests, &all).await?;
                Ok(got.into_iter().unzip())
            }
            Backend::Cluster(c) => {
                // One script call per hash tag (a tenant's slot), concurrently.
                let mut by_tag: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
                for (i, r) in requests.iter().enumerate() {
                    let tag = r.checks.first().map_or("", |c| c.tag.as_str());
                    by_tag.entry(tag).or_default().push(i);
                }
                let calls = by_tag.values().map(|idx| {
                    let mut c = c.clone();
                    async move { (idx, self.run(&mut c, requests, idx).await) }
                });
                let mut counts = vec![Vec::new(); requests.len()];
                let mut admitted = vec![false; requests.len()];
                for (idx, got) in futures_util::future::join_all(calls).await {
                    for (&i, (c, a)) in idx.iter().zip(got?) {
                        if let (Some(cs), Some(ad)) = (counts.get_mut(i), admitted.get_mut(i)) {
                            *cs = c;
                            *ad = a;
                        }
                    }
                }
                Ok((counts, admitted))
            }
        }
    }

    /// One script call for the requests `idx`.
    async fn run<C: redis::aio::ConnectionLike>(
        &self,
        con: &mut C,
        requests: &[Request],
        idx: &[usize],
    ) -> Result<Vec<(Vec<Counts>, bool)>, StoreError> {
        let chosen: Vec<&Request> = idx.iter().filter_map(|&i| requests.get(i)).collect();
        if chosen.iter().all(|r| r.checks.is_empty()) {
            return Ok(chosen.iter().map(|_| (Vec::new(), true)).collect());
        }
        let mut inv = self.script.prepare_invoke();
        inv.arg(chosen.len());
        let mut keys = 0usize;
        for r in &chosen {
            inv.arg(r.checks.len());
            for c in &r.checks {
                keys += 1;
                let k = keys;
                inv.key(&c.key);
                let pk = match &c.prev_key {
                    Some(p) => {
                        keys += 1;
                        inv.key(p);
                        keys
                    }
                    None => 0,
                };
                inv.arg(u8::from(c.sliding))
                    .arg(c.limit)
                    .arg(c.hits)
                    .arg(c.weight_ppm)
                    .arg(c.ttl_ms)
                    .arg(k)
                    .arg(pk)
                    .arg(c.key_hits);
            }
        }
        let answer: Vec<i64> = tokio::time::timeout(self.deadline, inv.invoke_async(con))
            .await
            .map_err(|_| StoreError::Timeout)?
            .map_err(StoreError::Redis)?;
        let mut it = answer.into_iter();
        let count = |v: Option<i64>| {
            v.and_then(|n| u64::try_from(n).ok())
                .ok_or(StoreError::Shape)
        };
        let mut out = Vec::with_capacity(chosen.len());
        for r in &chosen {
            let admitted = count(it.next())? == 1;
            let mut counts = Vec::with_capacity(r.checks.len());
            for _ in &r.checks {
                counts.push(Counts {
                    current: count(it.next())?,
                    previous: count(it.next())?,
                });
            }
            out.push((counts, admitted));
        }
        Ok(out)
    }

    /// Whether the store answers (PING within the deadline).
    pub async fn answers(&self) -> bool {
        let ping = redis::cmd("PING");
        match &self.backend {
            Backend::Memory(_) => true,
            Backend::Redis(c) => {
                let mut c = c.clone();
                matches!(
                    tokio::time::timeout(self.deadline, ping.query_async::<String>(&mut c)).await,
                    Ok(Ok(_))
                )
            }
            Backend::Cluster(c) => {
                let mut c = c.clone();
                matches!(
                    tokio::time::timeout(self.deadline, ping.query_async::<String>(&mut c)).await,
                    Ok(Ok(_))
                )
            }
        }
    }

    /// Drops expired counters of the memory store.
    pub fn sweep(&self, now_ms: u64) {
        if let Backend::Memory(m) = &self.backend {
            m.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .sweep(now_ms);
        }
    }
}

/// Connects to `url`: `memory`, `redis://host:port[/db]`, or
/// `redis-cluster://host:port[,host:port...]`. The password comes from
/// `password` (REDIS_AUTH).
pub async fn connect(
    url: &str,
    password: Option<String>,
    deadline: Duration,
) -> Result<Store, String> {
    if url == "memory" {
        return Ok(Store::memory(deadline));
    }
    let script = redis::Script::new(SCRIPT);
    if let Some(nodes) = url.strip_prefix("redis-cluster://") {
        let nodes: Vec<String> = nodes.split(',').map(|n| format!("redis://{n}")).collect();
        let mut b = redis::cluster::ClusterClientBuilder::new(nodes)
            .connection_timeout(deadline)
            .response_timeout(deadline);
        if let Some(p) = password {
            b = b.password(p);
        }
        let client = b.build().map_err(|e| format!("{url}: {e}"))?;
        let con = client
            .get_async_connection()
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        return Ok(Store {
            backend: Backend::Cluster(con),
            script,
            deadline,
        });
    }
    let mut info: redis::ConnectionInfo =
        redis::IntoConnectionInfo::into_connection_info(url).map_err(|e| format!("{url}: {e}"))?;
    if let Some(p) = password {
        info.redis.password = Some(p);
    }
    let client = redis::Client::open(info).map_err(|e| format!("{url}: {e}"))?;
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(deadline)
        .set_response_timeout(deadline)
        .set_number_of_retries(1)
        .set_max_delay(200);
    let con = ConnectionManager::new_with_config(client, config)
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    Ok(Store {
        backend: Backend::Redis(con),
        script,
        deadline,
    })
}
