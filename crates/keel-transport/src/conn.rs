//! The server's accept loop: axum's router served on hyper with the protections a public
//! server needs against clients that open connections and then stall — a deadline for a
//! request's headers, one for its body, one for an idle keep-alive connection, and a cap on
//! the connections open at once ([`ConnectionLimits`]). Shutdown is graceful as with
//! `axum::serve`: no new connection once the signal fires, open ones finish their requests.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderValue, Request, Response, StatusCode};
use axum::response::IntoResponse;
use axum::serve::Listener;
use axum::Router;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tower::ServiceExt;

/// How long a client may take over each part of its conversation with the server, and how
/// many connections may be open at once. The defaults suit a server on the open internet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// From a connection's first byte of a request (or from its opening) to the end of the
    /// request's headers; a connection that has not sent them by then is closed.
    pub header_timeout: Duration,
    /// From the end of a request's headers to the end of its body; a body still arriving then
    /// is answered HTTP 408 and its connection closed.
    pub body_timeout: Duration,
    /// How long a keep-alive connection with no request in progress stays open.
    pub idle_timeout: Duration,
    /// Most connections open at once; further ones wait in the listen queue until one closes
    /// (the kernel refuses them once that queue is full), while open ones are served as usual.
    pub max_connections: usize,
}

impl ConnectionLimits {
    /// 10 s for headers.
    pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
    /// 30 s for a body (1 MiB, the default body limit, at 35 KB/s).
    pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
    /// 60 s idle.
    pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
    /// 10,000 connections.
    pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            header_timeout: Self::DEFAULT_HEADER_TIMEOUT,
            body_timeout: Self::DEFAULT_BODY_TIMEOUT,
            idle_timeout: Self::DEFAULT_IDLE_TIMEOUT,
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// Serve `router` on `listener` under `limits` until `signal` completes, then stop accepting,
/// let every open connection finish its requests, and return (as `axum::serve(..)
/// .with_graceful_shutdown(signal)` does).
pub(crate) async fn serve<L>(
    mut listener: L,
    router: Router,
    limits: ConnectionLimits,
    signal: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()>
where
    L: Listener,
{
    let (signal_tx, signal_rx) = watch::channel(());
    tokio::spawn(async move {
        signal.await;
        drop(signal_rx);
    });
    let (close_tx, close_rx) = watch::channel(());
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    loop {
        // The permit comes first: past the cap, connections wait in the listen queue rather
        // than being accepted and left unserved.
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = signal_tx.closed() => break,
        };
        let (io, _) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = signal_tx.closed() => break,
        };
        let signal_tx = signal_tx.clone();
        let close_rx = close_rx.clone();
        let router = router.clone();
        tokio::spawn(async move {
            serve_connection(io, permit, router, limits, signal_tx).await;
            drop(close_rx);
        });
    }
    drop(close_rx);
    drop(listener);
    close_tx.closed().await;
    Ok(())
}

/// One connection, until it ends, stalls past a deadline, or the server shuts down.
async fn serve_connection<I>(
    io: I,
    permit: OwnedSemaphorePermit,
    router: Router,
    limits: ConnectionLimits,
    signal_tx: watch::Sender<()>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let io = Watched {
        inner: io,
        activity: activity.clone(),
        _permit: permit,
    };
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |request: Request<Incoming>| {
            let busy = InFlight::start(activity.clone());
            let router = router.clone();
            async move {
                let timed_out = Arc::new(AtomicBool::new(false));
                let deadline = Instant::now() + limits.body_timeout;
                let request = request.map(|body| {
                    Body::new(DeadlineBody {
                        inner: body,
                        deadline,
                        sleep: None,
                        timed_out: timed_out.clone(),
                    })
                });
                let response = match router.oneshot(request).await {
                    Ok(response) => response,
                    Err(never) => match never {},
                };
                let response = if timed_out.load(Ordering::Acquire) {
                    body_timeout_response()
                } else {
                    response
                };
                Ok::<_, std::convert::Infallible>(response.map(|body| {
                    Body::new(TrackedBody {
                        inner: body,
                        _busy: busy,
                    })
                }))
            }
        })
    };
    // gRPC is HTTP/2; without it, HTTP/1 only, as `axum::serve` served before.
    #[cfg(feature = "grpc")]
    let builder = {
        let mut builder = Builder::new(TokioExecutor::new());
        builder.http2().enable_connect_protocol();
        builder
    };
    #[cfg(not(feature = "grpc"))]
    let builder = Builder::new(TokioExecutor::new()).http1_only();
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    let mut conn = std::pin::pin!(conn);
    let mut stalled = std::pin::pin!(watchdog(activity, limits));
    let mut shutting_down = std::pin::pin!(signal_tx.closed());
    let mut shutdown_asked = false;
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(error) = result {
                    tracing::trace!(%error, "connection ended with an error");
                }
                return;
            }
            () = stalled.as_mut() => {
                // Dropping the connection closes the socket.
                return;
            }
            () = shutting_down.as_mut(), if !shutdown_asked => {
                shutdown_asked = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// The answer to a request whose body did not arrive in time; the connection closes after it.
fn body_timeout_response() -> Response<Body> {
    let mut response = (
        StatusCode::REQUEST_TIMEOUT,
        "request body not received in time",
    )
        .into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// Where a connection is in its conversation, for the deadlines that apply there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for a request's headers, since this instant (the connection's opening, or the
    /// first byte after an idle spell).
    Head(Instant),
    /// At least one request in progress: no connection deadline (the body has its own).
    Busy,
    /// No request in progress since this instant.
    Idle(Instant),
}

/// What one connection is doing, shared by its IO, its requests and its watchdog.
struct Activity {
    phase: watch::Sender<Phase>,
    in_flight: AtomicUsize,
    /// Whether the client speaks HTTP/2, whose frames (pings, settings) between requests are
    /// not the start of a request's headers.
    http2: AtomicBool,
    /// Whether any byte has arrived yet.
    started: AtomicBool,
}

impl Activity {
    fn new() -> Self {
        Self {
            phase: watch::Sender::new(Phase::Head(Instant::now())),
            in_flight: AtomicUsize::new(0),
            http2: AtomicBool::new(false),
            started: AtomicBool::new(false),
        }
    }

    /// Bytes arrived: on an idle HTTP/1 connection they begin a request's headers.
    fn received(&self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        if !self.started.swap(true, Ordering::AcqRel) && bytes.starts_with(b"PRI ") {
            self.http2.store(true, Ordering::Release);
        }
        if self.http2.load(Ordering::Acquire) {
            return;
        }
        self.phase.send_if_modified(|phase| match phase {
            Phase::Idle(_) => {
                *phase = Phase::Head(Instant::now());
                true
            }
            Phase::Head(_) | Phase::Busy => false,
        });
    }
}

/// A request in progress, from its headers until its response has been sent (or dropped).
struct InFlight(Arc<Activity>);

impl InFlight {
    fn start(activity: Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        activity.phase.send_replace(Phase::Busy);
        Self(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.phase.send_replace(Phase::Idle(Instant::now()));
        }
    }
}

/// Completes when the connection has stalled past the deadline of its phase.
async fn watchdog(activity: Arc<Activity>, limits: ConnectionLimits) {
    let mut phase = activity.phase.subscribe();
    loop {
        let current = *phase.borrow_and_update();
        let deadline = match current {
            Phase::Head(since) => since + limits.header_timeout,
            Phase::Idle(since) => since + limits.idle_timeout,
            Phase::Busy => {
                if phase.changed().await.is_err() {
                    return std::future::pending().await;
                }
                continue;
            }
        };
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => {
                if *phase.borrow() == current {
                    tracing::debug!(?current, "closing a stalled connection");
                    return;
                }
            }
            changed = phase.changed() => {
                if changed.is_err() {
                    return std::future::pending().await;
                }
            }
        }
    }
}

/// The connection's IO, reporting arriving bytes to its [`Activity`], and holding its place
/// under the connection cap for as long as the socket is open (an upgraded WebSocket too).
struct Watched<I> {
    inner: I,
    activity: Arc<Activity>,
    _permit: OwnedSemaphorePermit,
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            this.activity.received(&buf.filled()[before..]);
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A request body that fails once its deadline passes, and says so in `timed_out` so that
/// the answer becomes HTTP 408 whatever the handler made of the failed read.
struct DeadlineBody {
    inner: Incoming,
    deadline: Instant,
    /// Armed at the first read that has to wait: a body read in one go costs no timer.
    sleep: Option<Pin<Box<Sleep>>>,
    timed_out: Arc<AtomicBool>,
}

/// The error a [`DeadlineBody`] fails with.
#[derive(Debug)]
struct BodyTimeout;

impl std::fmt::Display for BodyTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("request body not received in time")
    }
}

impl std::error::Error for BodyTimeout {}

impl hyper::body::Body for DeadlineBody {
    type Data = axum::body::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let deadline = this.deadline;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.as_mut().poll(cx).is_ready() {
            this.timed_out.store(true, Ordering::Release);
            return Poll::Ready(Some(Err(BodyTimeout.into())));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that keeps its request counted as in progress until it has been sent.
struct TrackedBody {
    inner: Body,
    _busy: InFlight,
}

impl hyper::body::Body for TrackedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
