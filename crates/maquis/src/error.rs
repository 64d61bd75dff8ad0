//! Error types of the public API.

use thiserror::Error;

use crate::wire::WireError;

/// Why a message could not be sent.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SendError {
    /// The lane's outbound queue (or the local mailbox) is full; `try_send` never waits.
    #[error("backpressure: the {0} is full")]
    Backpressure(&'static str),
    /// The destination node is not a member, not connected, or was declared down.
    #[error("node {0} is unreachable")]
    Unreachable(String),
    /// The ref points at an older incarnation of a node that has since restarted.
    #[error("stale ref: node {node} restarted (ref incarnation {ref_incarnation}, now {current})")]
    StaleIncarnation {
        /// The node's name.
        node: String,
        /// The incarnation the ref was made for.
        ref_incarnation: u64,
        /// The incarnation the node has now.
        current: u64,
    },
    /// The actor does not exist (stopped, or never existed): a local target, or the answer to
    /// an acknowledged send.
    #[error("no such actor")]
    NoProc,
    /// The local actor exists but takes another message type.
    #[error("the actor takes another message type")]
    TypeMismatch,
    /// The message does not fit in one frame.
    #[error("message too large: {len} bytes, the frame limit is {max}")]
    TooLarge {
        /// Encoded size.
        len: usize,
        /// The configured `transport.max_frame_bytes`.
        max: usize,
    },
    /// The message could not be encoded.
    #[error("encode failed: {0}")]
    Encode(String),
    /// The ref was decoded outside a node, or its node has stopped.
    #[error("the node behind this ref has stopped (or the ref was decoded outside a node)")]
    NodeStopped,
    /// An acknowledged send got no acknowledgement within its `give_up_after`: the message
    /// may or may not have been handled.
    #[error("no acknowledgement within {after:?}: the message may or may not have been handled")]
    Unacknowledged {
        /// The send's `give_up_after`.
        after: std::time::Duration,
    },
}

/// Why a broadcast could not be sent.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum BroadcastError {
    /// The message could not be encoded.
    #[error("encode failed: {0}")]
    Encode(String),
    /// The message does not fit in one frame.
    #[error("message too large: {len} bytes, the broadcast limit is {max}")]
    TooLarge {
        /// Encoded size.
        len: usize,
        /// The limit (`transport.max_frame_bytes` less room for the protocol envelope).
        max: usize,
    },
    /// Topics starting with `$maquis/` belong to the runtime.
    #[error("the topic {0:?} is reserved")]
    ReservedTopic(String),
    /// The node has stopped.
    #[error("the node has stopped")]
    Stopped,
}

/// Why a request/response `call` failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The request could not be sent.
    #[error("send failed: {0}")]
    Send(#[from] SendError),
    /// No reply came within the timeout. A reply that arrives later is dropped.
    #[error("call timed out")]
    Timeout,
    /// The target actor does not exist on its node.
    #[error("no such actor on the remote node")]
    NoProc,
    /// No reply will come: the target's node went down or left, or this node stopped. (A
    /// responder that drops its `ReplyTo` without answering is seen as a timeout.)
    #[error("no reply: {0}")]
    NoReply(String),
    /// The reply could not be decoded into the expected type.
    #[error("reply decode failed: {0}")]
    Decode(String),
}

/// Why a node could not start.
#[derive(Debug, Error)]
pub enum StartError {
    /// The configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(#[from] crate::config::ConfigError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The admin address could not be bound.
    #[error("cannot serve admin on {addr}: {source}")]
    Admin {
        /// The address.
        addr: std::net::SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Why a join did not complete.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum JoinError {
    /// The contact could not be reached or refused the handshake.
    #[error("cannot join {addr}: {reason}")]
    Failed {
        /// The contact's address.
        addr: std::net::SocketAddr,
        /// What went wrong.
        reason: String,
    },
    /// The contact did not connect within the timeout.
    #[error("join timed out")]
    Timeout,
    /// The node is shutting down.
    #[error("the node has stopped")]
    Stopped,
}

/// Why a name could not be registered.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RegisterError {
    /// Another actor holds the name.
    #[error("the name {0:?} is taken")]
    Taken(String),
    /// The actor is not local or has stopped.
    #[error("the actor is not alive on this node")]
    NotLocal,
    /// Names starting with `$maquis/` are the runtime's own.
    #[error("the name {0:?} is reserved (names starting with $maquis/ are the runtime's)")]
    Reserved(String),
}

/// Why two actors could not be linked, or an actor could not be stopped.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum LinkError {
    /// The actor that links (or is stopped) must be an actor of this node.
    #[error("the actor is not on this node")]
    NotLocal,
    /// One of the actors does not exist (a remote one that does not is reported later, by
    /// stopping the local end with `DownReason::Linked`).
    #[error("no such actor")]
    NoProc,
    /// The other actor's node is not reachable now.
    #[error("the other actor's node is not reachable")]
    NodeDown,
    /// One of the actors already has as many watchers and links as a node keeps for one actor.
    #[error("too many watchers and links on one actor")]
    WatcherLimit,
}

/// Why a connection was closed during or after its handshake.
#[derive(Debug, Error)]
pub(crate) enum ConnError {
    /// I/O on the socket failed.
    #[error("io: {0}")]
    Io(std::io::Error),
    /// The TLS handshake failed, or the other end's certificate does not name the node it
    /// says it is.
    #[error("TLS: {reason}")]
    Tls {
        /// What went wrong.
        reason: String,
        /// Whether this node refused the other's TLS (its certificate, its name, bytes that
        /// are not TLS), rather than the other refusing this node's (an alert received).
        by_us: bool,
    },
    /// Bad bytes on the wire.
    #[error("wire: {0}")]
    Wire(#[from] WireError),
    /// The peer failed authentication.
    #[error("authentication failed: {0}")]
    Auth(String),
    /// The peer refused the connection.
    #[error("rejected by peer: {0}")]
    Rejected(String),
    /// The peer keeps a connection of its own for this lane (the tie-break chose it).
    #[error("superseded by {0}'s own connection")]
    Superseded(crate::id::NodeId),
    /// The two nodes' configurations cannot work together (e.g. different channel tables).
    #[error("incompatible configuration: {0}")]
    Incompatible(String),
    /// The peer sent something out of order.
    #[error("protocol: {0}")]
    Protocol(String),
    /// The handshake took too long.
    #[error("handshake timed out")]
    Timeout,
}

impl ConnError {
    /// Whether the other side refused on purpose (a wrong cookie, an incompatible
    /// configuration, a refusal with a reason) rather than the network failing: a
    /// configuration error someone should hear of.
    pub(crate) fn is_refusal(&self) -> bool {
        matches!(
            self,
            ConnError::Auth(_)
                | ConnError::Incompatible(_)
                | ConnError::Rejected(_)
                | ConnError::Tls { .. }
        )
    }

    /// Whether a failed dial is evidence that the peer is down: its address refused the
    /// connection (nothing listens there) or cannot be reached. A timeout, a handshake the
    /// peer broke off (a busy node refuses handshakes beyond its limit), a refusal on purpose
    /// or a lack of this node's own resources (file descriptors, ports) is not: the peer
    /// answered, or may be alive and only slow.
    pub(crate) fn is_evidence_of_down(&self) -> bool {
        let ConnError::Io(e) = self else {
            return false;
        };
        e.kind() == std::io::ErrorKind::ConnectionRefused
            || matches!(
                e.raw_os_error(),
                Some(libc::EHOSTUNREACH | libc::ENETUNREACH | libc::EHOSTDOWN)
            )
    }

    /// Whether this node refused the connection it dialed (the acceptor's certificate or
    /// name), rather than the acceptor refusing it.
    pub(crate) fn refused_here(&self) -> bool {
        matches!(self, ConnError::Tls { by_us: true, .. })
    }
}

impl From<std::io::Error> for ConnError {
    /// An I/O error, or a TLS error that a TLS stream reports as one.
    fn from(e: std::io::Error) -> Self {
        match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
            Some(tls) => ConnError::Tls {
                reason: crate::tls::describe(tls),
                by_us: !matches!(tls, rustls::Error::AlertReceived(_)),
            },
            None => ConnError::Io(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ConnError;

    #[test]
    fn only_a_refused_or_unreachable_address_is_evidence_that_a_peer_is_down() {
        let io = |e: std::io::Error| ConnError::Io(e);
        // A real refusal: nothing listens on a port this test just freed.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap();
        let refused = std::net::TcpStream::connect(port).unwrap_err();
        assert!(io(refused).is_evidence_of_down());
        assert!(io(std::io::Error::from_raw_os_error(libc::EHOSTUNREACH)).is_evidence_of_down());
        for not in [
            ConnError::Timeout,
            io(std::io::Error::from_raw_os_error(libc::EMFILE)),
            io(std::io::Error::from_raw_os_error(libc::EADDRNOTAVAIL)),
            io(std::io::ErrorKind::TimedOut.into()),
            io(std::io::ErrorKind::UnexpectedEof.into()),
            io(std::io::ErrorKind::ConnectionReset.into()),
            ConnError::Rejected("too many handshakes".into()),
            ConnError::Auth("bad cookie".into()),
        ] {
            assert!(!not.is_evidence_of_down(), "{not}");
        }
    }
}
