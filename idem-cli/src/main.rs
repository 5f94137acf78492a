//! `idem`: look at the idempotency records of any store, and repair them.
//!
//! ```text
//! idem --database-url postgres://… stats
//! DATABASE_URL=sqlite://idem.db idem stuck --older-than 5m --json
//! idem purge --expired --batch 5000
//! idem release pay order-7          # a stuck claim only; asks first; --yes to skip
//! idem outbox counts                # the idem-amqp outbox in the same database
//! idem outbox retry-dead --all --yes
//! ```
//!
//! Exit codes: 0 done; 1 the answer is "no" (a record not found, a table that fails
//! `check`, a claim whose lease still runs, nothing to release); 2 bad usage (clap's, no
//! store URL, an unknown kind of store, a command the store does not have); 3 the store
//! failed (the message names the URL, without its password, the table, and the
//! driver's cause).
//!
//! Why the dependencies: `clap` (the command line, with `DATABASE_URL` read as sqlx's
//! CLI does), `comfy-table` (aligned tables), `indicatif` (the purge's progress),
//! `serde_json` (`--json`), `chrono` (instants as RFC 3339), `idem-amqp` (the outbox's
//! statements, one source with the relay's).

mod args;
mod commands;
mod outbox;
mod records;
mod store;

use std::process::ExitCode;

use clap::Parser;

use args::Cli;
use store::{Opened, Store};

/// How a command ended, as the exit code says.
pub enum Ended {
    /// Done: 0.
    Done,
    /// The answer is "no": 1.
    No(String),
    /// Bad usage: 2.
    Usage(String),
    /// The store failed: 3.
    Failed(String),
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let ended = match Store::open(&cli.database_url, &cli.table, &cli.seal_keys).await {
        Opened::Store(store) => match store.refuses(&cli.command) {
            Some(usage) => Ended::Usage(usage),
            None => commands::run(&cli, &store).await,
        },
        Opened::Usage(usage) => Ended::Usage(usage),
        Opened::Failed(error) => Ended::Failed(error),
    };
    match ended {
        Ended::Done => ExitCode::SUCCESS,
        Ended::No(message) => {
            eprintln!("{message}");
            ExitCode::from(1)
        }
        Ended::Usage(message) => {
            eprintln!("idem: {message}");
            ExitCode::from(2)
        }
        Ended::Failed(message) => {
            eprintln!("idem: {message}");
            ExitCode::from(3)
        }
    }
}
