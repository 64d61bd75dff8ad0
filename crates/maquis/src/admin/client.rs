//! A small HTTP client for a node's admin endpoint, as used by the `maquis` CLI.
//!
//! `addr` is the endpoint's `host:port` (an `http://` prefix and a trailing `/` are accepted
//! too). Every function opens one connection, sends one request and closes the connection.
//! Connecting (name resolution included) times out after 5 s; [`get_status`] and [`get_metrics`]
//! also give up when the whole request takes more than 30 s, while [`ping`] waits as long as the
//! server takes. An answer other than 200 OK is [`AdminError::Http`].

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::header::{ACCEPT, AUTHORIZATION, HOST, USER_AGENT};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::{AdminError, PingReport, Status};

/// Time allowed for connecting to the endpoint.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Time allowed for a whole `/status` or `/metrics` request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest answer body accepted.
const MAX_BODY: usize = 64 * 1024 * 1024;

/// Fetches `GET /status` from the admin endpoint at `addr` (with its token, if it has one).
pub async fn get_status(addr: &str, token: Option<&str>) -> Result<Status, AdminError> {
    let body = with_timeout(request(addr, token, Method::GET, "/status")).await?;
    Ok(serde_json::from_slice(&body)?)
}

/// Fetches `GET /metrics` (Prometheus text format) from the admin endpoint at `addr`.
pub async fn get_metrics(addr: &str, token: Option<&str>) -> Result<String, AdminError> {
    let body = with_timeout(request(addr, token, Method::GET, "/metrics")).await?;
    String::from_utf8(body.to_vec()).map_err(|e| AdminError::Body(e.to_string()))
}

/// Asks the node at `addr` to ping node `to` (`POST /ping`): `count` calls of its `echo`
/// service with `size`-byte payloads. Waits as long as the server takes.
pub async fn ping(
    addr: &str,
    token: Option<&str>,
    to: &str,
    count: u32,
    size: usize,
) -> Result<PingReport, AdminError> {
    let path = format!("/ping?to={}&count={count}&size={size}", percent_encode(to));
    let body = request(addr, token, Method::POST, &path).await?;
    Ok(serde_json::from_slice(&body)?)
}

async fn with_timeout(
    request: impl std::future::Future<Output = Result<Bytes, AdminError>>,
) -> Result<Bytes, AdminError> {
    tokio::time::timeout(REQUEST_TIMEOUT, request)
        .await
        .map_err(|_| AdminError::Timeout)?
}

/// `host:port` from what the user gave.
fn authority(addr: &str) -> Result<&str, AdminError> {
    let trimmed = addr.trim();
    let rest = trimmed.strip_prefix("http://").unwrap_or(trimmed);
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() || rest.contains(['/', '?', '#', '@']) || rest.contains(char::is_whitespace)
    {
        return Err(AdminError::InvalidAddress(addr.to_owned()));
    }
    Ok(rest)
}

/// Aborts the connection driver when the request is done or abandoned.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Sends one request and returns the body of a 200 answer.
async fn request(
    addr: &str,
    token: Option<&str>,
    method: Method,
    path: &str,
) -> Result<Bytes, AdminError> {
    let authority = authority(addr)?;
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header(HOST, authority)
        .header(ACCEPT, "application/json, text/plain")
        .header(USER_AGENT, "maquis-admin-client");
    if let Some(token) = token {
        builder = builder.header(AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = builder
        .body(Empty::<Bytes>::new())
        .map_err(|_| AdminError::InvalidAddress(addr.to_owned()))?;

    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(authority))
        .await
        .map_err(|_| AdminError::Timeout)??;
    // Only a latency tweak; the request works without it.
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let _driver = AbortOnDrop(tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "admin client: connection error");
        }
    }));

    let response = sender.send_request(request).await?;
    let status = response.status();
    let body = Limited::new(response.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| match e.downcast::<hyper::Error>() {
            Ok(e) => AdminError::Hyper(*e),
            Err(e) => AdminError::Body(e.to_string()),
        })?
        .to_bytes();
    if status != StatusCode::OK {
        return Err(AdminError::Http {
            status: status.as_u16(),
            body: String::from_utf8_lossy(&body).trim_end().to_owned(),
        });
    }
    Ok(body)
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
pub(super) fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
