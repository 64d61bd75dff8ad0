//! The built-in echo service every node runs, registered as `echo`: it sends the payload of
//! each request back to the caller.

use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::Node;
use crate::actor::{ActorRef, ReplyTo};
use crate::dispatch::SendOpts;
use crate::error::{CallError, SendError};

/// The name the echo service is registered under.
pub const ECHO: &str = "echo";

/// A request to the echo service.
#[derive(Debug, Serialize, Deserialize)]
pub struct Echo {
    /// Bytes to send back.
    pub payload: Bytes,
    /// Where the reply goes.
    pub reply: ReplyTo<Bytes>,
}

pub(crate) fn spawn_echo(node: &Node) -> ActorRef<Echo> {
    let echo = node.spawn_fn(|mut inbox: super::Inbox<Echo>| async move {
        while let Some(Echo { payload, reply }) = inbox.recv().await {
            if let Err(e) = reply.send(payload).await {
                tracing::debug!(error = %e, "echo reply not sent");
            }
        }
    });
    if let Err(e) = node.register(ECHO, &echo) {
        tracing::error!(error = %e, "cannot register the echo service");
    }
    echo
}

/// Calls the echo service on member `to` once and returns the round-trip time.
pub async fn echo_once(
    node: &Node,
    to: &str,
    payload: Bytes,
    timeout: Duration,
    opts: &SendOpts,
) -> Result<Duration, CallError> {
    let target: ActorRef<Echo> = node
        .remote(to, ECHO)
        .ok_or_else(|| CallError::Send(SendError::Unreachable(to.to_string())))?;
    let len = payload.len();
    let start = Instant::now();
    let back = target
        .call_with(|reply| Echo { payload, reply }, timeout, opts)
        .await?;
    if back.len() != len {
        return Err(CallError::Decode(format!(
            "echo returned {} bytes, sent {len}",
            back.len()
        )));
    }
    Ok(start.elapsed())
}
