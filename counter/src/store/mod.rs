//! Where the counts live: in this process (`memory`), or in Redis (one
//! server, a Cluster, or the master a set of sentinels names; plain or
//! TLS), where one Lua script decides all of a call's requests that share
//! a slot, atomically.

pub mod memory;
pub mod sentinel;
pub mod url;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;

use ratelimit_config::window::sliding_wait_ms;

use crate::decide::{estimate, over, Check, Counts, Request};
pub use url::redacted;

/// The script (`script.lua`, headed by what each `KEYS[i]` and `ARGV[i]`
/// holds): reads every distinct key of the call once (MGET), decides each
/// request in order on those values as a whole (an admitted one's hits
/// count for the requests after it), then writes each key the admitted
/// requests add to once, their hits summed: `SET key hits PX ttl` on a key
/// that did not exist, else `INCRBY`. A refused request writes nothing.
/// Its numbers come packed in one argument (`Layout::pack`); it returns
/// each key's value as read, then per request admitted (0/1): the caller
/// replays the adds to know the counts each request was decided on.
pub const SCRIPT: &str = include_str!("script.lua");
pub enum Backend {
    Memory(memory::MemoryStore),
    Redis(Lazy<ConnectionManager>),
    Cluster(Lazy<ClusterConnection>),
    Sentinel(Box<sentinel::SentinelStore>),
}

type Opener<C> = Box<
    dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = redis::RedisResult<C>> + Send>>
        + Send
        + Sync,
>;

/// A Redis connection made on first use, and again on each use until one
/// is made: the counter runs (not ready, each call failing with the
/// reason) while Redis is down, or refuses its password, at start.
pub struct Lazy<C> {
    cell: tokio::sync::OnceCell<C>,
    open: Opener<C>,
}

impl<C: Clone> Lazy<C> {
    pub fn new(open: Opener<C>) -> Lazy<C> {
        Lazy {
            cell: tokio::sync::OnceCell::new(),
            open,
        }
    }

    /// The connection (a clone of it), made within `deadline` if need be.
    pub async fn get(&self, deadline: Duration) -> Result<C, StoreError> {
        if let Some(c) = self.cell.get() {
            return Ok(c.clone());
        }
        match tokio::time::timeout(deadline, self.cell.get_or_try_init(|| (self.open)())).await {
            Ok(Ok(c)) => Ok(c.clone()),
            Ok(Err(e)) => Err(StoreError::Redis(e)),
            Err(_) => Err(StoreError::Timeout),
        }
    }
}

pub struct Store {
    pub backend: Backend,
    pub script: redis::Script,
    /// The over-limit cache (Redis stores only: the memory store is as
    /// cheap to ask).
    pub cache: Option<FullCache>,
    /// Every Redis call is bounded by this.
    pub deadline: Duration,
}

#[derive(Debug)]
pub enum StoreError {
    Timeout,
    Redis(redis::RedisError),
    /// The script answered something else than it returns.
    Shape,
    /// The memory store holds its most keys (`--memory-max-keys`).
    Full(usize),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Timeout => f.write_str("Redis did not answer within the deadline"),
            StoreError::Redis(e) => write!(f, "Redis: {}", explain(e)),
            StoreError::Shape => f.write_str("the script's answer has an unexpected shape"),
            StoreError::Full(n) => write!(
                f,
                "the memory store holds its most keys (--memory-max-keys {n}): a call that adds keys is refused until counts expire"
            ),
        }
    }
}

/// Each request's counts and whether it was admitted, in the plan's order,
/// and how many requests the over-limit cache refused.
#[derive(Debug)]
pub struct Decided {
    pub counts: Vec<Vec<Counts>>,
    pub admitted: Vec<bool>,
    pub from_cache: usize,
}

impl Store {
    pub fn memory(deadline: Duration) -> Store {
        Store::memory_bounded(deadline, memory::DEFAULT_MAX_KEYS)
    }

    /// A memory store that holds at most `max_keys` keys.
    pub fn memory_bounded(deadline: Duration, max_keys: usize) -> Store {
        Store {
            backend: Backend::Memory(memory::MemoryStore::new(max_keys)),
            script: redis::Script::new(SCRIPT),
            cache: None,
            deadline,
        }
    }

    pub fn name(&self) -> &'static str {
        match self.backend {
            Backend::Memory(_) => "memory",
            Backend::Redis(_) => "redis",
            Backend::Cluster(_) => "redis-cluster",
            Backend::Sentinel(_) => "redis-sentinel",
        }
    }

    /// The store's own metrics, in Prometheus text (the memory store's
    /// keys and refusals; nothing for Redis).
    pub fn metrics(&self) -> String {
        match &self.backend {
            Backend::Memory(m) => m.metrics(),
            _ => String::new(),
        }
    }

    /// Decides every request of a call at `now_ms`: the over-limit cache
    /// first (Redis stores), the store for the rest.
    pub async fn decide(&self, requests: &[Request], now_ms: u64) -> Result<Decided, StoreError> {
        let Some(cache) = &self.cache else {
            let (counts, admitted) = self.decide_in_store(requests, now_ms).await?;
            return Ok(Decided {
                counts,
                admitted,
                from_cache: 0,
            });
        };
        let refused = cache.refuse(requests, now_ms);
        let from_cache = refused.iter().filter(|r| r.is_some()).count();
        if from_cache == 0 {
            let (counts, admitted) = self.decide_in_store(requests, now_ms).await?;
            cache.learn(requests, &counts, &admitted, now_ms);
            return Ok(Decided {
                counts,
                admitted,
                from_cache,
            });
        }
        let rest: Vec<Request> = requests
            .iter()
            .zip(&refused)
            .filter(|(_, r)| r.is_none())
            .map(|(q, _)| q.clone())
            .collect();
        let (mut rest_counts, mut rest_admitted) = if rest.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            self.decide_in_store(&rest, now_ms).await?
        };
        cache.learn(&rest, &rest_counts, &rest_admitted, now_ms);
        rest_counts.reverse();
        rest_admitted.reverse();
        let mut counts = Vec::with_capacity(requests.len());
        let mut admitted = Vec::with_capacity(requests.len());
        for r in refused {
            match r {
                Some(c) => {
                    counts.push(c);
                    admitted.push(false);
                }
                None => {
                    counts.push(rest_counts.pop().unwrap_or_default());
                    admitted.push(rest_admitted.pop().unwrap_or(false));
                }
            }
        }
        Ok(Decided {
            counts,
            admitted,
            from_cache,
        })
    }

    /// Decides every request in the store itself.
    async fn decide_in_store(
        &self,
        requests: &[Request],
        now_ms: u64,
    ) -> Result<(Vec<Vec<Counts>>, Vec<bool>), StoreError> {
        match &self.backend {
            Backend::Memory(m) => m.decide(requests, now_ms),
            Backend::Redis(c) => {
                let all: Vec<usize> = (0..requests.len()).collect();
                let mut c = c.get(self.deadline).await?;
                let got = self.run(&mut c, requests, &all).await?;
                Ok(got.into_iter().unzip())
            }
            Backend::Sentinel(s) => {
                let all: Vec<usize> = (0..requests.len()).collect();
                let got = async {
                    let mut c = s.get(self.deadline).await?;
                    self.run(&mut c, requests, &all).await
                }
                .await;
                if let Err(e) = &got {
                    s.failed(e);
                }
                Ok(got?.into_iter().unzip())
            }
            Backend::Cluster(c) => {
                let c = c.get(self.deadline).await?;
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
        let layout = Layout::of(&chosen);
        // EVALSHA with the keys and one packed argument (see SCRIPT).
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.script.get_hash()).arg(layout.keys.len());
        for k in &layout.keys {
            cmd.arg(*k);
        }
        cmd.arg(layout.pack(&chosen));
        let call = async {
            match cmd.query_async::<Vec<i64>>(con).await {
                Err(e) if e.kind() == redis::ErrorKind::NoScriptError => {
                    // Redis restarted or flushed its scripts: loaded again.
                    redis::cmd("SCRIPT")
                        .arg("LOAD")
                        .arg(SCRIPT)
                        .exec_async(con)
                        .await?;
                    cmd.query_async::<Vec<i64>>(con).await
                }
                other => other,
            }
        };
        let answer: Vec<i64> = tokio::time::timeout(self.deadline, call)
            .await
            .map_err(|_| StoreError::Timeout)?
            .map_err(StoreError::Redis)?;
        layout.replay(&answer).ok_or(StoreError::Shape)
    }

    /// Whether the store answers (PING within the deadline).
    pub async fn answers(&self) -> bool {
        self.ping().await.is_ok()
    }

    /// A PING within the deadline, or why not.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let ping = redis::cmd("PING");
        let answer = match &self.backend {
            Backend::Memory(_) => return Ok(()),
            Backend::Redis(c) => {
                let mut c = c.get(self.deadline).await?;
                tokio::time::timeout(self.deadline, ping.query_async::<String>(&mut c)).await
            }
            Backend::Cluster(c) => {
                let mut c = c.get(self.deadline).await?;
                tokio::time::timeout(self.deadline, ping.query_async::<String>(&mut c)).await
            }
            Backend::Sentinel(s) => {
                let mut c = s.get(self.deadline).await?;
                let answer = ping_result(
                    tokio::time::timeout(self.deadline, ping.query_async::<String>(&mut c)).await,
                );
                if let Err(e) = &answer {
                    s.failed(e);
                }
                return answer;
            }
        };
        ping_result(answer)
    }

    /// Drops expired counters of the memory store.
    pub fn sweep(&self, now_ms: u64) {
        if let Some(c) = &self.cache {
            c.sweep(now_ms);
        }
        if let Backend::Memory(m) = &self.backend {
            m.sweep(now_ms);
        }
    }
}

/// The most keys the over-limit cache remembers.
pub const FULL_CACHE_ENTRIES: usize = 65_536;

/// The over-limit cache: keys this process saw full (not even one more hit
/// fits), with the counts it saw, until the window ends (a sliding
/// window's: until its estimate admits one more). A count never falls
/// inside its window, so a request that one of these counts refuses is
/// refused without asking the store: the same decision, nothing counted.
/// Bounded: past `capacity`, expired entries go, then arbitrary ones.
#[derive(Debug)]
pub struct FullCache {
    entries: Mutex<HashMap<String, (Counts, u64)>>,
    capacity: usize,
}

impl FullCache {
    pub fn new(capacity: usize) -> FullCache {
        FullCache {
            entries: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Counts, u64)>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Per request, the counts it is refused on when the cache refuses it
    /// (a check of a key not remembered: 0), else None.
    pub fn refuse(&self, requests: &[Request], now_ms: u64) -> Vec<Option<Vec<Counts>>> {
        let m = self.lock();
        if m.is_empty() {
            return vec![None; requests.len()];
        }
        let seen = |key: &str| match m.get(key) {
            Some(&(n, until)) if until > now_ms => Some(n),
            _ => None,
        };
        requests
            .iter()
            .map(|r| {
                // A push is counted whatever the counts: never refused.
                let refused = !r.push
                    && r.checks
                        .iter()
                        .any(|c| seen(&c.key).is_some_and(|n| over(c, n)));
                refused.then(|| {
                    r.checks
                        .iter()
                        .map(|c| seen(&c.key).unwrap_or_default())
                        .collect()
                })
            })
            .collect()
    }

    /// Remembers the keys the store's answer shows full: each request's
    /// counts, with its hits when admitted. A request with a full key has
    /// its other keys' counts remembered too (what the cache's refusals
    /// report for them).
    pub fn learn(
        &self,
        requests: &[Request],
        counts: &[Vec<Counts>],
        admitted: &[bool],
        now_ms: u64,
    ) {
        let mut m: Option<std::sync::MutexGuard<'_, _>> = None;
        for ((r, counts), &ok) in requests.iter().zip(counts).zip(admitted) {
            let after = |c: &Check, n: Counts| Counts {
                current: n.current.saturating_add(if ok { c.key_hits } else { 0 }),
                previous: n.previous,
            };
            let full = r
                .checks
                .iter()
                .zip(counts)
                .any(|(c, &n)| estimate(c, after(c, n)) >= c.limit);
            if !full {
                continue;
            }
            let m = m.get_or_insert_with(|| self.lock());
            for (c, &n) in r.checks.iter().zip(counts) {
                let n = after(c, n);
                let until = if c.sliding {
                    let wait = sliding_wait_ms(
                        c.limit, 1, n.previous, n.current, c.window, c.next_end, now_ms,
                    )
                    .unwrap_or(c.next_end.saturating_sub(now_ms));
                    now_ms.saturating_add(wait)
                } else {
                    c.window.1
                };
                if until <= now_ms {
                    continue;
                }
                if m.len() >= self.capacity && !m.contains_key(&c.key) {
                    m.retain(|_, (_, u)| *u > now_ms);
                    if m.len() >= self.capacity {
                        let drop: Vec<String> =
                            m.keys().take(self.capacity / 8 + 1).cloned().collect();
                        for k in drop {
                            m.remove(&k);
                        }
                    }
                }
                let e = m.entry(c.key.clone()).or_insert((n, until));
                e.0.current = e.0.current.max(n.current);
                e.0.previous = e.0.previous.max(n.previous);
                e.1 = e.1.max(until);
            }
        }
    }

    /// Drops the entries that have expired.
    pub fn sweep(&self, now_ms: u64) {
        self.lock().retain(|_, (_, u)| *u > now_ms);
    }

    /// How many keys it remembers.
    #[cfg(test)]
    pub fn remembered(&self) -> usize {
        self.lock().len()
    }
}

/// A script call's arguments: the distinct keys of the chosen requests,
/// and per request its checks' keys (current, previous) and the keys it
/// adds to, as indexes into `keys`.
struct Layout<'a> {
    keys: Vec<&'a str>,
    ttl_ms: Vec<u64>,
    #[allow(clippy::type_complexity)]
    requests: Vec<(Vec<(usize, Option<usize>)>, Vec<(usize, u64)>)>,
}

impl<'a> Layout<'a> {
    fn of(chosen: &[&'a Request]) -> Layout<'a> {
        let mut index: HashMap<&'a str, usize> = HashMap::new();
        let mut keys: Vec<&'a str> = Vec::new();
        let mut ttl_ms: Vec<u64> = Vec::new();
        let mut at = |k: &'a str, ttl: u64, keys: &mut Vec<&'a str>, ttl_ms: &mut Vec<u64>| {
            let i = *index.entry(k).or_insert_with(|| {
                keys.push(k);
                ttl_ms.push(1);
                keys.len() - 1
            });
            if let Some(t) = ttl_ms.get_mut(i) {
                *t = (*t).max(ttl);
            }
            i
        };
        let mut requests = Vec::with_capacity(chosen.len());
        // Per key, the last request (numbered from 1) that adds to it.
        let mut added_by: Vec<usize> = Vec::new();
        for (q, r) in chosen.iter().enumerate() {
            let mut checks = Vec::with_capacity(r.checks.len());
            let mut adds: Vec<(usize, u64)> = Vec::new();
            for c in &r.checks {
                let k = at(&c.key, c.ttl_ms, &mut keys, &mut ttl_ms);
                let pk = c
                    .prev_key
                    .as_deref()
                    .map(|p| at(p, 1, &mut keys, &mut ttl_ms));
                checks.push((k, pk));
                // key_hits: the request's hits on that key, added once.
                if added_by.len() < keys.len() {
                    added_by.resize(keys.len(), 0);
                }
                if c.key_hits > 0 {
                    if let Some(a) = added_by.get_mut(k).filter(|a| **a != q + 1) {
                        *a = q + 1;
                        adds.push((k, c.key_hits));
                    }
                }
            }
            requests.push((checks, adds));
        }
        Layout {
            keys,
            ttl_ms,
            requests,
        }
    }

    /// The script's numbers (see SCRIPT), packed as little-endian doubles.
    fn pack(&self, chosen: &[&Request]) -> Vec<u8> {
        let per_request: usize = self
            .requests
            .iter()
            .map(|(checks, adds)| 2 + 5 * checks.len() + 2 * adds.len())
            .sum();
        let mut out = Vec::with_capacity(8 * (2 + self.ttl_ms.len() + per_request));
        let mut put = |n: u64| out.extend_from_slice(&(n as f64).to_le_bytes());
        put(self.keys.len() as u64);
        put(chosen.len() as u64);
        for &t in &self.ttl_ms {
            put(t);
        }
        for (r, (checks, adds)) in chosen.iter().zip(&self.requests) {
            // A push goes without checks: the script admits it and adds
            // its hits; its counts are replayed from the keys read.
            let checks: &[_] = if r.push { &[] } else { checks };
            put(checks.len() as u64);
            put(adds.len() as u64);
            for (c, &(k, pk)) in r.checks.iter().zip(checks) {
                put(c.limit);
                put(c.key_hits);
                put(k as u64 + 1);
                put(pk.map_or(0, |p| p as u64 + 1));
                put(c.weight_ppm);
            }
            for &(k, hits) in adds {
                put(k as u64 + 1);
                put(hits);
            }
        }
        out
    }

    /// Each request's counts as the script decided it on, from the keys'
    /// values as read and which requests were admitted: the adds of the
    /// admitted ones replayed in order.
    fn replay(&self, answer: &[i64]) -> Option<Vec<(Vec<Counts>, bool)>> {
        let nk = self.keys.len();
        if answer.len() != nk + self.requests.len() {
            return None;
        }
        let mut values: Vec<u64> = answer
            .get(..nk)?
            .iter()
            .map(|&n| u64::try_from(n).ok())
            .collect::<Option<_>>()?;
        let mut out = Vec::with_capacity(self.requests.len());
        for ((checks, adds), &ok) in self.requests.iter().zip(answer.get(nk..)?) {
            let counts = checks
                .iter()
                .map(|&(k, pk)| {
                    Some(Counts {
                        current: *values.get(k)?,
                        previous: match pk {
                            Some(p) => *values.get(p)?,
                            None => 0,
                        },
                    })
                })
                .collect::<Option<Vec<_>>>()?;
            let admitted = match ok {
                1 => true,
                0 => false,
                _ => return None,
            };
            if admitted {
                for &(k, hits) in adds {
                    let v = values.get_mut(k)?;
                    *v = v.saturating_add(hits);
                }
            }
            out.push((counts, admitted));
        }
        Some(out)
    }
}

/// A PING's answer within the deadline, or why not.
fn ping_result(
    answer: Result<redis::RedisResult<String>, tokio::time::error::Elapsed>,
) -> Result<(), StoreError> {
    match answer {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(StoreError::Redis(e)),
        Err(_) => Err(StoreError::Timeout),
    }
}

/// A Redis error in words an operator acts on: a certificate refused says
/// so. Never holds a password (Redis's own answers do not repeat it).
fn explain(e: &redis::RedisError) -> String {
    let text = e.to_string();
    if text.contains("UnknownIssuer") || text.contains("BadSignature") {
        format!("TLS: the Redis server's certificate is not signed by a CA this counter trusts (--redis-ca, else the system's CAs): {text}")
    } else if text.contains("NotValidForName") {
        format!("TLS: the Redis server's certificate does not name the host of --store: {text}")
    } else if text.contains("invalid peer certificate") {
        format!("TLS: the Redis server's certificate was refused: {text}")
    } else if text.contains("CertificateRequired") || text.contains("certificate required") {
        format!("TLS: the Redis server asks for a client certificate (--redis-cert, --redis-key): {text}")
    } else {
        text
    }
}

/// How the counter reaches its store: `--store` and what goes with it.
/// Every flag is also read from the environment.
#[derive(clap::Args, Clone)]
pub struct StoreOptions {
    /// memory, redis://HOST:PORT[/DB], rediss://HOST:PORT[/DB] (TLS),
    /// redis-cluster://HOST:PORT[,HOST:PORT...], rediss-cluster://... (TLS),
    /// redis-sentinel://HOST:PORT[,HOST:PORT...]/MASTER_NAME, rediss-sentinel://... (TLS).
    /// A user and password may be given as USER:PASSWORD@ before the hosts;
    /// REDIS_AUTH is better (a command line is seen by every user of the machine).
    #[arg(
        long,
        env = "TRL_COUNTER_STORE",
        default_value = "memory",
        hide_env_values = true
    )]
    pub store: String,
    /// Redis's password, or USER:PASSWORD for an ACL user. Give it in the
    /// environment, not on the command line.
    #[arg(long, env = "REDIS_AUTH", hide_env_values = true)]
    pub redis_auth: Option<String>,
    /// A file holding REDIS_AUTH (a mounted Secret), read at start.
    #[arg(long, env = "TRL_COUNTER_REDIS_AUTH_FILE")]
    pub redis_auth_file: Option<PathBuf>,
    /// The sentinels' password, or USER:PASSWORD (redis-sentinel:// only).
    /// Give it in the environment, not on the command line.
    #[arg(long, env = "REDIS_SENTINEL_AUTH", hide_env_values = true)]
    pub redis_sentinel_auth: Option<String>,
    /// The CA (PEM) that signed the Redis servers' certificates (rediss*:// only;
    /// default: the system's CAs).
    #[arg(long, env = "TRL_COUNTER_REDIS_CA")]
    pub redis_ca: Option<PathBuf>,
    /// A client certificate (PEM) for mutual TLS to Redis; with --redis-key.
    #[arg(long, env = "TRL_COUNTER_REDIS_CERT")]
    pub redis_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, env = "TRL_COUNTER_REDIS_KEY")]
    pub redis_key: Option<PathBuf>,
    /// Accept any certificate from Redis, its name and signer unchecked.
    /// Anyone on the path can then read and change the counts: for tests only.
    #[arg(long, env = "TRL_COUNTER_REDIS_INSECURE_SKIP_VERIFY")]
    pub redis_insecure_skip_verify: bool,
    /// The most keys the memory store holds; a call that would add more
    /// fails (counted in trl_counter_memory_full_total) until counts expire.
    #[arg(long, env = "TRL_COUNTER_MEMORY_MAX_KEYS", default_value_t = memory::DEFAULT_MAX_KEYS)]
    pub memory_max_keys: usize,
}

/// Never prints a secret.
impl std::fmt::Debug for StoreOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hidden = |a: &Option<String>| a.as_ref().map(|_| "***");
        f.debug_struct("StoreOptions")
            .field("store", &self.shown())
            .field("redis_auth", &hidden(&self.redis_auth))
            .field("redis_auth_file", &self.redis_auth_file)
            .field("redis_sentinel_auth", &hidden(&self.redis_sentinel_auth))
            .field("redis_ca", &self.redis_ca)
            .field("redis_cert", &self.redis_cert)
            .field("redis_key", &self.redis_key)
            .field(
                "redis_insecure_skip_verify",
                &self.redis_insecure_skip_verify,
            )
            .field("memory_max_keys", &self.memory_max_keys)
            .finish()
    }
}

impl StoreOptions {
    /// The options of `--store URL` alone.
    pub fn of(store: &str) -> StoreOptions {
        StoreOptions {
            store: store.to_string(),
            redis_auth: None,
            redis_auth_file: None,
            redis_sentinel_auth: None,
            redis_ca: None,
            redis_cert: None,
            redis_key: None,
            redis_insecure_skip_verify: false,
            memory_max_keys: memory::DEFAULT_MAX_KEYS,
        }
    }

    /// `--store` redacted: the only way it is shown.
    pub fn shown(&self) -> String {
        redacted(&self.store)
    }

    /// REDIS_AUTH, from the environment or its file.
    fn auth(&self) -> Result<Option<(Option<String>, String)>, String> {
        let auth = match (&self.redis_auth, &self.redis_auth_file) {
            (Some(a), _) if !a.is_empty() => Some(a.clone()),
            (_, Some(f)) => Some(
                std::fs::read_to_string(f)
                    .map_err(|e| format!("--redis-auth-file {}: {e}", f.display()))?
                    .trim_end_matches(['\n', '\r'])
                    .to_string(),
            ),
            _ => None,
        };
        Ok(auth.filter(|a| !a.is_empty()).map(|a| url::split_auth(&a)))
    }

    /// The TLS files read, for a rediss*:// store; an error for TLS files
    /// given to a plain one.
    fn certificates(&self, tls: bool) -> Result<Option<redis::TlsCertificates>, String> {
        let given = self.redis_ca.is_some()
            || self.redis_cert.is_some()
            || self.redis_key.is_some()
            || self.redis_insecure_skip_verify;
        if !tls {
            return if given {
                Err(format!(
                    "--redis-ca, --redis-cert, --redis-key and --redis-insecure-skip-verify need a TLS store (rediss://, rediss-cluster://, rediss-sentinel://), not {}",
                    self.shown()
                ))
            } else {
                Ok(None)
            };
        }
        let read = |flag: &str, p: &PathBuf| {
            std::fs::read(p).map_err(|e| format!("{flag} {}: {e}", p.display()))
        };
        let client_tls = match (&self.redis_cert, &self.redis_key) {
            (Some(c), Some(k)) => Some(redis::ClientTlsConfig {
                client_cert: read("--redis-cert", c)?,
                client_key: read("--redis-key", k)?,
            }),
            (None, None) => None,
            _ => return Err("--redis-cert and --redis-key go together".into()),
        };
        let root_cert = self
            .redis_ca
            .as_ref()
            .map(|p| read("--redis-ca", p))
            .transpose()?;
        Ok(Some(redis::TlsCertificates {
            client_tls,
            root_cert,
        }))
    }
}

/// Connects to the store `opts.store` names. Fails only on options it
/// cannot use (a URL it cannot read, a TLS file it cannot read): the
/// connection itself is made on first use (see [`Lazy`]).
pub async fn connect(opts: &StoreOptions, deadline: Duration) -> Result<Store, String> {
    let target = url::parse(&opts.store)?;
    if target.kind == url::Kind::Memory {
        return Ok(Store::memory_bounded(deadline, opts.memory_max_keys));
    }
    let shown = opts.shown();
    let certs = opts.certificates(target.tls)?;
    if target.tls {
        // ring, not aws-lc-rs (which needs cmake to build; ring's lack of
        // post-quantum key exchange is what rustls deprecates it for). An
        // error means a provider is installed already.
        #[allow(deprecated)]
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    let insecure = opts.redis_insecure_skip_verify;
    if insecure {
        eprintln!(
            "ratelimit-counter: WARNING: --redis-insecure-skip-verify: the Redis server's certificate is NOT checked; anyone on the path to {shown} can read and change every count"
        );
    }
    let (mut username, mut password) = (target.username.clone(), target.password.clone());
    if let Some((user, pass)) = opts.auth()? {
        if user.is_some() {
            username = user;
        }
        password = Some(pass);
    }
    let addr = |host: &str, port: u16| {
        if target.tls {
            redis::ConnectionAddr::TcpTls {
                host: host.to_string(),
                port,
                insecure,
                tls_params: None,
            }
        } else {
            redis::ConnectionAddr::Tcp(host.to_string(), port)
        }
    };
    let tls_mode = target.tls.then_some(if insecure {
        redis::TlsMode::Insecure
    } else {
        redis::TlsMode::Secure
    });
    let script = redis::Script::new(SCRIPT);
    let cache = Some(FullCache::new(FULL_CACHE_ENTRIES));
    let backend = match &target.kind {
        url::Kind::Memory => return Ok(Store::memory_bounded(deadline, opts.memory_max_keys)),
        url::Kind::Cluster => {
            let nodes: Vec<redis::ConnectionInfo> = target
                .nodes
                .iter()
                .map(|(h, p)| redis::ConnectionInfo {
                    addr: addr(h, *p),
                    redis: redis::RedisConnectionInfo::default(),
                })
                .collect();
            let mut b = redis::cluster::ClusterClientBuilder::new(nodes)
                .connection_timeout(deadline)
                .response_timeout(deadline);
            if let Some(p) = password {
                b = b.password(p);
            }
            if let Some(u) = username {
                b = b.username(u);
            }
            if let Some(mode) = tls_mode {
                b = b.tls(mode);
            }
            if let Some(c) = certs {
                b = b.certs(c);
            }
            let client = b.build().map_err(|e| format!("{shown}: {}", explain(&e)))?;
            Backend::Cluster(Lazy::new(Box::new(move || {
                let client = client.clone();
                Box::pin(async move { client.get_async_connection().await })
            })))
        }
        url::Kind::Sentinel { master } => {
            let sentinels = target.nodes.iter().map(|(h, p)| addr(h, *p));
            let mut b = redis::sentinel::SentinelClientBuilder::new(
                sentinels,
                master.clone(),
                redis::sentinel::SentinelServerType::Master,
            )
            .map_err(|e| format!("{shown}: {}", explain(&e)))?
            .set_client_to_redis_db(target.db);
            if let Some(p) = password {
                b = b.set_client_to_redis_password(p);
            }
            if let Some(u) = username {
                b = b.set_client_to_redis_username(u);
            }
            let sentinel_auth = opts
                .redis_sentinel_auth
                .as_deref()
                .filter(|a| !a.is_empty())
                .map(url::split_auth);
            if let Some((user, pass)) = sentinel_auth {
                b = b.set_client_to_sentinel_password(pass);
                if let Some(u) = user {
                    b = b.set_client_to_sentinel_username(u);
                }
            }
            if let Some(mode) = tls_mode {
                b = b
                    .set_client_to_redis_tls_mode(mode)
                    .set_client_to_sentinel_tls_mode(mode);
            }
            if let Some(c) = certs {
                b = b
                    .set_client_to_redis_certificates(c.clone())
                    .set_client_to_sentinel_certificates(c);
            }
            let client = b.build().map_err(|e| format!("{shown}: {}", explain(&e)))?;
            Backend::Sentinel(Box::new(sentinel::SentinelStore::new(client, deadline)))
        }
        url::Kind::Single => {
            let (host, port) = target
                .nodes
                .first()
                .ok_or_else(|| format!("{shown}: no HOST:PORT"))?;
            let info = redis::ConnectionInfo {
                addr: addr(host, *port),
                redis: redis::RedisConnectionInfo {
                    db: target.db,
                    username,
                    password,
                    ..Default::default()
                },
            };
            let client = match certs {
                Some(c) => redis::Client::build_with_tls(info, c),
                None => redis::Client::open(info),
            }
            .map_err(|e| format!("{shown}: {}", explain(&e)))?;
            Backend::Redis(single(client, deadline))
        }
    };
    Ok(Store {
        backend,
        script,
        cache,
        deadline,
    })
}

/// One Redis server's connection, made on first use.
fn single(client: redis::Client, deadline: Duration) -> Lazy<ConnectionManager> {
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
#[cfg(test)]
mod tests {
    use super::*;

    fn check(key: &str, prev: Option<&str>, limit: u64, hits: u64) -> Check {
        Check {
            index: 0,
            unit: ratelimit_config::Unit::Minute,
            limit,
            hits,
            key_hits: hits,
            sliding: prev.is_some(),
            shadow: false,
            group: 0,
            name: "g".into(),
            tag: "{1:d:a}".into(),
            key: key.into(),
            prev_key: prev.map(Into::into),
            window: (0, 60_000),
            next_end: 120_000,
            weight_ppm: 500_000,
            ttl_ms: 60_000,
        }
    }

    #[test]
    fn a_call_sends_each_key_once_and_adds_a_request_s_hits_to_a_key_once() {
        let mut twice = Request {
            checks: vec![check("k1", None, 5, 1), check("k1", None, 9, 2)],
            ..Request::default()
        };
        for c in &mut twice.checks {
            c.key_hits = 3;
        }
        let other = Request {
            checks: vec![check("k1", None, 5, 1), check("k2", Some("k0"), 5, 1)],
            ..Request::default()
        };
        let chosen = [&twice, &other];
        let l = Layout::of(&chosen);
        assert_eq!(l.keys, ["k1", "k2", "k0"]);
        assert_eq!(l.ttl_ms, [60_000, 60_000, 1]);
        assert_eq!(l.requests[0].1, [(0, 3)]);
        assert_eq!(l.requests[1].0, [(0, None), (1, Some(2))]);
        assert_eq!(l.requests[1].1, [(0, 1), (1, 1)]);
        // Read 1, 0, 4; the first request admitted: the second is decided on
        // k1 = 4.
        let got = l.replay(&[1, 0, 4, 1, 0]).unwrap();
        assert_eq!(
            got[0].0[0],
            Counts {
                current: 1,
                previous: 0
            }
        );
        assert_eq!(
            got[1].0[0],
            Counts {
                current: 4,
                previous: 0
            }
        );
        assert_eq!(
            got[1].0[1],
            Counts {
                current: 0,
                previous: 4
            }
        );
        assert_eq!((got[0].1, got[1].1), (true, false));
        assert!(l.replay(&[1, 0, 4, 1]).is_none());
        assert!(l.replay(&[1, 0, 4, 1, 2]).is_none());
        // The numbers the script reads, in its order.
        let packed: Vec<f64> = l
            .pack(&chosen)
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
            .collect();
        #[rustfmt::skip]
        let want = [
            3.0, 2.0, 60_000.0, 60_000.0, 1.0,  // keys, requests, ttls
            2.0, 1.0,                            // twice: 2 checks, 1 add
            5.0, 3.0, 1.0, 0.0, 500_000.0,
            9.0, 3.0, 1.0, 0.0, 500_000.0,
            1.0, 3.0,
            2.0, 2.0,                            // other: 2 checks, 2 adds
            5.0, 1.0, 1.0, 0.0, 500_000.0,
            5.0, 1.0, 2.0, 3.0, 500_000.0,
            1.0, 1.0, 2.0, 1.0,
        ];
        assert_eq!(packed, want);
    }

    #[tokio::test]
    async fn a_connection_not_made_says_why_and_is_made_on_a_later_use() {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        let tries = std::sync::Arc::new(AtomicUsize::new(0));
        let t = tries.clone();
        let lazy: Lazy<u32> = Lazy::new(Box::new(move || {
            let n = t.fetch_add(1, SeqCst);
            Box::pin(async move {
                if n == 0 {
                    Err(redis::RedisError::from((
                        redis::ErrorKind::AuthenticationFailed,
                        "Password authentication failed",
                    )))
                } else {
                    Ok(7)
                }
            })
        }));
        let second = Duration::from_secs(1);
        let e = lazy.get(second).await.unwrap_err();
        assert!(
            e.to_string().contains("Password authentication failed"),
            "{e}"
        );
        assert_eq!(lazy.get(second).await.unwrap(), 7);
        assert_eq!(lazy.get(second).await.unwrap(), 7);
        assert_eq!(tries.load(SeqCst), 2);
        // One that never answers fails within the deadline.
        let never: Lazy<u32> = Lazy::new(Box::new(|| Box::pin(std::future::pending())));
        let e = never.get(Duration::from_millis(10)).await.unwrap_err();
        assert!(matches!(e, StoreError::Timeout));
    }

    #[test]
    fn the_over_limit_cache_stays_within_its_bound_under_a_flood_of_keys() {
        let cache = FullCache::new(100);
        for i in 0..10_000 {
            let r = Request {
                checks: vec![check(&format!("k{i}"), None, 1, 1)],
                ..Request::default()
            };
            cache.learn(
                std::slice::from_ref(&r),
                &[vec![Counts::default()]],
                &[true],
                1_000,
            );
            assert!(cache.remembered() <= 100);
        }
        // A full key refuses until its window ends, then no longer.
        let r = Request {
            checks: vec![check("k9999", None, 1, 1)],
            ..Request::default()
        };
        assert!(cache.refuse(std::slice::from_ref(&r), 59_999)[0].is_some());
        assert!(cache.refuse(std::slice::from_ref(&r), 60_000)[0].is_none());
        cache.sweep(60_000);
        assert_eq!(cache.remembered(), 0);
    }
}
