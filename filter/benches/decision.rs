//! Micro-benchmark of one request's decision in the pure core, natively:
//! what `on_http_request_headers` does between reading the tenant header and
//! the host calls that carry the decision out (dispatching the gRPC call, or
//! sending the 429). Shared data is an in-memory store with Envoy's CAS
//! semantics; time is passed in, from a fake clock.
//!
//!     cargo bench -p tenant-ratelimit --bench decision

#[cfg(not(target_arch = "wasm32"))]
mod native {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::RefCell;
    use std::collections::HashSet;
    use std::hint::black_box;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

    use criterion::Criterion;
    use ratelimit_config::parse_plugin_config;
    use tenant_ratelimit::decision::{encode_request, first_step, Compiled, Step, RETRY_AFTER};
    use tenant_ratelimit::local::{
        admit, remember_over_limit, slot_for, update, LocalVerdict, SharedStore, SlotKey,
        StoreError, CAS_ATTEMPTS, SLOT_BYTES,
    };
    use tenant_ratelimit::proto::{Code, DescriptorStatus, Duration, RateLimit, RateLimitUnit};

    const TENANTS: usize = 1_000;
    const GOLD_TENANTS: usize = 100;
    const SLOTS: u32 = 4_096;
    /// 2023-11-14T22:13:20Z, a whole second.
    const EPOCH_MS: u64 = 1_700_000_000_000;

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

    /// The proxy-wasm shared data of one VM id: every slot created zeroed
    /// up front (as the glue's `create_slots` does), a CAS token per slot.
    struct MemStore {
        slots: RefCell<Vec<(Vec<u8>, u32)>>,
    }

    impl MemStore {
        fn new(slots: u32) -> MemStore {
            MemStore {
                slots: RefCell::new(vec![(vec![0; SLOT_BYTES], 1); slots as usize]),
            }
        }
    }

    /// The key the glue's `HostSlots` names a slot by, on every host call.
    fn host_key(index: u32) -> SlotKey {
        SlotKey::new(index)
    }

    impl SharedStore for MemStore {
        fn get(&self, index: u32) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
            black_box(host_key(index).as_str());
            let slots = self.slots.borrow();
            Ok(match slots.get(index as usize) {
                Some((value, cas)) => (Some(value.clone()), Some(*cas)),
                None => (None, None),
            })
        }

        fn set(&self, index: u32, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
            black_box(host_key(index).as_str());
            let mut slots = self.slots.borrow_mut();
            let Some((stored, token)) = slots.get_mut(index as usize) else {
                return Err(StoreError::Host("NotFound".into()));
            };
            if cas.is_some_and(|c| c != *token) {
                return Err(StoreError::CasMismatch);
            }
            stored.clear();
            stored.extend_from_slice(value);
            *token = token.wrapping_add(1);
            Ok(())
        }
    }

    /// What the glue does after deciding.
    enum Outcome {
        /// Not limited.
        Pass,
        /// Ask the service with this `RateLimitRequest`.
        Call(Vec<u8>),
        /// Answer 429 with these headers.
        Refuse(&'static str, Vec<(&'static str, String)>),
    }

    /// One request, as `on_http_request_headers` decides it.
    fn decide(c: &Compiled, store: &MemStore, tenant: &[u8], now_ms: u64) -> Outcome {
        let limited = match first_step(c, Some(tenant)) {
            Step::Limit(l) => l,
            Step::Pass | Step::DenyMissingTenant => return Outcome::Pass,
        };
        let local = &c.config.local;
        if local.enabled {
            let at = slot_for(&limited.group.name, &limited.tenant, local.slots);
            let bucket = local.bucket_for(limited.group);
            let mode = c.config.headers;
            match update(store, at.index, CAS_ATTEMPTS, |stored| {
                admit(stored, at, now_ms, bucket, mode)
            }) {
                Ok(LocalVerdict::Proceed | LocalVerdict::Contended) | Err(_) => {}
                Ok(LocalVerdict::BucketEmpty(h)) => return Outcome::Refuse("bucket_empty", h),
                Ok(LocalVerdict::CachedOverLimit(h)) => {
                    return Outcome::Refuse("cached_over_limit", h)
                }
            }
        }
        Outcome::Call(encode_request(c, &limited))
    }

    /// 1,000 tenants, 100 of them in the named group, each in a slot of its
    /// own (a tenant that shares a slot takes it over, which would turn a
    /// refusal into a call); the named group's every tenth.
    fn tenants() -> (Vec<String>, Vec<String>) {
        let mut used = HashSet::new();
        let mut pick = |group: &str, prefix: &str, n: usize| -> Vec<String> {
            (0..)
                .map(|i| format!("{prefix}-{i:05}"))
                .filter(|t| used.insert(slot_for(group, t, SLOTS).index))
                .take(n)
                .collect()
        };
        let gold = pick("gold", "gold", GOLD_TENANTS);
        let default = pick("default", "tenant", TENANTS - GOLD_TENANTS);
        let mut all = Vec::with_capacity(TENANTS);
        let (mut g, mut d) = (gold.iter(), default.iter());
        for i in 0..TENANTS {
            let next = if i % 10 == 0 { g.next() } else { d.next() };
            all.extend(next.cloned());
        }
        (all, gold)
    }

    fn compiled(gold: &[String], local_groups: &str) -> Compiled {
        let listed = gold
            .iter()
            .map(|t| format!("{t:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        let text = format!(
            r#"{{"domain": "internal-api",
                "rate_limit_service": {{"cluster": "ratelimit", "timeout_ms": 20}},
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
    fn expect_all(c: &Compiled, store: &MemStore, tenants: &[String], now_ms: u64, expected: &str) {
        for t in tenants {
            let got = match decide(c, store, t.as_bytes(), now_ms) {
                Outcome::Pass => "pass",
                Outcome::Call(message) if !message.is_empty() => "call",
                Outcome::Refuse(why, headers) if headers.iter().any(|(k, _)| *k == RETRY_AFTER) => {
                    why
                }
                _ => "a malformed outcome",
            };
            if got != expected {
                fail(&format!("{t}: expected {expected}, got {got}"));
            }
        }
    }

    fn status(
        code: Code,
        limit: u32,
        unit: RateLimitUnit,
        remaining: u32,
        reset_s: i64,
    ) -> DescriptorStatus {
        DescriptorStatus {
            code: code as i32,
            current_limit: Some(RateLimit {
                name: String::new(),
                requests_per_unit: limit,
                unit: unit as i32,
            }),
            limit_remaining: remaining,
            duration_until_reset: Some(Duration {
                seconds: reset_s,
                nanos: 0,
            }),
        }
    }

    /// The service refused every tenant: under its per-second limit, over
    /// its longer one for the next 1,800 s.
    fn remember_all_over_limit(c: &Compiled, store: &MemStore, tenants: &[String], asked_at: u64) {
        for t in tenants {
            let Step::Limit(l) = first_step(c, Some(t.as_bytes())) else {
                fail(&format!("{t} is not limited"));
            };
            let at = slot_for(&l.group.name, &l.tenant, c.config.local.slots);
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

    pub fn benches(c: &mut Criterion) {
        let (tenants, gold) = tenants();
        let mut group = c.benchmark_group("decision");

        // Under the bucket: take a token, then encode the call. The clock
        // moves 1 ms a request, so each tenant comes back every second with
        // its bucket (1,000/s or more) refilled.
        {
            let cfg = compiled(&gold, "");
            let store = MemStore::new(SLOTS);
            expect_all(&cfg, &store, &tenants, EPOCH_MS, "call");
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
            let store = MemStore::new(SLOTS);
            remember_all_over_limit(&cfg, &store, &tenants, EPOCH_MS);
            let now = EPOCH_MS + 10_250;
            expect_all(&cfg, &store, &tenants, now, "cached_over_limit");
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
            let one = r#", "groups": {"default": {"tokens_per_second": 1, "burst": 1},
                                       "gold": {"tokens_per_second": 1, "burst": 1}}"#;
            let cfg = compiled(&gold, one);
            let store = MemStore::new(SLOTS);
            expect_all(&cfg, &store, &tenants, EPOCH_MS, "call");
            let now = EPOCH_MS + 500;
            expect_all(&cfg, &store, &tenants, now, "bucket_empty");
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
            let mut i = 0usize;
            group.bench_function("first_step", |b| {
                b.iter(|| {
                    i = (i + 1) % TENANTS;
                    let t = tenants.get(i).map_or(&b""[..], |t| t.as_bytes());
                    matches!(first_step(&cfg, black_box(Some(t))), Step::Limit(_))
                })
            });
            let mut i = 0usize;
            group.bench_function("slot_for", |b| {
                b.iter(|| {
                    i = (i + 1) % TENANTS;
                    let t = tenants.get(i).map_or("", String::as_str);
                    slot_for(black_box("default"), black_box(t), black_box(SLOTS))
                })
            });
            let mut index = 0u32;
            group.bench_function("slot_key", |b| {
                b.iter(|| {
                    index = (index + 1) % SLOTS;
                    host_key(black_box(index)).as_str().len()
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
