//! Fuzz target: the frame decoder (see `maquis_fuzz::frame`).

#[global_allocator]
static ALLOC: maquis_fuzz::alloc::Counting = maquis_fuzz::alloc::Counting;

fn main() {
    #[cfg(fuzzing)]
    afl::fuzz!(|data: &[u8]| maquis_fuzz::frame::run(data));
    #[cfg(not(fuzzing))]
    maquis_fuzz::replay_args(maquis_fuzz::frame::run);
}
