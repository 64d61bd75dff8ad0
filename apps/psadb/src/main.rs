//! `psadb`: run a psaDB node: members of its groups, and a Redis-protocol front.
//!
//! ```text
//! psadb serve --name a --listen 127.0.0.1:7101 --resp 127.0.0.1:6391
//! psadb serve --name b --listen 127.0.0.1:7102 --resp 127.0.0.1:6392 --join 127.0.0.1:7101
//! psadb serve --name c --listen 127.0.0.1:7103 --resp 127.0.0.1:6393 --join 127.0.0.1:7101
//! redis-cli -p 6391 HSET user1 name ada
//! ```

use clap::{Parser, Subcommand};
use maquis_psadb::serve::ServeArgs;

#[derive(Parser, Debug)]
#[command(
    name = "psadb",
    version,
    about = "psaDB on Maquis: a key-value store on actor groups, with a Redis front"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a node with a member of each of its groups, and serve the Redis protocol until
    /// interrupted.
    Serve(ServeArgs),
}

#[tokio::main]
async fn main() {
    maquis::tune_allocator();
    maquis::init_logging("info");
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Serve(s) => match maquis_psadb::serve::serve(s).await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("psadb: {e}");
                1
            }
        },
    };
    std::process::exit(code);
}
