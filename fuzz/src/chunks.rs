//! Reading a byte stream in chunks, as a socket delivers it, and feeding it to a
//! [`StreamDecoder`] the way `tokio_util::codec::FramedRead` does.

use bytes::BytesMut;
use maquis_proto::wire::StreamDecoder;

use crate::alloc;

/// The sizes of successive reads, from one parameter byte: its low three bits choose the
/// largest read (from 1 byte to unbounded), the other five seed the sizes up to it.
#[derive(Clone, Debug)]
pub struct Chunker {
    state: u32,
    largest: usize,
}

impl Chunker {
    const LARGEST: [usize; 8] = [1, 2, 5, 16, 64, 300, 4096, usize::MAX];

    /// The chunking that `param` stands for.
    pub fn new(param: u8) -> Self {
        Chunker {
            // xorshift32 needs a non-zero state.
            state: (u32::from(param >> 3) + 1).wrapping_mul(0x9E37_79B9),
            largest: Self::LARGEST[usize::from(param & 7)],
        }
    }

    /// The size of the next read: between 1 and the largest, both included.
    pub fn next_len(&mut self) -> usize {
        let mut x = self.state;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.state = x;
        if self.largest == usize::MAX {
            return usize::MAX;
        }
        1 + x as usize % self.largest
    }
}

/// How feeding a stream to a decoder ended.
#[derive(Debug)]
pub struct Fed<T> {
    /// The items decoded, in order, each with the number of stream bytes it took.
    pub items: Vec<(T, usize)>,
    /// The first error (as text), which ends the feeding.
    pub error: Option<String>,
    /// The bytes left in the buffer.
    pub rest: BytesMut,
    /// The largest capacity the read buffer reached.
    pub max_capacity: usize,
    /// The most that one call of the decoder allocated at its peak.
    pub max_decode_alloc: usize,
}

impl<T> Fed<T> {
    fn new() -> Self {
        Fed {
            items: Vec::new(),
            error: None,
            rest: BytesMut::new(),
            max_capacity: 0,
            max_decode_alloc: 0,
        }
    }
}

/// Decodes from `buf` until the decoder needs more bytes or fails; returns whether to go on.
fn drain<D: StreamDecoder>(decoder: &mut D, buf: &mut BytesMut, fed: &mut Fed<D::Item>) -> bool {
    loop {
        let before = buf.len();
        let (decoded, allocated) = alloc::measure(|| decoder.decode(buf));
        fed.max_decode_alloc = fed.max_decode_alloc.max(allocated);
        fed.max_capacity = fed.max_capacity.max(buf.capacity());
        match decoded {
            Ok(Some(item)) => fed.items.push((item, before - buf.len())),
            Ok(None) => return true,
            Err(err) => {
                fed.error = Some(err.to_string());
                return false;
            }
        }
    }
}

/// Feeds `data` to `decoder` in reads of the sizes `chunker` gives. As in `FramedRead`, the
/// buffer starts empty, a read fills at most its spare capacity, and the buffer grows by
/// `reserve(1)` only when it is full: any other growth is the decoder's.
pub fn feed<D: StreamDecoder>(decoder: &mut D, data: &[u8], chunker: &mut Chunker) -> Fed<D::Item> {
    let mut fed = Fed::new();
    let mut buf = BytesMut::new();
    let mut data = data;
    while !data.is_empty() {
        if buf.len() == buf.capacity() {
            buf.reserve(1);
        }
        let n = chunker
            .next_len()
            .min(buf.capacity() - buf.len())
            .min(data.len());
        buf.extend_from_slice(&data[..n]);
        data = &data[n..];
        if !drain(decoder, &mut buf, &mut fed) {
            break;
        }
    }
    fed.rest = buf;
    fed
}

/// Decodes `data` arrived all at once.
pub fn whole<D: StreamDecoder>(decoder: &mut D, data: &[u8]) -> Fed<D::Item> {
    let mut fed = Fed::new();
    let mut buf = BytesMut::from(data);
    drain(decoder, &mut buf, &mut fed);
    fed.rest = buf;
    fed
}

/// Checks that a stream decodes the same whether it arrived in chunks or all at once, and
/// that `decode_eof` treats what is left over as the [`StreamDecoder`] contract says.
pub fn check_same<D, T>(mut decoder: impl FnMut() -> D, chunked: &Fed<T>, whole: &Fed<T>)
where
    D: StreamDecoder<Item = T>,
    T: PartialEq + std::fmt::Debug,
{
    assert_eq!(
        chunked.items, whole.items,
        "chunked and whole decodes differ"
    );
    assert_eq!(
        chunked.error, whole.error,
        "chunked and whole errors differ"
    );
    if chunked.error.is_none() {
        assert_eq!(
            chunked.rest, whole.rest,
            "chunked and whole leave other bytes"
        );
        let mut rest = chunked.rest.clone();
        match decoder().decode_eof(&mut rest) {
            Ok(None) => assert!(chunked.rest.is_empty(), "leftover bytes passed decode_eof"),
            Ok(Some(_)) => panic!("decode_eof found an item decode had not"),
            Err(_) => assert!(!chunked.rest.is_empty(), "decode_eof failed on nothing"),
        }
    }
}
