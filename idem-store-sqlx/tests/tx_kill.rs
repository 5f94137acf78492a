//! Transactional mode under SIGKILL, as real OS processes, on every database: workers
//! pay hundreds of keys, each in its own transaction, and are killed at random moments
//! (before a claim, in a body after its business write, between the record's update
//! and the commit, after the commit). Then one worker retries every key to the end.
//! Each key has exactly one business row, every answer a worker reported equals that
//! row, and no record is left `PROCESSING`.

use idem_testkit::conformance;
use idem_testkit::harness;

use std::collections::HashMap;
use std::io::Read;
use std::time::Duration;

/// Keys per run, kills before the final worker.
const KEYS: usize = 300;
const KILLS: usize = 8;

/// `DONE key token` lines a worker printed.
fn answers(out: &str) -> Vec<(String, String)> {
    out.lines()
        .filter_map(|line| line.strip_prefix("DONE "))
        .filter_map(|rest| rest.split_once(' '))
        .map(|(key, token)| (key.to_owned(), token.to_owned()))
        .collect()
}

/// xorshift, for kill moments that differ per run.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

macro_rules! tx_kill_suite {
    ($backend:literal, $db:ty, $store:ty, $insert:literal, $rows:literal, $processing:literal) => {
        use idem::sqlx::{self, Transaction};
        use idem::idempotent;

        use super::*;
        use harness::AppError;

        #[idempotent(key = key, biz = "txkill", tx = tx, wait = "30s")]
        async fn pay(tx: &mut Transaction<'_, $db>, key: &str, token: &str) -> Result<String, AppError> {
            sqlx::query($insert).bind(key).bind(token).execute(&mut **tx).await?;
            // Widens the moment between the business write and the commit, where a kill
            // must take the row with it.
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok(token.to_owned())
        }

        /// A worker: pays every key of the run in its own transaction, reporting each.
        #[test]
        fn worker() {
            let Some(settings) = harness::worker_settings(concat!("txkill-", $backend)) else {
                return;
            };
            let (url, run) = (settings["TXKILL_URL"].clone(), settings["TXKILL_RUN"].clone());
            let token = format!("p{}", std::process::id());
            let runtime = tokio::runtime::Runtime::new().unwrap();
            runtime.block_on(async {
                let store = <$store>::connect(&url).await.unwrap();
                for i in 0..KEYS {
                    let key = format!("{run}-{i}");
                    let mut tx = store.pool().begin().await.unwrap();
                    let answer = pay(&mut tx, &key, &token).await.unwrap();
                    tx.commit().await.unwrap();
                    harness::report(&format!("DONE {key} {answer}"));
                }
            });
        }

        #[test]
        fn killed_workers_leave_one_row_per_key() {
            let Some(url) = harness::backend_url($backend, "txkill") else {
                return;
            };
            let run = conformance::unique("txkill");
            let runtime = tokio::runtime::Runtime::new().unwrap();
            let store = runtime.block_on(async {
                let store = <$store>::connect(&url).await.unwrap();
                store.migrate().await.unwrap();
                sqlx::query("CREATE TABLE IF NOT EXISTS tx_kill_rows (order_key VARCHAR(255) NOT NULL, token VARCHAR(64) NOT NULL)")
                    .execute(store.pool())
                    .await
                    .unwrap();
                store
            });
            let settings = [("TXKILL_URL", url.clone()), ("TXKILL_RUN", run.clone())];
            let mut seed = harness::epoch_millis() | 1;
            let mut reported = Vec::new();
            for _ in 0..KILLS {
                let mut child = harness::worker(concat!("txkill-", $backend), concat!($backend, "::worker"), &settings)
                    .spawn()
                    .unwrap();
                std::thread::sleep(Duration::from_millis(100 + next(&mut seed) % 600));
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                let mut out = String::new();
                child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
                reported.extend(answers(&out));
            }
            let last = harness::worker(concat!("txkill-", $backend), concat!($backend, "::worker"), &settings)
                .output()
                .unwrap();
            assert!(last.status.success(), "the last worker finished");
            let finals = answers(&String::from_utf8_lossy(&last.stdout));
            assert_eq!(finals.len(), KEYS, "the last worker answered every key");
            let killed_answers = reported.len();
            reported.extend(finals);

            runtime.block_on(async {
                let rows: Vec<(String, String)> = sqlx::query_as($rows)
                    .bind(format!("{run}-%"))
                    .fetch_all(store.pool())
                    .await
                    .unwrap();
                let mut by_key: HashMap<String, Vec<String>> = HashMap::new();
                for (key, token) in rows {
                    by_key.entry(key).or_default().push(token);
                }
                assert_eq!(by_key.len(), KEYS, "every key has its business row");
                for (key, tokens) in &by_key {
                    assert_eq!(tokens.len(), 1, "key {key} has one business row: {tokens:?}");
                }
                for (key, token) in &reported {
                    assert_eq!(&by_key[key][0], token, "the answer for {key} is its row");
                }
                let processing: i64 = sqlx::query_scalar($processing)
                    .bind(format!("{run}-%"))
                    .fetch_one(store.pool())
                    .await
                    .unwrap();
                assert_eq!(processing, 0, "no record is left PROCESSING");
            });
            harness::say(&format!(
                "tx kill on {}: {KILLS} workers SIGKILLed, {KEYS} keys, {killed_answers} answers before the kills; one row per key, 0 PROCESSING",
                $backend
            ));
        }
    };
}

mod sqlite {
    tx_kill_suite!(
        "sqlite",
        idem::sqlx::Sqlite,
        idem::SqliteStore,
        "INSERT INTO tx_kill_rows (order_key, token) VALUES (?, ?)",
        "SELECT order_key, token FROM tx_kill_rows WHERE order_key LIKE ?",
        "SELECT COUNT(*) FROM idempotent_record WHERE biz_type = 'txkill' AND idempotent_key LIKE ? AND status = 'PROCESSING'"
    );
}

mod postgres {
    tx_kill_suite!(
        "postgres",
        idem::sqlx::Postgres,
        idem::PostgresStore,
        "INSERT INTO tx_kill_rows (order_key, token) VALUES ($1, $2)",
        "SELECT order_key, token FROM tx_kill_rows WHERE order_key LIKE $1",
        "SELECT COUNT(*) FROM idempotent_record WHERE biz_type = 'txkill' AND idempotent_key LIKE $1 AND status = 'PROCESSING'"
    );
}

mod mysql {
    tx_kill_suite!(
        "mysql",
        idem::sqlx::MySql,
        idem::MySqlStore,
        "INSERT INTO tx_kill_rows (order_key, token) VALUES (?, ?)",
        "SELECT order_key, token FROM tx_kill_rows WHERE order_key LIKE ?",
        "SELECT COUNT(*) FROM idempotent_record WHERE biz_type = 'txkill' AND idempotent_key LIKE ? AND status = 'PROCESSING'"
    );
}
