//! What the `maquis` binary and the benchmark binary share: how a command-line process of
//! Maquis sets itself up.

use std::future::Future;
use std::process::ExitCode;

/// Logs to standard error, filtered by `RUST_LOG` (default: warnings and errors).
pub fn init_tracing() {
    maquis::init_logging("warn");
}

/// Runs a command on a multi-threaded tokio runtime; fails if the runtime cannot start.
pub fn block_on(command: impl Future<Output = ExitCode>) -> ExitCode {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(command),
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}
