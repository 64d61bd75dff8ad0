//! Fuzz target: the handshake decoder and state machines (see `maquis_fuzz::handshake`).

#[global_allocator]
static ALLOC: maquis_fuzz::alloc::Counting = maquis_fuzz::alloc::Counting;

fn main() {
    #[cfg(fuzzing)]
    afl::fuzz!(|data: &[u8]| maquis_fuzz::handshake::run(data));
    #[cfg(not(fuzzing))]
    maquis_fuzz::replay_args(maquis_fuzz::handshake::run);
}
