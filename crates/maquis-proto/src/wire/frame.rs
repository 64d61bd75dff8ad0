//! Frames: what a lane carries once its handshake is done.
//!
//! Layout of one frame:
//!
//! ```text
//! [u32 BE: length of everything after this field][u16 BE: header length][header][payload]
//! ```
//!
//! The header is a postcard-encoded [`Header`]; the payload is opaque bytes whose meaning the
//! header gives. [`encode_head`] writes everything but the payload, so a sender can hand the
//! payload to vectored I/O without copying it; [`FrameDecoder`] hands the payload back as a
//! zero-copy slice of the read buffer.

use super::parts::Reassembly;
use super::stripes::PieceRooms;
use super::{decode_exact, peek_len, split_frame, StreamDecoder, WireError, MIN_BUFFER};
use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

/// The default bound on a frame's length (the `u32` length field excluded): 32 MiB.
pub const DEFAULT_MAX_FRAME: usize = 32 * 1024 * 1024;

/// Bytes before the header: the `u32` frame length and the `u16` header length.
const PREFIX: usize = 4 + 2;

/// Which actor on the receiving node a message is for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Dest {
    /// An actor by its node-local id.
    Id(u64),
    /// An actor by its registered name.
    Name(String),
}

/// Why a monitor fired.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DownReason {
    /// The watched actor stopped.
    Stopped,
    /// The watched actor did not exist (or no longer existed) when the monitor was set.
    NoProc,
    /// The node hosting the watched actor is gone or unreachable.
    NodeDown,
    /// The watched actor panicked; the panic's message.
    Panicked(String),
    /// The actor was told to stop from outside: by its supervisor or `Node::stop_actor`.
    Shutdown,
    /// A linked actor went down (for any reason but `Stopped`); which one and why.
    Linked(String),
    /// The actor gave up, with its reason (a supervisor whose children restarted more often
    /// than its intensity allows).
    Failed(String),
    /// The watch or link was refused: the actor already has as many watchers and links as a
    /// node keeps for one actor.
    WatcherLimit,
}

impl DownReason {
    /// Whether an actor linked to one that went down for this reason goes down too: every
    /// reason but `Stopped` (a normal end) does.
    pub fn propagates(&self) -> bool {
        !matches!(self, DownReason::Stopped)
    }
}

impl std::fmt::Display for DownReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DownReason::Stopped => f.write_str("stopped"),
            DownReason::NoProc => f.write_str("no such actor"),
            DownReason::NodeDown => f.write_str("its node went down"),
            DownReason::Panicked(m) => write!(f, "panicked: {m}"),
            DownReason::Shutdown => f.write_str("shut down"),
            DownReason::Linked(m) => write!(f, "linked: {m}"),
            DownReason::Failed(m) => write!(f, "failed: {m}"),
            DownReason::WatcherLimit => f.write_str("too many watchers and links"),
        }
    }
}

/// The outcome of a call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplyStatus {
    /// The call succeeded; the frame's payload is the encoded reply.
    Ok,
    /// The called actor does not exist.
    NoProc,
    /// The call failed, with a human-readable reason.
    Failed(String),
    /// The called actor takes another message type than the request's (their fingerprints
    /// differ); the request was not decoded.
    TypeMismatch,
}

/// What a frame is; tells the receiver how to read the payload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Header {
    /// Actor traffic from the sending node (a message, a reply, a watch); see [`ActorHeader`].
    Actor(ActorHeader),
    /// An overlay protocol message; the payload is the overlay's encoded message.
    Overlay,
    /// A liveness probe.
    Heartbeat {
        /// The probe's sequence number.
        seq: u64,
        /// When the probe was sent, in microseconds on the sender's clock.
        sent_us: u64,
    },
    /// The answer to a [`Header::Heartbeat`], echoing its fields.
    HeartbeatAck {
        /// The probe's sequence number.
        seq: u64,
        /// The probe's send time, echoed so the prober can measure the round trip.
        sent_us: u64,
    },
    /// A graceful goodbye before a node closes its lanes.
    Bye,
    /// A broadcast protocol message (Plumtree) between neighbours; the payload is the
    /// postcard-encoded `PlumtreeMsg<NodeId>`.
    Broadcast,
    /// Actor traffic for a node that is not a neighbour of its sender, forwarded hop by hop;
    /// the payload is that of the routed message. Only actor traffic is routed: protocol
    /// frames are between neighbours by nature.
    Routed {
        /// The destination node.
        to: crate::id::NodeId,
        /// The node that sent it (replies and failures go back to it).
        from: crate::id::NodeId,
        /// Hops travelled so far; it is dropped when this reaches the hop limit.
        hops: u16,
        /// The lane slot the sender picked (channel and index); every hop sends it on the same
        /// slot, so channels, parallelism and affinity hold along the way.
        lane: u16,
        /// What it is at the destination.
        actor: ActorHeader,
    },
    /// One piece of a frame too large to be written at once (see [`super::parts`]); the
    /// payload is the piece. The receiver's [`FrameDecoder`] puts the pieces together and
    /// hands on the frame they make: a reader never sees this header.
    Part {
        /// Whether this is the frame's last piece.
        last: bool,
    },
    /// One piece of a large frame striped over the lanes of its channel (see
    /// [`super::stripes`]); the payload is the piece, the bytes of the striped frame (its
    /// length prefix included) from `offset` on.
    Stripe {
        /// The receiver's table the frame was numbered for (see [`Header::StripeWindow`]).
        session: u64,
        /// The striped frame, numbered by its sender (per peer).
        id: u64,
        /// Where the piece goes in the striped frame's bytes.
        offset: u64,
        /// The striped frame's length in bytes, its length prefix included.
        total: u64,
    },
    /// The place of striped frame `id` in its channel's order, on the channel's ordering lane,
    /// written once every piece of it has been written: the receiver hands the frame on here.
    /// No payload.
    Commit {
        /// The receiver's table the frame was numbered for (see [`Header::StripeWindow`]).
        session: u64,
        /// The striped frame.
        id: u64,
        /// False when a piece of it was lost on the sender's side: the receiver drops it.
        ok: bool,
        /// The striped frame's hold key ([`super::stripes::hold_key`]): while it waits for its
        /// pieces, the frames behind it with another key go on. `None`: all wait.
        hold: Option<u64>,
        /// The lanes of the channel its pieces were queued on ([`super::stripes::lane_bit`]
        /// of each one's index): a lost connection of another lane cannot have taken a piece.
        lanes: u64,
    },
    /// A barrier across the first `lanes` lanes of a channel, written on each of them when the
    /// sender changes how many of them carry small frames (see `transport::widen` in the
    /// runtime): the receiver hands on nothing that follows a barrier on one of these lanes
    /// before everything that precedes it on all of them has been handed on. No payload.
    Barrier {
        /// The barrier's number, growing per peer and channel.
        epoch: u64,
        /// How many lanes of the channel, from its first, the barrier is written on.
        lanes: u16,
    },
    /// The receiver of striped frames lets their sender number them up to `limit` (excluded):
    /// its window (see [`super::stripes`]). Sent when the receiver's first lane of the peer
    /// connects, when frames are handed on or dropped, and again on the next ticks, since it may
    /// be lost; only a larger limit than the last counts, within a session. No payload. See
    /// [`super::stripes::Window`].
    StripeWindow {
        /// The receiver's table (chosen at random when it is made): a sender that hears of a
        /// new one numbers its frames from 0 again, and the frames numbered for another are
        /// dropped.
        session: u64,
        /// Every frame below it was handed on or dropped: where a sender that hears of the
        /// session for the first time starts numbering.
        low: u64,
        /// Striped frames with a smaller id may be sent.
        limit: u64,
        /// The frames from `low` on may hold this many bytes together (as their lengths
        /// count them).
        bytes: u64,
    },
}

/// Actor traffic: what a [`Header::Actor`] frame (from a neighbour) or a [`Header::Routed`]
/// frame (from further away) is at its destination.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ActorHeader {
    /// An application message for an actor on the receiving node; the payload is the
    /// postcard-encoded message.
    Send {
        /// The target actor.
        to: Dest,
        /// The incarnation of the target node the sender meant; 0 means any.
        incarnation: u64,
        /// The call id when this message is a request expecting an [`ActorHeader::Reply`].
        call: Option<u64>,
        /// The fingerprint of the message's type (0: unchecked); the receiver decodes it only
        /// if its actor's type has the same.
        ty: u64,
    },
    /// The reply to a call; the payload is the encoded reply when `status` is
    /// [`ReplyStatus::Ok`], and empty otherwise.
    Reply {
        /// The call id from the request's [`ActorHeader::Send`].
        call: u64,
        /// How the call went.
        status: ReplyStatus,
        /// The fingerprint of the reply's type (0: unchecked or no payload).
        ty: u64,
    },
    /// Asks the receiving node to report when actor `target` goes down (a name is resolved
    /// when the request arrives).
    Monitor {
        /// The watch on the sending node.
        watch: u64,
        /// The watched actor on the receiving node, by id or by registered name.
        target: Dest,
    },
    /// Cancels an [`ActorHeader::Monitor`].
    Demonitor {
        /// The watch on the sending node.
        watch: u64,
        /// The watched actor on the receiving node, as in the `Monitor`.
        target: Dest,
    },
    /// Reports that a monitored actor went down.
    Down {
        /// The watching actor on the receiving node.
        watch: u64,
        /// The watched actor on the sending node.
        target: u64,
        /// Why it went down.
        reason: DownReason,
    },
    /// Links actor `from` on the sending node with actor `to` on the receiving node: when
    /// either goes down for a reason that [propagates](DownReason::propagates), the other is
    /// stopped. The receiver answers a missing `to` with an `Exit` (`NoProc`).
    Link {
        /// The link's id on the sending node (the link's initiator).
        link: u64,
        /// The linking actor on the sending node.
        from: u64,
        /// The linked actor on the receiving node, by id or by registered name.
        to: Dest,
    },
    /// An application message sent for acknowledged delivery: like `Send` (no call), with the
    /// sender's sequence number for this node and its floor (see `crate::reliable`). The
    /// receiver answers with an [`ActorHeader::Ack`], and handles a number once.
    Reliable {
        /// The target actor.
        to: Dest,
        /// The incarnation of the target node the sender meant; 0 means any.
        incarnation: u64,
        /// The fingerprint of the message's type (0: unchecked).
        ty: u64,
        /// The sender's session with this node: numbers count from 1 in each session.
        session: u64,
        /// The message's sequence number from the sending node to this one.
        seq: u64,
        /// The oldest number the sender still waits on.
        floor: u64,
    },
    /// Acknowledges a [`ActorHeader::Reliable`]: `Ok` when it is in the actor's mailbox (now or
    /// before), `NoProc` or `TypeMismatch` when it never will be.
    Ack {
        /// The acknowledged number.
        seq: u64,
        /// The outcome.
        status: ReplyStatus,
    },
    /// Removes a link without stopping anyone.
    Unlink {
        /// The link's id on its initiator.
        link: u64,
        /// Whether the sender is the link's initiator.
        initiator: bool,
    },
    /// The sender's end of a link went down; the receiver's end stops unless `reason` is
    /// `Stopped`.
    Exit {
        /// The link's id on its initiator.
        link: u64,
        /// Whether the sender is the link's initiator.
        initiator: bool,
        /// Why the sender's end went down.
        reason: DownReason,
    },
}

/// One decoded frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame {
    /// What the frame is.
    pub header: Header,
    /// The payload, a zero-copy slice of the buffer the frame was read into.
    pub payload: Bytes,
}

/// Appends a frame's length field, header length field and header to `out`, but not its
/// payload of `payload_len` bytes, which the caller writes next (typically with vectored I/O).
///
/// Fails with [`WireError::HeaderTooLarge`] if the encoded header exceeds `u16::MAX` bytes, and
/// with [`WireError::FrameTooLarge`] if `2 + header + payload_len` exceeds `max_frame` (or
/// `u32::MAX`). On error `out` is left as it was.
pub fn encode_head(
    header: &Header,
    payload_len: usize,
    max_frame: usize,
    out: &mut BytesMut,
) -> Result<(), WireError> {
    let start = out.len();
    let result = write_head(header, payload_len, max_frame, out, start);
    if result.is_err() {
        out.truncate(start);
    }
    result
}

/// [`encode_head`] without the clean-up: serializes the header in place after a placeholder
/// prefix, then fills the prefix in.
fn write_head(
    header: &Header,
    payload_len: usize,
    max_frame: usize,
    out: &mut BytesMut,
    start: usize,
) -> Result<(), WireError> {
    out.put_bytes(0, PREFIX);
    postcard::to_io(header, (&mut *out).writer())
        .map_err(|err| WireError::Encode(err.to_string()))?;
    let header_len = out.len() - start - PREFIX;
    let header_len16 =
        u16::try_from(header_len).map_err(|_| WireError::HeaderTooLarge { len: header_len })?;
    let len = (2 + header_len).saturating_add(payload_len);
    let max = max_frame.min(u32::MAX as usize);
    if len > max {
        return Err(WireError::FrameTooLarge { len, max });
    }
    // `len <= max <= u32::MAX`, so the cast is exact.
    out[start..start + 4].copy_from_slice(&(len as u32).to_be_bytes());
    out[start + 4..start + PREFIX].copy_from_slice(&header_len16.to_be_bytes());
    Ok(())
}

/// Decodes the header of a head that [`encode_head`] wrote (the frame's prefix and header,
/// without its payload): how a sender reads back a frame it queued but could not write.
pub fn decode_head(head: &[u8]) -> Result<Header, WireError> {
    let Some(&[hi, lo]) = head.get(4..PREFIX) else {
        return Err(WireError::Truncated);
    };
    let end = PREFIX + usize::from(u16::from_be_bytes([hi, lo]));
    let bytes = head.get(PREFIX..end).ok_or(WireError::Truncated)?;
    decode_exact(bytes)
}

/// Encodes a whole frame, copying the payload: for tests and small frames.
pub fn encode_frame(
    header: &Header,
    payload: &[u8],
    max_frame: usize,
) -> Result<BytesMut, WireError> {
    let mut out = BytesMut::new();
    encode_head(header, payload.len(), max_frame, &mut out)?;
    out.extend_from_slice(payload);
    Ok(out)
}

/// Decodes frames from a byte stream (a [`StreamDecoder`]).
///
/// A frame longer than `max_frame` is refused as soon as its length field arrives, before any
/// memory is reserved for it; otherwise the decoder makes room for the rest of the current frame
/// only (in a buffer of at least 8 KiB, or [`FrameDecoder::read_buffer`], unless `max_frame` is
/// smaller), so the read buffer never grows past `max_frame + 4` bytes on the decoder's
/// account. Frames sent in parts ([`super::parts`]) come out whole, with their last part; the
/// one frame in parts a stream may have open at a time holds at most another `max_frame + 4`
/// bytes. Any error means the stream is corrupt or hostile and should be closed.
#[derive(Clone, Debug)]
pub struct FrameDecoder {
    max_frame: usize,
    parts: Reassembly,
    /// Bytes of the current part's piece still to come, and whether it is the last piece: a
    /// piece goes into the frame it belongs to as it is read, not first into a frame of its
    /// own.
    piece_left: usize,
    piece_last: bool,
    /// While the rest of a piece is read straight into its frame (see [`Lent`]).
    lent: Option<Lent>,
    /// Where the pieces of striped frames go as they are read, if anywhere.
    rooms: Option<std::sync::Arc<dyn PieceRooms>>,
    /// The smallest buffer a partial frame moves into: the reads that follow fill it.
    min_buffer: usize,
}

impl FrameDecoder {
    /// A decoder refusing frames longer than `max_frame` bytes (length field excluded).
    pub fn new(max_frame: usize) -> Self {
        FrameDecoder {
            max_frame,
            parts: Reassembly::new(),
            piece_left: 0,
            piece_last: false,
            lent: None,
            rooms: None,
            min_buffer: MIN_BUFFER,
        }
    }

    /// Puts the pieces of striped frames ([`Header::Stripe`]) into the frames they belong to,
    /// in the memory `rooms` lends, as they are read: they are taken in there and never come
    /// out of the decoder (without it, each comes out as a frame of its own).
    pub fn pieces_into(mut self, rooms: std::sync::Arc<dyn PieceRooms>) -> Self {
        self.rooms = Some(rooms);
        self
    }

    /// Makes the buffer a frame that has not fully arrived moves into at least `bytes` long
    /// (still at most `max_frame + 4`): the reads that follow fill it, so a stream of small
    /// frames is read in reads of about this size. Give it the size the read buffer starts
    /// with (8 KiB unless set).
    pub fn read_buffer(mut self, bytes: usize) -> Self {
        self.min_buffer = bytes;
        self
    }

    /// Bytes of a frame sent in parts held until its last part arrives (at most the frame
    /// limit plus four).
    pub fn partial_bytes(&self) -> usize {
        self.parts.held()
    }

    /// The largest frame this decoder accepts.
    pub fn max_frame(&self) -> usize {
        self.max_frame
    }
}

impl Default for FrameDecoder {
    /// A decoder with [`DEFAULT_MAX_FRAME`].
    fn default() -> Self {
        FrameDecoder::new(DEFAULT_MAX_FRAME)
    }
}

/// The rest of a piece being read straight into the memory of its frame: the reads go into
/// the room lent, and the read buffer waits aside until it is full.
#[derive(Clone, Debug)]
struct Lent {
    read_buffer: BytesMut,
    /// The bytes the room takes.
    len: usize,
    /// The striped frame's piece (session, id, offset), or `None`: the frame in parts.
    stripe: Option<(u64, u64, u64)>,
}

impl StreamDecoder for FrameDecoder {
    type Item = Frame;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, WireError> {
        loop {
            if let Some(lent) = &self.lent {
                let n = lent.len;
                if src.len() < n {
                    return Ok(None);
                }
                let lent = self.lent.take().expect("lent");
                let mut room = std::mem::replace(src, lent.read_buffer);
                if room.len() > n {
                    // Only a reader that grew the room past its capacity gets here.
                    src.extend_from_slice(&room.split_off(n));
                }
                match lent.stripe {
                    Some((session, id, offset)) => {
                        if let Some(rooms) = &self.rooms {
                            rooms.filled(session, id, offset, room)?;
                        }
                    }
                    None => {
                        self.parts.give_back(room);
                        self.piece_left -= n;
                        if self.piece_left == 0 && self.piece_last {
                            return self.parts.finish().map(Some);
                        }
                    }
                }
                continue;
            }
            if self.piece_left > 0 {
                let n = self.piece_left.min(src.len());
                if n > 0 {
                    self.parts.extend(&src[..n], self.max_frame)?;
                    let _ = src.split_to(n);
                    self.piece_left -= n;
                    if self.piece_left == 0 && self.piece_last {
                        return self.parts.finish().map(Some);
                    }
                    if self.piece_left == 0 {
                        continue;
                    }
                }
                // The read buffer is empty and the piece goes on: a large rest is read
                // straight into the frame's memory (the reads that follow fill the room the
                // frame lends, and stop where the piece does); a small one into the buffer.
                if self.piece_left >= self.min_buffer {
                    if let Some(room) = self.parts.lend(self.piece_left)? {
                        let read_buffer = std::mem::replace(src, room);
                        self.lent = Some(Lent {
                            read_buffer,
                            len: self.piece_left,
                            stripe: None,
                        });
                        return Ok(None);
                    }
                }
                // Room for the rest of the piece (and the next part's head), so that it is
                // read in as few reads as the socket allows.
                src.reserve((self.piece_left + PREFIX + 16).min(self.max_frame + 4));
                return Ok(None);
            }
            if self.start_piece(src)? || self.start_stripe(src)? {
                continue;
            }
            let Some(frame) = self.decode_one(src)? else {
                return Ok(None);
            };
            let Header::Part { last } = frame.header else {
                return Ok(Some(frame));
            };
            if let Some(whole) = self.parts.piece(&frame.payload, last, self.max_frame)? {
                return Ok(Some(whole));
            }
        }
    }
}

impl FrameDecoder {
    /// When the frame at the front of `src` is a part that has not fully arrived (and is not
    /// empty), takes its head off and makes its piece stream into the frame it belongs to;
    /// returns whether it did.
    fn start_piece(&mut self, src: &mut BytesMut) -> Result<bool, WireError> {
        let Some(len) = peek_len(src) else {
            return Ok(false);
        };
        let Some(&[hi, lo]) = src.get(4..PREFIX) else {
            return Ok(false);
        };
        let header_end = PREFIX + usize::from(u16::from_be_bytes([hi, lo]));
        if src.len() >= 4 + len || len > self.max_frame || header_end > 4 + len {
            // Whole (the usual way is as fast), or bad (the usual way says why).
            return Ok(false);
        }
        let Some(bytes) = src.get(PREFIX..header_end) else {
            return Ok(false);
        };
        let Ok(Header::Part { last }) = decode_exact::<Header>(bytes) else {
            return Ok(false);
        };
        let piece = 4 + len - header_end;
        if piece == 0 {
            return Ok(false);
        }
        let _ = src.split_to(header_end);
        self.piece_left = piece;
        self.piece_last = last;
        Ok(true)
    }

    /// When the frame at the front of `src` is a striped frame's piece and the decoder puts
    /// pieces in place ([`FrameDecoder::pieces_into`]), takes its head off, puts what arrived
    /// of it in the room its frame lends, and makes the reads that follow fill the rest;
    /// returns whether it did.
    fn start_stripe(&mut self, src: &mut BytesMut) -> Result<bool, WireError> {
        let Some(rooms) = &self.rooms else {
            return Ok(false);
        };
        let Some(len) = peek_len(src) else {
            return Ok(false);
        };
        if len < self.min_buffer {
            // Small (most frames): not worth a look at its header; a small piece comes out
            // and is copied into its room when it is taken in.
            return Ok(false);
        }
        let Some(&[hi, lo]) = src.get(4..PREFIX) else {
            return Ok(false);
        };
        let header_end = PREFIX + usize::from(u16::from_be_bytes([hi, lo]));
        if len > self.max_frame || header_end > 4 + len {
            // Bad: the usual way says why.
            return Ok(false);
        }
        let Some(bytes) = src.get(PREFIX..header_end) else {
            return Ok(false);
        };
        let Ok(Header::Stripe {
            session,
            id,
            offset,
            total,
        }) = decode_exact::<Header>(bytes)
        else {
            return Ok(false);
        };
        let piece = 4 + len - header_end;
        if piece == 0 {
            // An empty piece: the table refuses it when it comes out.
            return Ok(false);
        }
        let Some(mut room) = rooms.lend(session, id, offset, total, piece)? else {
            return Ok(false);
        };
        let _ = src.split_to(header_end);
        let here = piece.min(src.len());
        room.extend_from_slice(&src[..here]);
        let _ = src.split_to(here);
        if here == piece {
            rooms.filled(session, id, offset, room)?;
        } else {
            let read_buffer = std::mem::replace(src, room);
            self.lent = Some(Lent {
                read_buffer,
                len: piece,
                stripe: Some((session, id, offset)),
            });
        }
        Ok(true)
    }

    /// The next frame on the wire, a part or not.
    fn decode_one(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, WireError> {
        let Some(len) = peek_len(src) else {
            return Ok(None);
        };
        if len > self.max_frame {
            return Err(WireError::FrameTooLarge {
                len,
                max: self.max_frame,
            });
        }
        if len < 2 {
            return Err(WireError::Truncated);
        }
        // Check the header length as soon as it arrives, not only once the frame is complete.
        if let Some(&[hi, lo]) = src.get(4..PREFIX) {
            let header_len = usize::from(u16::from_be_bytes([hi, lo]));
            if header_len > len - 2 {
                return Err(WireError::BadHeader(format!(
                    "header length {header_len} exceeds the {} bytes left in the frame",
                    len - 2
                )));
            }
        }
        let Some(frame) = split_frame(src, len, self.max_frame, self.min_buffer) else {
            return Ok(None);
        };
        decode_whole(frame.freeze()).map(Some)
    }
}

/// Decodes `frame`, which holds exactly one frame, its length prefix included.
pub(crate) fn decode_whole(frame: Bytes) -> Result<Frame, WireError> {
    let len = super::peek_len(&frame).ok_or(WireError::Truncated)?;
    if frame.len() != 4 + len {
        return Err(WireError::BadHeader(format!(
            "a frame of {} bytes announces {len}",
            frame.len() - 4
        )));
    }
    let Some(&[hi, lo]) = frame.get(4..PREFIX) else {
        return Err(WireError::Truncated);
    };
    let header_end = PREFIX + usize::from(u16::from_be_bytes([hi, lo]));
    let header = decode_exact(frame.get(PREFIX..header_end).ok_or_else(|| {
        WireError::BadHeader(format!(
            "header length {} exceeds the {} bytes left in the frame",
            header_end - PREFIX,
            frame.len() - PREFIX
        ))
    })?)?;
    Ok(Frame {
        header,
        payload: frame.slice(header_end..),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::testing::feed;
    use proptest::prelude::*;

    const SMALL_MAX: usize = 1024;

    impl Arbitrary for Header {
        type Parameters = ();
        type Strategy = BoxedStrategy<Header>;

        fn arbitrary_with(_: ()) -> Self::Strategy {
            let dest = prop_oneof![
                any::<u64>().prop_map(Dest::Id),
                ".{0,40}".prop_map(Dest::Name)
            ];
            let status = prop_oneof![
                Just(ReplyStatus::Ok),
                Just(ReplyStatus::NoProc),
                ".{0,40}".prop_map(ReplyStatus::Failed),
                Just(ReplyStatus::TypeMismatch),
            ];
            let reason = prop_oneof![
                Just(DownReason::Stopped),
                Just(DownReason::NoProc),
                Just(DownReason::NodeDown),
                ".{0,20}".prop_map(DownReason::Panicked),
                Just(DownReason::Shutdown),
                ".{0,20}".prop_map(DownReason::Linked),
                ".{0,20}".prop_map(DownReason::Failed),
                Just(DownReason::WatcherLimit),
            ];
            let node = (".{0,20}", any::<u64>(), any::<u16>()).prop_map(|(name, inc, port)| {
                crate::id::NodeId::new(name, ([127, 0, 0, 1], port).into(), inc)
            });
            let actor = prop_oneof![
                (dest, any::<u64>(), any::<Option<u64>>(), any::<u64>()).prop_map(
                    |(to, incarnation, call, ty)| ActorHeader::Send {
                        to,
                        incarnation,
                        call,
                        ty,
                    }
                ),
                (any::<u64>(), status.clone(), any::<u64>())
                    .prop_map(|(call, status, ty)| ActorHeader::Reply { call, status, ty }),
                (any::<u64>(), any::<u64>()).prop_map(|(watch, id)| ActorHeader::Monitor {
                    watch,
                    target: Dest::Id(id)
                }),
                (any::<u64>(), ".{0,20}").prop_map(|(watch, name)| ActorHeader::Demonitor {
                    watch,
                    target: Dest::Name(name)
                }),
                (any::<u64>(), any::<u64>(), reason.clone()).prop_map(|(watch, target, reason)| {
                    ActorHeader::Down {
                        watch,
                        target,
                        reason,
                    }
                }),
                (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(link, from, to)| {
                    ActorHeader::Link {
                        link,
                        from,
                        to: Dest::Id(to),
                    }
                }),
                (any::<u64>(), any::<bool>())
                    .prop_map(|(link, initiator)| ActorHeader::Unlink { link, initiator }),
                (
                    any::<u64>(),
                    any::<u64>(),
                    any::<u64>(),
                    any::<u64>(),
                    any::<u64>()
                )
                    .prop_map(|(incarnation, ty, session, seq, floor)| {
                        ActorHeader::Reliable {
                            to: Dest::Name("r".into()),
                            incarnation,
                            ty,
                            session,
                            seq,
                            floor,
                        }
                    }),
                (any::<u64>(), status.clone())
                    .prop_map(|(seq, status)| ActorHeader::Ack { seq, status }),
                (any::<u64>(), any::<bool>(), reason).prop_map(|(link, initiator, reason)| {
                    ActorHeader::Exit {
                        link,
                        initiator,
                        reason,
                    }
                }),
            ];
            let routed = (
                node.clone(),
                node,
                any::<u16>(),
                any::<u16>(),
                actor.clone(),
            )
                .prop_map(|(to, from, hops, lane, actor)| Header::Routed {
                    to,
                    from,
                    hops,
                    lane,
                    actor,
                });
            prop_oneof![
                actor.prop_map(Header::Actor),
                Just(Header::Overlay),
                (any::<u64>(), any::<u64>())
                    .prop_map(|(seq, sent_us)| Header::Heartbeat { seq, sent_us }),
                (any::<u64>(), any::<u64>())
                    .prop_map(|(seq, sent_us)| Header::HeartbeatAck { seq, sent_us }),
                Just(Header::Bye),
                Just(Header::Broadcast),
                routed,
                (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
                    |(session, id, offset, total)| Header::Stripe {
                        session,
                        id,
                        offset,
                        total
                    }
                ),
                (
                    any::<u64>(),
                    any::<u64>(),
                    any::<bool>(),
                    any::<Option<u64>>(),
                    any::<u64>()
                )
                    .prop_map(|(session, id, ok, hold, lanes)| Header::Commit {
                        session,
                        id,
                        ok,
                        hold,
                        lanes
                    }),
                (any::<u64>(), any::<u16>())
                    .prop_map(|(epoch, lanes)| Header::Barrier { epoch, lanes }),
                (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
                    |(session, low, limit, bytes)| Header::StripeWindow {
                        session,
                        low,
                        limit,
                        bytes,
                    }
                ),
            ]
            .boxed()
        }
    }

    fn send() -> Header {
        Header::Actor(ActorHeader::Send {
            to: Dest::Name("echo".into()),
            incarnation: 7,
            call: Some(9),
            ty: 11,
        })
    }

    /// A frame built by hand from raw header bytes, with consistent length fields.
    fn raw_frame(header: &[u8], payload: &[u8]) -> BytesMut {
        let mut out = BytesMut::new();
        out.put_u32((2 + header.len() + payload.len()) as u32);
        out.put_u16(header.len() as u16);
        out.extend_from_slice(header);
        out.extend_from_slice(payload);
        out
    }

    /// Decodes every complete frame in `buf`.
    fn decode_all(dec: &mut FrameDecoder, buf: &mut BytesMut) -> Vec<Frame> {
        let mut frames = Vec::new();
        while let Some(frame) = dec.decode(buf).expect("valid stream") {
            frames.push(frame);
        }
        frames
    }

    #[test]
    fn round_trip_one_frame() {
        let mut buf = encode_frame(&send(), b"hello", DEFAULT_MAX_FRAME).unwrap();
        let frame = FrameDecoder::default().decode(&mut buf).unwrap().unwrap();
        assert_eq!(
            frame,
            Frame {
                header: send(),
                payload: Bytes::from_static(b"hello")
            }
        );
        assert!(buf.is_empty());
    }

    #[test]
    fn layout_is_as_documented() {
        let buf = encode_frame(&Header::Bye, b"xy", DEFAULT_MAX_FRAME).unwrap();
        let header = postcard::to_allocvec(&Header::Bye).unwrap();
        assert_eq!(&buf[..], &raw_frame(&header, b"xy")[..]);
    }

    #[test]
    fn encode_head_appends_and_leaves_payload_out() {
        let mut out = BytesMut::from(&b"before"[..]);
        encode_head(&Header::Overlay, 100, DEFAULT_MAX_FRAME, &mut out).unwrap();
        let header = postcard::to_allocvec(&Header::Overlay).unwrap();
        assert_eq!(&out[..6], b"before");
        assert_eq!(out.len(), 6 + PREFIX + header.len());
        assert_eq!(
            &out[6..10],
            &((2 + header.len() + 100) as u32).to_be_bytes()
        );
    }

    #[test]
    fn encode_refuses_frame_too_large() {
        let mut out = BytesMut::from(&b"keep"[..]);
        let err = encode_head(&Header::Bye, SMALL_MAX, SMALL_MAX, &mut out).unwrap_err();
        assert!(
            matches!(err, WireError::FrameTooLarge { max: SMALL_MAX, .. }),
            "{err}"
        );
        assert_eq!(&out[..], b"keep");
        assert!(encode_head(&Header::Bye, usize::MAX, usize::MAX, &mut out).is_err());
        assert_eq!(&out[..], b"keep");
        assert!(encode_frame(&Header::Bye, &[0; SMALL_MAX], SMALL_MAX).is_err());
    }

    #[test]
    fn encode_refuses_header_too_large() {
        let header = Header::Actor(ActorHeader::Send {
            to: Dest::Name("n".repeat(70_000)),
            incarnation: 0,
            call: None,
            ty: 0,
        });
        let mut out = BytesMut::new();
        let err = encode_head(&header, 0, DEFAULT_MAX_FRAME, &mut out).unwrap_err();
        assert!(matches!(err, WireError::HeaderTooLarge { .. }), "{err}");
        assert!(out.is_empty());
    }

    #[test]
    fn decode_refuses_too_large_before_reserving() {
        let mut buf = BytesMut::from(&[0xff, 0xff, 0xff, 0xff][..]);
        let capacity = buf.capacity();
        let err = FrameDecoder::new(SMALL_MAX).decode(&mut buf).unwrap_err();
        assert!(
            matches!(err, WireError::FrameTooLarge { len, max: SMALL_MAX } if len == u32::MAX as usize)
        );
        assert_eq!(buf.capacity(), capacity);
    }

    #[test]
    fn decode_refuses_frames_without_room_for_header_length() {
        for len in [0u32, 1] {
            let mut buf = BytesMut::new();
            buf.put_u32(len);
            buf.put_u8(0);
            let err = FrameDecoder::default().decode(&mut buf).unwrap_err();
            assert!(matches!(err, WireError::Truncated), "{err}");
        }
    }

    #[test]
    fn decode_refuses_header_longer_than_frame_early() {
        // The frame announces 10 bytes but a 20-byte header: refused before the rest arrives.
        let mut buf = BytesMut::new();
        buf.put_u32(10);
        buf.put_u16(20);
        let err = FrameDecoder::default().decode(&mut buf).unwrap_err();
        assert!(matches!(err, WireError::BadHeader(_)), "{err}");
    }

    #[test]
    fn decode_refuses_truncated_header() {
        let header = postcard::to_allocvec(&send()).unwrap();
        // The header length field cuts the header short; its last byte becomes payload.
        let mut buf = BytesMut::new();
        buf.put_u32((2 + header.len()) as u32);
        buf.put_u16((header.len() - 1) as u16);
        buf.extend_from_slice(&header);
        let err = FrameDecoder::default().decode(&mut buf).unwrap_err();
        assert!(matches!(err, WireError::Truncated), "{err}");
    }

    #[test]
    fn decode_refuses_bad_header_bytes() {
        // Variant 100 does not exist.
        let err = FrameDecoder::default()
            .decode(&mut raw_frame(&[100], b""))
            .unwrap_err();
        assert!(matches!(err, WireError::Decode(_)), "{err}");
        // A valid header followed by stray bytes inside the header length.
        let mut header = postcard::to_allocvec(&Header::Bye).unwrap();
        header.push(0);
        let err = FrameDecoder::default()
            .decode(&mut raw_frame(&header, b""))
            .unwrap_err();
        assert!(matches!(err, WireError::Decode(_)), "{err}");
    }

    #[test]
    fn decode_one_byte_at_a_time() {
        let wire = encode_frame(&send(), b"payload", DEFAULT_MAX_FRAME).unwrap();
        let mut dec = FrameDecoder::default();
        let mut buf = BytesMut::new();
        for (i, byte) in wire.iter().enumerate() {
            buf.put_u8(*byte);
            let out = dec.decode(&mut buf).unwrap();
            if i + 1 < wire.len() {
                assert_eq!(out, None, "frame decoded early at byte {i}");
            } else {
                assert_eq!(out.unwrap().payload, Bytes::from_static(b"payload"));
            }
        }
        assert!(buf.is_empty());
    }

    #[test]
    fn decode_several_frames_in_one_buffer() {
        let frames = vec![
            Frame {
                header: send(),
                payload: Bytes::from_static(b"one"),
            },
            Frame {
                header: Header::Heartbeat { seq: 1, sent_us: 2 },
                payload: Bytes::new(),
            },
            Frame {
                header: Header::Bye,
                payload: Bytes::from_static(b"three"),
            },
        ];
        let mut buf = BytesMut::new();
        for f in &frames {
            buf.extend_from_slice(&encode_frame(&f.header, &f.payload, DEFAULT_MAX_FRAME).unwrap());
        }
        buf.extend_from_slice(&[0, 0]); // the start of a fourth frame
        assert_eq!(decode_all(&mut FrameDecoder::default(), &mut buf), frames);
        assert_eq!(&buf[..], &[0, 0]);
    }

    #[test]
    fn decode_reserves_exactly_the_rest_of_a_large_frame() {
        let wire = encode_frame(&Header::Overlay, &[7; 100_000], DEFAULT_MAX_FRAME).unwrap();
        let mut buf = BytesMut::from(&wire[..PREFIX]);
        assert_eq!(FrameDecoder::default().decode(&mut buf).unwrap(), None);
        assert_eq!(buf.capacity(), wire.len());
        assert_eq!(&buf[..], &wire[..PREFIX]);
    }

    #[test]
    fn decode_reserves_a_useful_buffer_for_a_small_frame() {
        let wire = encode_frame(&Header::Overlay, &[7; 100], DEFAULT_MAX_FRAME).unwrap();
        let mut buf = BytesMut::from(&wire[..PREFIX]);
        assert_eq!(FrameDecoder::default().decode(&mut buf).unwrap(), None);
        assert_eq!(buf.capacity(), super::super::MIN_BUFFER);
        // ... but never more than a maximal frame.
        let mut buf = BytesMut::from(&wire[..PREFIX]);
        assert_eq!(FrameDecoder::new(200).decode(&mut buf).unwrap(), None);
        assert_eq!(buf.capacity(), 204);
        // A reader that reads 64 KiB at a time keeps reading that much.
        let mut buf = BytesMut::from(&wire[..PREFIX]);
        let mut dec = FrameDecoder::default().read_buffer(64 * 1024);
        assert_eq!(dec.decode(&mut buf).unwrap(), None);
        assert_eq!(buf.capacity(), 64 * 1024);
        assert_eq!(&buf[..], &wire[..PREFIX]);
        let mut buf = BytesMut::from(&wire[..PREFIX]);
        let mut dec = FrameDecoder::new(200).read_buffer(64 * 1024);
        assert_eq!(dec.decode(&mut buf).unwrap(), None);
        assert_eq!(buf.capacity(), 204);
    }

    #[test]
    fn maximal_frames_keep_the_buffer_bounded() {
        // With `BytesMut::reserve`, a stream of near-maximal frames, each dropped once decoded,
        // grows the buffer past the maximum.
        let mut wire = BytesMut::new();
        for n in [10, 1016, 10, 1016, 600, 1016, 999, 1016] {
            encode_head(&Header::Overlay, n, SMALL_MAX, &mut wire).unwrap();
            wire.extend_from_slice(&vec![1; n]);
        }
        for chunk in [1, 7, 63, 500, 4096] {
            let mut frames = 0;
            let fed = feed(&mut FrameDecoder::new(SMALL_MAX), &wire, chunk, |_| {
                frames += 1
            });
            assert!(fed.error.is_none());
            assert_eq!(frames, 8);
            assert!(
                fed.max_capacity <= 4 + SMALL_MAX,
                "capacity {}",
                fed.max_capacity
            );
        }
    }

    #[test]
    fn payload_is_a_slice_of_the_read_buffer() {
        let mut buf = encode_frame(&Header::Overlay, b"no copy", DEFAULT_MAX_FRAME).unwrap();
        let payload_at = buf.as_ptr() as usize + buf.len() - b"no copy".len();
        let frame = FrameDecoder::default().decode(&mut buf).unwrap().unwrap();
        assert_eq!(frame.payload.as_ptr() as usize, payload_at);
    }

    #[test]
    fn decode_eof_with_partial_frame_is_an_error() {
        let wire = encode_frame(&Header::Bye, b"", DEFAULT_MAX_FRAME).unwrap();
        let mut buf = BytesMut::from(&wire[..wire.len() - 1]);
        assert!(FrameDecoder::default().decode_eof(&mut buf).is_err());
        assert_eq!(
            FrameDecoder::default()
                .decode_eof(&mut BytesMut::new())
                .unwrap(),
            None
        );
    }

    /// Garbage, often behind a plausible length prefix so that the partial-frame path runs.
    fn garbage() -> impl Strategy<Value = Vec<u8>> {
        let prefix = prop_oneof![
            Just(Vec::new()),
            (0..=SMALL_MAX as u32 + 8).prop_map(|len| len.to_be_bytes().to_vec()),
            (0..=SMALL_MAX as u32 + 8, 0..=SMALL_MAX as u16 + 8).prop_map(|(len, hlen)| {
                let mut p = len.to_be_bytes().to_vec();
                p.extend_from_slice(&hlen.to_be_bytes());
                p
            }),
        ];
        (prefix, proptest::collection::vec(any::<u8>(), 0..4096)).prop_map(|(mut p, rest)| {
            p.extend(rest);
            p
        })
    }

    proptest! {
        #[test]
        fn frames_round_trip(
            frames in proptest::collection::vec(
                (any::<Header>(), proptest::collection::vec(any::<u8>(), 0..300)), 1..8),
            chunk in 1usize..64,
        ) {
            let mut wire = BytesMut::new();
            for (header, payload) in &frames {
                encode_head(header, payload.len(), DEFAULT_MAX_FRAME, &mut wire).unwrap();
                wire.extend_from_slice(payload);
            }
            let expected: Vec<Frame> = frames
                .into_iter()
                .map(|(header, payload)| Frame { header, payload: payload.into() })
                .collect();

            let mut whole = wire.clone();
            prop_assert_eq!(&decode_all(&mut FrameDecoder::default(), &mut whole), &expected);
            prop_assert!(whole.is_empty());

            let mut got = Vec::new();
            let fed = feed(&mut FrameDecoder::default(), &wire, chunk, |f| got.push(f));
            prop_assert!(fed.error.is_none());
            prop_assert_eq!(&got, &expected);
            prop_assert!(fed.rest.is_empty());
        }

        #[test]
        fn a_head_reads_back_as_its_header(header in any::<Header>(), len in 0usize..1 << 20) {
            let mut head = BytesMut::new();
            encode_head(&header, len, DEFAULT_MAX_FRAME, &mut head).unwrap();
            prop_assert_eq!(decode_head(&head).unwrap(), header);
            prop_assert!(decode_head(&head[..head.len() - 1]).is_err());
        }

        #[test]
        fn garbage_never_panics_nor_overallocates(data in garbage(), chunk in 1usize..64) {
            // Lengths up to 4 GiB are announced; the buffer never outgrows one maximal frame.
            let mut dec = FrameDecoder::new(SMALL_MAX);
            let mut fed = feed(&mut dec, &data, chunk, |frame| assert!(frame.payload.len() <= SMALL_MAX));
            prop_assert!(fed.max_capacity <= 4 + SMALL_MAX, "capacity {}", fed.max_capacity);
            if fed.error.is_none() {
                let _ = dec.decode_eof(&mut fed.rest);
            }
        }
    }
}
