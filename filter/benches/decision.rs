//! Micro-benchmark of one request's decision, natively: the real request
//! flow (`flow::Stream::on_request_headers`) over the in-memory host
//! (`testing::MemHost`, counting what the flow does instead of keeping it):
//! the tenant header, the clock, the slot in shared data with Envoy's CAS
//! semantics, then the gRPC call dispatched or the 429 sent.
//!
//!     cargo bench -p tenant-ratelimit --bench decision

#[cfg(not(target_arch = "wasm32"))]
mod native {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::collections::HashSet;
    use std::hint::black_box;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

    use criterion::Criterion;
    use ratelimit_config::parse_plugin_config;
    use tenant_ratelimit::compiled::Compiled;
    use tenant_ratelimit::counters::Counter;
    use tenant_ratelimit::decision::{first_step, Step};
    use tenant_ratelimit::flow::{Next, Stream};
    use tenant_ratelimit::group::GroupId;
    use tenant_ratelimit::local::{
        remember_over_limit, slot_for, update, SlotKey, SlotSecret, CAS_ATTEMPTS,
    };
    use tenant_ratelimit::tenant::Read;
    use tenant_ratelimit::testing::MEMHOST_SECRET;

    /// The key MemHost hashes with, so that the tenants picked here are
    /// where the flow looks for them.
    const KEY: SlotSecret = SlotSecret::from_bytes(MEMHOST_SECRET);
    use tenant_ratelimit::proto::{Code, RateLimitUnit};
    use tenant_ratelimit::testing::{status, MemHost, Worker};

    const TENANTS: usize = 1_000;
    const GOLD_TENANTS: usize = 100;
    const SLOTS: u32 = 4_096;
    /// 2023-11-14T22:13:20Z, a whole second.
    const EPOCH_MS: u64 = 1_700_000_000_000;
    const HEADER: &str = "x-tenant-id";

    /// Counts allocations while `COUNTING` is on (never while timing), to
    /// report how many one request makes.
    struct CountingAlloc;

    static COUNTING: AtomicBool = AtomicBool::new(false);
    static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

    // SAFETY: every call is passed on to the system allocator unchanged.
    unsafe impl GlobalAlloc for CountingAlloc {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            if COUNTING.load(Relaxed) {
                ALLOCATIONS.fetch_add(1, Relaxed);
            }
            // SAFETY: the caller's contract, passed on.
            unsafe { System.alloc(layout) }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: the caller's contract, passed on.
            unsafe { System.dealloc(ptr, layout) }
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            if COUNTING.load(Relaxed) {
                ALLOCATIONS.fetch_add(1, Relaxed);
            }
            // SAFETY: the caller's contract, passed on.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    #[global_allocator]
    static GLOBAL: CountingAlloc = CountingAlloc;

    /// Allocations (and reallocations) made by `f`, once.
    fn allocations<T>(f: impl FnOnce() -> T) -> usize {
        ALLOCATIONS.store(0, Relaxed);
        COUNTING.store(true, Relaxed);
        let out = f();
        COUNTING.store(false, Relaxed);
        drop(black_box(out));
        ALLOCATIONS.load(Relaxed)
    }

    /// What the flow did with one request.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum BatchOutcome {
        /// Not limited.
        Pass,
        /// Asked the service.
        Call,
        /// Answered 429 (from the bucket or the cache).
        Refuse,
    }

    /// One request through the real flow, up to its first answer: the
    /// tenant header, then `on_request_headers` with a fresh stream, as
    /// Envoy creates one per request.
    fn decide(c: &Compiled, worker: &Worker, tenant: &[u8], now_ms: u64) -> Next {
        worker.set_request_header(HEADER, tenant);
        worker.set_now_ms(now_ms);
        let mut stream = Stream::default();
        stream.on_request_headers(c, &worker.host, &worker.vm)
    }

    /// What the last `decide` did, from what the host saw.
    fn outcome(host: &MemHost, next: Next, calls: u64, replies: u64) -> BatchOutcome {
        match (
            next,
            host.call_count() - calls,
            host.reply_count() - replies,
        ) {
            (Next::Pause, 1, 0) => BatchOutcome::Call,
            (Next::Pause, 0, 1) => BatchOutcome::Refuse,
            _ => BatchOutcome::Pass,
        }
    }

    /// 1,000 tenants, 100 of them in the named group, each in a slot of its
    /// own (a tenant that shares a slot takes it over, which would turn a
    /// refusal into a call); the named group's every tenth.
    fn tenants() -> (Vec<String>, Vec<String>) {
        // A tenant's slot depends on its group's scope, not on the tenants
        // the group lists: any list gives the bench configurations' scopes.
        // The scope also holds the group's local bucket: a tenant must
        // have a slot of its own with and without `ONE_TOKEN`'s buckets.
        let placeholder = ["placeholder".to_string()];
        let scopes = [
            compiled(&placeholder, ""),
            compiled(&placeholder, ONE_TOKEN),
        ];
        let mut used = [HashSet::new(), HashSet::new()];
        let mut pick = |group: usize, prefix: &str, n: usize| -> Vec<String> {
            (0..)
                .map(|i| format!("{prefix}-{i:05}"))
                .filter(|t| {
                    let at =
                        |c: &Compiled| slot_for(&KEY, c.scope(GroupId::new(group)), t, SLOTS).index;
                    let (a, b) = (at(&scopes[0]), at(&scopes[1]));
                    if used[0].contains(&a) || used[1].contains(&b) {
                        return false;
                    }
                    used[0].insert(a);
                    used[1].insert(b);
                    true
                })
                .take(n)
                .collect()
        };
        let gold = pick(1, "gold", GOLD_TENANTS);
        let default = pick(0, "tenant", TENANTS - GOLD_TENANTS);
        let mut all = Vec::with_capacity(TENANTS);
        let (mut g, mut d) = (gold.iter(), default.iter());
        for i in 0..TENANTS {
            let next = if i % 10 == 0 { g.next() } else { d.next() };
            all.extend(next.cloned());
        }
        (all, gold)
    }

    /// Local buckets of 1 token, 1 a second, for both groups.
    const ONE_TOKEN: &str = r#", "groups": {"default": {"tokens_per_second": 1, "burst": 1},
                                          "gold": {"tokens_per_second": 1, "burst": 1}}"#;

    /// One call per request (`"batch": false`): the bench never answers
    /// its calls, so batched requests would queue behind the first two.
    fn compiled(gold: &[String], local_groups: &str) -> Compiled {
        let listed = gold
            .iter()
            .map(|t| format!("{t:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        let text = format!(
            r#"{{"domain": "internal-api",
                "rate_limit_service": {{"cluster": "ratelimit", "timeout_ms": 20, "batch": false}},
                "limits": {{"x-tenant-id": {{
                    "default": {{"persecond": 1000, "perhour": 3600000}},
                    "gold": {{"persecond": 5000, "perminute": 300000, "header_value": [{listed}]}}}}}},
                "local": {{"slots": {SLOTS}{local_groups}}}}}"#
        );
        match parse_plugin_config(text.as_bytes()) {
            Ok((config, _)) => Compiled::new(config),
            Err(e) => fail(&format!("bench configuration: {e:?}")),
        }
    }

    fn fail(why: &str) -> ! {
        eprintln!("decision bench: {why}");
        std::process::exit(1)
    }

    /// Every tenant's decision at `now_ms` must be `expected`, before the
    /// case is timed.
    fn expect_all(
        c: &Compiled,
        host: &Worker,
        tenants: &[String],
        now_ms: u64,
        expected: BatchOutcome,
    ) {
        for t in tenants {
            let (calls, replies) = (host.call_count(), host.reply_count());
            let next = decide(c, host, t.as_bytes(), now_ms);
            let got = outcome(host, next, calls, replies);
            if got != expected {
                fail(&format!("{t}: expected {expected:?}, got {got:?}"));
            }
        }
    }

    /// The service refused every tenant: under its per-second limit, over
    /// its longer one for the next 1,800 s.
    fn remember_all_over_limit(c: &Compiled, store: &MemHost, tenants: &[String], asked_at: u64) {
        for t in tenants {
            let read = Read::Value(t.as_bytes().to_vec());
            let Step::Limit(l) = first_step(c, &read) else {
                fail(&format!("{t} is not limited"));
            };
            let at = slot_for(&KEY, c.scope(l.group_id), &l.tenant, c.config.local.slots);
            let statuses = [
                status(Code::Ok, 1000, RateLimitUnit::Second, 999, 1),
                status(Code::OverLimit, 3600, RateLimitUnit::Hour, 0, 1_800),
            ];
            let r = update(store, at.index, CAS_ATTEMPTS, |stored| {
                ((), remember_over_limit(stored, at, asked_at, &statuses))
            });
            if let Err(e) = r {
                fail(&format!("{t}: {e:?}"));
            }
        }
    }

    /// Every tenant's refusal was counted as `c`.
    fn expect_counted(host: &MemHost, c: Counter) {
        if host.counter(c) != TENANTS as u64 {
            fail(&format!("{c:?} counted {} times", host.counter(c)));
        }
    }

    /// The shared data of one VM id, every slot created zeroed up front
    /// (as the root does at configure), and one VM's state.
    fn new_host() -> Worker {
        let host = MemHost::counting();
        host.create_slots(SLOTS);
        Worker::with(host)
    }

    pub fn benches(c: &mut Criterion) {
        let (tenants, gold) = tenants();
        let mut group = c.benchmark_group("decision");

        // Under the bucket: take a token, then encode the call. The clock
        // moves 1 ms a request, so each tenant comes back every second with
        // its bucket (1,000/s or more) refilled.
        {
            let cfg = compiled(&gold, "");
            let store = new_host();
            expect_all(&cfg, &store, &tenants, EPOCH_MS, BatchOutcome::Call);
            let (mut i, mut now) = (0usize, EPOCH_MS);
            let t = tenants.get(1).map_or(&b""[..], |t| t.as_bytes());
            let n = allocations(|| decide(&cfg, &store, t, EPOCH_MS + 1_000));
            println!("decision/allowed: {n} allocations a request");
            group.bench_function("allowed", |b| {
                b.iter(|| {
                    i = (i + 1) % TENANTS;
                    now += 1;
                    let t = tenants.get(i).map_or(&b""[..], |t| t.as_bytes());
                    decide(&cfg, &store, black_box(t), black_box(now))
                })
            });
        }

        // Refused from the over-limit cache: the headers rebuilt as they
        // stand now.
        {
            let cfg = compiled(&gold, "");
            let store = new_host();
            remember_all_over_limit(&cfg, &store, &tenants, EPOCH_MS);
            let now = EPOCH_MS + 10_250;
            expect_all(&cfg, &store, &tenants, now, BatchOutcome::Refuse);
            expect_counted(&store, Counter::CachedOverLimit);
            let mut i = 0usize;
            let t = tenants.get(1).map_or(&b""[..], |t| t.as_bytes());
            let n = allocations(|| decide(&cfg, &store, t, now));
            println!("decision/cached_over_limit: {n} allocations a request");
            group.bench_function("cached_over_limit", |b| {
                b.iter(|| {
                    i = (i + 1) % TENANTS;
                    let t = tenants.get(i).map_or(&b""[..], |t| t.as_bytes());
                    decide(&cfg, &store, black_box(t), black_box(now))
                })
            });
        }

        // Refused by an empty bucket (1 token, 1 a second, taken): 429 with
        // Retry-After, nothing written.
        {
            let cfg = compiled(&gold, ONE_TOKEN);
            let store = new_host();
            expect_all(&cfg, &store, &tenants, EPOCH_MS, BatchOutcome::Call);
            let now = EPOCH_MS + 500;
            expect_all(&cfg, &store, &tenants, now, BatchOutcome::Refuse);
            expect_counted(&store, Counter::LocalOverLimit);
            let mut i = 0usize;
            let t = tenants.get(1).map_or(&b""[..], |t| t.as_bytes());
            let n = allocations(|| decide(&cfg, &store, t, now));
            println!("decision/bucket_empty: {n} allocations a request");
            group.bench_function("bucket_empty", |b| {
                b.iter(|| {
                    i = (i + 1) % TENANTS;
                    let t = tenants.get(i).map_or(&b""[..], |t| t.as_bytes());
                    decide(&cfg, &store, black_box(t), black_box(now))
                })
            });
        }

        // The parts, for attribution.
        {
            let cfg = compiled(&gold, "");
            let reads: Vec<Read> = tenants
                .iter()
                .map(|t| Read::Value(t.as_bytes().to_vec()))
                .collect();
            let mut i = 0usize;
            group.bench_function("first_step", |b| {
                b.iter(|| {
                    i = (i + 1) % TENANTS;
                    let read = reads.get(i).unwrap_or(&Read::Missing);
                    matches!(first_step(&cfg, black_box(read)), Step::Limit(_))
                })
            });
            let mut i = 0usize;
            let scope = cfg.scope(GroupId::new(0));
            group.bench_function("slot_for", |b| {
                b.iter(|| {
                    i = (i + 1) % TENANTS;
                    let t = tenants.get(i).map_or("", String::as_str);
                    slot_for(&KEY, black_box(scope), black_box(t), black_box(SLOTS))
                })
            });
            let mut index = 0u32;
            group.bench_function("slot_key", |b| {
                b.iter(|| {
                    index = (index + 1) % SLOTS;
                    SlotKey::new(black_box(index)).as_str().len()
                })
            });
        }
        group.finish();
    }
}

#[cfg(not(target_arch = "wasm32"))]
fn main() {
    let mut c = criterion::Criterion::default().configure_from_args();
    native::benches(&mut c);
    c.final_summary();
}

/// Benchmarks run natively only.
#[cfg(target_arch = "wasm32")]
fn main() {}
