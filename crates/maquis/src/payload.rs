//! [`Payload`]: bytes that arrive without being copied.
//!
//! A message field of type `bytes::Bytes` is copied out of the received frame when the message
//! is decoded. A [`Payload`] field instead becomes a slice of the frame itself: the frame's
//! buffer is reference-counted, so decoding a large payload costs no copy and no allocation.
//! On the wire a `Payload` is exactly a byte string (the same encoding as `Bytes` or
//! `Vec<u8>`), so the two are interchangeable between versions of a message type.
//!
//! Payloads smaller than [`SHARE_FROM`] are still copied: a small frame shares its read
//! buffer (up to [`READ_BUFFER`] bytes) with its neighbours, and a tiny slice should not keep a
//! whole buffer alive.
//!
//! Sending is the mirror image: a payload of at least [`LEND_FROM`] bytes is not copied into
//! the encoded message; the message is encoded around it (the bytes before it, the payload's
//! own buffer, the bytes after it) and the lane writes the pieces with one vectored write.

use std::cell::RefCell;
use std::fmt;
use std::ops::Deref;

use bytes::Bytes;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// Payloads at least this long are shared with the frame they arrived in instead of copied.
pub const SHARE_FROM: usize = 4096;

/// Bytes a lane reads at a time: the buffer small frames arrive in (a larger frame gets one of
/// its own size), and the least a frame that has not fully arrived waits in. A frame, or a
/// payload shared with it, keeps the buffer it arrived in alive.
pub const READ_BUFFER: usize = 64 * 1024;

/// Payloads at least this long are sent from their own buffer instead of copied into the
/// encoded message.
pub const LEND_FROM: usize = 16 * 1024;

thread_local! {
    /// The frame being decoded on this thread, if any (set by the runtime around a decode).
    static SOURCE: RefCell<Option<Bytes>> = const { RefCell::new(None) };
    /// While a message is encoded for the wire on this thread ([`lending`]): `Some`, holding
    /// the payload being serialized, lent to the encoder ([`take_lent`]) instead of copied.
    static LENT: RefCell<Option<Option<Bytes>>> = const { RefCell::new(None) };
}

/// Runs `f` (an encoding) with large payloads lent to it: a [`Payload`] of at least
/// [`LEND_FROM`] bytes serialized inside `f` can be taken by [`take_lent`].
pub(crate) fn lending<T>(f: impl FnOnce() -> T) -> T {
    let prev = LENT.with(|l| l.replace(Some(None)));
    let out = f();
    LENT.with(|l| *l.borrow_mut() = prev);
    out
}

/// Offers `b` to the encoding in progress, if any, just before its bytes are serialized.
fn lend(b: &Bytes) {
    if b.len() >= LEND_FROM {
        LENT.with(|l| {
            if let Some(slot) = l.borrow_mut().as_mut() {
                *slot = Some(b.clone());
            }
        });
    }
}

/// The buffer lent for `data` if `data` is exactly its bytes (the encoder got the payload's
/// own slice), else `None` (copy `data`).
pub(crate) fn take_lent(data: &[u8]) -> Option<Bytes> {
    LENT.with(|l| {
        let mut l = l.borrow_mut();
        let slot = l.as_mut()?;
        let same = slot
            .as_ref()
            .is_some_and(|b| b.as_ptr() == data.as_ptr() && b.len() == data.len());
        if same {
            slot.take()
        } else {
            None
        }
    })
}

/// Runs `f` with `frame` as the buffer that [`Payload`]s decoded inside it may borrow from.
pub(crate) fn with_source<T>(frame: &Bytes, f: impl FnOnce() -> T) -> T {
    let prev = SOURCE.with(|s| s.replace(Some(frame.clone())));
    let out = f();
    SOURCE.with(|s| *s.borrow_mut() = prev);
    out
}

/// A slice of the frame being decoded when `v` lies inside it and is large enough, else a copy.
fn share_or_copy(v: &[u8]) -> Bytes {
    if v.len() < SHARE_FROM {
        return Bytes::copy_from_slice(v);
    }
    SOURCE.with(|s| match s.borrow().as_ref() {
        Some(src) if contains(src, v) => src.slice_ref(v),
        _ => Bytes::copy_from_slice(v),
    })
}

/// Whether `part` lies within `whole`'s memory (so `slice_ref` cannot panic).
fn contains(whole: &[u8], part: &[u8]) -> bool {
    let (w, p) = (whole.as_ptr() as usize, part.as_ptr() as usize);
    p >= w && p + part.len() <= w + whole.len()
}

/// Bytes carried in a message without a copy on arrival (see the module documentation).
///
/// ```
/// use maquis::Payload;
/// let p = Payload::from(vec![1u8, 2, 3]);
/// assert_eq!(&p[..], &[1, 2, 3]);
/// let bytes: bytes::Bytes = p.into_bytes();
/// assert_eq!(bytes.len(), 3);
/// ```
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Payload(Bytes);

impl Payload {
    /// Wraps bytes (no copy).
    pub fn new(bytes: Bytes) -> Self {
        Payload(bytes)
    }

    /// The bytes (no copy).
    pub fn into_bytes(self) -> Bytes {
        self.0
    }

    /// The bytes, borrowed.
    pub fn as_bytes(&self) -> &Bytes {
        &self.0
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Payload({} bytes)", self.0.len())
    }
}

impl Deref for Payload {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl AsRef<[u8]> for Payload {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl From<Bytes> for Payload {
    fn from(b: Bytes) -> Self {
        Payload(b)
    }
}

impl From<Vec<u8>> for Payload {
    fn from(v: Vec<u8>) -> Self {
        Payload(Bytes::from(v))
    }
}

impl From<&'static [u8]> for Payload {
    fn from(s: &'static [u8]) -> Self {
        Payload(Bytes::from_static(s))
    }
}

impl From<Payload> for Bytes {
    fn from(p: Payload) -> Bytes {
        p.0
    }
}

impl Serialize for Payload {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        lend(&self.0);
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_bytes(PayloadVisitor)
    }
}

struct PayloadVisitor;

impl<'de> Visitor<'de> for PayloadVisitor {
    type Value = Payload;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a byte string")
    }

    fn visit_borrowed_bytes<E: de::Error>(self, v: &'de [u8]) -> Result<Payload, E> {
        Ok(Payload(share_or_copy(v)))
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Payload, E> {
        Ok(Payload(Bytes::copy_from_slice(v)))
    }

    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Payload, E> {
        Ok(Payload(Bytes::from(v)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Payload, A::Error> {
        // Self-describing formats (JSON) write bytes as a sequence of numbers.
        let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(SHARE_FROM));
        while let Some(b) = seq.next_element::<u8>()? {
            v.push(b);
        }
        Ok(Payload(Bytes::from(v)))
    }
}

/// For `#[serde(with = "maquis::payload::shared")]` on a `bytes::Bytes` field: the field keeps
/// its type and decodes like a [`Payload`] (shared with the frame, not copied).
pub mod shared {
    use bytes::Bytes;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes the bytes as a byte string.
    pub fn serialize<S: Serializer>(b: &Bytes, s: S) -> Result<S::Ok, S::Error> {
        super::lend(b);
        s.serialize_bytes(b)
    }

    /// Reads a byte string, sharing the frame's buffer when it can.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        super::Payload::deserialize(d).map(super::Payload::into_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct Msg {
        tag: u32,
        body: Payload,
    }

    fn decode(frame: &Bytes) -> Msg {
        with_source(frame, || postcard::from_bytes(frame).unwrap())
    }

    #[test]
    fn large_payloads_share_the_frame() {
        let body = Payload::from(vec![7u8; 64 * 1024]);
        let frame = Bytes::from(postcard::to_stdvec(&Msg { tag: 1, body }).unwrap());
        let m = decode(&frame);
        assert_eq!(m.body.len(), 64 * 1024);
        assert!(
            contains(&frame, &m.body),
            "the payload should point into the frame"
        );
    }

    #[test]
    fn small_payloads_and_foreign_buffers_are_copied() {
        let frame = Bytes::from(
            postcard::to_stdvec(&Msg {
                tag: 2,
                body: Payload::from(vec![1u8; 16]),
            })
            .unwrap(),
        );
        let m = decode(&frame);
        assert!(!contains(&frame, &m.body));
        // Without a source frame (or from another buffer), decoding copies.
        let big = postcard::to_stdvec(&Msg {
            tag: 3,
            body: Payload::from(vec![2u8; SHARE_FROM]),
        })
        .unwrap();
        let m: Msg = postcard::from_bytes(&big).unwrap();
        assert_eq!(m.body.len(), SHARE_FROM);
        let other = Bytes::from(vec![0u8; 8]);
        let m: Msg = with_source(&other, || postcard::from_bytes(&big).unwrap());
        assert_eq!(&m.body[..], &vec![2u8; SHARE_FROM][..]);
    }

    #[test]
    fn bytes_fields_can_decode_shared() {
        #[derive(Serialize, Deserialize)]
        struct Plain {
            #[serde(with = "shared")]
            body: Bytes,
        }
        let frame = Bytes::from(
            postcard::to_stdvec(&Plain {
                body: Bytes::from(vec![3u8; 10_000]),
            })
            .unwrap(),
        );
        let p: Plain = with_source(&frame, || postcard::from_bytes(&frame).unwrap());
        assert!(contains(&frame, &p.body));
    }

    #[test]
    fn same_encoding_as_bytes() {
        let b = Bytes::from(vec![9u8; 5000]);
        let a = postcard::to_stdvec(&b).unwrap();
        let p = postcard::to_stdvec(&Payload::from(b.clone())).unwrap();
        assert_eq!(a, p);
        let back: Bytes = postcard::from_bytes(&p).unwrap();
        assert_eq!(back, b);
        let json = serde_json::to_string(&Payload::from(vec![1u8, 2])).unwrap();
        let back: Payload = serde_json::from_str(&json).unwrap();
        assert_eq!(&back[..], &[1, 2]);
    }
}
