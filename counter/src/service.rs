//! The glue: the gRPC method, and the HTTP endpoints.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::codegen::{http, Body, BoxFuture, Service, StdError};

use crate::decide::{answer, plan};
use crate::metrics::{GroupCounts, Metrics};
use crate::proto::{RateLimitRequest, RateLimitResponse, PATH, SERVICE};
use crate::store::Store;
use crate::teams::Teams;

/// The largest message read: a call of MAX_DESCRIPTORS descriptors fits.
const MAX_MESSAGE_BYTES: usize = 1 << 20;

pub struct State {
    pub teams: Arc<Teams>,
    pub store: Arc<Store>,
    pub metrics: Arc<Metrics>,
    pub clock_file: Option<PathBuf>,
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
        let domain = self.teams.get(&req.domain);
        let planned = plan(domain.as_deref(), &req, now).map_err(|e| {
            self.metrics.bad_calls.fetch_add(1, Ordering::Relaxed);
            tonic::Status::invalid_argument(e.to_string())
        })?;
        let started = std::time::Instant::now();
        let decided = self.store.decide(&planned.requests, now).await;
        let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        // A call the over-limit cache answered whole did no store work.
        if !matches!(&decided, Ok(d) if d.from_cache > 0 && d.from_cache == planned.requests.len())
        {
            self.metrics.latency(us);
        }
        let decided = decided.map_err(|e| {
            self.metrics.store_errors.fetch_add(1, Ordering::Relaxed);
            tonic::Status::unavailable(e.to_string())
        })?;
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
            for o in &outcomes {
                match per_group.iter_mut().find(|(g, _)| *g == o.group) {
                    Some((_, c)) => c.add(o),
                    None => {
                        let mut c = GroupCounts::default();
                        c.add(o);
                        per_group.push((o.group, c));
                    }
                }
            }
            per_group.sort_unstable_by_key(|(g, _)| *g);
            let mut groups = d.limits.all_groups().enumerate();
            let named = per_group.into_iter().map(|(i, c)| {
                let name = groups
                    .find(|(j, _)| *j == i)
                    .map_or("", |(_, g)| g.name.as_str());
                (name, c)
            });
            self.metrics.requests(&req.domain, named);
        }
        Ok(response)
    }
}

#[derive(Clone)]
pub struct RateLimitServer {
    state: Arc<State>,
}

impl RateLimitServer {
    pub fn new(state: Arc<State>) -> RateLimitServer {
        RateLimitServer { state }
    }
}

impl tonic::server::NamedService for RateLimitServer {
    const NAME: &'static str = SERVICE;
}

struct Unary(Arc<State>);

impl tonic::server::UnaryService<RateLimitRequest> for Unary {
    type Response = RateLimitResponse;
    type Future = BoxFuture<tonic::Response<RateLimitResponse>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> Self::Future {
        let state = self.0.clone();
        Box::pin(async move {
            state
                .should_rate_limit(request.into_inner())
                .await
                .map(tonic::Response::new)
        })
    }
}

impl<B> Service<http::Request<B>> for RateLimitServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != PATH {
            return Box::pin(async move { Ok(tonic::Status::unimplemented("").into_http()) });
        }
        let state = self.state.clone();
        Box::pin(async move {
            let codec = tonic_prost::ProstCodec::<RateLimitResponse, RateLimitRequest>::default();
            let mut grpc = tonic::server::Grpc::new(codec)
                .apply_max_message_size_config(Some(MAX_MESSAGE_BYTES), None);
            Ok(grpc.unary(Unary(state), req).await)
        })
    }
}

/// /metrics, /healthz (the process runs), /readyz (a team file is loaded
/// and the store answers).
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    state: Arc<State>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) {
    use axum::routing::get;
    let metrics = {
        let state = state.clone();
        move || {
            let state = state.clone();
            async move { state.metrics.render(state.store.name()) + &state.store.metrics() }
        }
    };
    let ready = {
        let state = state.clone();
        move || {
            let state = state.clone();
            async move {
                let loaded = state.teams.loaded();
                let answers = state.store.answers().await;
                let code = if loaded && answers {
                    http::StatusCode::OK
                } else {
                    http::StatusCode::SERVICE_UNAVAILABLE
                };
                (
                    code,
                    format!("team file loaded: {loaded}\nstore answers: {answers}\n"),
                )
            }
        }
    };
    let app = axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready));
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
    {
        eprintln!("ratelimit-counter: HTTP: {e}");
    }
}
