//! Small outbound buffers (frame heads, small encoded messages) cut from a per-thread block
//! instead of one allocation each.
//!
//! Every remote send builds a frame head of a few dozen bytes and, usually, a payload of a few
//! hundred; allocating and freeing each on its own cost the sender several percent of its CPU.
//! Here a thread keeps one block of [`BLOCK`] bytes and hands out pieces of it as [`Bytes`]
//! that share the block (a reference count, no allocation); the block is freed when its last
//! piece is dropped. Pieces above [`MAX_PIECE`] get an allocation of their own, so a block is
//! never held by a large buffer, and a small piece kept for long holds at most one block.

use std::cell::RefCell;

use bytes::{BufMut, Bytes, BytesMut};

use crate::payload::LEND_FROM;
use crate::wire::Body;

/// Bytes of a block.
const BLOCK: usize = 16 * 1024;
/// The largest piece cut from a block.
pub(crate) const MAX_PIECE: usize = 2 * 1024;

thread_local! {
    static SLAB: RefCell<BytesMut> = RefCell::new(BytesMut::new());
}

/// What `fill` writes into an empty buffer with room for `hint` bytes, as [`Bytes`]: a piece
/// of this thread's block when `hint` is at most [`MAX_PIECE`], else a buffer of its own.
/// `fill` may write more than `hint` (the buffer grows).
pub(crate) fn cut<E>(
    hint: usize,
    fill: impl FnOnce(&mut BytesMut) -> Result<(), E>,
) -> Result<Bytes, E> {
    if hint > MAX_PIECE {
        return own(hint, fill);
    }
    SLAB.with(|slab| {
        // `fill` runs user serializers; should one cut a buffer too, it gets its own.
        let Ok(mut slab) = slab.try_borrow_mut() else {
            return own(hint, fill);
        };
        if slab.capacity() < hint {
            *slab = BytesMut::with_capacity(BLOCK);
        }
        let r = fill(&mut slab);
        let piece = slab.split().freeze();
        r.map(|()| piece)
    })
}

fn own<E>(hint: usize, fill: impl FnOnce(&mut BytesMut) -> Result<(), E>) -> Result<Bytes, E> {
    let mut buf = BytesMut::with_capacity(hint);
    fill(&mut buf)?;
    Ok(buf.freeze())
}

/// Encodes `value` as messages travel ([`crate::encode`]), into a buffer sized by a first
/// counting pass: a piece of the thread's block when small. A message of at least
/// [`LEND_FROM`] bytes is encoded around its large payloads instead: each stays in its own
/// buffer (see [`crate::payload`]), and the body is the pieces in order.
pub(crate) fn encode<T: serde::Serialize>(value: &T) -> Result<Body, postcard::Error> {
    let size = postcard::serialize_with_flavor(value, postcard::ser_flavors::Size::default())?;
    if size < LEND_FROM {
        return cut(size, |buf| postcard::to_io(value, buf.writer()).map(drop)).map(Body::from);
    }
    crate::payload::lending(|| postcard::serialize_with_flavor(value, Pieces::default()))
}

/// A postcard output that keeps lent payloads in their own buffers.
#[derive(Default)]
struct Pieces {
    /// The bytes since the last lent payload.
    open: BytesMut,
    /// The pieces so far.
    done: Vec<Bytes>,
}

impl postcard::ser_flavors::Flavor for Pieces {
    type Output = Body;

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        match crate::payload::take_lent(data) {
            Some(lent) => {
                if !self.open.is_empty() {
                    self.done.push(self.open.split().freeze());
                }
                self.done.push(lent);
            }
            None => self.open.extend_from_slice(data),
        }
        Ok(())
    }

    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.open.put_u8(data);
        Ok(())
    }

    fn finalize(mut self) -> postcard::Result<Body> {
        if !self.open.is_empty() {
            self.done.push(self.open.freeze());
        }
        Ok(Body::from_bufs(self.done))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_pieces_share_a_block_and_large_ones_do_not() {
        // Room for both pieces, so that the second follows the first.
        let a = cut(15, |b| {
            b.put_slice(b"0123456789");
            Ok::<_, ()>(())
        })
        .unwrap();
        let b = cut(5, |b| {
            b.put_slice(b"abcde");
            Ok::<_, ()>(())
        })
        .unwrap();
        assert_eq!((&a[..], &b[..]), (&b"0123456789"[..], &b"abcde"[..]));
        assert_eq!(
            a.as_ptr() as usize + a.len(),
            b.as_ptr() as usize,
            "the second piece follows the first in the block"
        );
        let big = cut(MAX_PIECE + 1, |b| {
            b.put_bytes(7, MAX_PIECE + 1);
            Ok::<_, ()>(())
        })
        .unwrap();
        assert_eq!(big.len(), MAX_PIECE + 1);
        // Writing past the hint grows the piece; what was cut before is untouched.
        let grown = cut(1, |b| {
            b.put_bytes(9, 3 * BLOCK);
            Ok::<_, ()>(())
        })
        .unwrap();
        assert_eq!(grown.len(), 3 * BLOCK);
        assert!(grown.iter().all(|&x| x == 9));
        assert_eq!(&a[..], b"0123456789");
        // A failed fill hands nothing on, and the next piece starts clean.
        assert!(cut(4, |b| {
            b.put_slice(b"junk");
            Err::<(), _>("no")
        })
        .is_err());
        let c = cut(3, |b| {
            b.put_slice(b"xyz");
            Ok::<_, ()>(())
        })
        .unwrap();
        assert_eq!(&c[..], b"xyz");
    }

    #[test]
    fn many_pieces_outlive_their_blocks() {
        let pieces: Vec<Bytes> = (0..10_000u32)
            .map(|i| encode(&(i, "message")).unwrap().to_bytes())
            .collect();
        for (i, p) in pieces.iter().enumerate() {
            assert_eq!(
                postcard::from_bytes::<(u32, String)>(p).unwrap(),
                (i as u32, "message".to_string())
            );
        }
        assert_eq!(
            encode(&vec![1u8; 4 * MAX_PIECE]).unwrap().len(),
            4 * MAX_PIECE + 2
        );
    }

    #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    struct Carrier {
        before: String,
        body: crate::Payload,
        #[serde(with = "crate::payload::shared")]
        raw: Bytes,
        after: u64,
    }

    #[test]
    fn large_payloads_are_lent_not_copied_and_the_bytes_are_the_same() {
        let body = Bytes::from(vec![7u8; LEND_FROM]);
        let raw = Bytes::from(vec![9u8; 3 * LEND_FROM]);
        let msg = Carrier {
            before: "head".into(),
            body: crate::Payload::new(body.clone()),
            raw: raw.clone(),
            after: 42,
        };
        let encoded = encode(&msg).unwrap();
        // The payloads' own buffers are in the body, between the bytes around them.
        let bufs = encoded.bufs();
        assert_eq!(bufs.len(), 5, "prefix, body, length of raw, raw, suffix");
        assert_eq!(bufs[1].as_ptr(), body.as_ptr());
        assert_eq!(bufs[3].as_ptr(), raw.as_ptr());
        // On the wire it is exactly what postcard writes.
        assert_eq!(
            &encoded.to_bytes()[..],
            &postcard::to_stdvec(&msg).unwrap()[..]
        );
        let back: Carrier = postcard::from_bytes(&encoded.to_bytes()).unwrap();
        assert_eq!(back, msg);
        // Below the threshold a payload is copied: one buffer.
        let small = Carrier {
            body: crate::Payload::new(Bytes::from(vec![1u8; LEND_FROM - 1])),
            raw: Bytes::new(),
            ..msg
        };
        assert_eq!(encode(&small).unwrap().bufs().len(), 1);
        // Nothing stays lent after an encoding.
        assert!(crate::payload::take_lent(&body).is_none());
    }
}
