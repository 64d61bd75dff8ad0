//! The built-in echo service every node runs, registered as `echo`: it sends the payload of
//! each request back to the caller.

use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::Node;
use crate::actor::{ActorRef, ReplyTo};
use crate::dispatch::SendOpts;
use crate::error::{CallError, SendError};
use crate::payload::Payload;

/// The name the echo service is registered under.
pub const ECHO: &str = "echo";

/// A request to the echo service. Its payload and the reply's are [`Payload`]s on the wire: a
/// large one is neither copied into the encoded message nor out of the received frame.
#[derive(Debug, Serialize, Deserialize)]
pub struct Echo {
    /// Bytes to send back.
    #[serde(with = "crate::payload::shared")]
    pub payload: Bytes,
    /// Where the reply goes.
    pub reply: ReplyTo<Payload>,
}

pub(crate) fn spawn_echo(node: &Node) -> ActorRef<Echo> {
    let echo = node.spawn_fn(|mut inbox: super::Inbox<Echo>| async move {
        while let Some(Echo { payload, reply }) = inbox.recv().await {
            if let Err(e) = reply.send(Payload::new(payload)).await {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::NodeId;

    /// A reply address as one decoded from another node's request.
    fn reply() -> ReplyTo<Payload> {
        let node = NodeId::new("caller", "127.0.0.1:1".parse().expect("address"), 1);
        let wire = (node, 1u64, 0u64, None::<String>, None::<u64>, false);
        postcard::from_bytes(&postcard::to_allocvec(&wire).expect("encodes")).expect("decodes")
    }

    /// A large echo payload is written from its own buffer and read as a slice of the frame
    /// (a copy of megabytes each way held a worker thread for milliseconds).
    #[test]
    fn a_large_payload_is_neither_copied_in_nor_out() {
        let payload = Bytes::from(vec![7u8; 256 * 1024]);
        let echo = Echo {
            payload: payload.clone(),
            reply: reply(),
        };
        let body = crate::slab::encode(&echo).expect("encodes");
        assert!(
            body.bufs().iter().any(|b| b.as_ptr() == payload.as_ptr()),
            "the payload is lent to the encoded message"
        );
        let frame: Bytes = body.bufs().concat().into();
        let back: Echo =
            crate::payload::with_source(&frame, || postcard::from_bytes(&frame).expect("decodes"));
        assert_eq!(back.payload, payload);
        let inside = frame.as_ptr_range();
        assert!(
            inside.contains(&back.payload.as_ptr()),
            "the decoded payload is a slice of the frame"
        );
        back.reply.forget();
        echo.reply.forget();
    }
}
