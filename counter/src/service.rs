//! The glue: the gRPC method, and the HTTP endpoints.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract;
use tonic::codegen::http;

use crate::bounds::{Bounds, OutOfBounds};
use crate::decide::{answer, plan};
use crate::metrics::{GroupCounts, Metrics};
use crate::proto::{RateLimitRequest, RateLimitResponse};
use crate::store::Store;
use crate::teams::Teams;

/// The largest message read: a call of MAX_DESCRIPTORS descriptors fits.
const MAX_MESSAGE_BYTES: usize = 1 << 20;

pub struct State {
    pub teams: Arc<Teams>,
    pub store: Arc<Store>,
    pub metrics: Arc<Metrics>,
    pub clock_file: Option<PathBuf>,
    pub bounds: Bounds,
}

impl State {
    pub fn now(&self) -> u64 {
        crate::now_ms(self.clock_file.as_deref())
    }

    pub async fn should_rate_limit(
        &self,
        req: RateLimitRequest,
    ) -> Result<RateLimitResponse, tonic::Status> {
        self.metrics.calls.fetch_add(1, Ordering::Relaxed);
        let now = self.now();
        // Before any store work: hits the store must never be asked to
        // add, tenants longer than the filter sends.
        self.bounds.check(&req).map_err(|e| {
            self.metrics.bad_calls.fetch_add(1, Ordering::Relaxed);
            let refused = match e {
                OutOfBounds::TenantLength { .. } => &self.metrics.limits.tenant_too_long,
                OutOfBounds::Hits { .. } | OutOfBounds::CallHits(_) => {
                    &self.metrics.limits.hits_refused
                }
            };
            refused.fetch_add(1, Ordering::Relaxed);
            tonic::Status::invalid_argument(e.to_string())
        })?;
        let domain = self.teams.get(&req.domain);
        let planned = plan(domain.as_deref().map(|d| &d.domain), &req, now).map_err(|e| {
            self.metrics.bad_calls.fetch_add(1, Ordering::Relaxed);
            tonic::Status::invalid_argument(e.to_string())
        })?;
        let started = std::time::Instant::now();
        let decided = self.store.decide(&planned.requests, now).await;
        let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        // A call the over-limit cache answered whole did no store work, nor
        // did one failed at once (the store known down).
        if !matches!(&decided, Ok(d) if d.from_cache > 0 && d.from_cache == planned.requests.len())
            && !matches!(&decided, Err(crate::store::StoreError::Down(_)))
        {
            self.metrics.latency(us);
        }
        let decided = decided.map_err(|e| {
            self.metrics.store_errors.fetch_add(1, Ordering::Relaxed);
            if matches!(e, crate::store::StoreError::Down(_)) {
                self.metrics
                    .limits
                    .store_fast_failed
                    .fetch_add(1, Ordering::Relaxed);
            }
            tonic::Status::unavailable(e.to_string())
        })?;
        // Requests whose keys hold something else than a count failed
        // alone; a call of which every request failed fails.
        let failed = decided.requests.iter().filter(|d| d.failed).count();
        if failed > 0 {
            self.metrics
                .store_bad_values
                .fetch_add(failed as u64, Ordering::Relaxed);
            if failed == planned.requests.len() {
                self.metrics.store_errors.fetch_add(1, Ordering::Relaxed);
                return Err(tonic::Status::unavailable(
                    crate::store::StoreError::BadValue.to_string(),
                ));
            }
        }
        if decided.from_cache > 0 {
            self.metrics
                .cache_refused
                .fetch_add(decided.from_cache as u64, Ordering::Relaxed);
        }
        let (response, outcomes) = answer(&planned, &decided.requests, now);
        if let Some(d) = &domain {
            // Per group first (a call's requests are mostly of a few
            // groups), then each group's name once.
            let mut per_group: Vec<(usize, GroupCounts)> = Vec::new();
            for o in outcomes.iter().filter(|o| !o.failed) {
                match per_group.iter_mut().find(|(g, _)| *g == o.group) {
                    Some((_, c)) => c.add(o),
                    None => {
                        let mut c = GroupCounts::default();
                        c.add(o);
                        per_group.push((o.group, c));
                    }
                }
            }
            let named = per_group.into_iter().map(|(g, c)| (d.group_name(g), c));
            self.metrics.requests(&req.domain, named);
        }
        Ok(response)
    }
}

/// The server side tonic generates (`build.rs`) for the rate-limit
/// service: routing, decoding and the `RateLimitService` trait.
#[allow(clippy::all, clippy::pedantic, missing_docs, unused_qualifications)]
mod generated {
    include!(concat!(
        env!("OUT_DIR"),
        "/envoy.service.ratelimit.v3.RateLimitService.rs"
    ));
}

pub use generated::rate_limit_service_server::RateLimitService;
use generated::rate_limit_service_server::RateLimitServiceServer;

/// The rate-limit service: each call decided by [`State::should_rate_limit`].
pub struct Rls(pub Arc<State>);

#[tonic::async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        self.0
            .should_rate_limit(request.into_inner())
            .await
            .map(tonic::Response::new)
    }
}

/// The gRPC service to add to the server, its message size bounded and
/// its message bytes counted against its connection's most.
pub fn rate_limit_server(
    state: Arc<State>,
) -> crate::limits::Budgeted<RateLimitServiceServer<Rls>> {
    crate::limits::Budgeted {
        metrics: state.metrics.clone(),
        inner: RateLimitServiceServer::new(Rls(state)).max_decoding_message_size(MAX_MESSAGE_BYTES),
    }
}

/// What `/readyz` and the gRPC health both answer from: ready only with a
/// team file loaded and a store that answers, and otherwise what is missing.
pub struct Readiness {
    pub teams: Result<String, String>,
    pub store: Result<(), String>,
}

impl Readiness {
    pub fn ready(&self) -> bool {
        self.teams.is_ok() && self.store.is_ok()
    }

    /// The body of `/readyz`: one line each, with what is missing.
    pub fn body(&self) -> String {
        let teams = match &self.teams {
            Ok(shown) => format!("team file loaded: true ({shown})\n"),
            Err(why) => format!("team file loaded: false ({why})\n"),
        };
        let store = match &self.store {
            Ok(()) => "store answers: true\n".to_string(),
            Err(why) => format!("store answers: false ({why})\n"),
        };
        teams + &store
    }
}

impl State {
    pub async fn readiness(&self) -> Readiness {
        Readiness {
            teams: self.teams.status(),
            store: self.store.ping().await.map_err(|e| e.to_string()),
        }
    }
}

async fn metrics(extract::State(state): extract::State<Arc<State>>) -> String {
    state
        .metrics
        .limits
        .store_down
        .store(u64::from(state.store.down()), Ordering::Relaxed);
    state.metrics.render(state.store.name()) + &state.store.metrics()
}

async fn ready(extract::State(state): extract::State<Arc<State>>) -> (http::StatusCode, String) {
    let r = state.readiness().await;
    let code = if r.ready() {
        http::StatusCode::OK
    } else {
        http::StatusCode::SERVICE_UNAVAILABLE
    };
    (code, r.body())
}

/// /metrics, /healthz (the process runs), /readyz (a team file is loaded
/// and the store answers).
pub fn http_app(state: Arc<State>) -> axum::Router {
    use axum::routing::get;
    axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(state)
}
