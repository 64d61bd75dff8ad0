//! Large frames in parts, so that they do not hold up the frames queued behind them.
//!
//! A frame longer than a part (`part` bytes, [`PART_BYTES`] by default) is not written in one
//! piece: its bytes — length prefix, header and payload, exactly as [`super::encode_head`] and
//! the payload would put them on the wire — are cut into pieces of at most `part` bytes, and
//! each piece travels as the payload of a frame of its own with a [`Header::Part`] header
//! (`last` on the final piece). Between two parts the writer may put any other frame, so a small
//! message queued behind an 8 MiB one waits for a part or a few, not for the whole frame.
//!
//! The reader puts the pieces back together in a [`Reassembly`] (one per connection: a writer
//! sends the parts of one frame at a time on a connection, so at most one frame is ever
//! partial) and, with the last piece, decodes the frame they make and hands it on as if it had
//! arrived whole. [`super::FrameDecoder`] does this by itself: a reader never sees a `Part`.
//! Once the frame's length is known, the decoder lends the reader the frame's own memory for
//! the rest of a large piece: the socket's reads fill the frame where
//! it lies, and its bytes are not copied from a read buffer after.
//!
//! Bounds: the frame in pieces obeys the reader's frame limit like any other (checked on its
//! length prefix, in the first piece, before anything is reserved for it), the pieces may not
//! run past the length they announced, and a frame in pieces may not itself be a `Part`. Any
//! violation is an error: the stream is hostile or corrupt.

use bytes::{Bytes, BytesMut};

use super::body::Body;
use super::frame::{decode_whole, encode_head, Frame, Header};
use super::{peek_len, WireError};

/// The default size of a part: frames longer than this (length prefix included) are sent in
/// parts of this many bytes.
pub const PART_BYTES: usize = 1024 * 1024;

/// The smallest part: the first piece must hold the frame's length prefix.
pub const MIN_PART_BYTES: usize = 64;

/// A frame being sent in parts: its bytes and how far the parts have got.
#[derive(Clone, Debug)]
pub struct Parts {
    head: Bytes,
    payload: Body,
    part: usize,
    sent: usize,
}

impl Parts {
    /// Whether a frame of `head` and `payload` bytes is sent in parts of `part` bytes.
    pub fn needed(head: usize, payload: usize, part: usize) -> bool {
        head.saturating_add(payload) > part.max(MIN_PART_BYTES)
    }

    /// The parts of the frame `head` (its length prefix and header, as [`super::encode_head`]
    /// wrote them) + `payload`, of at most `part` bytes each (at least [`MIN_PART_BYTES`]).
    pub fn new(head: Bytes, payload: impl Into<Body>, part: usize) -> Self {
        Parts {
            head,
            payload: payload.into(),
            part: part.max(MIN_PART_BYTES),
            sent: 0,
        }
    }

    /// The frame's bytes in all (length prefix included).
    pub fn len(&self) -> usize {
        self.head.len() + self.payload.len()
    }

    /// Whether the frame has no bytes (never true of an encoded frame).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes of the frame the parts taken so far carry.
    pub fn sent(&self) -> usize {
        self.sent
    }

    /// Whether every part has been taken.
    pub fn is_done(&self) -> bool {
        self.sent >= self.len()
    }

    /// Whether any part has been taken.
    pub fn is_started(&self) -> bool {
        self.sent > 0
    }

    /// Starts over from the first part (the parts taken so far went to a connection that was
    /// lost before the last one).
    pub fn restart(&mut self) {
        self.sent = 0;
    }

    /// Appends the next part to `out` — its own frame head, then the piece, as one or two
    /// buffers that share the frame's memory — and returns whether it was the last. Appends
    /// nothing and returns `true` once every part has been taken.
    pub fn next_part(&mut self, out: &mut Vec<Bytes>) -> bool {
        let total = self.len();
        if self.sent >= total {
            return true;
        }
        let end = (self.sent + self.part).min(total);
        let last = end == total;
        let mut head = BytesMut::with_capacity(16);
        // A part's header is a few bytes and its length at most `part`, so the head always
        // encodes; the limit that matters is checked on the whole frame.
        if encode_head(
            &Header::Part { last },
            end - self.sent,
            usize::MAX,
            &mut head,
        )
        .is_err()
        {
            return true;
        }
        out.push(head.freeze());
        let h = self.head.len();
        if self.sent < h {
            out.push(self.head.slice(self.sent..end.min(h)));
        }
        if end > h {
            let piece = self.payload.slice(self.sent.max(h) - h..end - h);
            out.extend(piece.bufs().iter().filter(|b| !b.is_empty()).cloned());
        }
        self.sent = end;
        last
    }
}

/// Puts the pieces of a frame sent in parts back together (see the module's doc). The bytes of
/// a piece may come in any number of slices, as they are read.
#[derive(Clone, Debug, Default)]
pub struct Reassembly {
    buf: BytesMut,
    /// While room for a piece is lent ([`Reassembly::lend`]): the frame's memory after it.
    tail: Option<BytesMut>,
}

impl Reassembly {
    /// No frame in pieces yet.
    pub fn new() -> Self {
        Reassembly::default()
    }

    /// Bytes of a partial frame held (a piece being read into lent room counts once it is
    /// given back).
    pub fn held(&self) -> usize {
        self.buf.len()
    }

    /// Lends the room for the frame's next `n` bytes, once its length is known (its first
    /// four bytes taken; else `None`): an empty buffer of exactly `n` bytes' capacity in the
    /// frame's own memory, for a reader to read them straight into, without copying them
    /// after. Give it back, filled, with [`Reassembly::give_back`]. The bytes may not run past
    /// the length the frame announced.
    pub(crate) fn lend(&mut self, n: usize) -> Result<Option<BytesMut>, WireError> {
        let Some(len) = peek_len(&self.buf) else {
            return Ok(None);
        };
        let total = len + 4;
        let have = self.buf.len() + n;
        if have > total {
            self.buf = BytesMut::new();
            return Err(WireError::BadHeader(format!(
                "parts of a frame of {total} bytes run to {have}"
            )));
        }
        // Reserved when the length came: a no-op then.
        self.buf.reserve(total - self.buf.len());
        let at = self.buf.len();
        let mut room = self.buf.split_off(at);
        self.tail = Some(room.split_off(n));
        Ok(Some(room))
    }

    /// Takes back the room [`Reassembly::lend`] gave, with the bytes read into it: they join
    /// the frame where they lie (copied only if the room was replaced by a larger buffer).
    pub(crate) fn give_back(&mut self, room: BytesMut) {
        self.buf.unsplit(room);
        if let Some(tail) = self.tail.take() {
            self.buf.unsplit(tail);
        }
    }

    /// Takes one piece whole (the payload of a `Part` frame; `last` from its header) of a
    /// frame whose reader accepts frames of at most `max_frame` bytes; returns the whole frame
    /// with its last piece.
    pub fn piece(
        &mut self,
        piece: &[u8],
        last: bool,
        max_frame: usize,
    ) -> Result<Option<Frame>, WireError> {
        self.extend(piece, max_frame)?;
        if last {
            self.finish().map(Some)
        } else {
            Ok(None)
        }
    }

    /// Takes the next bytes of the frame in pieces, checking them against the limit.
    pub fn extend(&mut self, mut bytes: &[u8], max_frame: usize) -> Result<(), WireError> {
        if self.buf.len() < 4 {
            // The frame's length prefix is its first four bytes: it must be within the limit
            // before anything is reserved for the frame.
            let n = (4 - self.buf.len()).min(bytes.len());
            self.buf.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            let Some(len) = peek_len(&self.buf) else {
                return Ok(());
            };
            if len > max_frame {
                self.buf = BytesMut::new();
                return Err(WireError::FrameTooLarge {
                    len,
                    max: max_frame,
                });
            }
            self.buf.reserve(len);
        }
        let total = peek_len(&self.buf).ok_or(WireError::Truncated)? + 4;
        let have = self.buf.len() + bytes.len();
        if have > total {
            self.buf = BytesMut::new();
            return Err(WireError::BadHeader(format!(
                "parts of a frame of {total} bytes run to {have}"
            )));
        }
        self.buf.extend_from_slice(bytes);
        Ok(())
    }

    /// The frame the pieces taken make (after its last piece).
    pub fn finish(&mut self) -> Result<Frame, WireError> {
        self.tail = None;
        let whole = std::mem::take(&mut self.buf);
        let total = peek_len(&whole).ok_or(WireError::Truncated)? + 4;
        if whole.len() < total {
            return Err(WireError::Truncated);
        }
        let frame = decode_whole(whole.freeze())?;
        if matches!(frame.header, Header::Part { .. }) {
            return Err(WireError::BadHeader(
                "a part inside a frame in parts".into(),
            ));
        }
        Ok(frame)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::frame::{encode_frame, ActorHeader, Dest};
    use crate::wire::{FrameDecoder, StreamDecoder};
    use proptest::prelude::*;

    fn message(len: usize) -> (Header, Bytes) {
        let header = Header::Actor(ActorHeader::Send {
            to: Dest::Name("echo".into()),
            incarnation: 7,
            call: Some(3),
            ty: 9,
        });
        let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        (header, Bytes::from(payload))
    }

    fn head_of(header: &Header, payload: usize) -> Bytes {
        let mut head = BytesMut::new();
        encode_head(header, payload, usize::MAX, &mut head).unwrap();
        head.freeze()
    }

    /// The wire bytes of `parts`, every part taken.
    fn wire(parts: &mut Parts) -> BytesMut {
        let mut out = BytesMut::new();
        loop {
            let mut bufs = Vec::new();
            let last = parts.next_part(&mut bufs);
            for b in bufs {
                out.extend_from_slice(&b);
            }
            if last {
                return out;
            }
        }
    }

    proptest! {
        /// Whatever the sizes, the pieces make the frame again, byte for byte, and only the
        /// last part says so.
        #[test]
        fn parts_make_the_frame_again(
            len in 0usize..5000,
            part in MIN_PART_BYTES..700,
            cut in 0usize..5000,
        ) {
            let (header, payload) = message(len);
            let head = head_of(&header, payload.len());
            // The payload in two buffers (a message encoded around a large byte string).
            let cut = cut.min(len);
            let body = Body::from_bufs(vec![payload.slice(..cut), payload.slice(cut..)]);
            let mut parts = Parts::new(head.clone(), body, part);
            let mut stream = wire(&mut parts);
            prop_assert!(parts.is_done());
            let mut decoder = FrameDecoder::new(1 << 20);
            let frame = decoder.decode(&mut stream).unwrap().expect("a whole frame");
            prop_assert!(stream.is_empty());
            prop_assert_eq!(frame.header, header);
            prop_assert_eq!(frame.payload, payload);
        }
    }

    proptest! {
        /// The same when the bytes arrive a few at a time: pieces stream into their frame.
        #[test]
        fn parts_arriving_in_slices_make_the_frame_again(
            len in 0usize..5000,
            part in MIN_PART_BYTES..700,
            step in 1usize..300,
        ) {
            let (header, payload) = message(len);
            let mut parts = Parts::new(head_of(&header, payload.len()), payload.clone(), part);
            let stream = wire(&mut parts);
            let mut decoder = FrameDecoder::new(1 << 20);
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            for slice in stream.chunks(step) {
                buf.extend_from_slice(slice);
                while let Some(f) = decoder.decode(&mut buf).unwrap() {
                    got.push(f);
                }
            }
            prop_assert!(buf.is_empty());
            prop_assert_eq!(got.len(), 1);
            prop_assert_eq!(&got[0].header, &header);
            prop_assert_eq!(&got[0].payload, &payload);
            prop_assert_eq!(decoder.partial_bytes(), 0);
        }
    }

    /// Frames between the parts of another come out at once, in their place; the frame in
    /// parts comes out with its last piece.
    #[test]
    fn frames_between_parts_come_out_first() {
        let (header, _, mut stream, n) = interleaved(10_000, 4096);
        assert_eq!(n, 2, "10 KiB in parts of 4 KiB: three parts");
        let mut decoder = FrameDecoder::new(1 << 20);
        let mut got = Vec::new();
        while let Some(f) = decoder.decode(&mut stream).unwrap() {
            got.push(f.header);
        }
        assert_eq!(got, vec![Header::Bye, Header::Bye, header]);
    }

    /// A restarted frame is sent whole again, from its first part.
    #[test]
    fn a_restart_sends_every_part_again() {
        let (header, payload) = message(3000);
        // 3,000 bytes of payload and a head: four parts of 1,000.
        let mut parts = Parts::new(head_of(&header, payload.len()), payload, 1000);
        let mut first = Vec::new();
        assert!(!parts.next_part(&mut first));
        assert!(parts.is_started());
        parts.restart();
        assert!(!parts.is_started());
        let all = wire(&mut parts);
        let part_head = head_of(&Header::Part { last: false }, 0).len();
        assert_eq!(
            all.len(),
            parts.len() + 4 * part_head,
            "all four parts again"
        );
    }

    /// A frame in parts above the reader's limit is refused on its first piece; pieces that
    /// run past the announced length, a first piece too short for a length, and a part inside
    /// a frame in parts are errors.
    #[test]
    fn hostile_parts_are_refused() {
        let (header, payload) = message(5000);
        let head = head_of(&header, payload.len());
        let mut r = Reassembly::new();
        let first = [&head[..], &payload[..100]].concat();
        let err = r.piece(&first, false, 1000).unwrap_err();
        assert!(matches!(err, WireError::FrameTooLarge { max: 1000, .. }));
        assert_eq!(r.held(), 0, "nothing reserved or kept");

        let mut r = Reassembly::new();
        assert!(r.piece(&first, false, 1 << 20).unwrap().is_none());
        let too_much = vec![0u8; 6000];
        assert!(r.piece(&too_much, false, 1 << 20).is_err());

        assert!(Reassembly::new().piece(&[0, 0], true, 1 << 20).is_err());

        let inner = encode_frame(&Header::Part { last: true }, b"x", usize::MAX).unwrap();
        let err = Reassembly::new().piece(&inner, true, 1 << 20).unwrap_err();
        assert!(matches!(err, WireError::BadHeader(_)));

        // A last piece short of the announced length.
        let mut r = Reassembly::new();
        assert!(matches!(
            r.piece(&first, true, 1 << 20),
            Err(WireError::Truncated)
        ));
    }

    /// The wire bytes of a frame of `len` payload bytes in parts of `part`, with a small frame
    /// after each part but the last; the header, the payload, and how many small frames.
    fn interleaved(len: usize, part: usize) -> (Header, Bytes, BytesMut, usize) {
        let (header, payload) = message(len);
        let mut parts = Parts::new(head_of(&header, payload.len()), payload.clone(), part);
        let small = encode_frame(&Header::Bye, b"hi", usize::MAX).unwrap();
        let mut stream = BytesMut::new();
        let mut n = 0;
        loop {
            let mut bufs = Vec::new();
            let last = parts.next_part(&mut bufs);
            bufs.iter().for_each(|b| stream.extend_from_slice(b));
            if last {
                return (header, payload, stream, n);
            }
            stream.extend_from_slice(&small);
            n += 1;
        }
    }

    proptest! {
        /// Read the way a socket is (reads into the buffer's spare capacity), with a read
        /// buffer small enough that the rest of most pieces is read straight into the frame's
        /// room: the frame comes out the same, after the small frames between its parts.
        #[test]
        fn pieces_read_into_their_frame_make_it_again(
            len in 0usize..20_000,
            part in MIN_PART_BYTES..3000,
            chunk in 1usize..2000,
            read_buffer in 16usize..512,
        ) {
            let (header, payload, stream, n) = interleaved(len, part);
            let mut decoder = FrameDecoder::new(1 << 20).read_buffer(read_buffer);
            let mut got = Vec::new();
            let fed = crate::wire::testing::feed(&mut decoder, &stream, chunk, |f| got.push(f));
            prop_assert!(fed.error.is_none(), "{:?}", fed.error);
            prop_assert!(fed.rest.is_empty());
            prop_assert_eq!(got.len(), n + 1);
            prop_assert!(got[..n].iter().all(|f| f.header == Header::Bye));
            prop_assert_eq!(&got[n].header, &header);
            prop_assert_eq!(&got[n].payload, &payload);
            prop_assert_eq!(decoder.partial_bytes(), 0);
        }

        /// The same when a reader grows the room it was lent past its capacity (appending
        /// more than it holds): the bytes past the piece go back to the read buffer.
        #[test]
        fn pieces_survive_a_reader_that_outgrows_the_room(
            len in 0usize..20_000,
            part in MIN_PART_BYTES..3000,
            step in 1usize..2000,
        ) {
            let (header, payload, stream, n) = interleaved(len, part);
            let mut decoder = FrameDecoder::new(1 << 20).read_buffer(16);
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            for slice in stream.chunks(step) {
                buf.extend_from_slice(slice);
                while let Some(f) = decoder.decode(&mut buf).unwrap() {
                    got.push(f);
                }
            }
            prop_assert!(buf.is_empty());
            prop_assert_eq!(got.len(), n + 1);
            prop_assert_eq!(&got[n].header, &header);
            prop_assert_eq!(&got[n].payload, &payload);
        }
    }

    /// A large piece is read straight into its frame: the frame handed on lies in the memory
    /// the socket's reads wrote to, not in a copy of it.
    #[test]
    fn a_large_piece_is_not_copied() {
        let (header, payload, stream, _) = interleaved(3 << 20, 1 << 20);
        let mut decoder = FrameDecoder::new(8 << 20).read_buffer(64 << 10);
        let mut buf = BytesMut::with_capacity(64 << 10);
        let mut written = Vec::new();
        let mut data = &stream[..];
        let mut frames = Vec::new();
        while !data.is_empty() {
            if buf.len() == buf.capacity() {
                buf.reserve(1);
            }
            let n = (64 << 10).min(buf.capacity() - buf.len()).min(data.len());
            let at = buf.as_ptr() as usize + buf.len();
            buf.extend_from_slice(&data[..n]);
            written.push(at..at + n);
            data = &data[n..];
            while let Some(f) = decoder.decode(&mut buf).unwrap() {
                frames.push(f);
            }
        }
        let frame = frames.pop().expect("the frame");
        assert_eq!(frame.header, header);
        assert_eq!(frame.payload, payload);
        // Every byte of the payload but what came with a part's head was written there by a
        // read.
        let start = frame.payload.as_ptr() as usize;
        let in_place: usize = written
            .iter()
            .map(|w| {
                w.end
                    .min(start + payload.len())
                    .saturating_sub(w.start.max(start))
            })
            .sum();
        assert!(
            in_place > payload.len() - (256 << 10),
            "{in_place} of {} bytes read in place",
            payload.len()
        );
    }
}
