//! Where the counts live, behind one trait ([`Storage`]): in this
//! process (`memory`), or in Redis, where one Lua script (`script.lua`)
//! decides all of a call's requests that share a slot, atomically: one
//! server (`single`), a Cluster (`cluster`), or the master a set of
//! sentinels names (`sentinel`); plain or TLS. [`Store`] is what the
//! service holds: a store, with the over-limit cache in front of a Redis
//! one (`over_limit_cache`). [`connect`] picks the store a `--store` URL
//! names.

pub mod cluster;
pub mod fleet;
pub mod memory;
pub mod over_limit_cache;
pub mod script;
pub mod sentinel;
pub mod single;
#[cfg(test)]
pub mod testing;
pub mod url;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::decide::{Decision, Request};
pub use over_limit_cache::OverLimitCache;
pub use script::SCRIPT;
pub use url::redacted;

/// A registry's metrics in the Prometheus text format (0.0.4, no `# EOF`,
/// so that pages concatenate): the counter's `/metrics` page and each
/// store's part of it.
pub fn metrics_text(registry: &prometheus_client::registry::Registry) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, registry);
    out
}

/// A store's answer, later: what its methods return.
pub type Pending<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A call's decisions, later: what [`Storage::decide`] returns.
pub type Deciding<'a> = Pending<'a, Result<Vec<Decision>, StoreError>>;

/// One place the counts live. Every store decides as
/// [`crate::decide::admits`] does (the memory store calls it; the Redis
/// stores run `script.lua`, which the tests of `decide` prove to decide
/// the same on every store).
pub trait Storage: Send + Sync {
    /// The store's kind, as the metrics label it.
    fn name(&self) -> &'static str;

    /// Decides every request of a call at `now_ms`, in order (an admitted
    /// request's hits count for the requests after it), adding the hits
    /// of the admitted ones: one decision per request.
    fn decide<'a>(&'a self, requests: &'a [Request], now_ms: u64) -> Deciding<'a>;

    /// Whether the store answers (a PING within the deadline), or why not.
    fn ping(&self) -> Pending<'_, Result<(), StoreError>>;

    /// Drops what has expired (the memory store's counts).
    fn sweep(&self, _now_ms: u64) {}

    /// Writes what this replica heard of the fleet and reads each domain's
    /// size (`self::fleet::sync_redis`); None for a store the replicas do
    /// not share (memory: the replica's own count is the fleet's).
    fn fleet<'a>(
        &'a self,
        _syncs: &'a [self::fleet::Sync],
    ) -> Pending<'a, Result<Option<Vec<u32>>, StoreError>> {
        Box::pin(std::future::ready(Ok(None)))
    }

    /// The store's own metrics, in the Prometheus text format
    /// ([`metrics_text`] of its registry), appended to the counter's.
    fn metrics(&self) -> String {
        String::new()
    }

    /// A counter's value at `now_ms` (0 when there is none): the tests
    /// compare stores by it.
    #[cfg(test)]
    fn value<'a>(&'a self, key: &'a str, now_ms: u64) -> Pending<'a, Result<u64, StoreError>>;
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

impl<C: redis::aio::ConnectionLike + Clone + Send> Lazy<C> {
    /// A PING within `deadline` (the connection made if need be), or why not.
    pub async fn ping(&self, deadline: Duration) -> Result<(), StoreError> {
        let mut c = self.get(deadline).await?;
        script::ping(&mut c, deadline).await
    }

    /// A key's value (0 when missing), for the tests that compare stores.
    #[cfg(test)]
    pub async fn value(&self, key: &str, deadline: Duration) -> Result<u64, StoreError> {
        let mut c = self.get(deadline).await?;
        script::value(&mut c, key).await
    }
}

/// What the service holds: a store, and in front of a Redis store the
/// over-limit cache.
pub struct Store {
    storage: Box<dyn Storage>,
    cache: Option<OverLimitCache>,
    health: Health,
}

/// Whether the store's connection is known down: set when a failed call
/// is followed by a failed PING, cleared by the first PING that answers.
/// While it is set, calls fail at once ([`StoreError::Down`]) instead of
/// each waiting out the store's deadline; [`Store::watch`] retries.
#[derive(Default)]
struct Health {
    down: std::sync::atomic::AtomicBool,
    why: std::sync::Mutex<String>,
    /// Wakes the watch after a call failed as if the connection were down.
    suspect: tokio::sync::Notify,
}

#[derive(Debug)]
pub enum StoreError {
    Timeout,
    Redis(redis::RedisError),
    /// The script answered something else than it returns.
    Shape,
    /// The memory store holds its most keys (`--memory-max-keys`).
    Full(usize),
    /// The connection is known down (the last PING's failure); nothing
    /// was asked of the store.
    Down(String),
    /// Redis ran the script past the call's deadline: it did nothing.
    TooLate,
    /// Every request of the call has a key that holds something else
    /// than a count: none was decided, nothing counted.
    BadValue,
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
            StoreError::Down(why) => write!(
                f,
                "the store's connection is down ({why}); retried in the background"
            ),
            StoreError::TooLate => f.write_str(
                "Redis ran the script past the call's deadline (it was slow, or its clock is ahead of the counter's): nothing counted",
            ),
            StoreError::BadValue => f.write_str(
                "a Redis key of this call holds something else than a count (an integer): nothing counted",
            ),
        }
    }
}

/// A call decided: one decision per request, in the plan's order, and how
/// many of them the over-limit cache refused.
#[derive(Debug)]
pub struct Decided {
    pub requests: Vec<Decision>,
    pub from_cache: usize,
}

impl Store {
    /// `storage`, with `cache` in front of it.
    pub fn new(storage: Box<dyn Storage>, cache: Option<OverLimitCache>) -> Store {
        Store {
            storage,
            cache,
            health: Health::default(),
        }
    }

    /// A memory store that holds at most `max_keys` keys.
    pub fn memory(max_keys: usize) -> Store {
        Store::new(Box::new(memory::MemoryStore::new(max_keys)), None)
    }

    pub fn name(&self) -> &'static str {
        self.storage.name()
    }

    /// The store's own metrics, in Prometheus text (the memory store's
    /// keys and refusals; nothing for Redis).
    pub fn metrics(&self) -> String {
        self.storage.metrics()
    }

    /// Decides every request of a call at `now_ms`: the over-limit cache
    /// first (Redis stores), the store for the rest.
    pub async fn decide(&self, requests: &[Request], now_ms: u64) -> Result<Decided, StoreError> {
        if self.health.down.load(Ordering::Relaxed) {
            return Err(StoreError::Down(self.down_reason()));
        }
        let decided = self.decide_now(requests, now_ms).await;
        if let Err(e) = &decided {
            if connection_failed(e) {
                self.health.suspect.notify_one();
            }
        }
        decided
    }

    /// The fleet's sizes, through the store (`Storage::fleet`); nothing is
    /// asked while its connection is known down.
    pub async fn fleet(&self, syncs: &[self::fleet::Sync]) -> Result<Option<Vec<u32>>, StoreError> {
        if self.health.down.load(Ordering::Relaxed) {
            return Err(StoreError::Down(self.down_reason()));
        }
        self.storage.fleet(syncs).await
    }

    /// Whether the store's connection is known down.
    pub fn down(&self) -> bool {
        self.health.down.load(Ordering::Relaxed)
    }

    fn down_reason(&self) -> String {
        self.health
            .why
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Follows the connection's health for as long as it runs: after a
    /// call failed as a connection does, PINGs; while they fail the store
    /// is down (calls fail at once), and PINGs again every `retry` until
    /// one answers. `on_change` hears each change (true: down).
    pub async fn watch(&self, retry: Duration, on_change: impl Fn(bool)) {
        loop {
            self.health.suspect.notified().await;
            loop {
                match self.storage.ping().await {
                    Ok(()) => {
                        if self.health.down.swap(false, Ordering::Relaxed) {
                            eprintln!("ratelimit-counter: the store answers again");
                            on_change(false);
                        }
                        break;
                    }
                    Err(e) => {
                        *self
                            .health
                            .why
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner) = e.to_string();
                        if !self.health.down.swap(true, Ordering::Relaxed) {
                            eprintln!(
                                "ratelimit-counter: the store's connection is down ({e}): calls fail at once until a PING answers"
                            );
                            on_change(true);
                        }
                        tokio::time::sleep(retry).await;
                    }
                }
            }
        }
    }

    async fn decide_now(&self, requests: &[Request], now_ms: u64) -> Result<Decided, StoreError> {
        let Some(cache) = &self.cache else {
            return Ok(Decided {
                requests: self.storage.decide(requests, now_ms).await?,
                from_cache: 0,
            });
        };
        let mut refused = cache.refuse(requests, now_ms);
        let from_cache = refused.iter().filter(|r| r.is_some()).count();
        if from_cache == 0 {
            let decided = self.storage.decide(requests, now_ms).await?;
            cache.learn(requests.iter().zip(&decided), now_ms);
            return Ok(Decided {
                requests: decided,
                from_cache,
            });
        }
        // The store decides the rest, and its decisions fill the places
        // the cache left empty, in order.
        let rest: Vec<Request> = requests
            .iter()
            .zip(&refused)
            .filter(|(_, r)| r.is_none())
            .map(|(q, _)| q.clone())
            .collect();
        let decided = if rest.is_empty() {
            Vec::new()
        } else {
            self.storage.decide(&rest, now_ms).await?
        };
        cache.learn(rest.iter().zip(&decided), now_ms);
        let mut decided = decided.into_iter();
        for place in refused.iter_mut().filter(|r| r.is_none()) {
            *place = decided.next();
        }
        Ok(Decided {
            requests: refused.into_iter().map(Option::unwrap_or_default).collect(),
            from_cache,
        })
    }

    /// Whether the store answers (PING within the deadline).
    pub async fn answers(&self) -> bool {
        self.ping().await.is_ok()
    }

    /// A PING within the deadline, or why not. One that answers ends a
    /// known-down store at once (readiness and the calls agree).
    pub async fn ping(&self) -> Result<(), StoreError> {
        let answer = self.storage.ping().await;
        if answer.is_ok() && self.health.down.swap(false, Ordering::Relaxed) {
            eprintln!("ratelimit-counter: the store answers again");
        }
        answer
    }

    /// Drops what has expired: the cache's entries, the memory store's
    /// counts.
    pub fn sweep(&self, now_ms: u64) {
        if let Some(c) = &self.cache {
            c.sweep(now_ms);
        }
        self.storage.sweep(now_ms);
    }
}

/// Whether a failed call may mean the connection is down (a PING then
/// says whether it is).
///
/// A slow answer is not one: a Redis slower than the store timeout is
/// answered `UNAVAILABLE` after that timeout on every call, as the timeout
/// promises, not at once.
fn connection_failed(e: &StoreError) -> bool {
    match e {
        StoreError::Redis(e) => {
            !e.is_timeout()
                && (e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal())
        }
        // TooLate: Redis answered (late), so its connection works.
        StoreError::Timeout
        | StoreError::Shape
        | StoreError::Full(_)
        | StoreError::Down(_)
        | StoreError::TooLate
        | StoreError::BadValue => false,
    }
}

/// A Redis store's way in: the parsed `--store`, the credentials and TLS
/// files that go with it.
pub struct Reach {
    pub target: url::Target,
    /// `--store`, redacted.
    pub shown: String,
    pub username: Option<String>,
    pub password: Option<String>,
    /// REDIS_SENTINEL_AUTH: (user, password).
    pub sentinel_auth: Option<(Option<String>, String)>,
    pub certs: Option<redis::TlsCertificates>,
    pub insecure: bool,
    pub deadline: Duration,
}

impl Reach {
    /// A node's address, TLS or not as the URL says.
    pub fn addr(&self, host: &str, port: u16) -> redis::ConnectionAddr {
        if self.target.tls {
            redis::ConnectionAddr::TcpTls {
                host: host.to_string(),
                port,
                insecure: self.insecure,
                tls_params: None,
            }
        } else {
            redis::ConnectionAddr::Tcp(host.to_string(), port)
        }
    }

    pub fn tls_mode(&self) -> Option<redis::TlsMode> {
        self.target.tls.then_some(if self.insecure {
            redis::TlsMode::Insecure
        } else {
            redis::TlsMode::Secure
        })
    }

    /// A client error, with the URL redacted.
    pub fn error(&self, e: &redis::RedisError) -> String {
        format!("{}: {}", self.shown, explain(e))
    }
}

/// A Redis error in words an operator acts on: a certificate refused says
/// so. Never holds a password (Redis's own answers do not repeat it).
pub(crate) fn explain(e: &redis::RedisError) -> String {
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

/// Connects to the store `opts.store` names, with the over-limit cache in
/// front of a Redis store. Fails only on options it cannot use (a URL it
/// cannot read, a TLS file it cannot read): the connection itself is made
/// on first use (see [`Lazy`]).
pub async fn connect(opts: &StoreOptions, deadline: Duration) -> Result<Store, String> {
    let storage = open(opts, deadline)?;
    let cache = match storage.name() {
        "memory" => None,
        _ => Some(OverLimitCache::new(over_limit_cache::ENTRIES)),
    };
    Ok(Store::new(storage, cache))
}

/// The store `opts.store` names, alone.
pub fn open(opts: &StoreOptions, deadline: Duration) -> Result<Box<dyn Storage>, String> {
    let target = url::parse(&opts.store)?;
    if target.kind == url::Kind::Memory {
        return Ok(Box::new(memory::MemoryStore::new(opts.memory_max_keys)));
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
    let sentinel_auth = opts
        .redis_sentinel_auth
        .as_deref()
        .filter(|a| !a.is_empty())
        .map(url::split_auth);
    let kind = target.kind.clone();
    let reach = Reach {
        target,
        shown,
        username,
        password,
        sentinel_auth,
        certs,
        insecure,
        deadline,
    };
    Ok(match kind {
        url::Kind::Memory => Box::new(memory::MemoryStore::new(opts.memory_max_keys)),
        url::Kind::Single => Box::new(single::RedisStore::open(&reach)?),
        url::Kind::Cluster => Box::new(cluster::ClusterStore::open(&reach)?),
        url::Kind::Sentinel { master } => Box::new(sentinel::SentinelStore::open(&reach, master)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
