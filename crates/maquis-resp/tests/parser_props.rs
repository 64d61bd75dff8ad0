//! Property tests of the RESP request parser: arbitrary bytes never panic and never make it
//! hold more than the limits allow; well-formed requests parse the same however they are split.

use bytes::{Bytes, BytesMut};
use maquis_resp::parser::{encode_request, Limits, RequestParser};
use proptest::prelude::*;

fn small_limits() -> Limits {
    Limits {
        max_bulk: 1024,
        max_args: 64,
        max_inline: 256,
        max_request: 8 * 1024,
    }
}

/// Feeds `input` in pieces cut at `cuts`; returns the requests and whether it errored.
fn feed(input: &[u8], cuts: &[usize], limits: Limits) -> (Vec<Vec<Bytes>>, bool) {
    let mut parser = RequestParser::new(limits.clone());
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
    points.push(input.len());
    points.sort_unstable();
    let mut at = 0;
    for p in points {
        buf.extend_from_slice(&input[at..p]);
        at = p;
        loop {
            match parser.next(&mut buf) {
                Ok(Some(args)) => {
                    assert!(!args.is_empty());
                    assert!(args.len() <= limits.max_args);
                    assert!(args
                        .iter()
                        .all(|a| a.len() <= limits.max_bulk.max(limits.max_inline)));
                    out.push(args);
                }
                Ok(None) => break,
                Err(_) => return (out, true),
            }
        }
        // What the parser keeps waiting on stays within the request limit (plus one read).
        assert!(buf.len() <= limits.max_request + input.len());
    }
    (out, false)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn arbitrary_bytes_never_panic(input in proptest::collection::vec(any::<u8>(), 0..2048),
                                   cuts in proptest::collection::vec(any::<usize>(), 0..8)) {
        let _ = feed(&input, &cuts, small_limits());
        let _ = feed(&input, &cuts, Limits::default());
    }

    #[test]
    fn resp_shaped_noise_never_panics(parts in proptest::collection::vec(
        prop_oneof![
            Just(b"*".to_vec()), Just(b"$".to_vec()), Just(b"\r\n".to_vec()), Just(b"-".to_vec()),
            Just(b"999999999999999999999".to_vec()), Just(b"0".to_vec()), Just(b"3".to_vec()),
            Just(b"GET".to_vec()), Just(b" ".to_vec()), Just(b"\n".to_vec()),
            proptest::collection::vec(any::<u8>(), 0..8),
        ], 0..64),
        cuts in proptest::collection::vec(any::<usize>(), 0..8)) {
        let input: Vec<u8> = parts.concat();
        let _ = feed(&input, &cuts, small_limits());
    }

    #[test]
    fn requests_parse_the_same_however_split(
        reqs in proptest::collection::vec(
            proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 1..6), 1..6),
        cuts in proptest::collection::vec(any::<usize>(), 0..12)) {
        let mut wire = BytesMut::new();
        for r in &reqs {
            let args: Vec<&[u8]> = r.iter().map(|a| a.as_slice()).collect();
            encode_request(&args, &mut wire);
        }
        let (got, errored) = feed(&wire, &cuts, small_limits());
        prop_assert!(!errored);
        let want: Vec<Vec<Bytes>> = reqs
            .iter()
            .map(|r| r.iter().map(|a| Bytes::copy_from_slice(a)).collect())
            .collect();
        prop_assert_eq!(got, want);
    }
}
