//! `maquis sim-actop`: ActOp's pairwise partitioning (the code the nodes run) on a
//! Halo-Presence-like graph of games and players, far more actors than live nodes could host;
//! prints each round's remote share, moves and imbalance, as a table or as JSON.

use std::process::ExitCode;

use clap::Args;
use maquis_sim::{run_actop, ActopSim};

/// The options of `maquis sim-actop`.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct ActopArgs {
    /// Servers.
    #[arg(long, default_value_t = 10)]
    pub servers: u16,
    /// Games (each one game actor and `--players` players: 1,000,000 actors by default).
    #[arg(long, default_value_t = 111_112)]
    pub games: u32,
    /// Players per game.
    #[arg(long, default_value_t = 8)]
    pub players: u32,
    /// Actors a server offers, or sends back, per exchange at most.
    #[arg(long, default_value_t = 5000)]
    pub candidates: usize,
    /// Actors two servers may differ by after an exchange (δ).
    #[arg(long, default_value_t = 1000)]
    pub imbalance: usize,
    /// Rounds at most (each server starts one exchange per round).
    #[arg(long, default_value_t = 40)]
    pub rounds: usize,
    /// Seed of the random placement.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs the simulation on a blocking thread and prints it.
pub async fn run(args: ActopArgs) -> ExitCode {
    if args.servers < 2 || args.games == 0 || args.players == 0 || args.candidates == 0 {
        eprintln!(
            "error: --servers must be at least 2; --games, --players, --candidates at least 1"
        );
        return ExitCode::FAILURE;
    }
    let cfg = ActopSim {
        servers: args.servers,
        games: args.games,
        players: args.players,
        candidates: args.candidates,
        imbalance: args.imbalance,
        rounds: args.rounds,
        seed: args.seed,
    };
    let rounds = match tokio::task::spawn_blocking(move || run_actop(&cfg)).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.json {
        match serde_json::to_string_pretty(&rounds) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
        return ExitCode::SUCCESS;
    }
    let actors = u64::from(args.games) * u64::from(args.players + 1);
    println!(
        "{actors} actors on {} servers, {} candidates, imbalance {}",
        args.servers, args.candidates, args.imbalance
    );
    println!("round  remote share  moved  imbalance  ms");
    for r in &rounds {
        println!(
            "{:>5}  {:>12.3}  {:>5}  {:>9}  {}",
            r.round, r.remote_fraction, r.migrations, r.imbalance, r.millis
        );
    }
    ExitCode::SUCCESS
}
