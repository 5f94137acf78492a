//! `idem`: look at the idempotency records of any store, and repair them.
//!
//! ```text
//! idem --database-url postgres://… stats
//! DATABASE_URL=sqlite://idem.db idem stuck --older-than 5m --json
//! idem purge --expired --batch 5000
//! idem release pay order-7          # asks first; --yes to skip
//! ```
//!
//! Exit codes: 0 done; 1 the answer is "no" (a record not found, a table that fails
//! `check`, nothing to release); 2 bad usage (clap's); 3 the store failed (the message
//! names the URL, without its password, and the table).
//!
//! Why the dependencies: `clap` (the command line, with `DATABASE_URL` read as sqlx's
//! CLI does), `comfy-table` (aligned tables), `indicatif` (the purge's progress),
//! `serde_json` (`--json`).

mod args;
mod records;
mod store;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use idem_runtime::{Lease, Status};

use args::{Cli, Command};
use records::{print_records, print_stats};
use store::Store;

/// How a command ended, as the exit code says.
enum Ended {
    Done,
    No(String),
    Failed(String),
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let ended = match Store::open(&cli.database_url, &cli.table).await {
        Ok(store) => run(&cli, &store).await,
        Err(error) => Ended::Failed(error),
    };
    match ended {
        Ended::Done => ExitCode::SUCCESS,
        Ended::No(message) => {
            eprintln!("{message}");
            ExitCode::from(1)
        }
        Ended::Failed(message) => {
            eprintln!("idem: {message}");
            ExitCode::from(3)
        }
    }
}

async fn run(cli: &Cli, store: &Store) -> Ended {
    let failed = |error: idem_runtime::StoreError| Ended::Failed(store.describe(&error));
    match &cli.command {
        Command::Stats { biz } => match store.stats().await {
            Ok(rows) => {
                let rows: Vec<_> = rows
                    .into_iter()
                    .filter(|row| biz.as_ref().is_none_or(|b| &row.biz == b))
                    .collect();
                // The oldest PROCESSING record (of the biz, among the 10,000 oldest).
                let oldest = match store
                    .stuck(Duration::ZERO, if biz.is_some() { 10_000 } else { 1 })
                    .await
                {
                    Ok(records) => records.into_iter().find(|r| biz.as_ref().is_none_or(|b| &r.biz == b)),
                    Err(error) => return failed(error),
                };
                print_stats(&rows, oldest.as_ref(), cli.json);
                Ended::Done
            }
            Err(error) => failed(error),
        },
        Command::Stuck { older_than, limit } => match store.stuck(*older_than, *limit).await {
            Ok(records) => {
                print_records(&records, cli.json);
                Ended::Done
            }
            Err(error) => failed(error),
        },
        Command::Failed { biz, limit } => match store.failed(*limit).await {
            Ok(records) => {
                let records: Vec<_> = records
                    .into_iter()
                    .filter(|r| biz.as_ref().is_none_or(|b| &r.biz == b))
                    .collect();
                print_records(&records, cli.json);
                Ended::Done
            }
            Err(error) => failed(error),
        },
        Command::Show { biz, key } => match store.get(biz, key).await {
            Ok(Some(record)) => {
                print_records(std::slice::from_ref(&record), cli.json);
                Ended::Done
            }
            Ok(None) => Ended::No(format!("no record of biz `{biz}` key `{key}` in {}", store.name())),
            Err(error) => failed(error),
        },
        Command::Purge { batch, .. } => purge(store, *batch, cli.json).await,
        Command::Release { biz, key, yes } => {
            let record = match store.get(biz, key).await {
                Ok(Some(record)) if record.status == Status::Processing => record,
                Ok(Some(record)) => {
                    return Ended::No(format!(
                        "biz `{biz}` key `{key}` is {}, not PROCESSING: nothing to release",
                        record.status.as_str()
                    ))
                }
                Ok(None) => return Ended::No(format!("no record of biz `{biz}` key `{key}` in {}", store.name())),
                Err(error) => return failed(error),
            };
            if !confirmed(
                *yes,
                &format!("release the claim on biz `{biz}` key `{key}` (fence {})", record.fence),
            ) {
                return Ended::No("not released".to_owned());
            }
            match store.release(&Lease::of(&record)).await {
                Ok(idem_runtime::FenceCheck::Held) => {
                    println!("released biz `{biz}` key `{key}`: the next call runs the body");
                    Ended::Done
                }
                Ok(idem_runtime::FenceCheck::Lost) => {
                    Ended::No("the record changed meanwhile: not released".to_owned())
                }
                Err(error) => failed(error),
            }
        }
        Command::RetryFailed { biz, key, yes } => {
            if !confirmed(
                *yes,
                &format!("delete the FAIL record of biz `{biz}` key `{key}` so the next call runs again"),
            ) {
                return Ended::No("not deleted".to_owned());
            }
            match store.forget_failed(biz, key).await {
                Ok(true) => {
                    println!("deleted the FAIL record of biz `{biz}` key `{key}`: the next call runs the body");
                    Ended::Done
                }
                Ok(false) => Ended::No(format!("no FAIL record of biz `{biz}` key `{key}`")),
                Err(error) => failed(error),
            }
        }
        Command::Migrate => match store.migrate().await {
            Ok(()) => {
                println!("{}: migrated", store.name());
                Ended::Done
            }
            Err(error) => failed(error),
        },
        Command::Check => match store.check().await {
            Ok(()) => {
                println!("{}: the table has the shape idem needs", store.name());
                Ended::Done
            }
            Err(error) => Ended::No(store.describe(&error)),
        },
    }
}

/// `idem purge --expired`: batches until none is left, with a progress spinner on a
/// terminal, or a line per batch on stderr otherwise (a log, a pipe).
async fn purge(store: &Store, batch: u64, json: bool) -> Ended {
    use std::io::IsTerminal;
    let on_terminal = std::io::stderr().is_terminal();
    let progress = if json || !on_terminal {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new_spinner().with_message("purging expired records")
    };
    progress.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {pos} records purged ({per_sec}) {msg}").unwrap(),
    );
    let mut purged = 0u64;
    loop {
        match store.purge(batch).await {
            Ok(0) => break,
            Ok(deleted) => {
                purged += deleted;
                progress.set_position(purged);
                if !on_terminal {
                    eprintln!("purged {purged} expired records so far");
                }
            }
            Err(error) => {
                progress.abandon();
                return Ended::Failed(store.describe(&error));
            }
        }
    }
    progress.finish_with_message("done");
    if json {
        println!("{}", serde_json::json!({ "purged": purged }));
    } else {
        println!("purged {purged} expired records from {}", store.name());
    }
    Ended::Done
}

/// Ask on the terminal, unless `yes`.
fn confirmed(yes: bool, what: &str) -> bool {
    if yes {
        return true;
    }
    eprint!("{what}? [y/N] ");
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer).is_ok() && matches!(answer.trim(), "y" | "Y" | "yes")
}
