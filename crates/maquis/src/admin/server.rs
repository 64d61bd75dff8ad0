//! The admin HTTP server.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::{JoinError, JoinSet};

use super::{
    render_metrics, AdminSource, MAX_ADMIN_CONNECTIONS, MAX_ADMIN_CONNECTIONS_PER_SOURCE,
    MAX_PING_BYTES_IN_FLIGHT, MAX_PING_COUNT, MAX_PING_SIZE,
};
use crate::per_source::PerSource;

/// A connection that does not deliver a complete request head within this time (including an
/// idle keep-alive connection between requests) is closed, so it gives its permit back.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// After shutdown, connections get this long to finish the request they are serving.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Pause after an accept error that is not about one connection (e.g. out of file descriptors).
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

const JSON: &str = "application/json";
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4";
const PLAIN_TEXT: &str = "text/plain; charset=utf-8";

/// Serves the admin HTTP endpoint on `listener` until `shutdown` resolves. With a `token`, every
/// request must carry `Authorization: Bearer <token>`; others are answered 401.
///
/// Routes:
/// - `GET /status`: [`Status`](super::Status) as JSON (`application/json`);
/// - `GET /metrics`: Prometheus text format (`text/plain; version=0.0.4`), see
///   [`render_metrics`];
/// - `GET` or `POST /ping?to=NAME&count=N&size=BYTES`: runs [`AdminSource::ping`] and answers
///   the [`PingReport`](super::PingReport) as JSON. All three parameters are required;
///   `count` must be in `1..=MAX_PING_COUNT` and `size` in `0..=MAX_PING_SIZE`. A missing,
///   repeated, malformed or out-of-range parameter is answered with 400 and a plain-text reason.
///   Unknown parameters are ignored.
/// - any other path: 404; a method other than `GET` or `POST`: 405 (as is `POST` on `/status`
///   and `/metrics`), with an `Allow` header.
///
/// Request bodies are never read (no route needs one); a connection whose request had a body is
/// closed after the answer.
///
/// At most [`MAX_ADMIN_CONNECTIONS`] connections are served at once (a tokio `Semaphore`): while
/// all permits are taken, no further connection is accepted, so an extra client waits (its
/// connection sits in the listener's backlog) until a served connection closes. One IP address
/// holds at most [`MAX_ADMIN_CONNECTIONS_PER_SOURCE`] of them (more from it are closed at once),
/// so a source of idle connections cannot lock the others out. A connection that does not send
/// a complete request head within 10 s, idle keep-alive connections included, is closed.
/// `/ping` requests together hold at most [`MAX_PING_BYTES_IN_FLIGHT`] payload bytes; one
/// that does not fit is answered 503 at once.
///
/// Errors on one connection (malformed requests, resets, timeouts, even a panic in the handler)
/// are logged with `tracing` and never stop the server; errors from `accept` are logged too,
/// followed by a short pause when they are not about a single connection.
///
/// When `shutdown` resolves, the listener is closed, open connections finish the request they are
/// serving (idle ones close at once) for up to 5 s, then the remaining ones are aborted, and the
/// function returns `Ok(())`. Dropping the returned future instead aborts every connection at once.
pub async fn serve(
    listener: TcpListener,
    source: Arc<dyn AdminSource>,
    token: Option<String>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let token: Option<Arc<str>> = token.map(Into::into);
    let local = listener.local_addr().ok();
    tracing::debug!(?local, "admin endpoint serving");
    let permits = Arc::new(Semaphore::new(MAX_ADMIN_CONNECTIONS));
    let sources = Arc::new(PerSource::default());
    let pings = Arc::new(Semaphore::new(MAX_PING_BYTES_IN_FLIGHT));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns: JoinSet<()> = JoinSet::new();
    tokio::pin!(shutdown);

    'accept: loop {
        while let Some(done) = conns.try_join_next() {
            log_join(done);
        }
        let permit = tokio::select! {
            () = &mut shutdown => break 'accept,
            permit = Arc::clone(&permits).acquire_owned() => match permit {
                Ok(permit) => permit,
                // The semaphore is never closed; treat it as a shutdown if it ever is.
                Err(_) => break 'accept,
            },
        };
        let accepted = tokio::select! {
            () = &mut shutdown => break 'accept,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) if is_connection_error(&e) => {
                tracing::debug!(error = %e, "admin endpoint: accept failed for one connection");
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "admin endpoint: accept failed; retrying shortly");
                tokio::select! {
                    () = &mut shutdown => break 'accept,
                    () = tokio::time::sleep(ACCEPT_ERROR_BACKOFF) => continue,
                }
            }
        };
        let Some(slot) = sources.take(peer.ip(), MAX_ADMIN_CONNECTIONS_PER_SOURCE) else {
            tracing::debug!(%peer, "admin endpoint: too many connections from this address");
            drop(stream);
            continue;
        };
        let source = Arc::clone(&source);
        let stop = stop_rx.clone();
        let pings = Arc::clone(&pings);
        let token = token.clone();
        conns.spawn(async move {
            let _held = (permit, slot);
            serve_connection(stream, peer, source, pings, token, stop).await;
        });
    }

    drop(listener);
    tracing::debug!(?local, open = conns.len(), "admin endpoint shutting down");
    // Receivers only see this if they still exist; an error just means none do.
    let _ = stop_tx.send(true);
    let drain = async {
        while let Some(done) = conns.join_next().await {
            log_join(done);
        }
    };
    if tokio::time::timeout(SHUTDOWN_GRACE, drain).await.is_err() {
        tracing::debug!(
            open = conns.len(),
            "admin endpoint: aborting connections still busy after shutdown grace period"
        );
        conns.abort_all();
        while conns.join_next().await.is_some() {}
    }
    Ok(())
}

/// Errors from `accept` that concern one connection only; the next accept may well succeed.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
            | io::ErrorKind::TimedOut
    )
}

fn log_join(done: Result<(), JoinError>) {
    if let Err(e) = done {
        if e.is_panic() {
            tracing::error!("admin endpoint: connection task panicked");
        }
    }
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    source: Arc<dyn AdminSource>,
    pings: Arc<Semaphore>,
    token: Option<Arc<str>>,
    mut stop: watch::Receiver<bool>,
) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "admin endpoint: set_nodelay failed");
    }
    let service = service_fn(move |req| {
        let source = Arc::clone(&source);
        let pings = Arc::clone(&pings);
        let token = token.clone();
        async move {
            if let Some(token) = token {
                if let Some(why) = authorized(&req, &token) {
                    return Ok::<_, Infallible>(unauthorized(why));
                }
            }
            Ok::<_, Infallible>(handle(req, source, pings).await)
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let mut stopping = false;
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    if e.is_parse() || e.is_timeout() || e.is_incomplete_message() {
                        tracing::debug!(%peer, error = %e, "admin endpoint: bad or incomplete request");
                    } else {
                        tracing::warn!(%peer, error = %e, "admin endpoint: connection error");
                    }
                }
                break;
            }
            _ = stop.wait_for(|stop| *stop), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

type Answer = Response<Full<Bytes>>;

/// `None` if the request carries `Authorization: Bearer <token>` (the scheme in any case, the
/// token compared in constant time), else why not.
fn authorized(req: &Request<Incoming>, token: &str) -> Option<&'static str> {
    let Some(value) = req.headers().get(AUTHORIZATION).map(|v| v.as_bytes()) else {
        return Some("this endpoint needs its token: Authorization: Bearer <token> (maquis status and ping: --token or MAQUIS_ADMIN_TOKEN)");
    };
    let given = match value.split_at_checked(7) {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case(b"bearer ") => rest,
        _ => return Some("the Authorization header is not `Bearer <token>`"),
    };
    let want = token.as_bytes();
    let same =
        given.len() == want.len() && given.iter().zip(want).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0;
    (!same).then_some("wrong token")
}

fn unauthorized(why: &'static str) -> Answer {
    let mut response = text(StatusCode::UNAUTHORIZED, why);
    response
        .headers_mut()
        .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

fn answer(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Answer {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn text(status: StatusCode, reason: impl Into<String>) -> Answer {
    let mut body = reason.into();
    body.push('\n');
    answer(status, PLAIN_TEXT, body)
}

fn method_not_allowed(allow: &'static str) -> Answer {
    let mut response = text(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("method not allowed; allowed: {allow}"),
    );
    response
        .headers_mut()
        .insert(ALLOW, HeaderValue::from_static(allow));
    response
}

fn json<T: serde::Serialize>(value: &T) -> Answer {
    match serde_json::to_vec(value) {
        Ok(body) => answer(StatusCode::OK, JSON, body),
        Err(e) => {
            tracing::error!(error = %e, "admin endpoint: cannot serialize answer");
            text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot serialize answer: {e}"),
            )
        }
    }
}

async fn handle(
    req: Request<Incoming>,
    source: Arc<dyn AdminSource>,
    pings: Arc<Semaphore>,
) -> Answer {
    let method = req.method().clone();
    if method != Method::GET && method != Method::POST {
        return method_not_allowed("GET, POST");
    }
    match req.uri().path() {
        "/status" if method == Method::GET => json(&source.status()),
        "/metrics" if method == Method::GET => answer(
            StatusCode::OK,
            PROMETHEUS_TEXT,
            render_metrics(&source.status()),
        ),
        "/status" | "/metrics" => method_not_allowed("GET"),
        "/ping" => {
            let params = parse_ping_query(req.uri().query());
            // The body is never read; let hyper know early.
            drop(req);
            let p = match params {
                Ok(p) => p,
                Err(reason) => return text(StatusCode::BAD_REQUEST, reason),
            };
            // Its payload's bytes, held while it runs (a size of 0 still counts one).
            let bytes = u32::try_from(p.size.max(1)).unwrap_or(u32::MAX);
            let Ok(_held) = pings.try_acquire_many(bytes) else {
                return text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "too many pings in progress (at most {MAX_PING_BYTES_IN_FLIGHT} payload \
                         bytes together); try again"
                    ),
                );
            };
            json(&source.ping(p.to, p.count, p.size).await)
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found; try /status, /metrics or /ping",
        ),
    }
}

/// Validated parameters of `/ping`.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct PingParams {
    pub(super) to: String,
    pub(super) count: u32,
    pub(super) size: usize,
}

/// Parses and validates the query string of `/ping`; the error is a reason for people.
pub(super) fn parse_ping_query(query: Option<&str>) -> Result<PingParams, String> {
    let mut to = None;
    let mut count = None;
    let mut size = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let key = percent_decode(key).ok_or("malformed query string")?;
        let value = percent_decode(value).ok_or("malformed query string")?;
        let slot = match key.as_str() {
            "to" => &mut to,
            "count" => &mut count,
            "size" => &mut size,
            _ => continue,
        };
        if slot.is_some() {
            return Err(format!("parameter `{key}` given more than once"));
        }
        *slot = Some(value);
    }

    let to = to.ok_or("missing parameter `to` (the node to ping)")?;
    if to.is_empty() {
        return Err("parameter `to` must not be empty".into());
    }
    let count = count.ok_or("missing parameter `count`")?;
    let count = match count.parse::<u32>() {
        Ok(n) if (1..=MAX_PING_COUNT).contains(&n) => n,
        _ => {
            return Err(format!(
                "parameter `count` must be an integer from 1 to {MAX_PING_COUNT}, got {:?}",
                shorten(&count)
            ))
        }
    };
    let size = size.ok_or("missing parameter `size` (payload bytes)")?;
    let size = match size.parse::<usize>() {
        Ok(n) if n <= MAX_PING_SIZE => n,
        _ => {
            return Err(format!(
                "parameter `size` must be an integer from 0 to {MAX_PING_SIZE} (bytes), got {:?}",
                shorten(&size)
            ))
        }
    };
    Ok(PingParams { to, count, size })
}

/// At most 40 characters of `s`, so that reasons stay short.
fn shorten(s: &str) -> String {
    const MAX: usize = 40;
    if s.chars().count() <= MAX {
        s.to_owned()
    } else {
        let mut short: String = s.chars().take(MAX).collect();
        short.push('…');
        short
    }
}

/// Decodes `%XX` escapes and `+` (as a space); `None` for a bad escape or invalid UTF-8.
pub(super) fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hi = hex_value(*bytes.get(i + 1)?)?;
                let lo = hex_value(*bytes.get(i + 2)?)?;
                out.push(hi << 4 | lo);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}
