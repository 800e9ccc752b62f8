//! What one client can hold of the counter, on both ports: connections
//! (each port its own most, those beyond wait in the listen backlog), the
//! time to a connection's first bytes and a request's headers, HTTP/2
//! streams per connection, the time of a gRPC call, and the unfinished
//! message bytes a connection (and the whole counter) holds. Also the
//! open-file limit, raised at start.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::codegen::http;

use crate::metrics::Metrics;

/// The limits (flags in `main.rs`).
#[derive(Clone, Debug)]
pub struct Limits {
    pub grpc_max_connections: usize,
    pub http_max_connections: usize,
    pub max_streams: u32,
    /// A connection's first bytes, and an HTTP/1 request's headers.
    pub header_timeout: Duration,
    /// A whole gRPC call: its message read and answered.
    pub call_timeout: Duration,
    pub connection_bytes: usize,
    pub total_bytes: usize,
}

/// HTTP/2 flow control windows of the gRPC port: what a connection can
/// send before the counter reads it.
pub const STREAM_WINDOW: u32 = 256 << 10;
pub const CONNECTION_WINDOW: u32 = 1 << 20;

/// The unfinished message bytes held: per connection, and in all.
#[derive(Debug)]
pub struct Held {
    connection: AtomicUsize,
    total: Arc<AtomicUsize>,
    connection_max: usize,
    total_max: usize,
}

/// What a connection of the gRPC port hands its calls (tonic puts it in
/// each request's extensions).
#[derive(Clone, Debug)]
pub struct ConnInfo {
    pub held: Arc<Held>,
}

/// An accepted connection, holding its place among the port's most.
pub struct Conn<IO> {
    io: IO,
    held: Arc<Held>,
    _permit: OwnedSemaphorePermit,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Conn<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Conn<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<IO> tonic::transport::server::Connected for Conn<IO> {
    type ConnectInfo = ConnInfo;
    fn connect_info(&self) -> ConnInfo {
        ConnInfo {
            held: self.held.clone(),
        }
    }
}

/// Accepts connections on `listener`, at most `max` open at once (the
/// rest wait in the backlog), each made ready by `prepare` (a first byte
/// within the header timeout, a TLS handshake) apart from the others; a
/// connection `prepare` drops frees its place.
pub fn accept<IO, F, Fut>(
    listener: TcpListener,
    max: usize,
    limits: &Limits,
    prepare: F,
) -> impl futures_util::Stream<Item = Result<Conn<IO>, std::io::Error>>
where
    IO: Send + 'static,
    F: Fn(TcpStream, SocketAddr) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Option<IO>> + Send + 'static,
{
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Conn<IO>, std::io::Error>>(64);
    let open = Arc::new(Semaphore::new(max.max(1)));
    let total = Arc::new(AtomicUsize::new(0));
    let (connection_max, total_max) = (limits.connection_bytes, limits.total_bytes);
    tokio::spawn(async move {
        loop {
            let permit = tokio::select! {
                () = tx.closed() => return,
                p = open.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => return,
                },
            };
            let accepted = tokio::select! {
                () = tx.closed() => return,
                a = listener.accept() => a,
            };
            let (tcp, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: wait, go on.
                    eprintln!("ratelimit-counter: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let ready = prepare(tcp, peer);
            let (tx, total) = (tx.clone(), total.clone());
            tokio::spawn(async move {
                if let Some(io) = ready.await {
                    let held = Arc::new(Held {
                        connection: AtomicUsize::new(0),
                        total,
                        connection_max,
                        total_max,
                    });
                    let _ = tx
                        .send(Ok(Conn {
                            io,
                            held,
                            _permit: permit,
                        }))
                        .await;
                }
            });
        }
    });
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// A plain TCP connection, once it has sent a first byte within `within`.
pub async fn first_byte(tcp: TcpStream, within: Duration) -> Option<TcpStream> {
    let mut b = [0u8; 1];
    match tokio::time::timeout(within, tcp.peek(&mut b)).await {
        Ok(Ok(n)) if n > 0 => Some(tcp),
        _ => None,
    }
}

/// The rate-limit service with each call's message bytes counted against
/// its connection's and the counter's most.
#[derive(Clone)]
pub struct Budgeted<S> {
    pub inner: S,
    pub metrics: Arc<Metrics>,
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Budgeted<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> tonic::codegen::Service<http::Request<tonic::body::Body>> for Budgeted<S>
where
    S: tonic::codegen::Service<http::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let held = req.extensions().get::<ConnInfo>().map(|c| c.held.clone());
        let req = match held {
            Some(held) => {
                let metrics = self.metrics.clone();
                req.map(|body| {
                    tonic::body::Body::new(Counted {
                        body,
                        held,
                        mine: 0,
                        metrics,
                    })
                })
            }
            None => req,
        };
        self.inner.call(req)
    }
}

/// A call's body, its bytes counted as held until it is dropped.
struct Counted {
    body: tonic::body::Body,
    held: Arc<Held>,
    mine: usize,
    metrics: Arc<Metrics>,
}

impl http_body::Body for Counted {
    type Data = tonic::codegen::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        let Poll::Ready(Some(Ok(frame))) = polled else {
            return polled;
        };
        let n = frame.data_ref().map_or(0, |d| d.len());
        if n == 0 {
            return Poll::Ready(Some(Ok(frame)));
        }
        let h = self.held.clone();
        let connection = h.connection.fetch_add(n, Ordering::Relaxed) + n;
        let total = h.total.fetch_add(n, Ordering::Relaxed) + n;
        self.mine += n;
        if connection > h.connection_max || total > h.total_max {
            self.metrics
                .limits
                .bytes_refused
                .fetch_add(1, Ordering::Relaxed);
            let why = if connection > h.connection_max {
                format!(
                    "the connection holds {connection} bytes of unfinished messages; at most {} (--max-connection-bytes)",
                    h.connection_max
                )
            } else {
                format!(
                    "the counter holds {total} bytes of unfinished messages; at most {} (--max-total-bytes)",
                    h.total_max
                )
            };
            return Poll::Ready(Some(Err(tonic::Status::resource_exhausted(why))));
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.held.connection.fetch_sub(self.mine, Ordering::Relaxed);
        self.held.total.fetch_sub(self.mine, Ordering::Relaxed);
    }
}

/// Serves `app` (the HTTP port) on the connections of `incoming` until
/// `stop`, then lets the requests under way finish (the caller bounds how
/// long).
pub async fn serve_http<S>(
    mut incoming: S,
    app: axum::Router,
    limits: Limits,
    stop: impl Future<Output = ()> + Send + 'static,
) where
    S: futures_util::Stream<Item = Result<Conn<TcpStream>, std::io::Error>> + Unpin,
{
    use futures_util::StreamExt;
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(16 << 10);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_streams)
        .keep_alive_interval(Some(limits.header_timeout))
        .keep_alive_timeout(limits.header_timeout);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let service = hyper_util::service::TowerToHyperService::new(app);
    tokio::pin!(stop);
    loop {
        let conn = tokio::select! {
            () = &mut stop => break,
            c = incoming.next() => c,
        };
        let Some(Ok(conn)) = conn else {
            break;
        };
        let serving = builder
            .serve_connection_with_upgrades(TokioIo::new(conn), service.clone())
            .into_owned();
        let serving = graceful.watch(serving);
        tokio::spawn(async move {
            let _ = serving.await;
        });
    }
    drop(incoming);
    graceful.shutdown().await;
}

/// Raises the open-file soft limit to the hard limit; the limits after.
pub fn raise_open_files() -> Option<(u64, u64)> {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write `l`, a valid rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
            return None;
        }
        if l.rlim_cur < l.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: l.rlim_max,
                rlim_max: l.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                l = raised;
            }
        }
    }
    Some((l.rlim_cur, l.rlim_max))
}
