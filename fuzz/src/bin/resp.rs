//! Fuzz target: the RESP request parser (see `maquis_fuzz::resp`).

#[global_allocator]
static ALLOC: maquis_fuzz::alloc::Counting = maquis_fuzz::alloc::Counting;

fn main() {
    #[cfg(fuzzing)]
    afl::fuzz!(|data: &[u8]| maquis_fuzz::resp::run(data));
    #[cfg(not(fuzzing))]
    maquis_fuzz::replay_args(maquis_fuzz::resp::run);
}
