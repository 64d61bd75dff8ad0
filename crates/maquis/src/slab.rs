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
/// counting pass: a piece of the thread's block when small.
pub(crate) fn encode<T: serde::Serialize>(value: &T) -> Result<Bytes, postcard::Error> {
    let size = postcard::serialize_with_flavor(value, postcard::ser_flavors::Size::default())?;
    cut(size, |buf| postcard::to_io(value, buf.writer()).map(drop))
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
            .map(|i| encode(&(i, "message")).unwrap())
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
}
