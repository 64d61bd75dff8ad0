//! The frame decoder, [`maquis_proto::wire::FrameDecoder`].
//!
//! Input: `[max][chunking][stream…]`. `max & 3` picks the decoder's frame limit (16, 100,
//! 1024 or 8192 bytes); `chunking` is a [`Chunker`] parameter. The stream is decoded twice,
//! in chunks and all at once. Checked:
//!
//! - no panic, and both decodes give the same frames, the same error and the same leftover;
//! - the read buffer never grows past `4 + max` (the decoder's promise), and no call of the
//!   decoder allocates more than one maximal frame's worth (twice, for the buffer and the
//!   header's strings) plus a little: a length field claiming up to 4 GiB reserves nothing;
//! - every frame returned is within the limit, re-encodes (with the same limit) to no more
//!   bytes than it arrived in, and the re-encoding decodes to the same frame.

use bytes::BytesMut;
use maquis_proto::wire::{encode_frame, FrameDecoder, StreamDecoder};

use crate::chunks::{check_same, feed, whole, Chunker};

/// The frame limits a target input chooses from.
pub const MAX_FRAMES: [usize; 4] = [16, 100, 1024, 8192];

/// What one call of the decoder may allocate beyond its buffer and the header's strings:
/// the bookkeeping of shared buffers and error messages.
const SLACK: usize = 4096;

/// Runs one input.
pub fn run(data: &[u8]) {
    let [max, chunking, stream @ ..] = data else {
        return;
    };
    let max_frame = MAX_FRAMES[usize::from(max & 3)];
    let chunked = feed(
        &mut FrameDecoder::new(max_frame),
        stream,
        &mut Chunker::new(*chunking),
    );
    let whole = whole(&mut FrameDecoder::new(max_frame), stream);
    check_same(|| FrameDecoder::new(max_frame), &chunked, &whole);

    assert!(
        chunked.max_capacity <= 4 + max_frame,
        "read buffer grew to {} bytes with a limit of {max_frame}",
        chunked.max_capacity
    );
    let bound = 2 * (4 + max_frame) + SLACK;
    for fed in [&chunked.max_decode_alloc, &whole.max_decode_alloc] {
        assert!(
            *fed <= bound,
            "one decode allocated {fed} bytes with a limit of {max_frame}"
        );
    }

    for (frame, took) in &whole.items {
        assert!(
            frame.payload.len() + 2 <= max_frame,
            "payload over the limit"
        );
        let mut again = encode_frame(&frame.header, &frame.payload, max_frame)
            .unwrap_or_else(|err| panic!("a decoded frame does not re-encode: {err}"));
        assert!(
            again.len() <= *took,
            "re-encoded in {} bytes, arrived in {took}",
            again.len()
        );
        let decoded = FrameDecoder::new(max_frame)
            .decode(&mut again)
            .expect("a re-encoded frame decodes");
        assert_eq!(
            decoded.as_ref(),
            Some(frame),
            "re-encoding changed the frame"
        );
        assert_eq!(again, BytesMut::new(), "re-encoding left bytes over");
    }
}
