//! The wire format: the connection handshake and the frames that follow it.
//!
//! Everything here is pure: encoders append to a [`bytes::BytesMut`], decoders implement
//! [`StreamDecoder`] (take whole messages off the front of a read buffer), which a transport
//! adapts to its own reader. No function in this module performs I/O.

mod auth;
pub mod barriers;
pub mod body;
pub mod frame;
pub mod handshake;
pub mod parts;
pub mod stripes;

use bytes::BytesMut;

pub use auth::{Acceptor, AcceptorStep, Dialer, DialerStep, HandshakeError};
pub use barriers::{Arrival, Barriers};
pub use body::Body;
pub use frame::{
    decode_head, encode_frame, encode_head, ActorHeader, Dest, DownReason, Frame, FrameDecoder,
    Header, ReplyStatus, DEFAULT_MAX_FRAME,
};
pub use handshake::{
    check_hello_version, encode_handshake, new_nonce, HandshakeDecoder, HandshakeMsg, Nonce, Proof,
    RejectCode, Transcript, MAGIC, MAX_HANDSHAKE_FRAME, VERSION,
};
pub use parts::{Parts, Reassembly, PART_BYTES};
pub use stripes::{
    actor_hold_key, hold_key, lane_bit, Assembled, CommitOutcome, Held, OrderingQueue, PartOutcome,
    PieceRooms, PiecesOn, StripeLimits, Stripes, Tick, Window, ANNOUNCE_TICKS,
};

/// Takes whole messages off the front of a buffer that a byte stream is read into.
pub trait StreamDecoder {
    /// What one message decodes to.
    type Item;

    /// Takes the next whole message off `src`, or returns `None` (and makes room in `src` for
    /// the rest of the message) if it has not fully arrived. Any error means the stream is
    /// corrupt or hostile: close it.
    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Self::Item>, WireError>;

    /// As [`StreamDecoder::decode`], at the end of the stream: bytes left over that do not
    /// make a whole message are [`WireError::Truncated`].
    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Self::Item>, WireError> {
        match self.decode(src)? {
            Some(item) => Ok(Some(item)),
            None if src.is_empty() => Ok(None),
            None => Err(WireError::Truncated),
        }
    }
}

/// Everything that can go wrong while encoding or decoding wire data.
///
/// Any decoding error means the peer sent something this node cannot trust; the connection
/// should be closed.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The underlying stream failed (only produced when a transport's reader drives a decoder).
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// A frame (length field excluded) is longer than the configured maximum.
    #[error("frame of {len} bytes exceeds the maximum of {max} bytes")]
    FrameTooLarge {
        /// The announced or computed frame length.
        len: usize,
        /// The maximum allowed.
        max: usize,
    },
    /// An encoded header does not fit in its `u16` length field.
    #[error("header of {len} bytes does not fit in a u16 length field")]
    HeaderTooLarge {
        /// The encoded header length.
        len: usize,
    },
    /// A frame or message ended before its content did.
    #[error("frame or message is truncated")]
    Truncated,
    /// The header length field is inconsistent with the frame.
    #[error("bad frame header: {0}")]
    BadHeader(String),
    /// A handshake `Hello` carried the wrong magic bytes: the peer does not speak Maquis.
    #[error("bad magic {got:?}: not a Maquis peer")]
    BadMagic {
        /// The magic bytes received.
        got: [u8; 4],
    },
    /// A handshake `Hello` carried an unsupported protocol version.
    #[error("unsupported protocol version {got} (this node speaks {want})")]
    BadVersion {
        /// The version the peer announced.
        got: u16,
        /// The version this node speaks.
        want: u16,
    },
    /// A header or message could not be deserialized.
    #[error("cannot decode: {0}")]
    Decode(String),
    /// A header or message could not be serialized.
    #[error("cannot encode: {0}")]
    Encode(String),
}

/// Maps a postcard deserialization error: running out of input is [`WireError::Truncated`].
fn decode_error(err: postcard::Error) -> WireError {
    match err {
        postcard::Error::DeserializeUnexpectedEnd => WireError::Truncated,
        other => WireError::Decode(other.to_string()),
    }
}

/// Deserializes exactly `bytes` into a `T`: running short or leaving bytes over is an error.
fn decode_exact<'a, T: serde::Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, WireError> {
    let (value, rest) = postcard::take_from_bytes(bytes).map_err(decode_error)?;
    if rest.is_empty() {
        Ok(value)
    } else {
        Err(WireError::Decode(format!("{} trailing bytes", rest.len())))
    }
}

/// Reads the big-endian `u32` length prefix at the start of `src`, if all four bytes are there.
fn peek_len(src: &[u8]) -> Option<usize> {
    let prefix: [u8; 4] = src.get(..4)?.try_into().ok()?;
    Some(u32::from_be_bytes(prefix) as usize)
}

/// The smallest buffer worth allocating for a partial message (unless the largest message
/// allowed is smaller), unless the decoder is told another: the reads that follow go into it.
/// `FramedRead` starts with this size.
const MIN_BUFFER: usize = 8 * 1024;

/// Splits one complete length-prefixed message (its four-byte prefix included) off `src`, whose
/// prefix announced `len <= max` bytes. If the message has not fully arrived, makes room for the
/// rest of it (in a buffer of at least `min_buffer` bytes, or `max + 4` if that is smaller) and
/// returns `None`.
///
/// Room is made by moving the partial message into a buffer of the size it needs (or
/// `min_buffer`) rather than with `BytesMut::reserve`, whose amortized growth may double the
/// buffer: this way a decode never grows the buffer past one maximal message plus its prefix.
fn split_frame(src: &mut BytesMut, len: usize, max: usize, min_buffer: usize) -> Option<BytesMut> {
    let total = 4 + len;
    if src.len() >= total {
        return Some(src.split_to(total));
    }
    if src.capacity() < total {
        let mut buf = BytesMut::with_capacity(total.max(min_buffer.min(4 + max)));
        buf.extend_from_slice(src);
        *src = buf;
    }
    None
}

#[cfg(test)]
mod testing {
    use bytes::BytesMut;

    use super::StreamDecoder;

    /// How a [`feed`] ended.
    pub(crate) struct Fed<E> {
        /// The first error, which ends the feeding.
        pub error: Option<E>,
        /// The largest capacity the buffer reached.
        pub max_capacity: usize,
        /// What was left in the buffer.
        pub rest: BytesMut,
    }

    /// Feeds `data` to `decoder` the way `FramedRead` does, handing each item to `on_item`:
    /// each read fills at most `chunk` bytes of the buffer's spare capacity, and the buffer
    /// only grows by `reserve(1)` when it is full, or by what the decoder does.
    pub(crate) fn feed<D: StreamDecoder>(
        decoder: &mut D,
        data: &[u8],
        chunk: usize,
        mut on_item: impl FnMut(D::Item),
    ) -> Fed<super::WireError> {
        let mut buf = BytesMut::new();
        let mut max_capacity = 0;
        let mut data = data;
        while !data.is_empty() {
            if buf.len() == buf.capacity() {
                buf.reserve(1);
            }
            let n = chunk.min(buf.capacity() - buf.len()).min(data.len());
            buf.extend_from_slice(&data[..n]);
            data = &data[n..];
            loop {
                let decoded = decoder.decode(&mut buf);
                max_capacity = max_capacity.max(buf.capacity());
                match decoded {
                    Ok(Some(item)) => on_item(item),
                    Ok(None) => break,
                    Err(err) => {
                        return Fed {
                            error: Some(err),
                            max_capacity,
                            rest: buf,
                        }
                    }
                }
            }
        }
        Fed {
            error: None,
            max_capacity,
            rest: buf,
        }
    }
}
