//! The connection handshake: its messages, their framing, and the cookie proofs.
//!
//! ```text
//! dialer                                   acceptor
//!   Hello { magic, version, node, lane, nonce, channels, max_frame } ->
//!                    <- Challenge { node, nonce, max_frame }   (or Rejected)
//!   Response { proof } ->
//!                    <- Accepted { proof }                     (or Rejected)
//! ```
//!
//! Both sides prove they know the cluster cookie with an HMAC-SHA256, keyed by the cookie, over
//! a role label and the whole transcript (both identities, the lane, both nonces and both
//! frame limits). The cookie itself never travels. The dialer proves first: the acceptor sends
//! nothing derived from the cookie before the dialer's proof has checked, so a connection to a
//! node gives no one a value to test guesses of the cookie against offline (the dialer's proof
//! goes only to a node it chose to dial). Each message is framed as
//! `[u32 BE length][postcard]`, at most [`MAX_HANDSHAKE_FRAME`] bytes.
//!
//! Each side announces the largest frame it accepts (`max_frame`); a node sends a peer nothing
//! larger than the peer's limit, so a message too large for its receiver fails at its sender.

use super::{decode_exact, peek_len, split_frame, StreamDecoder, WireError, MIN_BUFFER};
use crate::id::{LaneId, NodeId};
use bytes::{BufMut, BytesMut};
use hmac::{Hmac, Mac};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// The magic bytes opening every `Hello`.
pub const MAGIC: [u8; 4] = *b"MAQS";
/// The protocol version this node speaks.
pub const VERSION: u16 = 9;
/// The bound on one handshake message (its length field excluded): 16 KiB.
pub const MAX_HANDSHAKE_FRAME: usize = 16 * 1024;

/// A random per-connection challenge.
pub type Nonce = [u8; 32];
/// An HMAC-SHA256 proof of knowledge of the cookie.
pub type Proof = [u8; 32];

/// Label of the acceptor's proof: keeps it from being replayed as a dialer's proof.
const ACCEPTOR_LABEL: &[u8] = b"maquis-acceptor-v3";
/// Label of the dialer's proof.
const DIALER_LABEL: &[u8] = b"maquis-dialer-v3";

type HmacSha256 = Hmac<Sha256>;

/// A handshake message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HandshakeMsg {
    /// Dialer → acceptor: who is dialing, which lane, and a fresh nonce.
    Hello {
        /// Must be [`MAGIC`].
        magic: [u8; 4],
        /// The dialer's protocol version.
        version: u16,
        /// The dialer's identity.
        node: NodeId,
        /// The lane this connection is for.
        lane: LaneId,
        /// The dialer's nonce.
        nonce: Nonce,
        /// The dialer's channel table, (name, parallelism) in lane order; both ends must agree.
        channels: Vec<(String, u16)>,
        /// The largest frame the dialer accepts, in bytes.
        max_frame: u64,
    },
    /// Acceptor → dialer: its identity, its nonce and its frame limit; nothing derived from the
    /// cookie (the dialer proves first).
    Challenge {
        /// The acceptor's identity.
        node: NodeId,
        /// The acceptor's nonce.
        nonce: Nonce,
        /// The largest frame the acceptor accepts, in bytes.
        max_frame: u64,
    },
    /// Dialer → acceptor: the dialer's proof.
    Response {
        /// See [`Transcript::dialer_proof`].
        proof: Proof,
    },
    /// Acceptor → dialer: the lane is established, and the acceptor's proof that it knows the
    /// cookie too (the dialer drops the connection if it does not check).
    Accepted {
        /// See [`Transcript::acceptor_proof`].
        proof: Proof,
    },
    /// Either side: refused, with a code the other side acts on and a human-readable detail.
    Rejected {
        /// Why, as a code.
        code: RejectCode,
        /// Why, in words.
        detail: String,
        /// The acceptor's proof, when it refuses a dialer it has authenticated (a lane decision
        /// such as [`RejectCode::Superseded`]): the dialer can then trust who refused it.
        proof: Option<Proof>,
    },
}

/// Why a handshake was refused: the code travels in [`HandshakeMsg::Rejected`], so the dialer
/// knows what to do (a superseded lane is not an error, an incompatible peer is not retried).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
pub enum RejectCode {
    /// The `Hello` carried other magic bytes or another protocol version.
    #[error("unsupported protocol version")]
    Version,
    /// The dialer's proof did not check: it does not know the cookie.
    #[error("authentication failed")]
    Auth,
    /// The two nodes' configurations cannot work together (different channel tables).
    #[error("incompatible configuration")]
    Incompatible,
    /// The dialer has the acceptor's own name.
    #[error("a node of the same name")]
    SameName,
    /// The dialer asked for a lane the acceptor does not have.
    #[error("unknown lane")]
    UnknownLane,
    /// The acceptor keeps a connection of its own for this lane (the tie-break chose it).
    #[error("superseded")]
    Superseded,
    /// The acceptor refuses for another reason (it is shutting down, the dialer is an older
    /// incarnation than one it knows).
    #[error("refused")]
    Refused,
    /// Another node of the dialer's name, at another address, is connected to the acceptor:
    /// two nodes may not share a name.
    #[error("a node of that name is already in the cluster")]
    DuplicateName,
}

/// A fresh random nonce from the thread-local cryptographically secure generator.
pub fn new_nonce() -> Nonce {
    let mut nonce = [0; 32];
    rand::thread_rng().fill_bytes(&mut nonce);
    nonce
}

/// What both proofs of one handshake are bound to: both identities, the lane, both nonces and
/// both frame limits, as each side saw them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Transcript {
    /// The dialing node.
    pub dialer: NodeId,
    /// The accepting node.
    pub acceptor: NodeId,
    /// The lane the connection is for.
    pub lane: LaneId,
    /// The dialer's nonce.
    pub dialer_nonce: Nonce,
    /// The acceptor's nonce.
    pub acceptor_nonce: Nonce,
    /// The dialer's frame limit.
    pub dialer_max_frame: u64,
    /// The acceptor's frame limit.
    pub acceptor_max_frame: u64,
}

impl Transcript {
    /// The HMAC of `label` followed by the postcard encoding of the transcript.
    fn mac(&self, label: &[u8], cookie: &[u8]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(cookie).expect("HMAC accepts keys of any length");
        mac.update(label);
        // Strings, socket addresses, integers and byte arrays always serialize with postcard.
        let bytes = postcard::to_allocvec(self).expect("a handshake transcript always serializes");
        mac.update(&bytes);
        mac
    }

    /// The dialer's proof that it knows `cookie`.
    pub fn dialer_proof(&self, cookie: &[u8]) -> Proof {
        self.mac(DIALER_LABEL, cookie)
            .finalize()
            .into_bytes()
            .into()
    }

    /// The acceptor's proof that it knows `cookie`.
    pub fn acceptor_proof(&self, cookie: &[u8]) -> Proof {
        self.mac(ACCEPTOR_LABEL, cookie)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Checks, in constant time, a dialer's proof received by the acceptor.
    pub fn verify_dialer(&self, cookie: &[u8], proof: &Proof) -> bool {
        self.mac(DIALER_LABEL, cookie).verify_slice(proof).is_ok()
    }

    /// Checks, in constant time, an acceptor's proof received by the dialer.
    pub fn verify_acceptor(&self, cookie: &[u8], proof: &Proof) -> bool {
        self.mac(ACCEPTOR_LABEL, cookie).verify_slice(proof).is_ok()
    }
}

/// Checks a `Hello`'s magic bytes and protocol version.
pub fn check_hello_version(magic: &[u8; 4], version: u16) -> Result<(), WireError> {
    if *magic != MAGIC {
        return Err(WireError::BadMagic { got: *magic });
    }
    if version != VERSION {
        return Err(WireError::BadVersion {
            got: version,
            want: VERSION,
        });
    }
    Ok(())
}

/// Frames a handshake message as `[u32 BE length][postcard]`; fails with
/// [`WireError::FrameTooLarge`] if the encoding exceeds [`MAX_HANDSHAKE_FRAME`].
pub fn encode_handshake(msg: &HandshakeMsg) -> Result<BytesMut, WireError> {
    let body = postcard::to_allocvec(msg).map_err(|err| WireError::Encode(err.to_string()))?;
    if body.len() > MAX_HANDSHAKE_FRAME {
        return Err(WireError::FrameTooLarge {
            len: body.len(),
            max: MAX_HANDSHAKE_FRAME,
        });
    }
    let mut out = BytesMut::with_capacity(4 + body.len());
    // `body.len() <= MAX_HANDSHAKE_FRAME`, so the cast is exact.
    out.put_u32(body.len() as u32);
    out.extend_from_slice(&body);
    Ok(out)
}

/// Decodes handshake messages from a byte stream; a [`StreamDecoder`], which the runtime wraps as a codec for `FramedRead`.
///
/// A message longer than [`MAX_HANDSHAKE_FRAME`] is refused as soon as its length field
/// arrives, before any memory is reserved for it.
#[derive(Clone, Copy, Debug, Default)]
pub struct HandshakeDecoder;

impl HandshakeDecoder {
    /// A handshake decoder.
    pub fn new() -> Self {
        HandshakeDecoder
    }
}

impl StreamDecoder for HandshakeDecoder {
    type Item = HandshakeMsg;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<HandshakeMsg>, WireError> {
        let Some(len) = peek_len(src) else {
            return Ok(None);
        };
        if len > MAX_HANDSHAKE_FRAME {
            return Err(WireError::FrameTooLarge {
                len,
                max: MAX_HANDSHAKE_FRAME,
            });
        }
        match split_frame(src, len, MAX_HANDSHAKE_FRAME, MIN_BUFFER) {
            None => Ok(None),
            Some(frame) => decode_exact(&frame[4..]).map(Some),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::testing::feed;
    use proptest::prelude::*;
    use std::net::{IpAddr, SocketAddr};

    fn transcript() -> Transcript {
        Transcript {
            dialer: NodeId::new("a", "127.0.0.1:4000".parse().unwrap(), 1),
            acceptor: NodeId::new("b", "127.0.0.1:4001".parse().unwrap(), 2),
            lane: LaneId::new("default", 0),
            dialer_nonce: new_nonce(),
            acceptor_nonce: new_nonce(),
            dialer_max_frame: 1 << 20,
            acceptor_max_frame: 1 << 25,
        }
    }

    const COOKIE: &[u8] = b"secret cookie";

    #[test]
    fn right_cookie_verifies() {
        let t = transcript();
        assert!(t.verify_acceptor(COOKIE, &t.acceptor_proof(COOKIE)));
        assert!(t.verify_dialer(COOKIE, &t.dialer_proof(COOKIE)));
    }

    #[test]
    fn wrong_cookie_fails() {
        let t = transcript();
        assert!(!t.verify_acceptor(COOKIE, &t.acceptor_proof(b"other cookie")));
        assert!(!t.verify_dialer(COOKIE, &t.dialer_proof(b"other cookie")));
        assert!(!t.verify_dialer(b"", &t.dialer_proof(COOKIE)));
    }

    #[test]
    fn swapped_roles_fail() {
        let t = transcript();
        assert_ne!(t.acceptor_proof(COOKIE), t.dialer_proof(COOKIE));
        assert!(!t.verify_dialer(COOKIE, &t.acceptor_proof(COOKIE)));
        assert!(!t.verify_acceptor(COOKIE, &t.dialer_proof(COOKIE)));
    }

    #[test]
    fn changed_transcript_fails() {
        let t = transcript();
        let (acceptor, dialer) = (t.acceptor_proof(COOKIE), t.dialer_proof(COOKIE));
        let changes: [fn(&mut Transcript); 8] = [
            |t| t.dialer_max_frame += 1,
            |t| t.acceptor_max_frame -= 1,
            |t| t.dialer_nonce[0] ^= 1,
            |t| t.acceptor_nonce[31] ^= 1,
            |t| t.lane.index += 1,
            |t| t.dialer.incarnation += 1,
            |t| t.acceptor.name = format!("{}x", t.acceptor.name).into(),
            |t| std::mem::swap(&mut t.dialer, &mut t.acceptor),
        ];
        for change in changes {
            let mut changed = t.clone();
            change(&mut changed);
            assert!(!changed.verify_acceptor(COOKIE, &acceptor));
            assert!(!changed.verify_dialer(COOKIE, &dialer));
        }
    }

    #[test]
    fn nonces_are_fresh() {
        assert_ne!(new_nonce(), new_nonce());
    }

    #[test]
    fn hello_version_check() {
        assert!(check_hello_version(&MAGIC, VERSION).is_ok());
        let err = check_hello_version(b"HTTP", VERSION).unwrap_err();
        assert!(
            matches!(err, WireError::BadMagic { got } if &got == b"HTTP"),
            "{err}"
        );
        let err = check_hello_version(&MAGIC, VERSION + 1).unwrap_err();
        assert!(matches!(err, WireError::BadVersion { got, want: VERSION } if got == VERSION + 1));
    }

    #[test]
    fn encode_refuses_too_large() {
        let msg = HandshakeMsg::Rejected {
            code: RejectCode::Auth,
            detail: "x".repeat(MAX_HANDSHAKE_FRAME),
            proof: None,
        };
        let err = encode_handshake(&msg).unwrap_err();
        assert!(
            matches!(
                err,
                WireError::FrameTooLarge {
                    max: MAX_HANDSHAKE_FRAME,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn decode_refuses_too_large_before_reserving() {
        let mut buf = BytesMut::new();
        buf.put_u32(MAX_HANDSHAKE_FRAME as u32 + 1);
        let capacity = buf.capacity();
        let err = HandshakeDecoder.decode(&mut buf).unwrap_err();
        assert!(matches!(err, WireError::FrameTooLarge { .. }), "{err}");
        assert_eq!(buf.capacity(), capacity);
    }

    #[test]
    fn decode_refuses_bad_bodies() {
        // Empty body.
        let mut buf = BytesMut::from(&[0, 0, 0, 0][..]);
        assert!(matches!(
            HandshakeDecoder.decode(&mut buf),
            Err(WireError::Truncated)
        ));
        // Unknown variant.
        let mut buf = BytesMut::from(&[0, 0, 0, 1, 100][..]);
        assert!(matches!(
            HandshakeDecoder.decode(&mut buf),
            Err(WireError::Decode(_))
        ));
        // A valid message with a stray byte inside its length.
        let mut buf = BytesMut::from(&[0, 0, 0, 5, 4, 0, 0, 0, 0][..]);
        assert_eq!(
            postcard::to_allocvec(&HandshakeMsg::Rejected {
                code: RejectCode::Version,
                detail: String::new(),
                proof: None,
            })
            .unwrap(),
            [4, 0, 0, 0]
        );
        assert!(matches!(
            HandshakeDecoder.decode(&mut buf),
            Err(WireError::Decode(_))
        ));
        // A body cut short.
        let wire = encode_handshake(&HandshakeMsg::Rejected {
            code: RejectCode::Refused,
            detail: "no".into(),
            proof: None,
        })
        .unwrap();
        let mut buf = BytesMut::new();
        buf.put_u32(wire.len() as u32 - 5);
        buf.extend_from_slice(&wire[4..wire.len() - 1]);
        assert!(matches!(
            HandshakeDecoder.decode(&mut buf),
            Err(WireError::Truncated)
        ));
    }

    #[test]
    fn decode_one_byte_at_a_time_and_several_in_one_buffer() {
        let t = transcript();
        let msgs = vec![
            HandshakeMsg::Hello {
                magic: MAGIC,
                version: VERSION,
                node: t.dialer.clone(),
                lane: t.lane.clone(),
                nonce: t.dialer_nonce,
                channels: vec![("membership".into(), 1), ("default".into(), 16)],
                max_frame: t.dialer_max_frame,
            },
            HandshakeMsg::Challenge {
                node: t.acceptor.clone(),
                nonce: t.acceptor_nonce,
                max_frame: t.acceptor_max_frame,
            },
            HandshakeMsg::Response {
                proof: t.dialer_proof(COOKIE),
            },
            HandshakeMsg::Accepted {
                proof: t.acceptor_proof(COOKIE),
            },
        ];
        let mut wire = BytesMut::new();
        for msg in &msgs {
            wire.extend_from_slice(&encode_handshake(msg).unwrap());
        }

        let mut got = Vec::new();
        let mut buf = BytesMut::new();
        for byte in wire.iter() {
            buf.put_u8(*byte);
            got.extend(HandshakeDecoder.decode(&mut buf).unwrap());
        }
        assert_eq!(got, msgs);

        let mut got = Vec::new();
        while let Some(msg) = HandshakeDecoder.decode(&mut wire).unwrap() {
            got.push(msg);
        }
        assert_eq!(got, msgs);
        assert!(wire.is_empty());
    }

    fn node_id() -> impl Strategy<Value = NodeId> {
        let ip = prop_oneof![
            any::<std::net::Ipv4Addr>().prop_map(IpAddr::V4),
            any::<std::net::Ipv6Addr>().prop_map(IpAddr::V6),
        ];
        (".{0,20}", ip, any::<u16>(), any::<u64>())
            .prop_map(|(name, ip, port, inc)| NodeId::new(name, SocketAddr::new(ip, port), inc))
    }

    fn handshake_msg() -> impl Strategy<Value = HandshakeMsg> {
        let lane = (".{0,20}", any::<u16>()).prop_map(|(c, i)| LaneId::new(c, i));
        prop_oneof![
            (
                any::<[u8; 4]>(),
                any::<u16>(),
                node_id(),
                lane,
                any::<Nonce>(),
                prop::collection::vec((".{0,10}", any::<u16>()), 0..4),
                any::<u64>(),
            )
                .prop_map(
                    |(magic, version, node, lane, nonce, channels, max_frame)| {
                        HandshakeMsg::Hello {
                            magic,
                            version,
                            node,
                            lane,
                            nonce,
                            channels,
                            max_frame,
                        }
                    }
                ),
            (node_id(), any::<Nonce>(), any::<u64>()).prop_map(|(node, nonce, max_frame)| {
                HandshakeMsg::Challenge {
                    node,
                    nonce,
                    max_frame,
                }
            }),
            any::<Proof>().prop_map(|proof| HandshakeMsg::Response { proof }),
            any::<Proof>().prop_map(|proof| HandshakeMsg::Accepted { proof }),
            (".{0,100}", any::<Option<Proof>>()).prop_map(|(detail, proof)| {
                HandshakeMsg::Rejected {
                    code: RejectCode::Incompatible,
                    detail,
                    proof,
                }
            }),
        ]
    }

    proptest! {
        #[test]
        fn handshake_round_trip(msg in handshake_msg(), chunk in 1usize..64) {
            let wire = encode_handshake(&msg).unwrap();
            let mut whole = wire.clone();
            prop_assert_eq!(HandshakeDecoder.decode(&mut whole).unwrap(), Some(msg.clone()));
            prop_assert!(whole.is_empty());

            let mut got = Vec::new();
            let fed = feed(&mut HandshakeDecoder, &wire, chunk, |m| got.push(m));
            prop_assert!(fed.error.is_none());
            prop_assert_eq!(got, vec![msg]);
            prop_assert!(fed.rest.is_empty());
        }

        #[test]
        fn garbage_never_panics_nor_overallocates(
            len in prop_oneof![any::<u32>(), 0..=MAX_HANDSHAKE_FRAME as u32 + 8],
            data in proptest::collection::vec(any::<u8>(), 0..4096),
            chunk in 1usize..64,
        ) {
            let mut input = len.to_be_bytes().to_vec();
            input.extend(data);
            let fed = feed(&mut HandshakeDecoder, &input, chunk, drop);
            prop_assert!(
                fed.max_capacity <= 4 + MAX_HANDSHAKE_FRAME,
                "capacity {}",
                fed.max_capacity
            );
        }
    }
}
