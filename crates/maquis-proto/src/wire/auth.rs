//! The handshake's two sides as state machines: a [`Dialer`] and an [`Acceptor`], each fed the
//! messages that arrive and answering what to send, without sockets.
//!
//! ```text
//! Dialer                                          Acceptor
//! new → Hello ───────────────────────────────────▶ AwaitHello
//! AwaitChallenge ◀──────────────── Challenge ───── (version) → AwaitResponse
//!   (check the expected node)
//! Response (dialer's proof) ─────────────────────▶ (check the dialer's proof, the channel
//! AwaitVerdict                                      table, the name) → Authenticated
//!                                                   the driver picks the lane: accept / reject
//! (check the acceptor's proof)
//! Established ◀────────── Accepted (acceptor's proof) ── Done
//! ```
//!
//! The dialer proves first, so the acceptor answers an unauthenticated connection with nothing
//! that depends on the cookie. A message out of order ends the handshake with
//! [`HandshakeError::Unexpected`]; a refusal carries a [`RejectCode`] the other side acts on.
//! What needs the runtime's state (is the lane known, is there a newer incarnation, which of
//! two crossing connections wins) is decided by the driver between
//! [`AcceptorStep::Authenticated`] and [`Acceptor::accept`] / [`Acceptor::reject`]. Both sides
//! end knowing the other's frame limit.

use super::handshake::{
    check_hello_version, HandshakeMsg, Nonce, RejectCode, Transcript, MAGIC, VERSION,
};
use crate::id::{LaneId, NodeId};

/// Why a handshake ended without a connection.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// A message arrived that this side does not expect now.
    #[error("expected {expected}, got {got}")]
    Unexpected {
        /// What this side waited for.
        expected: &'static str,
        /// What arrived.
        got: &'static str,
    },
    /// The other side's proof did not check: it does not know the cookie.
    #[error("{0} does not know the cookie")]
    Auth(String),
    /// The other side refused.
    #[error("rejected by peer ({code}): {detail}")]
    Rejected {
        /// Its code.
        code: RejectCode,
        /// Its words.
        detail: String,
    },
    /// This side refused (the reply that says so is in [`AcceptorStep::Refuse`]).
    #[error("refused ({code}): {detail}")]
    Refused {
        /// The code sent.
        code: RejectCode,
        /// The words sent.
        detail: String,
    },
    /// The dialer reached another node than the one it meant (a restarted node has a new
    /// incarnation).
    #[error("expected {want}, reached {got}")]
    WrongPeer {
        /// The node meant.
        want: Box<NodeId>,
        /// The node reached.
        got: Box<NodeId>,
    },
}

fn kind(msg: &HandshakeMsg) -> &'static str {
    match msg {
        HandshakeMsg::Hello { .. } => "Hello",
        HandshakeMsg::Challenge { .. } => "Challenge",
        HandshakeMsg::Response { .. } => "Response",
        HandshakeMsg::Accepted { .. } => "Accepted",
        HandshakeMsg::Rejected { .. } => "Rejected",
    }
}

fn unexpected(expected: &'static str, got: &HandshakeMsg) -> HandshakeError {
    match got {
        HandshakeMsg::Rejected { code, detail, .. } => HandshakeError::Rejected {
            code: *code,
            detail: detail.clone(),
        },
        other => HandshakeError::Unexpected {
            expected,
            got: kind(other),
        },
    }
}

/// What the dialer does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DialerStep {
    /// Send this message and wait for the next.
    Send(HandshakeMsg),
    /// The lane is established.
    Established {
        /// The node reached (its proof checked).
        acceptor: NodeId,
        /// The largest frame it accepts.
        max_frame: u64,
    },
}

#[derive(Debug)]
enum DialerState {
    AwaitChallenge,
    AwaitVerdict(Box<Transcript>),
    Done,
}

/// The dialer's side of one handshake.
#[derive(Debug)]
pub struct Dialer {
    me: NodeId,
    lane: LaneId,
    cookie: Vec<u8>,
    nonce: Nonce,
    max_frame: u64,
    expect: Option<NodeId>,
    /// The node that answered, once its proof checked.
    verified: Option<NodeId>,
    state: DialerState,
}

impl Dialer {
    /// The node reached, once its proof checked (in `Accepted`, or in a `Rejected` sent after
    /// it authenticated this dialer).
    pub fn acceptor(&self) -> Option<&NodeId> {
        self.verified.as_ref()
    }

    /// Starts a handshake for `lane`; returns the machine and the `Hello` to send first.
    /// `max_frame` is the largest frame this node accepts. With `expect`, the acceptor must be
    /// exactly that node.
    pub fn new(
        me: NodeId,
        lane: LaneId,
        channels: Vec<(String, u16)>,
        max_frame: u64,
        cookie: &[u8],
        nonce: Nonce,
        expect: Option<NodeId>,
    ) -> (Dialer, HandshakeMsg) {
        let hello = HandshakeMsg::Hello {
            magic: MAGIC,
            version: VERSION,
            node: me.clone(),
            lane: lane.clone(),
            nonce,
            channels,
            max_frame,
        };
        let d = Dialer {
            me,
            lane,
            cookie: cookie.to_vec(),
            nonce,
            max_frame,
            expect,
            verified: None,
            state: DialerState::AwaitChallenge,
        };
        (d, hello)
    }

    /// A message from the acceptor.
    pub fn handle(&mut self, msg: HandshakeMsg) -> Result<DialerStep, HandshakeError> {
        let state = std::mem::replace(&mut self.state, DialerState::Done);
        match (state, msg) {
            (
                DialerState::AwaitChallenge,
                HandshakeMsg::Challenge {
                    node,
                    nonce,
                    max_frame,
                },
            ) => {
                if let Some(want) = &self.expect {
                    if *want != node {
                        return Err(HandshakeError::WrongPeer {
                            want: Box::new(want.clone()),
                            got: Box::new(node),
                        });
                    }
                }
                let transcript = Transcript {
                    dialer: self.me.clone(),
                    acceptor: node,
                    lane: self.lane.clone(),
                    dialer_nonce: self.nonce,
                    acceptor_nonce: nonce,
                    dialer_max_frame: self.max_frame,
                    acceptor_max_frame: max_frame,
                };
                let proof = transcript.dialer_proof(&self.cookie);
                self.state = DialerState::AwaitVerdict(Box::new(transcript));
                Ok(DialerStep::Send(HandshakeMsg::Response { proof }))
            }
            (DialerState::AwaitChallenge, other) => Err(unexpected("Challenge", &other)),
            (DialerState::AwaitVerdict(t), HandshakeMsg::Accepted { proof }) => {
                if !t.verify_acceptor(&self.cookie, &proof) {
                    return Err(HandshakeError::Auth(t.acceptor.to_string()));
                }
                self.verified = Some(t.acceptor.clone());
                Ok(DialerStep::Established {
                    acceptor: t.acceptor,
                    max_frame: t.acceptor_max_frame,
                })
            }
            (
                DialerState::AwaitVerdict(t),
                HandshakeMsg::Rejected {
                    code,
                    detail,
                    proof: Some(proof),
                },
            ) if t.verify_acceptor(&self.cookie, &proof) => {
                self.verified = Some(t.acceptor.clone());
                Err(HandshakeError::Rejected { code, detail })
            }
            (DialerState::AwaitVerdict(_), other) => Err(unexpected("Accepted", &other)),
            (DialerState::Done, other) => Err(unexpected("nothing", &other)),
        }
    }
}

/// What the acceptor does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcceptorStep {
    /// Send this message and wait for the next.
    Send(HandshakeMsg),
    /// The dialer is authenticated and compatible: the driver now decides the lane and calls
    /// [`Acceptor::accept`] or [`Acceptor::reject`].
    Authenticated {
        /// The dialer.
        dialer: NodeId,
        /// The lane it asks for.
        lane: LaneId,
        /// The largest frame it accepts.
        max_frame: u64,
    },
    /// Send `reply` (if any), then close: the handshake failed with `error`.
    Refuse {
        /// The refusal to send first.
        reply: Option<HandshakeMsg>,
        /// Why.
        error: HandshakeError,
    },
}

#[derive(Debug)]
enum AcceptorState {
    AwaitHello,
    AwaitResponse {
        transcript: Box<Transcript>,
        channels: Vec<(String, u16)>,
    },
    Authenticated(Box<Transcript>),
    Done,
}

/// The acceptor's side of one handshake.
#[derive(Debug)]
pub struct Acceptor {
    me: NodeId,
    cookie: Vec<u8>,
    nonce: Nonce,
    channels: Vec<(String, u16)>,
    max_frame: u64,
    state: AcceptorState,
}

fn refuse(code: RejectCode, detail: String) -> AcceptorStep {
    AcceptorStep::Refuse {
        reply: Some(HandshakeMsg::Rejected {
            code,
            detail: detail.clone(),
            proof: None,
        }),
        error: HandshakeError::Refused { code, detail },
    }
}

impl Acceptor {
    /// Waits for a `Hello`; `channels` is this node's channel table, which the dialer's must
    /// equal, and `max_frame` the largest frame this node accepts.
    pub fn new(
        me: NodeId,
        cookie: &[u8],
        channels: Vec<(String, u16)>,
        max_frame: u64,
        nonce: Nonce,
    ) -> Self {
        Acceptor {
            me,
            cookie: cookie.to_vec(),
            nonce,
            channels,
            max_frame,
            state: AcceptorState::AwaitHello,
        }
    }

    /// A message from the dialer.
    pub fn handle(&mut self, msg: HandshakeMsg) -> AcceptorStep {
        let state = std::mem::replace(&mut self.state, AcceptorState::Done);
        match (state, msg) {
            (
                AcceptorState::AwaitHello,
                HandshakeMsg::Hello {
                    magic,
                    version,
                    node,
                    lane,
                    nonce,
                    channels,
                    max_frame,
                },
            ) => {
                if let Err(e) = check_hello_version(&magic, version) {
                    return refuse(RejectCode::Version, e.to_string());
                }
                let challenge = HandshakeMsg::Challenge {
                    node: self.me.clone(),
                    nonce: self.nonce,
                    max_frame: self.max_frame,
                };
                let transcript = Transcript {
                    dialer: node,
                    acceptor: self.me.clone(),
                    lane,
                    dialer_nonce: nonce,
                    acceptor_nonce: self.nonce,
                    dialer_max_frame: max_frame,
                    acceptor_max_frame: self.max_frame,
                };
                self.state = AcceptorState::AwaitResponse {
                    transcript: Box::new(transcript),
                    channels,
                };
                AcceptorStep::Send(challenge)
            }
            (
                AcceptorState::AwaitResponse {
                    transcript,
                    channels,
                },
                HandshakeMsg::Response { proof },
            ) => {
                let dialer = &transcript.dialer;
                if !transcript.verify_dialer(&self.cookie, &proof) {
                    return AcceptorStep::Refuse {
                        reply: Some(HandshakeMsg::Rejected {
                            code: RejectCode::Auth,
                            detail: "the proof of the cookie does not check".into(),
                            proof: None,
                        }),
                        error: HandshakeError::Auth(dialer.to_string()),
                    };
                }
                if channels != self.channels {
                    let detail = format!(
                        "channel tables differ (ours {}, theirs {})",
                        show_table(&self.channels),
                        show_table(&channels)
                    );
                    return refuse(RejectCode::Incompatible, detail);
                }
                if dialer.name == self.me.name {
                    return refuse(RejectCode::SameName, format!("{dialer} has our name"));
                }
                let step = AcceptorStep::Authenticated {
                    dialer: dialer.clone(),
                    lane: transcript.lane.clone(),
                    max_frame: transcript.dialer_max_frame,
                };
                self.state = AcceptorState::Authenticated(transcript);
                step
            }
            (AcceptorState::AwaitHello, other) => AcceptorStep::Refuse {
                reply: None,
                error: unexpected("Hello", &other),
            },
            (AcceptorState::AwaitResponse { .. }, other) => AcceptorStep::Refuse {
                reply: None,
                error: unexpected("Response", &other),
            },
            (AcceptorState::Authenticated(_) | AcceptorState::Done, other) => {
                AcceptorStep::Refuse {
                    reply: None,
                    error: unexpected("nothing", &other),
                }
            }
        }
    }

    /// After [`AcceptorStep::Authenticated`]: the lane is established; send this (it carries
    /// this node's proof). `None` if the dialer was not authenticated: nothing to send.
    pub fn accept(&mut self) -> Option<HandshakeMsg> {
        match std::mem::replace(&mut self.state, AcceptorState::Done) {
            AcceptorState::Authenticated(t) => Some(HandshakeMsg::Accepted {
                proof: t.acceptor_proof(&self.cookie),
            }),
            _ => None,
        }
    }

    /// The driver refuses; send the refusal, then close. After
    /// [`AcceptorStep::Authenticated`] it carries this node's proof, so the dialer knows who
    /// refused it.
    pub fn reject(&mut self, code: RejectCode, detail: String) -> (HandshakeMsg, HandshakeError) {
        let proof = match std::mem::replace(&mut self.state, AcceptorState::Done) {
            AcceptorState::Authenticated(t) => Some(t.acceptor_proof(&self.cookie)),
            _ => None,
        };
        let reply = HandshakeMsg::Rejected {
            code,
            detail: detail.clone(),
            proof,
        };
        (reply, HandshakeError::Refused { code, detail })
    }
}

fn show_table(t: &[(String, u16)]) -> String {
    t.iter()
        .map(|(c, p)| format!("{c}:{p}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::encode_handshake;

    fn id(name: &str, inc: u64) -> NodeId {
        NodeId::new(name, ([127, 0, 0, 1], 7000).into(), inc)
    }

    fn table() -> Vec<(String, u16)> {
        vec![("default".into(), 4), ("membership".into(), 1)]
    }

    const DIALER_MAX: u64 = 1 << 20;
    const ACCEPTOR_MAX: u64 = 1 << 25;

    fn acceptor(name: &str, cookie: &[u8], channels: Vec<(String, u16)>) -> Acceptor {
        Acceptor::new(id(name, 1), cookie, channels, ACCEPTOR_MAX, [2; 32])
    }

    fn dialer(me: NodeId, cookie: &[u8], expect: Option<NodeId>) -> (Dialer, HandshakeMsg) {
        Dialer::new(
            me,
            LaneId::new("default", 2),
            table(),
            DIALER_MAX,
            cookie,
            [1; 32],
            expect,
        )
    }

    fn pair(
        dialer_cookie: &[u8],
        acceptor_cookie: &[u8],
        expect: Option<NodeId>,
    ) -> (Dialer, HandshakeMsg, Acceptor) {
        let (d, hello) = dialer(id("a", 1), dialer_cookie, expect);
        (d, hello, acceptor("b", acceptor_cookie, table()))
    }

    /// Runs a handshake to the acceptor's decision; returns the acceptor's last step.
    fn run_to_decision(d: &mut Dialer, hello: HandshakeMsg, acc: &mut Acceptor) -> AcceptorStep {
        let AcceptorStep::Send(challenge) = acc.handle(hello) else {
            panic!("no challenge")
        };
        match d.handle(challenge) {
            Ok(DialerStep::Send(response)) => acc.handle(response),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_full_handshake_establishes_the_lane_and_tells_each_side_the_others_limit() {
        let (mut d, hello, mut acc) = pair(b"c", b"c", Some(id("b", 1)));
        let step = run_to_decision(&mut d, hello, &mut acc);
        assert_eq!(
            step,
            AcceptorStep::Authenticated {
                dialer: id("a", 1),
                lane: LaneId::new("default", 2),
                max_frame: DIALER_MAX,
            }
        );
        let accepted = acc.accept().expect("authenticated");
        assert_eq!(
            d.handle(accepted),
            Ok(DialerStep::Established {
                acceptor: id("b", 1),
                max_frame: ACCEPTOR_MAX
            })
        );
    }

    #[test]
    fn the_acceptor_reveals_nothing_derived_from_the_cookie_to_an_unproven_dialer() {
        // Two acceptors that differ only in their cookie answer a Hello with the same bytes:
        // the challenge is no oracle for guessing the cookie.
        let (_, hello) = dialer(id("a", 1), b"guess", None);
        let mut right = acceptor("b", b"s3cret", table());
        let mut other = acceptor("b", b"another", table());
        let (AcceptorStep::Send(c1), AcceptorStep::Send(c2)) =
            (right.handle(hello.clone()), other.handle(hello))
        else {
            panic!("no challenge")
        };
        assert_eq!(
            encode_handshake(&c1).unwrap(),
            encode_handshake(&c2).unwrap()
        );
        // A dialer with the wrong cookie gets a refusal that carries no proof, and the
        // acceptor has nothing to accept with.
        let (mut d, hello) = dialer(id("a", 1), b"guess", None);
        let mut acc = acceptor("b", b"s3cret", table());
        let AcceptorStep::Refuse { reply, error } = run_to_decision(&mut d, hello, &mut acc) else {
            panic!("a wrong proof is refused")
        };
        assert!(matches!(error, HandshakeError::Auth(_)));
        assert_eq!(
            reply,
            Some(HandshakeMsg::Rejected {
                code: RejectCode::Auth,
                detail: "the proof of the cookie does not check".into(),
                proof: None,
            })
        );
        assert_eq!(acc.accept(), None);
    }

    #[test]
    fn a_wrong_cookie_fails_on_the_side_that_checks() {
        // The acceptor checks the dialer's proof first.
        let (mut d, hello, mut acc) = pair(b"right", b"wrong", None);
        assert!(matches!(
            run_to_decision(&mut d, hello, &mut acc),
            AcceptorStep::Refuse {
                error: HandshakeError::Auth(_),
                reply: Some(HandshakeMsg::Rejected {
                    code: RejectCode::Auth,
                    ..
                })
            }
        ));
        // A tampered dialer proof is refused with a code.
        let (mut d, hello, mut acc) = pair(b"right", b"right", None);
        let AcceptorStep::Send(challenge) = acc.handle(hello) else {
            panic!()
        };
        let Ok(DialerStep::Send(HandshakeMsg::Response { mut proof })) = d.handle(challenge) else {
            panic!()
        };
        proof[0] ^= 1;
        let AcceptorStep::Refuse { reply, error } = acc.handle(HandshakeMsg::Response { proof })
        else {
            panic!()
        };
        assert!(matches!(error, HandshakeError::Auth(_)));
        assert!(matches!(
            reply,
            Some(HandshakeMsg::Rejected {
                code: RejectCode::Auth,
                ..
            })
        ));
        // The dialer checks the acceptor's proof last: an acceptor that does not know the
        // cookie cannot finish the handshake.
        let (mut d, hello, mut acc) = pair(b"c", b"c", None);
        assert!(matches!(
            run_to_decision(&mut d, hello, &mut acc),
            AcceptorStep::Authenticated { .. }
        ));
        let Some(HandshakeMsg::Accepted { mut proof }) = acc.accept() else {
            panic!()
        };
        proof[31] ^= 1;
        assert!(matches!(
            d.handle(HandshakeMsg::Accepted { proof }),
            Err(HandshakeError::Auth(_))
        ));
    }

    #[test]
    fn out_of_order_messages_end_the_handshake() {
        let (mut d, _hello, mut acc) = pair(b"c", b"c", None);
        assert!(matches!(
            acc.handle(HandshakeMsg::Accepted { proof: [0; 32] }),
            AcceptorStep::Refuse {
                reply: None,
                error: HandshakeError::Unexpected {
                    expected: "Hello",
                    got: "Accepted"
                }
            }
        ));
        assert_eq!(
            d.handle(HandshakeMsg::Accepted { proof: [0; 32] }),
            Err(HandshakeError::Unexpected {
                expected: "Challenge",
                got: "Accepted"
            })
        );
        assert!(
            matches!(
                d.handle(HandshakeMsg::Accepted { proof: [0; 32] }),
                Err(HandshakeError::Unexpected { .. })
            ),
            "a failed machine takes nothing more"
        );
    }

    #[test]
    fn refusals_carry_their_code_to_the_dialer() {
        let (mut d, hello, mut acc) = pair(b"c", b"c", None);
        assert!(matches!(
            run_to_decision(&mut d, hello, &mut acc),
            AcceptorStep::Authenticated { .. }
        ));
        let (reply, _) = acc.reject(RejectCode::Superseded, "crossing dials".into());
        assert_eq!(d.acceptor(), None);
        assert_eq!(
            d.handle(reply.clone()),
            Err(HandshakeError::Rejected {
                code: RejectCode::Superseded,
                detail: "crossing dials".into()
            })
        );
        assert_eq!(
            d.acceptor(),
            Some(&id("b", 1)),
            "a refusal after authentication proves who sent it"
        );
        // A refusal whose proof does not check names no one.
        let (mut d, hello, mut acc) = pair(b"c", b"c", None);
        run_to_decision(&mut d, hello, &mut acc);
        let HandshakeMsg::Rejected { code, detail, .. } = reply else {
            panic!()
        };
        let forged = HandshakeMsg::Rejected {
            code,
            detail,
            proof: Some([7; 32]),
        };
        assert!(matches!(
            d.handle(forged),
            Err(HandshakeError::Rejected { .. })
        ));
        assert_eq!(d.acceptor(), None);
    }

    #[test]
    fn incompatible_tables_same_names_and_versions_are_refused() {
        let (mut d, hello, _) = pair(b"c", b"c", None);
        let mut acc = acceptor("b", b"c", vec![("default".into(), 1)]);
        let AcceptorStep::Refuse { reply, .. } = run_to_decision(&mut d, hello, &mut acc) else {
            panic!()
        };
        assert!(matches!(
            reply,
            Some(HandshakeMsg::Rejected {
                code: RejectCode::Incompatible,
                ..
            })
        ));
        let (mut d, hello) = dialer(id("b", 2), b"c", None);
        let mut acc = acceptor("b", b"c", table());
        let AcceptorStep::Refuse { reply, .. } = run_to_decision(&mut d, hello, &mut acc) else {
            panic!()
        };
        assert!(matches!(
            reply,
            Some(HandshakeMsg::Rejected {
                code: RejectCode::SameName,
                ..
            })
        ));
        let mut acc = acceptor("b", b"c", table());
        let old = HandshakeMsg::Hello {
            magic: MAGIC,
            version: VERSION - 1,
            node: id("a", 1),
            lane: LaneId::new("default", 0),
            nonce: [0; 32],
            channels: table(),
            max_frame: DIALER_MAX,
        };
        assert!(matches!(
            acc.handle(old),
            AcceptorStep::Refuse {
                reply: Some(HandshakeMsg::Rejected {
                    code: RejectCode::Version,
                    ..
                }),
                ..
            }
        ));
    }

    #[test]
    fn the_dialer_refuses_a_node_it_did_not_mean() {
        let (mut d, hello, mut acc) = pair(b"c", b"c", Some(id("b", 0)));
        let AcceptorStep::Send(challenge) = acc.handle(hello) else {
            panic!()
        };
        assert!(matches!(
            d.handle(challenge),
            Err(HandshakeError::WrongPeer { .. })
        ));
    }
}
