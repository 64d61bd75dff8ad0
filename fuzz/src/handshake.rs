//! The handshake: [`maquis_proto::wire::HandshakeDecoder`] and the two state machines that
//! consume what it decodes, [`Acceptor`] and [`Dialer`].
//!
//! Input: `[chunking][c0 … c7][stream…]`. The stream is decoded twice, in chunks (a
//! [`Chunker`] parameter) and all at once, with the same checks as the frame target (same
//! result, buffer within one maximal message, bounded allocation per decode, every message
//! re-encodes to no more bytes and decodes back the same; the allocation bound is one maximal
//! message plus [`PER_BYTE`] bytes per stream byte, as a channel table is a vector). Then every message decoded is
//! delivered, in order, to an acceptor or to a dialer, as control byte `c[i % 8]` says:
//!
//! - bit 0: to the dialer (set) or the acceptor (clear);
//! - bit 1: first replace a proof in it with the one that checks (a `Response` to the
//!   acceptor, an `Accepted` or a `Rejected` to the dialer), so that the paths behind
//!   the HMAC run too;
//! - bits 2-5: when the acceptor authenticates a dialer, accept (bit 2 clear) or reject with
//!   code `bits 3-5`; bit 4 also makes the driver decide once before the message is delivered,
//!   whatever the acceptor's state;
//! - bit 7: loop back: what one machine answers is delivered to the other one;
//! - `c0` only: bit 5 delivers the dialer's own `Hello` to the acceptor first; bit 6 makes the
//!   dialer expect the acceptor's exact identity.
//!
//! Each machine runs next to a model of it written from its documentation; every step must be
//! the one the model predicts (so every path ends in a step or an error, out-of-order messages
//! end the handshake, and a proof is accepted only if it is the right one). A second acceptor
//! with another cookie gets the same messages and must answer the same until a valid proof
//! arrives: before that, nothing the acceptor says depends on the cookie. Every message a
//! machine asks to send must encode (a refusal of an incompatible channel table may be too
//! large to: it quotes the dialer's table) and decode back the same.

use bytes::BytesMut;
use maquis_proto::id::{LaneId, NodeId};
use maquis_proto::wire::{
    encode_handshake, Acceptor, AcceptorStep, Dialer, DialerStep, HandshakeDecoder, HandshakeError,
    HandshakeMsg, Nonce, Proof, RejectCode, StreamDecoder, Transcript, WireError, MAGIC,
    MAX_HANDSHAKE_FRAME, VERSION,
};

use crate::chunks::{check_same, feed, whole, Chunker};

/// The cookie both machines know.
pub const COOKIE: &[u8] = b"fuzzing cookie";
/// The cookie of the second acceptor.
const OTHER_COOKIE: &[u8] = b"another cookie";
/// The dialer's nonce.
pub const DIALER_NONCE: Nonce = [1; 32];
/// The acceptor's nonce.
pub const ACCEPTOR_NONCE: Nonce = [2; 32];
/// The dialer's frame limit.
pub const DIALER_MAX: u64 = 1 << 20;
/// The acceptor's frame limit.
pub const ACCEPTOR_MAX: u64 = 1 << 25;

/// What one call of the decoder may allocate beyond its buffer and the message.
const SLACK: usize = 4096;

/// The most memory one byte of a message may decode to: a channel table entry, a
/// `(String, u16)` of 32 bytes, takes as little as 2 bytes on the wire, and a vector grown by
/// doubling may hold twice the room it uses. (postcard bounds the room a vector reserves up
/// front by the bytes left in the message, so a claimed length costs no more than real
/// entries would.)
const PER_BYTE: usize = 40;

/// The dialer's identity.
pub fn dialer_node() -> NodeId {
    NodeId::new("a", ([127, 0, 0, 1], 7000).into(), 1)
}

/// The acceptor's identity.
pub fn acceptor_node() -> NodeId {
    NodeId::new("b", ([127, 0, 0, 1], 7001).into(), 2)
}

/// The lane the dialer asks for.
pub fn lane() -> LaneId {
    LaneId::new("default", 1)
}

/// Both machines' channel table.
pub fn table() -> Vec<(String, u16)> {
    vec![("default".into(), 4), ("membership".into(), 1)]
}

/// The dialer of a target run, and the `Hello` it sends.
pub fn dialer(expect: Option<NodeId>) -> (Dialer, HandshakeMsg) {
    Dialer::new(
        dialer_node(),
        lane(),
        table(),
        DIALER_MAX,
        COOKIE,
        DIALER_NONCE,
        expect,
    )
}

/// An acceptor of a target run.
pub fn acceptor(cookie: &[u8]) -> Acceptor {
    Acceptor::new(
        acceptor_node(),
        cookie,
        table(),
        ACCEPTOR_MAX,
        ACCEPTOR_NONCE,
    )
}

/// The codes a driver rejects with.
const CODES: [RejectCode; 8] = [
    RejectCode::Version,
    RejectCode::Auth,
    RejectCode::Incompatible,
    RejectCode::SameName,
    RejectCode::UnknownLane,
    RejectCode::Superseded,
    RejectCode::Refused,
    RejectCode::DuplicateName,
];

/// Runs one input.
pub fn run(data: &[u8]) {
    drive(data);
}

/// What a run reached, for the seeds' tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Messages decoded from the stream.
    pub decoded: usize,
    /// The acceptor authenticated a dialer.
    pub authenticated: bool,
    /// The dialer established the lane.
    pub established: bool,
    /// The dialer knows whom it reached (an acceptance or a refusal with a proof).
    pub verified: bool,
}

/// Runs one input; returns what it reached.
pub fn drive(data: &[u8]) -> Outcome {
    let [chunking, c0, c1, c2, c3, c4, c5, c6, c7, stream @ ..] = data else {
        return Outcome::default();
    };
    let control = [*c0, *c1, *c2, *c3, *c4, *c5, *c6, *c7];

    let chunked = feed(&mut HandshakeDecoder, stream, &mut Chunker::new(*chunking));
    let whole = whole(&mut HandshakeDecoder, stream);
    check_same(HandshakeDecoder::new, &chunked, &whole);
    assert!(
        chunked.max_capacity <= 4 + MAX_HANDSHAKE_FRAME,
        "read buffer grew to {} bytes",
        chunked.max_capacity
    );
    // A message is at most `MAX_HANDSHAKE_FRAME` bytes, and one byte of it decodes to at most
    // `PER_BYTE` bytes of memory, whatever its length fields claim.
    let bound =
        2 * (4 + MAX_HANDSHAKE_FRAME) + PER_BYTE * stream.len().min(MAX_HANDSHAKE_FRAME) + SLACK;
    for fed in [&chunked.max_decode_alloc, &whole.max_decode_alloc] {
        assert!(*fed <= bound, "one decode allocated {fed} bytes");
    }
    for (msg, took) in &whole.items {
        let again = encode_handshake(msg)
            .unwrap_or_else(|err| panic!("a decoded message does not re-encode: {err}"));
        assert!(
            again.len() <= *took,
            "re-encoded in {} bytes, arrived in {took}",
            again.len()
        );
        assert_round_trip(msg, again);
    }

    let decoded = whole.items.len();
    let mut run = Run::new(control[0]);
    if control[0] & 0x20 != 0 {
        let hello = run.hello.clone();
        run.give_acceptor(hello, control[0], false, 0);
    }
    for (i, (msg, _)) in whole.items.into_iter().enumerate() {
        let c = control[i % control.len()];
        if c & 1 == 0 {
            run.give_acceptor(msg, c, c & 2 != 0, 0);
        } else {
            run.give_dialer(msg, c, c & 2 != 0, 0);
        }
    }
    Outcome {
        decoded,
        authenticated: run.authenticated,
        established: run.established,
        verified: run.dialer.acceptor().is_some(),
    }
}

fn assert_round_trip(msg: &HandshakeMsg, mut wire: BytesMut) {
    let back = HandshakeDecoder
        .decode(&mut wire)
        .expect("an encoded message decodes");
    assert_eq!(back.as_ref(), Some(msg), "encoding changed the message");
    assert!(wire.is_empty(), "encoding left bytes over");
}

/// Checks that a message a machine asks to send encodes and decodes back the same.
fn assert_sendable(msg: &HandshakeMsg) {
    match encode_handshake(msg) {
        Ok(wire) => assert_round_trip(msg, wire),
        Err(WireError::FrameTooLarge { .. })
            if matches!(
                msg,
                HandshakeMsg::Rejected {
                    code: RejectCode::Incompatible,
                    ..
                }
            ) => {}
        Err(err) => panic!("a message to send does not encode: {err}"),
    }
}

/// A handshake error, as the model predicts it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ErrorSeen {
    Unexpected {
        expected: &'static str,
        got: &'static str,
    },
    Auth(String),
    Rejected {
        code: RejectCode,
        detail: String,
    },
    Refused(RejectCode),
    WrongPeer {
        want: NodeId,
        got: NodeId,
    },
}

impl From<&HandshakeError> for ErrorSeen {
    fn from(err: &HandshakeError) -> Self {
        match err {
            HandshakeError::Unexpected { expected, got } => ErrorSeen::Unexpected { expected, got },
            HandshakeError::Auth(who) => ErrorSeen::Auth(who.clone()),
            HandshakeError::Rejected { code, detail } => ErrorSeen::Rejected {
                code: *code,
                detail: detail.clone(),
            },
            HandshakeError::Refused { code, .. } => ErrorSeen::Refused(*code),
            HandshakeError::WrongPeer { want, got } => ErrorSeen::WrongPeer {
                want: (**want).clone(),
                got: (**got).clone(),
            },
        }
    }
}

/// An acceptor's step, as the model predicts it: refusal texts are left out but for their code.
#[derive(Clone, Debug, PartialEq, Eq)]
enum AcceptorSeen {
    Send(HandshakeMsg),
    Authenticated {
        dialer: NodeId,
        lane: LaneId,
        max_frame: u64,
    },
    Refuse {
        reply: Option<(RejectCode, Option<Proof>)>,
        error: ErrorSeen,
    },
}

impl From<&AcceptorStep> for AcceptorSeen {
    fn from(step: &AcceptorStep) -> Self {
        match step {
            AcceptorStep::Send(msg) => AcceptorSeen::Send(msg.clone()),
            AcceptorStep::Authenticated {
                dialer,
                lane,
                max_frame,
            } => AcceptorSeen::Authenticated {
                dialer: dialer.clone(),
                lane: lane.clone(),
                max_frame: *max_frame,
            },
            AcceptorStep::Refuse { reply, error } => {
                let reply = reply.as_ref().map(|reply| match reply {
                    HandshakeMsg::Rejected {
                        code,
                        detail,
                        proof,
                    } => {
                        if let HandshakeError::Refused {
                            code: sent,
                            detail: said,
                        } = error
                        {
                            assert_eq!((sent, said), (code, detail), "refusal and reply differ");
                        }
                        (*code, *proof)
                    }
                    other => panic!("a refusal replies {other:?}"),
                });
                AcceptorSeen::Refuse {
                    reply,
                    error: error.into(),
                }
            }
        }
    }
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

/// The error for `msg` arriving when `expected` was: the peer's refusal, or out of order.
fn unexpected(expected: &'static str, msg: &HandshakeMsg) -> ErrorSeen {
    match msg {
        HandshakeMsg::Rejected { code, detail, .. } => ErrorSeen::Rejected {
            code: *code,
            detail: detail.clone(),
        },
        other => ErrorSeen::Unexpected {
            expected,
            got: kind(other),
        },
    }
}

/// The acceptor as its documentation describes it.
enum AcceptorModel {
    AwaitHello,
    AwaitResponse {
        transcript: Transcript,
        channels: Vec<(String, u16)>,
    },
    Authenticated(Transcript),
    Done,
}

impl AcceptorModel {
    /// The proof that authenticates a dialer now, if the acceptor waits for one.
    fn dialer_proof(&self, cookie: &[u8]) -> Option<Proof> {
        match self {
            AcceptorModel::AwaitResponse { transcript, .. } => {
                Some(transcript.dialer_proof(cookie))
            }
            _ => None,
        }
    }

    fn handle(&mut self, msg: &HandshakeMsg, cookie: &[u8]) -> AcceptorSeen {
        let silent = |error| AcceptorSeen::Refuse { reply: None, error };
        let refuse = |code| AcceptorSeen::Refuse {
            reply: Some((code, None)),
            error: ErrorSeen::Refused(code),
        };
        match (std::mem::replace(self, AcceptorModel::Done), msg) {
            (
                AcceptorModel::AwaitHello,
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
                if *magic != MAGIC || *version != VERSION {
                    return refuse(RejectCode::Version);
                }
                *self = AcceptorModel::AwaitResponse {
                    transcript: Transcript {
                        dialer: node.clone(),
                        acceptor: acceptor_node(),
                        lane: lane.clone(),
                        dialer_nonce: *nonce,
                        acceptor_nonce: ACCEPTOR_NONCE,
                        dialer_max_frame: *max_frame,
                        acceptor_max_frame: ACCEPTOR_MAX,
                    },
                    channels: channels.clone(),
                };
                AcceptorSeen::Send(HandshakeMsg::Challenge {
                    node: acceptor_node(),
                    nonce: ACCEPTOR_NONCE,
                    max_frame: ACCEPTOR_MAX,
                })
            }
            (AcceptorModel::AwaitHello, other) => silent(unexpected("Hello", other)),
            (
                AcceptorModel::AwaitResponse {
                    transcript,
                    channels,
                },
                HandshakeMsg::Response { proof },
            ) => {
                if *proof != transcript.dialer_proof(cookie) {
                    return AcceptorSeen::Refuse {
                        reply: Some((RejectCode::Auth, None)),
                        error: ErrorSeen::Auth(transcript.dialer.to_string()),
                    };
                }
                if channels != table() {
                    return refuse(RejectCode::Incompatible);
                }
                if transcript.dialer.name == acceptor_node().name {
                    return refuse(RejectCode::SameName);
                }
                let seen = AcceptorSeen::Authenticated {
                    dialer: transcript.dialer.clone(),
                    lane: transcript.lane.clone(),
                    max_frame: transcript.dialer_max_frame,
                };
                *self = AcceptorModel::Authenticated(transcript);
                seen
            }
            (AcceptorModel::AwaitResponse { .. }, other) => silent(unexpected("Response", other)),
            (AcceptorModel::Authenticated(_) | AcceptorModel::Done, other) => {
                silent(unexpected("nothing", other))
            }
        }
    }

    /// What `accept` sends.
    fn accept(&mut self, cookie: &[u8]) -> Option<HandshakeMsg> {
        match std::mem::replace(self, AcceptorModel::Done) {
            AcceptorModel::Authenticated(t) => Some(HandshakeMsg::Accepted {
                proof: t.acceptor_proof(cookie),
            }),
            _ => None,
        }
    }

    /// The proof `reject` sends.
    fn reject(&mut self, cookie: &[u8]) -> Option<Proof> {
        match std::mem::replace(self, AcceptorModel::Done) {
            AcceptorModel::Authenticated(t) => Some(t.acceptor_proof(cookie)),
            _ => None,
        }
    }
}

/// A dialer's step, as the model predicts it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum DialerSeen {
    Send(HandshakeMsg),
    Established { acceptor: NodeId, max_frame: u64 },
    Failed(ErrorSeen),
}

impl From<&Result<DialerStep, HandshakeError>> for DialerSeen {
    fn from(step: &Result<DialerStep, HandshakeError>) -> Self {
        match step {
            Ok(DialerStep::Send(msg)) => DialerSeen::Send(msg.clone()),
            Ok(DialerStep::Established {
                acceptor,
                max_frame,
            }) => DialerSeen::Established {
                acceptor: acceptor.clone(),
                max_frame: *max_frame,
            },
            Err(err) => DialerSeen::Failed(err.into()),
        }
    }
}

/// The dialer as its documentation describes it.
enum DialerModel {
    AwaitChallenge,
    AwaitVerdict(Box<Transcript>),
    Done,
}

struct DialerTrack {
    state: DialerModel,
    expect: Option<NodeId>,
    verified: Option<NodeId>,
}

impl DialerTrack {
    /// The acceptor's proof that checks now, if the dialer waits for one.
    fn acceptor_proof(&self) -> Option<Proof> {
        match &self.state {
            DialerModel::AwaitVerdict(t) => Some(t.acceptor_proof(COOKIE)),
            _ => None,
        }
    }

    fn handle(&mut self, msg: &HandshakeMsg) -> DialerSeen {
        let valid = self.acceptor_proof();
        match (std::mem::replace(&mut self.state, DialerModel::Done), msg) {
            (
                DialerModel::AwaitChallenge,
                HandshakeMsg::Challenge {
                    node,
                    nonce,
                    max_frame,
                },
            ) => {
                if let Some(want) = &self.expect {
                    if want != node {
                        return DialerSeen::Failed(ErrorSeen::WrongPeer {
                            want: want.clone(),
                            got: node.clone(),
                        });
                    }
                }
                let t = Transcript {
                    dialer: dialer_node(),
                    acceptor: node.clone(),
                    lane: lane(),
                    dialer_nonce: DIALER_NONCE,
                    acceptor_nonce: *nonce,
                    dialer_max_frame: DIALER_MAX,
                    acceptor_max_frame: *max_frame,
                };
                let proof = t.dialer_proof(COOKIE);
                self.state = DialerModel::AwaitVerdict(Box::new(t));
                DialerSeen::Send(HandshakeMsg::Response { proof })
            }
            (DialerModel::AwaitChallenge, other) => {
                DialerSeen::Failed(unexpected("Challenge", other))
            }
            (DialerModel::AwaitVerdict(t), HandshakeMsg::Accepted { proof }) => {
                if Some(*proof) != valid {
                    return DialerSeen::Failed(ErrorSeen::Auth(t.acceptor.to_string()));
                }
                self.verified = Some(t.acceptor.clone());
                DialerSeen::Established {
                    acceptor: t.acceptor,
                    max_frame: t.acceptor_max_frame,
                }
            }
            (
                DialerModel::AwaitVerdict(t),
                HandshakeMsg::Rejected {
                    code,
                    detail,
                    proof: Some(proof),
                },
            ) if Some(*proof) == valid => {
                self.verified = Some(t.acceptor);
                DialerSeen::Failed(ErrorSeen::Rejected {
                    code: *code,
                    detail: detail.clone(),
                })
            }
            (DialerModel::AwaitVerdict(_), other) => {
                DialerSeen::Failed(unexpected("Accepted", other))
            }
            (DialerModel::Done, other) => DialerSeen::Failed(unexpected("nothing", other)),
        }
    }
}

/// One run: the machines, their models, and the second acceptor while it still shadows.
struct Run {
    hello: HandshakeMsg,
    dialer: Dialer,
    dialer_model: DialerTrack,
    acceptor: Acceptor,
    acceptor_model: AcceptorModel,
    shadow: Option<(Acceptor, AcceptorModel)>,
    authenticated: bool,
    established: bool,
}

/// Deliveries that one delivered message may cause by looping back (each machine answers at
/// most a few times, so this is never reached; it keeps a mistake from recursing forever).
const MAX_DEPTH: usize = 8;

impl Run {
    fn new(c0: u8) -> Self {
        let expect = (c0 & 0x40 != 0).then(acceptor_node);
        let (dialer, hello) = dialer(expect.clone());
        assert_sendable(&hello);
        Run {
            hello,
            dialer,
            dialer_model: DialerTrack {
                state: DialerModel::AwaitChallenge,
                expect,
                verified: None,
            },
            acceptor: acceptor(COOKIE),
            acceptor_model: AcceptorModel::AwaitHello,
            shadow: Some((acceptor(OTHER_COOKIE), AcceptorModel::AwaitHello)),
            authenticated: false,
            established: false,
        }
    }

    /// The driver's decision on the acceptor's lane: accept, or reject with a code.
    fn decide(&mut self, c: u8, depth: usize) {
        let code = CODES[usize::from(c >> 3) & 7];
        let decide = |acceptor: &mut Acceptor, model: &mut AcceptorModel, cookie: &[u8]| {
            if c & 4 == 0 {
                let sent = acceptor.accept();
                assert_eq!(sent, model.accept(cookie), "accept");
                sent
            } else {
                let detail = "decided by the driver".to_string();
                let (sent, error) = acceptor.reject(code, detail.clone());
                let proof = model.reject(cookie);
                assert_eq!(
                    sent,
                    HandshakeMsg::Rejected {
                        code,
                        detail: detail.clone(),
                        proof
                    },
                    "reject"
                );
                assert_eq!(error, HandshakeError::Refused { code, detail }, "reject");
                Some(sent)
            }
        };
        let sent = decide(&mut self.acceptor, &mut self.acceptor_model, COOKIE);
        if let Some((shadow, model)) = &mut self.shadow {
            let other = decide(shadow, model, OTHER_COOKIE);
            assert_eq!(
                other, sent,
                "an unproven dialer saw the cookie make a difference"
            );
        }
        if let Some(msg) = sent {
            assert_sendable(&msg);
            if c & 0x80 != 0 {
                self.give_dialer(msg, c, false, depth + 1);
            }
        }
    }

    fn give_acceptor(&mut self, msg: HandshakeMsg, c: u8, fix: bool, depth: usize) {
        assert!(depth < MAX_DEPTH, "the machines answer each other forever");
        if c & 0x10 != 0 {
            self.decide(c, depth);
        }
        let valid = self.acceptor_model.dialer_proof(COOKIE);
        let msg = match (msg, valid) {
            (HandshakeMsg::Response { .. }, Some(proof)) if fix => HandshakeMsg::Response { proof },
            (msg, _) => msg,
        };
        let proven = matches!(&msg, HandshakeMsg::Response { proof } if Some(*proof) == valid);

        let expected = self.acceptor_model.handle(&msg, COOKIE);
        let step = self.acceptor.handle(msg.clone());
        let seen = AcceptorSeen::from(&step);
        assert_eq!(seen, expected, "acceptor given {msg:?}");

        if proven {
            // From here on the two acceptors may differ.
            self.shadow = None;
        }
        if let Some((shadow, model)) = &mut self.shadow {
            let expected = model.handle(&msg, OTHER_COOKIE);
            let other = AcceptorSeen::from(&shadow.handle(msg));
            assert_eq!(other, expected, "second acceptor");
            assert_eq!(
                other, seen,
                "an unproven dialer saw the cookie make a difference"
            );
        }

        match step {
            AcceptorStep::Send(msg) => {
                assert_sendable(&msg);
                if c & 0x80 != 0 {
                    self.give_dialer(msg, c, false, depth + 1);
                }
            }
            AcceptorStep::Authenticated { .. } => {
                self.authenticated = true;
                self.decide(c & !0x10, depth)
            }
            AcceptorStep::Refuse {
                reply: Some(msg), ..
            } => {
                assert_sendable(&msg);
                if c & 0x80 != 0 {
                    self.give_dialer(msg, c, false, depth + 1);
                }
            }
            AcceptorStep::Refuse { reply: None, .. } => {}
        }
    }

    fn give_dialer(&mut self, msg: HandshakeMsg, c: u8, fix: bool, depth: usize) {
        assert!(depth < MAX_DEPTH, "the machines answer each other forever");
        let msg = match (msg, self.dialer_model.acceptor_proof()) {
            (HandshakeMsg::Accepted { .. }, Some(proof)) if fix => HandshakeMsg::Accepted { proof },
            (HandshakeMsg::Rejected { code, detail, .. }, Some(proof)) if fix => {
                HandshakeMsg::Rejected {
                    code,
                    detail,
                    proof: Some(proof),
                }
            }
            (msg, _) => msg,
        };
        let expected = self.dialer_model.handle(&msg);
        let step = self.dialer.handle(msg.clone());
        let seen = DialerSeen::from(&step);
        assert_eq!(seen, expected, "dialer given {msg:?}");
        assert_eq!(
            self.dialer.acceptor(),
            self.dialer_model.verified.as_ref(),
            "the node the dialer trusts"
        );
        self.established |= matches!(step, Ok(DialerStep::Established { .. }));
        if let Ok(DialerStep::Send(msg)) = step {
            assert_sendable(&msg);
            if c & 0x80 != 0 {
                self.give_acceptor(msg, c, false, depth + 1);
            }
        }
    }
}
