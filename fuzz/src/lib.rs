//! The bodies of Maquis's fuzz targets, one module per untrusted-input parser, and what they
//! share: a reader that feeds a decoder in chunks the way a socket reader does, a counting
//! allocator that measures what one decode allocates, and the seed inputs.
//!
//! Every target takes a few parameter bytes off the front of its input (the chunking, the
//! limits, how to drive a state machine) and treats the rest as the byte stream a peer sent.
//! A target panics when a property fails; the fuzzer records that input as a crash.

pub mod alloc;
pub mod chunks;
pub mod frame;
pub mod handshake;
pub mod resp;
pub mod seeds;

use std::path::Path;

/// Runs `target` on every file named on the command line (a directory stands for the files
/// in it): how a target binary built without `cargo afl` replays a corpus or a crash.
pub fn replay_args(target: fn(&[u8])) {
    let paths: Vec<_> = std::env::args_os().skip(1).collect();
    if paths.is_empty() {
        eprintln!("usage: TARGET FILE|DIR... (built with `cargo afl build`, it is a fuzz target)");
        std::process::exit(2);
    }
    let mut count = 0;
    for path in &paths {
        count += replay(Path::new(path), target).unwrap_or_else(|err| {
            eprintln!("{}: {err}", Path::new(path).display());
            std::process::exit(1);
        });
    }
    println!("{count} inputs ran without a failure");
}

/// Runs `target` on the file at `path`, or on each file in the directory at `path`; returns how
/// many inputs ran.
pub fn replay(path: &Path, target: fn(&[u8])) -> std::io::Result<usize> {
    if !path.is_dir() {
        target(&std::fs::read(path)?);
        return Ok(1);
    }
    let mut files: Vec<_> = std::fs::read_dir(path)?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.sort();
    let mut count = 0;
    for file in files.iter().filter(|f| f.is_file()) {
        target(&std::fs::read(file)?);
        count += 1;
    }
    Ok(count)
}

#[cfg(test)]
#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    /// The committed corpus of `target` (empty if none is committed yet).
    fn corpus(target: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("corpus")
            .join(target)
    }

    fn check(name: &str, target: fn(&[u8]), seeds: Vec<(String, Vec<u8>)>) {
        assert!(!seeds.is_empty());
        for (seed, input) in seeds {
            eprintln!("{name}: seed {seed}");
            target(&input);
        }
        let dir = corpus(name);
        if dir.is_dir() {
            super::replay(&dir, target).unwrap();
        }
    }

    #[test]
    fn frame_seeds_and_corpus_pass() {
        check("frame", super::frame::run, super::seeds::frame());
    }

    #[test]
    fn handshake_seeds_and_corpus_pass() {
        check(
            "handshake",
            super::handshake::run,
            super::seeds::handshake(),
        );
    }

    #[test]
    fn handshake_seeds_reach_the_ends_of_the_handshake() {
        use super::handshake::{drive, Outcome};
        let seeds: std::collections::HashMap<_, _> =
            super::seeds::handshake().into_iter().collect();
        let outcome = |name: &str| drive(&seeds[name]);
        let done = Outcome {
            decoded: 0,
            authenticated: true,
            established: true,
            verified: true,
        };
        assert_eq!(outcome("honest-loop"), done);
        assert_eq!(
            outcome("honest-loop-reject"),
            Outcome {
                established: false,
                ..done
            }
        );
        assert_eq!(
            outcome("acceptor-in-order"),
            Outcome {
                decoded: 2,
                authenticated: true,
                ..Outcome::default()
            }
        );
        assert_eq!(
            outcome("dialer-in-order"),
            Outcome {
                decoded: 2,
                authenticated: false,
                ..done
            }
        );
        assert!(outcome("dialer-rejected").verified);
        assert_eq!(outcome("crossed").decoded, 4);
    }

    #[test]
    fn resp_seeds_and_corpus_pass() {
        check("resp", super::resp::run, super::seeds::resp());
    }

    #[test]
    fn the_allocator_measures_what_a_closure_allocates() {
        let ((), peak) = super::alloc::measure(|| drop(vec![0u8; 10_000]));
        assert!((10_000..11_000).contains(&peak), "{peak}");
        let (kept, peak) = super::alloc::measure(|| vec![1u8; 100]);
        assert!(peak >= 100);
        drop(kept);
    }
}
