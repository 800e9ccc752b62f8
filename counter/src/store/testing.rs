//! Every store under one test: [`test_with_all_stores!`] runs a test
//! against the memory store, one Redis server and a Redis Cluster of three
//! masters, so that the script is proven to decide as the Rust code does.
//!
//! The Redis servers are real: Debian's `redis-server` (`TRL_REDIS`, else
//! `.deps/bin/redis-server`), started once per test process on free
//! loopback ports, without persistence, and stopped when the process ends.
//! A Redis that cannot be started fails the test: set
//! `TRL_SKIP_REDIS_TESTS=1` to run the memory store alone.

use std::cell::RefCell;
use std::path::PathBuf;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::{memory, open, OverLimitCache, Store, StoreOptions};
use crate::decide::{Check, Decision, Request};

/// The stores a test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Memory,
    Redis,
    Cluster,
}

/// Runs each named test, a `fn(&Under)`, once per store: a module of the
/// test's name with one `#[test]` per store (`memory`, `redis`,
/// `redis_cluster`), as Limitador's `test_with_all_storage_impls!` does.
#[macro_export]
macro_rules! test_with_all_stores {
    ($($test:ident),* $(,)?) => {
        $(
            mod $test {
                use $crate::store::testing::{Kind, Under};

                #[test]
                fn memory() {
                    Under::run(Kind::Memory, super::$test);
                }

                #[test]
                fn redis() {
                    Under::run(Kind::Redis, super::$test);
                }

                #[test]
                fn redis_cluster() {
                    Under::run(Kind::Cluster, super::$test);
                }
            }
        )*
    };
}

/// A fixed minute window's check of one hit on `key`, in the minute from 0.
pub fn minute_check(key: &str, limit: u64) -> Check {
    Check {
        index: 0,
        unit: ratelimit_config::Unit::Minute,
        limit,
        hits: 1,
        key_hits: 1,
        sliding: false,
        shadow: false,
        group: 0,
        name: "g".into(),
        tag: "{1:d:a}".into(),
        key: key.into(),
        prev_key: None,
        window: (0, 60_000),
        next_end: 120_000,
        weight_ppm: 0,
        ttl_ms: 60_000,
        regional: None,
    }
}

/// How long a Redis key of a test lives at least. Tests pass the time in:
/// a key must not expire on the wall clock while the test's own clock is
/// still inside its window. Keys name their window's start, so a longer
/// life changes no decision (no key is read after the windows that read
/// it, on any store).
const TTL_FLOOR_MS: u64 = 600_000;

/// One store under test, with its own namespace of keys.
pub struct Under {
    pub kind: Kind,
    runtime: tokio::runtime::Runtime,
    /// The over-limit cache's size, when one is in front of the store.
    cache_entries: Option<usize>,
    store: RefCell<Store>,
    /// Put before every key (after none of its hash tag), so that the
    /// tests sharing one Redis never share a key.
    prefix: RefCell<String>,
}

impl Under {
    /// Runs `test` on a fresh store of `kind` (nothing, for a Redis one,
    /// under `TRL_SKIP_REDIS_TESTS=1`).
    pub fn run(kind: Kind, test: fn(&Under)) {
        if kind != Kind::Memory && std::env::var("TRL_SKIP_REDIS_TESTS").is_ok_and(|v| v == "1") {
            eprintln!("TRL_SKIP_REDIS_TESTS=1: the {kind:?} variant skipped");
            return;
        }
        test(&Under::new(kind, None));
    }

    fn new(kind: Kind, cache_entries: Option<usize>) -> Under {
        let under = Under {
            kind,
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
            cache_entries,
            store: RefCell::new(Under::store(kind, cache_entries)),
            prefix: RefCell::new(String::new()),
        };
        under.fresh();
        under
    }

    /// A store of the same kind with a namespace of its own, behind an
    /// over-limit cache of `entries` keys.
    pub fn with_cache(&self, entries: usize) -> Under {
        Under::new(self.kind, Some(entries))
    }

    fn store(kind: Kind, cache_entries: Option<usize>) -> Store {
        let url = match kind {
            Kind::Memory => "memory".to_string(),
            Kind::Redis => format!("redis://127.0.0.1:{}", single().port),
            Kind::Cluster => {
                let ports: Vec<String> = cluster()
                    .iter()
                    .map(|s| format!("127.0.0.1:{}", s.port))
                    .collect();
                format!("redis-cluster://{}", ports.join(","))
            }
        };
        let mut opts = StoreOptions::of(&url);
        opts.memory_max_keys = memory::DEFAULT_MAX_KEYS;
        let storage = open(&opts, Duration::from_secs(5)).unwrap();
        Store::new(storage, cache_entries.map(OverLimitCache::new))
    }

    /// Forgets every count: a new store (and cache), a new namespace of
    /// keys (Redis keeps the old ones until they expire).
    pub fn fresh(&self) {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        *self.store.borrow_mut() = Under::store(self.kind, self.cache_entries);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        *self.prefix.borrow_mut() = format!("t{}.{n}:", std::process::id());
    }

    /// How many keys its over-limit cache remembers.
    pub fn remembered(&self) -> usize {
        self.store
            .borrow()
            .cache
            .as_ref()
            .map_or(0, |c| c.remembered())
    }

    /// How many cases a property test runs: fewer on Redis, where each
    /// call is a round trip.
    pub fn cases(&self) -> u32 {
        match self.kind {
            Kind::Memory => 256,
            Kind::Redis | Kind::Cluster => 48,
        }
    }

    /// The requests as this store sees them: keys in its namespace.
    fn local(&self, requests: &[Request]) -> Vec<Request> {
        let prefix = self.prefix.borrow();
        let mut requests = requests.to_vec();
        for c in requests.iter_mut().flat_map(|r| &mut r.checks) {
            c.key.insert_str(0, &prefix);
            if let Some(p) = &mut c.prev_key {
                p.insert_str(0, &prefix);
            }
            if let Some(r) = &mut c.regional {
                r.key.insert_str(0, &prefix);
            }
            if self.kind != Kind::Memory {
                c.ttl_ms = c.ttl_ms.max(TTL_FLOOR_MS);
            }
        }
        requests
    }

    /// One call's requests decided by the store (its cache first, if it
    /// has one), in order.
    pub fn decide(&self, requests: &[Request], now_ms: u64) -> Vec<Decision> {
        let requests = self.local(requests);
        let store = self.store.borrow();
        let decided = self
            .runtime
            .block_on(store.decide(&requests, now_ms))
            .unwrap()
            .requests;
        assert_eq!(decided.len(), requests.len());
        decided
    }

    /// The fleet's sizes through the store (`Store::fleet`), its domains in
    /// this store's namespace; None on the memory store.
    pub fn fleet(&self, syncs: &[super::fleet::Sync]) -> Option<Vec<u32>> {
        let prefix = self.prefix.borrow().clone();
        let syncs: Vec<super::fleet::Sync> = syncs
            .iter()
            .map(|s| super::fleet::Sync {
                domain: format!("{prefix}{}", s.domain),
                ..s.clone()
            })
            .collect();
        let store = self.store.borrow();
        self.runtime.block_on(store.fleet(&syncs)).unwrap()
    }

    /// Runs a raw Redis command on a counter key (`args` after the key),
    /// for the tests of keys that hold something else than a count; false
    /// on the memory store, which cannot hold one.
    pub fn poison(&self, command: &str, key: &str, args: &[&str]) -> bool {
        let key = format!("{}{key}", self.prefix.borrow());
        let mut cmd = redis::cmd(command);
        cmd.arg(&key).arg(args);
        match self.kind {
            Kind::Memory => return false,
            Kind::Redis => {
                let client =
                    redis::Client::open(format!("redis://127.0.0.1:{}", single().port)).unwrap();
                cmd.exec(&mut client.get_connection().unwrap()).unwrap();
            }
            Kind::Cluster => {
                let nodes: Vec<String> = cluster()
                    .iter()
                    .map(|s| format!("redis://127.0.0.1:{}", s.port))
                    .collect();
                let client = redis::cluster::ClusterClient::new(nodes).unwrap();
                cmd.exec(&mut client.get_connection().unwrap()).unwrap();
            }
        }
        true
    }

    /// A hash's fields (a regions hash), on the single Redis.
    pub fn hash(&self, key: &str) -> std::collections::HashMap<String, String> {
        let key = format!("{}{key}", self.prefix.borrow());
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", single().port)).unwrap();
        redis::cmd("HGETALL")
            .arg(&key)
            .query(&mut client.get_connection().unwrap())
            .unwrap()
    }

    /// A counter's value (0 when there is none).
    pub fn value(&self, key: &str, now_ms: u64) -> u64 {
        let key = format!("{}{key}", self.prefix.borrow());
        let store = self.store.borrow();
        self.runtime
            .block_on(store.storage.value(&key, now_ms))
            .unwrap()
    }
}

/// A redis-server this process started; stopped when the process ends
/// (its shell waits on our end of a pipe, then stops it).
pub struct Server {
    pub port: u16,
    _alive: Mutex<ChildStdin>,
}

fn redis_server() -> PathBuf {
    let path = std::env::var_os("TRL_REDIS").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.deps/bin/redis-server"),
        PathBuf::from,
    );
    assert!(
        path.exists(),
        "no redis-server at {} (set TRL_REDIS; or TRL_SKIP_REDIS_TESTS=1 to test the memory store alone)",
        path.display()
    );
    path
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts redis-server with `args` and waits for its PING.
// The shell is waited for by no one: it outlives every test, and ends
// when the process does.
#[allow(clippy::zombie_processes)]
fn start(extra: &[String]) -> Server {
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("trl-counter-redis-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut args: Vec<String> = [
        "--bind",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        "--loglevel",
        "warning",
        "--dir",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(dir.display().to_string());
    args.extend_from_slice(extra);
    // The shell starts the server, then waits for our end of its stdin to
    // close (this process ending, however it ends) and stops it.
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(r#"dir="$1"; shift; "$@" & pid=$!; read _; kill "$pid"; wait "$pid"; rm -rf "$dir""#)
        .arg("sh")
        .arg(&dir)
        .arg(redis_server())
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let alive = child.stdin.take().unwrap();
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
    wait_until(&format!("redis-server on port {port} answers PING"), || {
        client
            .get_connection()
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
            .is_ok()
    });
    Server {
        port,
        _alive: Mutex::new(alive),
    }
}

/// Polls `ready` until it holds (a start-up, not a timing assertion: 30 s).
fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what}: not within 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One Redis server for every test of the process.
fn single() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| start(&[]))
}

/// A Redis Cluster of three masters (no replicas) for every test of the
/// process, made by `redis-cli --cluster create`.
fn cluster() -> &'static [Server] {
    static CLUSTER: OnceLock<Vec<Server>> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let nodes: Vec<Server> = (0..3)
            .map(|_| {
                let bus = free_port();
                start(&[
                    "--cluster-enabled".into(),
                    "yes".into(),
                    "--cluster-config-file".into(),
                    "nodes.conf".into(),
                    "--cluster-port".into(),
                    bus.to_string(),
                    "--cluster-announce-ip".into(),
                    "127.0.0.1".into(),
                ])
            })
            .collect();
        let cli = redis_server()
            .canonicalize()
            .ok()
            .and_then(|p| p.parent().map(|d| d.join("redis-cli")))
            .filter(|p| p.exists())
            .unwrap_or_else(|| PathBuf::from("redis-cli"));
        let out = Command::new(&cli)
            .arg("--cluster")
            .arg("create")
            .args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)))
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", cli.display()));
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        for n in &nodes {
            let client = redis::Client::open(format!("redis://127.0.0.1:{}", n.port)).unwrap();
            wait_until(
                &format!("cluster node {} sees the cluster ok", n.port),
                || {
                    client
                        .get_connection()
                        .and_then(|mut c| redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut c))
                        .is_ok_and(|info| info.contains("cluster_state:ok"))
                },
            );
        }
        nodes
    })
}
