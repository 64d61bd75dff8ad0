//! The handshake's two sides as state machines: a [`Dialer`] and an [`Acceptor`], each fed the
//! messages that arrive and answering what to send, without sockets.
//!
//! ```text
//! Dialer                                          Acceptor
//! new → Hello ───────────────────────────────────▶ AwaitHello
//! AwaitChallenge ◀──────────────── Challenge ───── (version, proof) → AwaitResponse
//!   (check the acceptor's proof, the expected node)
//! Response ──────────────────────────────────────▶ (check the dialer's proof, the channel
//! AwaitVerdict                                      table, the name) → Authenticated
//!                                                   the driver picks the lane: accept / reject
//! Established ◀──────────────────── Accepted ───── Done
//! ```
//!
//! A message out of order ends the handshake with [`HandshakeError::Unexpected`]; a refusal
//! carries a [`RejectCode`] the other side acts on. What needs the runtime's state (is the lane
//! known, is there a newer incarnation, which of two crossing connections wins) is decided by
//! the driver between [`AcceptorStep::Authenticated`] and [`Acceptor::accept`] /
//! [`Acceptor::reject`].

use super::handshake::{
    acceptor_proof, check_hello_version, dialer_proof, verify_acceptor, verify_dialer,
    HandshakeMsg, Nonce, RejectCode, MAGIC, VERSION,
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
        HandshakeMsg::Accepted => "Accepted",
        HandshakeMsg::Rejected { .. } => "Rejected",
    }
}

fn unexpected(expected: &'static str, got: &HandshakeMsg) -> HandshakeError {
    match got {
        HandshakeMsg::Rejected { code, detail } => HandshakeError::Rejected {
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
    /// The lane is established with this node.
    Established(NodeId),
}

#[derive(Debug)]
enum DialerState {
    AwaitChallenge,
    AwaitVerdict { acceptor: NodeId },
    Done,
}

/// The dialer's side of one handshake.
#[derive(Debug)]
pub struct Dialer {
    me: NodeId,
    lane: LaneId,
    cookie: Vec<u8>,
    nonce: Nonce,
    expect: Option<NodeId>,
    /// The node that answered, once its proof checked.
    acceptor: Option<NodeId>,
    state: DialerState,
}

impl Dialer {
    /// The node reached, once its proof checked.
    pub fn acceptor(&self) -> Option<&NodeId> {
        self.acceptor.as_ref()
    }

    /// Starts a handshake for `lane`; returns the machine and the `Hello` to send first. With
    /// `expect`, the acceptor must be exactly that node.
    pub fn new(
        me: NodeId,
        lane: LaneId,
        channels: Vec<(String, u16)>,
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
        };
        let d = Dialer {
            me,
            lane,
            cookie: cookie.to_vec(),
            nonce,
            expect,
            acceptor: None,
            state: DialerState::AwaitChallenge,
        };
        (d, hello)
    }

    /// A message from the acceptor.
    pub fn handle(&mut self, msg: HandshakeMsg) -> Result<DialerStep, HandshakeError> {
        let state = std::mem::replace(&mut self.state, DialerState::Done);
        match (state, msg) {
            (DialerState::AwaitChallenge, HandshakeMsg::Challenge { node, nonce, proof }) => {
                let (me, lane) = (&self.me, &self.lane);
                if !verify_acceptor(&self.cookie, me, &node, lane, &self.nonce, &nonce, &proof) {
                    return Err(HandshakeError::Auth(node.to_string()));
                }
                if let Some(want) = &self.expect {
                    if *want != node {
                        return Err(HandshakeError::WrongPeer {
                            want: Box::new(want.clone()),
                            got: Box::new(node),
                        });
                    }
                }
                let proof = dialer_proof(&self.cookie, me, &node, lane, &self.nonce, &nonce);
                self.acceptor = Some(node.clone());
                self.state = DialerState::AwaitVerdict { acceptor: node };
                Ok(DialerStep::Send(HandshakeMsg::Response { proof }))
            }
            (DialerState::AwaitChallenge, other) => Err(unexpected("Challenge", &other)),
            (DialerState::AwaitVerdict { acceptor }, HandshakeMsg::Accepted) => {
                Ok(DialerStep::Established(acceptor))
            }
            (DialerState::AwaitVerdict { .. }, other) => Err(unexpected("Accepted", &other)),
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
        dialer: NodeId,
        lane: LaneId,
        dialer_nonce: Nonce,
        channels: Vec<(String, u16)>,
    },
    Authenticated,
    Done,
}

/// The acceptor's side of one handshake.
#[derive(Debug)]
pub struct Acceptor {
    me: NodeId,
    cookie: Vec<u8>,
    nonce: Nonce,
    channels: Vec<(String, u16)>,
    state: AcceptorState,
}

fn refuse(code: RejectCode, detail: String) -> AcceptorStep {
    AcceptorStep::Refuse {
        reply: Some(HandshakeMsg::Rejected {
            code,
            detail: detail.clone(),
        }),
        error: HandshakeError::Refused { code, detail },
    }
}

impl Acceptor {
    /// Waits for a `Hello`; `channels` is this node's channel table, which the dialer's must
    /// equal.
    pub fn new(me: NodeId, cookie: &[u8], channels: Vec<(String, u16)>, nonce: Nonce) -> Self {
        Acceptor {
            me,
            cookie: cookie.to_vec(),
            nonce,
            channels,
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
                },
            ) => {
                if let Err(e) = check_hello_version(&magic, version) {
                    return refuse(RejectCode::Version, e.to_string());
                }
                let proof =
                    acceptor_proof(&self.cookie, &node, &self.me, &lane, &nonce, &self.nonce);
                let challenge = HandshakeMsg::Challenge {
                    node: self.me.clone(),
                    nonce: self.nonce,
                    proof,
                };
                self.state = AcceptorState::AwaitResponse {
                    dialer: node,
                    lane,
                    dialer_nonce: nonce,
                    channels,
                };
                AcceptorStep::Send(challenge)
            }
            (
                AcceptorState::AwaitResponse {
                    dialer,
                    lane,
                    dialer_nonce,
                    channels,
                },
                HandshakeMsg::Response { proof },
            ) => {
                let me = &self.me;
                let nonces = (&dialer_nonce, &self.nonce);
                if !verify_dialer(&self.cookie, &dialer, me, &lane, nonces.0, nonces.1, &proof) {
                    return AcceptorStep::Refuse {
                        reply: Some(HandshakeMsg::Rejected {
                            code: RejectCode::Auth,
                            detail: "authentication failed".into(),
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
                if dialer.name == me.name {
                    return refuse(RejectCode::SameName, format!("{dialer} has our name"));
                }
                self.state = AcceptorState::Authenticated;
                AcceptorStep::Authenticated { dialer, lane }
            }
            (AcceptorState::AwaitHello, other) => AcceptorStep::Refuse {
                reply: None,
                error: unexpected("Hello", &other),
            },
            (AcceptorState::AwaitResponse { .. }, other) => AcceptorStep::Refuse {
                reply: None,
                error: unexpected("Response", &other),
            },
            (AcceptorState::Authenticated | AcceptorState::Done, other) => AcceptorStep::Refuse {
                reply: None,
                error: unexpected("nothing", &other),
            },
        }
    }

    /// After [`AcceptorStep::Authenticated`]: the lane is established; send this.
    pub fn accept(&mut self) -> HandshakeMsg {
        self.state = AcceptorState::Done;
        HandshakeMsg::Accepted
    }

    /// After [`AcceptorStep::Authenticated`]: the driver refuses; send the refusal, then close.
    pub fn reject(&mut self, code: RejectCode, detail: String) -> (HandshakeMsg, HandshakeError) {
        self.state = AcceptorState::Done;
        let reply = HandshakeMsg::Rejected {
            code,
            detail: detail.clone(),
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

    fn id(name: &str, inc: u64) -> NodeId {
        NodeId::new(name, ([127, 0, 0, 1], 7000).into(), inc)
    }

    fn table() -> Vec<(String, u16)> {
        vec![("default".into(), 4), ("membership".into(), 1)]
    }

    fn pair(
        dialer_cookie: &[u8],
        acceptor_cookie: &[u8],
        expect: Option<NodeId>,
    ) -> (Dialer, HandshakeMsg, Acceptor) {
        let (d, hello) = Dialer::new(
            id("a", 1),
            LaneId::new("default", 2),
            table(),
            dialer_cookie,
            [1; 32],
            expect,
        );
        let acc = Acceptor::new(id("b", 1), acceptor_cookie, table(), [2; 32]);
        (d, hello, acc)
    }

    /// Runs a handshake to the acceptor's decision; returns the dialer, the acceptor and the
    /// acceptor's last step.
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
    fn a_full_handshake_establishes_the_lane() {
        let (mut d, hello, mut acc) = pair(b"c", b"c", Some(id("b", 1)));
        let step = run_to_decision(&mut d, hello, &mut acc);
        assert_eq!(
            step,
            AcceptorStep::Authenticated {
                dialer: id("a", 1),
                lane: LaneId::new("default", 2)
            }
        );
        assert_eq!(
            d.handle(acc.accept()),
            Ok(DialerStep::Established(id("b", 1)))
        );
    }

    #[test]
    fn a_wrong_cookie_fails_on_the_side_that_checks() {
        // The dialer checks the acceptor's proof first.
        let (mut d, hello, mut acc) = pair(b"right", b"wrong", None);
        let AcceptorStep::Send(challenge) = acc.handle(hello) else {
            panic!()
        };
        assert!(matches!(d.handle(challenge), Err(HandshakeError::Auth(_))));
        // A dialer that does not know it is refused with a code.
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
    }

    #[test]
    fn out_of_order_messages_end_the_handshake() {
        let (mut d, _hello, mut acc) = pair(b"c", b"c", None);
        assert!(matches!(
            acc.handle(HandshakeMsg::Accepted),
            AcceptorStep::Refuse {
                reply: None,
                error: HandshakeError::Unexpected {
                    expected: "Hello",
                    got: "Accepted"
                }
            }
        ));
        assert_eq!(
            d.handle(HandshakeMsg::Accepted),
            Err(HandshakeError::Unexpected {
                expected: "Challenge",
                got: "Accepted"
            })
        );
        assert!(
            matches!(
                d.handle(HandshakeMsg::Accepted),
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
        assert_eq!(
            d.handle(reply),
            Err(HandshakeError::Rejected {
                code: RejectCode::Superseded,
                detail: "crossing dials".into()
            })
        );
    }

    #[test]
    fn incompatible_tables_same_names_and_versions_are_refused() {
        let (mut d, hello, _) = pair(b"c", b"c", None);
        let mut acc = Acceptor::new(id("b", 1), b"c", vec![("default".into(), 1)], [2; 32]);
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
        let (mut d, hello) = Dialer::new(
            id("b", 2),
            LaneId::new("default", 0),
            table(),
            b"c",
            [1; 32],
            None,
        );
        let mut acc = Acceptor::new(id("b", 1), b"c", table(), [2; 32]);
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
        let mut acc = Acceptor::new(id("b", 1), b"c", table(), [2; 32]);
        let old = HandshakeMsg::Hello {
            magic: MAGIC,
            version: VERSION - 1,
            node: id("a", 1),
            lane: LaneId::new("default", 0),
            nonce: [0; 32],
            channels: table(),
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
