//! One function per command; [`run`] only dispatches.

use std::time::Duration;

use idem_runtime::repair::{self, Release};
use idem_runtime::StoreError;

use crate::args::{BizFilter, Cli, Command, Confirm, RecordId};
use crate::records::{instant, print_record, print_records, print_stats, print_unsettled};
use crate::store::Store;
use crate::Ended;

/// Run the command `cli` names on `store`.
pub async fn run(cli: &Cli, store: &Store) -> Ended {
    let json = cli.json;
    let ended = match &cli.command {
        Command::Stats { filter } => stats(store, filter, json).await,
        Command::Stuck {
            older_than,
            filter,
            limit,
        } => stuck(store, *older_than, filter, *limit, json).await,
        Command::Failed { filter, limit } => failed(store, filter, *limit, json).await,
        Command::Show { record, http } => match http.record_key(&record.key) {
            None => show(store, record, json).await,
            Some(Ok(key)) => {
                let scoped = RecordId {
                    biz: record.biz.clone(),
                    key,
                };
                show(store, &scoped, json).await
            }
            Some(Err(usage)) => Ok(Ended::Usage(usage)),
        },
        Command::Purge { batch, .. } => purge(store, *batch, json).await,
        Command::Release { record, confirm, force } => release(store, record, confirm, *force).await,
        Command::RetryFailed { record, confirm } => retry_failed(store, record, confirm).await,
        Command::Unknown { filter, limit } => unknown(store, filter, *limit, json).await,
        Command::Settle {
            record,
            step,
            value,
            confirm,
            ..
        } => settle(store, record, step.as_deref().unwrap_or(""), value.as_deref(), confirm).await,
        Command::Erase {
            subject,
            subject_key,
            confirm,
        } => erase(store, subject, subject_key, confirm, json).await,
        Command::Rekey { batch } => rekey(store, *batch, json).await,
        Command::Migrate { print: false } => migrate(store).await,
        Command::Migrate { print: true } => print_migration(store).await,
        Command::Check => check(store).await,
        Command::Outbox { outbox_table, command } => crate::outbox::run(store, outbox_table, command, json).await,
    };
    ended.unwrap_or_else(|error| Ended::Failed(store.describe(&error)))
}

type Outcome = Result<Ended, StoreError>;

async fn stats(store: &Store, filter: &BizFilter, json: bool) -> Outcome {
    let biz = filter.biz.as_deref();
    let rows = store.stats(biz).await?;
    let oldest = store.oldest_processing(biz).await?;
    print_stats(&rows, oldest.as_ref(), json);
    Ok(Ended::Done)
}

async fn stuck(store: &Store, older_than: Duration, filter: &BizFilter, limit: u32, json: bool) -> Outcome {
    let records = store.stuck(filter.biz.as_deref(), older_than, limit).await?;
    print_records(&records, json);
    Ok(Ended::Done)
}

async fn failed(store: &Store, filter: &BizFilter, limit: u32, json: bool) -> Outcome {
    let records = store.failed(filter.biz.as_deref(), limit).await?;
    print_records(&records, json);
    Ok(Ended::Done)
}

async fn unknown(store: &Store, filter: &BizFilter, limit: u32, json: bool) -> Outcome {
    let records = store.unsettled(filter.biz.as_deref(), limit).await?;
    print_unsettled(&records, json);
    let sealed = records
        .iter()
        .filter(|record| idem_runtime::unknown::unsettled(record).is_none())
        .count();
    if sealed > 0 {
        eprintln!(
            "{sealed} more wait to be settled, their intents sealed: give the application's key ring \
             (--seal-keys or IDEM_SEAL_KEYS) to list them"
        );
    }
    Ok(Ended::Done)
}

/// `idem settle BIZ KEY STEP --value JSON | --not-done`.
async fn settle(store: &Store, id: &RecordId, step_name: &str, value: Option<&str>, confirm: &Confirm) -> Outcome {
    let (biz, key) = (id.biz.as_str(), id.key.as_str());
    let step = crate::records::step_text(step_name);
    let (settlement, question) = match value {
        Some(json) => (
            repair::Settlement::Done(json.to_owned()),
            format!("settle {step} of biz `{biz}` key `{key}` as done with {json} (the next call returns it)"),
        ),
        None => (
            repair::Settlement::NotDone,
            format!("settle {step} of biz `{biz}` key `{key}` as not done (the next call runs it)"),
        ),
    };
    if !confirmed(confirm, &question) {
        return Ok(Ended::No("not settled".to_owned()));
    }
    Ok(match repair::settle(store.shared(), biz, key, step_name, settlement).await? {
        repair::Settle::Settled { .. } => {
            println!("settled {step} of biz `{biz}` key `{key}`: the next call goes on from it");
            Ended::Done
        }
        repair::Settle::NotFound => not_found(store, id),
        repair::Settle::NotUnknown { unknown } if unknown.is_empty() => Ended::No(format!(
            "biz `{biz}` key `{key}` has no effect of unknown outcome: nothing to settle (`idem show {biz} {key}`)"
        )),
        repair::Settle::NotUnknown { unknown } => Ended::No(format!(
            "{step} of biz `{biz}` key `{key}` is not of unknown outcome; these are: {}",
            unknown.iter().map(|name| crate::records::step_text(name)).collect::<Vec<_>>().join(", ")
        )),
        repair::Settle::StillHolding => Ended::No(format!(
            "the call that found the outcome of biz `{biz}` key `{key}` unknown is still holding its record; try again in a moment"
        )),
        other => Ended::Failed(format!("settling came to {other:?}")),
    })
}

/// `idem rekey`: every record re-sealed with the ring's current key, a batch at a time.
async fn rekey(store: &Store, batch: u32, json: bool) -> Outcome {
    let Some(sealed) = store.sealed() else {
        return Ok(Ended::Failed(
            "rekey needs the key ring, the new key first and the old ones after it: --seal-keys or IDEM_SEAL_KEYS"
                .to_owned(),
        ));
    };
    let started = std::time::Instant::now();
    let done = sealed
        .rekey(store.pages(), batch, |so_far| {
            eprintln!(
                "rekey: {} records read, {} re-sealed, {} changed meanwhile ({:.1} s)",
                so_far.scanned,
                so_far.resealed,
                so_far.changed_meanwhile,
                started.elapsed().as_secs_f64()
            );
        })
        .await?;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "scanned": done.scanned,
                "resealed": done.resealed,
                "changed_meanwhile": done.changed_meanwhile,
            })
        );
    } else {
        println!(
            "re-sealed {} of {} records on {} ({} changed meanwhile: run again once every process seals with \
             the new key)",
            done.resealed,
            done.scanned,
            store.name(),
            done.changed_meanwhile
        );
    }
    Ok(Ended::Done)
}

/// `idem erase --subject S`.
async fn erase(store: &Store, subject: &str, key: &str, confirm: &Confirm, json: bool) -> Outcome {
    if key.is_empty() {
        return Ok(Ended::Failed(
            "erase needs the application's subject key, which the records' subject hashes are keyed with: \
             --subject-key or IDEM_SUBJECT_KEY (32 bytes in base64)"
                .to_owned(),
        ));
    }
    let key = match idem_runtime::subject::SubjectKey::from_base64(key) {
        Ok(key) => key,
        Err(error) => return Ok(Ended::Failed(error.to_string())),
    };
    let question = format!(
        "erase every record of subject {subject:?} on {} (their requests, answers, failures and steps; a retry of \
         their calls is answered \"erased\" and not run)",
        store.name()
    );
    if !confirmed(confirm, &question) {
        return Ok(Ended::No("nothing erased".to_owned()));
    }
    let erased = idem_runtime::subject::erase(store.shared(), &key, subject).await?;
    if json {
        println!("{}", serde_json::json!({ "erased": erased }));
    } else {
        println!("erased {erased} records of the subject on {}", store.name());
    }
    Ok(Ended::Done)
}

async fn show(store: &Store, id: &RecordId, json: bool) -> Outcome {
    Ok(match store.get(&id.biz, &id.key).await? {
        Some(record) => {
            print_record(&record, json);
            Ended::Done
        }
        None => not_found(store, id),
    })
}

fn not_found(store: &Store, id: &RecordId) -> Ended {
    Ended::No(format!(
        "no record of biz `{}` key `{}` in {}",
        id.biz,
        id.key,
        store.name()
    ))
}

/// `idem purge --expired`: batches until none is left ([`in_batches`]).
async fn purge(store: &Store, batch: u64, json: bool) -> Outcome {
    let purged = in_batches("expired records", json, || store.purge(batch)).await?;
    if json {
        println!("{}", serde_json::json!({ "purged": purged }));
    } else {
        println!("purged {purged} expired records from {}", store.name());
    }
    Ok(Ended::Done)
}

/// Delete `what` a batch at a time (`batch` says how many went) until a batch deletes
/// none: how many in all. A progress spinner on a terminal, or a line per batch on
/// stderr otherwise (a log, a pipe).
pub(crate) async fn in_batches<F, Fut>(what: &str, json: bool, mut batch: F) -> Result<u64, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<u64, StoreError>>,
{
    use std::io::IsTerminal;
    let on_terminal = std::io::stderr().is_terminal();
    let progress = if json || !on_terminal {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new_spinner().with_message(format!("purging {what}"))
    };
    let template = format!("{{spinner}} {{pos}} {what} purged ({{per_sec}}) {{msg}}");
    progress.set_style(indicatif::ProgressStyle::with_template(&template).unwrap());
    let mut purged = 0u64;
    loop {
        match batch().await {
            Ok(0) => break,
            Ok(deleted) => {
                purged += deleted;
                progress.set_position(purged);
                if !on_terminal {
                    eprintln!("purged {purged} {what} so far");
                }
            }
            Err(error) => {
                progress.abandon();
                return Err(error);
            }
        }
    }
    progress.finish_with_message("done");
    Ok(purged)
}

async fn release(store: &Store, id: &RecordId, confirm: &Confirm, force: bool) -> Outcome {
    let (biz, key) = (id.biz.as_str(), id.key.as_str());
    let Some(record) = store.get(biz, key).await? else {
        return Ok(not_found(store, id));
    };
    let question = if force {
        format!(
            "release the claim on biz `{biz}` key `{key}` (fence {}) even if its holder is running (the body may \
             then run twice)",
            record.fence
        )
    } else {
        format!(
            "release the stuck claim on biz `{biz}` key `{key}` (fence {})",
            record.fence
        )
    };
    if !confirmed(confirm, &question) {
        return Ok(Ended::No("not released".to_owned()));
    }
    let released = if force {
        repair::force_release(store.shared(), biz, key).await?
    } else {
        repair::release_stuck(store.shared(), biz, key, idem_runtime::now()).await?
    };
    Ok(match released {
        Release::Released { .. } => {
            println!("released biz `{biz}` key `{key}`: the next call runs the body");
            Ended::Done
        }
        Release::NotFound => not_found(store, id),
        Release::Finished(status) => Ended::No(format!(
            "biz `{biz}` key `{key}` is {}, not PROCESSING: nothing to release",
            status.as_str()
        )),
        Release::LeaseRunning { until, fence } => Ended::No(format!(
            "biz `{biz}` key `{key}` is running: the lease of fence {fence} runs until {} and its holder renews it \
             while the body runs; releasing it would run the body twice. Wait until the lease lapses (then \
             `idem stuck` lists it), or pass --force if its holder is known to be gone",
            instant(until)
        )),
        other => Ended::No(format!("biz `{biz}` key `{key}` was not released: {other:?}")),
    })
}

async fn retry_failed(store: &Store, id: &RecordId, confirm: &Confirm) -> Outcome {
    let (biz, key) = (id.biz.as_str(), id.key.as_str());
    if !confirmed(
        confirm,
        &format!("delete the FAIL record of biz `{biz}` key `{key}` so the next call runs again"),
    ) {
        return Ok(Ended::No("not deleted".to_owned()));
    }
    Ok(if store.forget_failed(biz, key).await? {
        println!("deleted the FAIL record of biz `{biz}` key `{key}`: the next call runs the body");
        Ended::Done
    } else {
        Ended::No(format!("no FAIL record of biz `{biz}` key `{key}`"))
    })
}

async fn migrate(store: &Store) -> Outcome {
    store.migrate().await?;
    println!("{}: migrated", store.name());
    Ok(Ended::Done)
}

async fn print_migration(store: &Store) -> Outcome {
    print!("{}", store.migration_sql().await?);
    Ok(Ended::Done)
}

async fn check(store: &Store) -> Outcome {
    Ok(match store.check().await {
        Ok(()) => {
            println!("{}: the table has the shape idem needs", store.name());
            Ended::Done
        }
        Err(error) => Ended::No(store.describe(&error)),
    })
}

/// Ask on the terminal, unless `--yes`.
pub(crate) fn confirmed(confirm: &Confirm, what: &str) -> bool {
    if confirm.yes {
        return true;
    }
    eprint!("{what}? [y/N] ");
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer).is_ok() && matches!(answer.trim(), "y" | "Y" | "yes")
}
