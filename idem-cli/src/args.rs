//! The command line.

use std::time::Duration;

use clap::{Parser, Subcommand};

/// Look at idempotency records, and repair them, on any idem store.
#[derive(Debug, Parser)]
#[command(name = "idem", version)]
pub struct Cli {
    /// The store: `sqlite://…`, `postgres://…`, `mysql://…` (or `mariadb://…`),
    /// `redis://…`.
    #[arg(long, env = "DATABASE_URL", global = true, default_value = "")]
    pub database_url: String,
    /// The table, when not `idempotent_record` (SQL stores).
    #[arg(long, global = true, default_value = "idempotent_record")]
    pub table: String,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Records by biz and status, how many expired, the oldest PROCESSING.
    Stats {
        /// Only this biz.
        #[arg(long)]
        biz: Option<String>,
    },
    /// PROCESSING records created at least `--older-than` ago (the oldest first).
    Stuck {
        /// `90s`, `5m`, `2h`, `1d`.
        #[arg(long, value_parser = duration)]
        older_than: Duration,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Live FAIL records (the oldest first).
    Failed {
        /// Only this biz.
        #[arg(long)]
        biz: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// One record.
    Show {
        /// The biz.
        biz: String,
        /// The key.
        key: String,
    },
    /// Delete expired records in batches, never a running claim.
    Purge {
        /// Required: what is purged.
        #[arg(long, required = true)]
        expired: bool,
        /// Records per batch.
        #[arg(long, default_value_t = 1000)]
        batch: u64,
    },
    /// Free a PROCESSING claim (its holder is gone): the next call runs the body.
    Release {
        /// The biz.
        biz: String,
        /// The key.
        key: String,
        /// Do not ask.
        #[arg(long)]
        yes: bool,
    },
    /// Delete a FAIL record so that the next call runs the body again.
    RetryFailed {
        /// The biz.
        biz: String,
        /// The key.
        key: String,
        /// Do not ask.
        #[arg(long)]
        yes: bool,
    },
    /// Create the table and its index if missing (the DDL of `migrate()`).
    Migrate,
    /// Check the table's shape against what the store needs.
    Check,
}

/// `90s`, `5m`, `2h`, `1d`.
fn duration(text: &str) -> Result<Duration, String> {
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: expected a number, then s, m, h or d"))?;
    let unit = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{text:?}: unknown unit {unit:?}; use s, m, h or d")),
    };
    Ok(Duration::from_secs(n * unit))
}
