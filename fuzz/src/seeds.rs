//! Seed inputs for the targets, made with the encoders the runtime uses: each is a target's
//! parameter bytes followed by a stream of real messages (whole, cut short, or pipelined).

use bytes::BytesMut;
use maquis_proto::id::{LaneId, NodeId};
use maquis_proto::wire::{
    encode_frame, encode_handshake, ActorHeader, Dest, DownReason, Frame, HandshakeMsg, Header,
    RejectCode, ReplyStatus, Transcript, MAGIC, VERSION,
};
use maquis_ring::resp::parser::encode_request;

use crate::handshake;

/// A named seed input.
pub type Seed = (String, Vec<u8>);

fn seed(name: impl Into<String>, params: &[u8], stream: &[u8]) -> Seed {
    let mut input = params.to_vec();
    input.extend_from_slice(stream);
    (name.into(), input)
}

fn node(name: &str, port: u16, incarnation: u64) -> NodeId {
    NodeId::new(name, ([10, 0, 0, 1], port).into(), incarnation)
}

/// One frame of each kind of header.
fn frames() -> Vec<Frame> {
    let send = ActorHeader::Send {
        to: Dest::Name("kv".into()),
        incarnation: 3,
        call: Some(17),
        ty: 0x1234_5678_9abc_def0,
    };
    let headers = vec![
        Header::Actor(send.clone()),
        Header::Actor(ActorHeader::Send {
            to: Dest::Id(42),
            incarnation: 0,
            call: None,
            ty: 0,
        }),
        Header::Actor(ActorHeader::Reply {
            call: 17,
            status: ReplyStatus::Ok,
            ty: 5,
        }),
        Header::Actor(ActorHeader::Reply {
            call: 18,
            status: ReplyStatus::Failed("boom".into()),
            ty: 0,
        }),
        Header::Actor(ActorHeader::Reply {
            call: 19,
            status: ReplyStatus::TypeMismatch,
            ty: 0,
        }),
        Header::Actor(ActorHeader::Monitor {
            watch: 1,
            target: Dest::Name("echo".into()),
        }),
        Header::Actor(ActorHeader::Demonitor {
            watch: 1,
            target: Dest::Id(7),
        }),
        Header::Actor(ActorHeader::Down {
            watch: 1,
            target: 7,
            reason: DownReason::Panicked("oops".into()),
        }),
        Header::Actor(ActorHeader::Link {
            link: 9,
            from: 3,
            to: Dest::Name("sup".into()),
        }),
        Header::Actor(ActorHeader::Unlink {
            link: 9,
            initiator: true,
        }),
        Header::Actor(ActorHeader::Exit {
            link: 9,
            initiator: false,
            reason: DownReason::Linked("child".into()),
        }),
        Header::Overlay,
        Header::Heartbeat {
            seq: 300,
            sent_us: 1_700_000_000_000_000,
        },
        Header::HeartbeatAck {
            seq: 300,
            sent_us: 1,
        },
        Header::Bye,
        Header::Broadcast,
        Header::Routed {
            to: node("c", 7002, 4),
            from: NodeId::new("a", "[::1]:7000".parse().unwrap(), 1),
            hops: 2,
            lane: 5,
            actor: send,
        },
    ];
    headers
        .into_iter()
        .enumerate()
        .map(|(i, header)| Frame {
            header,
            payload: vec![i as u8; i % 4 * 5].into(),
        })
        .collect()
}

fn encode(frame: &Frame) -> BytesMut {
    encode_frame(&frame.header, &frame.payload, 1 << 20).expect("a seed frame encodes")
}

/// Seeds of the frame target.
pub fn frame() -> Vec<Seed> {
    // Parameters: frame limit 1024 (2) or 8192 (3); reads of up to 16 (3) or any size (7).
    let frames = frames();
    let mut seeds = Vec::new();
    for (i, f) in frames.iter().enumerate() {
        let wire = encode(f);
        seeds.push(seed(format!("frame-{i:02}"), &[2, 7], &wire));
        if i % 4 == 0 {
            seeds.push(seed(
                format!("frame-{i:02}-cut"),
                &[3, 3],
                &wire[..wire.len() - 1],
            ));
        }
    }
    let mut all = BytesMut::new();
    for f in &frames {
        all.extend_from_slice(&encode(f));
    }
    seeds.push(seed("pipeline", &[3, 0x2b], &all));
    seeds.push(seed("pipeline-small-limit", &[0, 0x14], &all[..200]));
    seeds.push(seed("too-large", &[1, 7], &[0xff, 0xff, 0xff, 0xff, 0, 0]));
    seeds.push(seed("header-past-frame", &[2, 7], &[0, 0, 0, 10, 0, 20]));
    seeds
}

/// Seeds of the handshake target.
pub fn handshake() -> Vec<Seed> {
    // Control bytes: 0x80 loops answers back; 0x20 (first byte only) delivers the dialer's
    // own Hello; 0x02 fixes proofs; 0x01 delivers to the dialer.
    let (_, hello) = handshake::dialer(None);
    let transcript = Transcript {
        dialer: handshake::dialer_node(),
        acceptor: handshake::acceptor_node(),
        lane: handshake::lane(),
        dialer_nonce: handshake::DIALER_NONCE,
        acceptor_nonce: handshake::ACCEPTOR_NONCE,
        dialer_max_frame: handshake::DIALER_MAX,
        acceptor_max_frame: handshake::ACCEPTOR_MAX,
    };
    let challenge = HandshakeMsg::Challenge {
        node: handshake::acceptor_node(),
        nonce: handshake::ACCEPTOR_NONCE,
        max_frame: handshake::ACCEPTOR_MAX,
    };
    let response = HandshakeMsg::Response {
        proof: transcript.dialer_proof(handshake::COOKIE),
    };
    let accepted = HandshakeMsg::Accepted {
        proof: transcript.acceptor_proof(handshake::COOKIE),
    };
    let rejected = HandshakeMsg::Rejected {
        code: RejectCode::Superseded,
        detail: "crossing dials".into(),
        proof: Some(transcript.acceptor_proof(handshake::COOKIE)),
    };
    let foreign = HandshakeMsg::Hello {
        magic: MAGIC,
        version: VERSION,
        node: NodeId::new("z", "[2001:db8::7]:9000".parse().unwrap(), 99),
        lane: LaneId::new("membership", 0),
        nonce: [9; 32],
        channels: vec![("membership".into(), 1), ("default".into(), 16)],
        max_frame: 32 << 20,
    };
    let old = HandshakeMsg::Hello {
        magic: *b"HTTP",
        version: VERSION - 1,
        node: handshake::dialer_node(),
        lane: handshake::lane(),
        nonce: [0; 32],
        channels: handshake::table(),
        max_frame: 1024,
    };
    let wire = |msgs: &[&HandshakeMsg]| {
        let mut out = BytesMut::new();
        for msg in msgs {
            out.extend_from_slice(&encode_handshake(msg).expect("a seed message encodes"));
        }
        out
    };
    let acceptor = [0x07, 0, 0, 0, 0, 0, 0, 0, 0];
    let dialer = [0x07, 1, 1, 1, 1, 1, 1, 1, 1];
    let mut seeds = vec![
        seed("honest-loop", &[7, 0xa0, 0, 0, 0, 0, 0, 0, 0], &[]),
        seed("honest-loop-reject", &[7, 0xec, 0, 0, 0, 0, 0, 0, 0], &[]),
        seed(
            "acceptor-in-order",
            &[0x0b, 0, 2, 0, 0, 0, 0, 0, 0],
            &wire(&[&hello, &response]),
        ),
        seed(
            "dialer-in-order",
            &[0x05, 0x41, 1, 1, 1, 1, 1, 1, 1],
            &wire(&[&challenge, &accepted]),
        ),
        seed(
            "dialer-rejected",
            &[0x05, 1, 1, 1, 1, 1, 1, 1, 1],
            &wire(&[&challenge, &rejected]),
        ),
        seed("foreign-hello", &acceptor, &wire(&[&foreign, &response])),
        seed("old-hello", &acceptor, &wire(&[&old])),
        seed(
            "out-of-order",
            &acceptor,
            &wire(&[&accepted, &hello, &challenge]),
        ),
        seed(
            "crossed",
            &[0x03, 0x81, 0x80, 0x03, 0x02, 0, 0, 0, 0],
            &wire(&[&challenge, &hello, &response, &accepted]),
        ),
    ];
    for (i, msg) in [&hello, &challenge, &response, &accepted, &rejected]
        .into_iter()
        .enumerate()
    {
        let one = wire(&[msg]);
        seeds.push(seed(format!("one-{i}"), &dialer, &one));
        seeds.push(seed(
            format!("one-{i}-cut"),
            &acceptor,
            &one[..one.len() - 1],
        ));
    }
    seeds
}

/// Seeds of the RESP target.
pub fn resp() -> Vec<Seed> {
    // Parameters: 0xff keeps the default limits; 0xbe is max_bulk 512, max_args 64,
    // max_inline 1024, max_request 256.
    let request = |args: &[&[u8]]| {
        let mut out = BytesMut::new();
        encode_request(args, &mut out);
        out.to_vec()
    };
    let set = request(&[b"SET", b"key", b"va\r\nlue"]);
    let mut pipeline = request(&[b"MSET", b"a", b"1", b"b", b"2"]);
    pipeline.extend_from_slice(b"PING\r\n\r\nECHO hello  world\n*0\r\n*-1\r\n");
    pipeline.extend_from_slice(&request(&[b"MGET", b"a", b"b", b""]));
    pipeline.extend_from_slice(&request(&[b"GET", b"a"])[..9]);
    vec![
        seed("set", &[0xff, 7], &set),
        seed("set-small", &[0xbe, 1], &set),
        seed("pipeline", &[0xff, 0x24], &pipeline),
        seed("pipeline-small", &[0xaa, 0x63], &pipeline),
        seed("inline", &[0xbe, 3], b"CLIENT SETNAME fuzz\r\nINFO\r\n"),
        seed("too-many-args", &[0x00, 7], b"*99999999999\r\n"),
        seed("bulk-too-long", &[0xff, 7], b"*2\r\n$999999999999\r\n"),
        seed("negative-bulk", &[0xff, 7], b"*1\r\n$-5\r\n"),
        seed("not-a-bulk", &[0xff, 7], b"*1\r\n:12\r\n"),
        seed("unterminated", &[0xff, 2], b"*1\r\n$3\r\nabcd\r\n"),
    ]
}
