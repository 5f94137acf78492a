//! `idem outbox …`: the transactional outbox of `idem-amqp` in the store's database,
//! through the outbox's own statements.

use idem_amqp::{Outbox, OutboxDatabase};
use idem_runtime::StoreError;
use serde_json::json;

use crate::args::OutboxCommand;
use crate::commands::{confirmed, in_batches};
use crate::store::{Backend, Store};
use crate::Ended;

/// Run `command` on the outbox `table` of the database behind `store`.
pub async fn run(store: &Store, table: &str, command: &OutboxCommand, json: bool) -> Result<Ended, StoreError> {
    match store.backend() {
        Backend::Sqlite(store) => on(store.pool(), table, command, json).await,
        Backend::Postgres(store) => on(store.pool(), table, command, json).await,
        Backend::MySql(store) => on(store.pool(), table, command, json).await,
        Backend::Redis(_) => Ok(Ended::Usage(
            "`idem outbox` needs the SQL database the outbox is in".to_owned(),
        )),
    }
}

async fn on<DB: OutboxDatabase>(
    pool: &sqlx::Pool<DB>,
    table: &str,
    command: &OutboxCommand,
    json: bool,
) -> Result<Ended, StoreError> {
    let outbox = match Outbox::<DB>::named(table) {
        Ok(outbox) => outbox,
        Err(error) => return Ok(Ended::Usage(error.to_string())),
    };
    let failed = |error: sqlx::Error| StoreError::with_source(format!("outbox table {table}"), error);
    match command {
        OutboxCommand::Counts => {
            let counts = outbox.counts(pool).await.map_err(failed)?;
            if json {
                let figures = json!({"pending": counts.pending, "retrying": counts.retrying, "sent": counts.sent, "dead": counts.dead});
                println!("{figures}");
            } else {
                println!(
                    "pending {} (retrying {}), sent {}, dead {}",
                    counts.pending, counts.retrying, counts.sent, counts.dead
                );
            }
        }
        OutboxCommand::Dead { limit } => {
            let rows = outbox.dead(pool, *limit).await.map_err(failed)?;
            if json {
                let rows: Vec<_> = rows
                    .iter()
                    .map(|row| {
                        json!({"id": row.id, "exchange": row.exchange, "routing_key": row.routing_key,
                               "attempts": row.attempts, "error": row.error})
                    })
                    .collect();
                println!("{}", serde_json::Value::from(rows));
            } else {
                let mut table = comfy_table::Table::new();
                table.load_preset(comfy_table::presets::NOTHING);
                table.set_header(["id", "exchange", "routing key", "attempts", "last error"]);
                for row in &rows {
                    let exchange = if row.exchange.is_empty() {
                        "(default)"
                    } else {
                        &row.exchange
                    };
                    table.add_row([
                        row.id.to_string(),
                        exchange.to_owned(),
                        row.routing_key.clone(),
                        row.attempts.to_string(),
                        row.error.clone(),
                    ]);
                }
                println!("{table}");
            }
        }
        OutboxCommand::RetryDead { id, confirm, .. } => {
            let what = id.map_or("every parked row".to_owned(), |id| format!("row {id}"));
            if !confirmed(confirm, &format!("give {what} of {table} back to the relay")) {
                return Ok(Ended::No("nothing done".to_owned()));
            }
            let revived = outbox.retry_dead(pool, *id).await.map_err(failed)?;
            if revived == 0 {
                return Ok(Ended::No(format!(
                    "no parked row{} in {table}",
                    id.map_or(String::new(), |id| format!(" {id}"))
                )));
            }
            if json {
                println!("{}", json!({ "revived": revived }));
            } else {
                println!("gave {revived} parked rows of {table} back to the relay");
            }
        }
        OutboxCommand::PurgeSent { older_than, batch } => {
            let purged = in_batches("sent rows", json, || async {
                outbox.purge_sent(pool, *older_than, *batch).await.map_err(failed)
            })
            .await?;
            if json {
                println!("{}", json!({ "purged": purged }));
            } else {
                println!("deleted {purged} sent rows of {table}");
            }
        }
    }
    Ok(Ended::Done)
}
