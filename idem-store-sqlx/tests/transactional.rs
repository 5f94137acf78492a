//! Transactional mode (DESIGN §3b) on each database: the claim, the body's writes and
//! the record commit together or not at all; a duplicate waits on the open
//! transaction's lock, bounded by `wait`, and a claim that waited out leaves the
//! caller's transaction usable.

use idem_testkit::conformance;
use idem_testkit::harness;

/// The application's error: its database's, its own, idem's.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// idem's.
    #[error(transparent)]
    Idem(#[from] idem::Error),
    /// The database's.
    #[error(transparent)]
    Db(#[from] idem::sqlx::Error),
    /// The business's own.
    #[error("declined")]
    Declined,
}

/// The suite for one database: `$open` gives `Option<(Pool, Store)>`, `$insert` and
/// `$count` are the business statements in its placeholders.
///
/// `$repeatable_read` starts a transaction's REPEATABLE READ snapshot (`""`: the database
/// has no such level); `$replays_in_snapshot` says whether the database can answer a
/// duplicate from the latest commit inside an older snapshot (MySQL's locking reads do;
/// PostgreSQL refuses the write with a serialization failure, to be retried).
macro_rules! transactional_suite {
    ($backend:literal, $db:ty, $store:ty, $insert:literal, $count:literal, $record_count:literal, $lock_wait:literal,
     $repeatable_read:literal, $replays_in_snapshot:literal) => {
        use std::sync::Arc;
        use std::time::Duration;

        use idem::sqlx::{self, Pool, Transaction};
        use idem::{idempotent, Error, Status};

        use crate::conformance::calls::Runs;
        use crate::conformance::unique;
        use crate::AppError;

        #[idempotent(key = key, biz = "tx.pay", tx = tx, wait = "10s")]
        async fn pay(tx: &mut Transaction<'_, $db>, key: &str, cents: i64, runs: &Runs) -> Result<i64, AppError> {
            pay_body(tx, key, cents, runs).await
        }

        /// `pay` without `wait`: the claim waits as any statement of the connection.
        #[idempotent(key = key, biz = "tx.pay", tx = tx)]
        async fn pay_unbounded(
            tx: &mut Transaction<'_, $db>,
            key: &str,
            cents: i64,
            runs: &Runs,
        ) -> Result<i64, AppError> {
            pay_body(tx, key, cents, runs).await
        }

        async fn pay_body(tx: &mut Transaction<'_, $db>, key: &str, cents: i64, runs: &Runs) -> Result<i64, AppError> {
            runs.hit();
            sqlx::query($insert)
                .bind(key)
                .bind(cents)
                .execute(&mut **tx)
                .await?;
            Ok(cents)
        }

        #[idempotent(key = key, biz = "tx.pay", tx = tx, wait = "300ms")]
        async fn pay_briefly(tx: &mut Transaction<'_, $db>, key: &str, runs: &Runs) -> Result<i64, AppError> {
            runs.hit();
            Ok(0)
        }

        #[idempotent(key = key, biz = "tx.pay", tx = tx, mode = Reject, payload = cents)]
        async fn pay_once(tx: &mut Transaction<'_, $db>, key: &str, cents: i64) -> Result<i64, AppError> {
            sqlx::query($insert)
                .bind(key)
                .bind(cents)
                .execute(&mut **tx)
                .await?;
            Ok(cents)
        }

        #[idempotent(key = key, biz = "tx.fail", tx = tx)]
        async fn decline_released(tx: &mut Transaction<'_, $db>, key: &str) -> Result<i64, AppError> {
            Err(AppError::Declined)
        }

        /// The store on this backend, its table migrated once per process (`migrate`
        /// takes table locks, `CREATE INDEX IF NOT EXISTS`, that queue behind the open
        /// transactions of the tests beside it, and claims queued behind those would
        /// wait out their `wait`), and the business table.
        async fn open() -> Option<(Pool<$db>, $store)> {
            let url = crate::harness::backend_url($backend, "tx")?;
            let store = <$store>::connect(&url).await.unwrap();
            static MIGRATED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
            MIGRATED
                .get_or_init(|| async { store.migrate().await.unwrap() })
                .await;
            sqlx::query(
                "CREATE TABLE IF NOT EXISTS tx_charges (order_key VARCHAR(255) PRIMARY KEY, cents BIGINT NOT NULL)",
            )
            .execute(store.pool())
            .await
            .unwrap();
            Some((store.pool().clone(), store))
        }

        async fn charges(pool: &Pool<$db>, key: &str) -> i64 {
            sqlx::query_scalar($count)
                .bind(key)
                .fetch_one(pool)
                .await
                .unwrap()
        }

        async fn records_in(tx: &mut Transaction<'_, $db>, key: &str) -> i64 {
            sqlx::query_scalar($record_count)
                .bind(key)
                .fetch_one(&mut **tx)
                .await
                .unwrap()
        }

        /// The connection's own bound on lock waits, as text.
        async fn lock_wait_setting(conn: &mut <$db as sqlx::Database>::Connection) -> String {
            sqlx::query_scalar($lock_wait).fetch_one(conn).await.unwrap()
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn the_record_commits_with_the_business_write() {
            let Some((pool, store)) = open().await else { return };
            let (key, runs) = (unique("tx-commit"), Runs::default());
            // Read before the transaction begins: a SQLite transaction that reads before
            // its claim may be refused the write lock (see `transaction.rs`).
            let mut conn = pool.acquire().await.unwrap();
            let setting = lock_wait_setting(&mut conn).await;
            let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
            assert_eq!(pay(&mut tx, &key, 199, &runs).await.unwrap(), 199);
            assert_eq!(
                lock_wait_setting(&mut *tx).await,
                setting,
                "the wait bound is restored after the claim"
            );
            tx.commit().await.unwrap();
            assert_eq!(charges(&pool, &key).await, 1);
            let record = idem::IdempotencyStore::get(&store, "tx.pay", &key)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(record.status, Status::Succeeded);
            let mut tx = pool.begin().await.unwrap();
            assert_eq!(pay(&mut tx, &key, 500, &runs).await.unwrap(), 199, "replayed");
            tx.commit().await.unwrap();
            assert_eq!((runs.count(), charges(&pool, &key).await), (1, 1));
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_rollback_erases_both_and_the_retry_runs_cleanly() {
            let Some((pool, store)) = open().await else { return };
            let (key, runs) = (unique("tx-rollback"), Runs::default());
            let mut tx = pool.begin().await.unwrap();
            pay(&mut tx, &key, 199, &runs).await.unwrap();
            tx.rollback().await.unwrap();
            assert_eq!(charges(&pool, &key).await, 0);
            assert!(idem::IdempotencyStore::get(&store, "tx.pay", &key)
                .await
                .unwrap()
                .is_none());
            // A dropped transaction is a rollback too.
            let mut tx = pool.begin().await.unwrap();
            pay(&mut tx, &key, 199, &runs).await.unwrap();
            drop(tx);
            let mut tx = pool.begin().await.unwrap();
            pay(&mut tx, &key, 199, &runs).await.unwrap();
            tx.commit().await.unwrap();
            assert_eq!((runs.count(), charges(&pool, &key).await), (3, 1));
        }

        /// The first transaction commits (or rolls back) while a duplicate waits on it,
        /// up to its `wait` (`bounded`) or as any statement of its connection.
        async fn duplicate_meets_an_open_transaction(
            commit: bool,
            bounded: bool,
        ) -> Option<(Result<i64, AppError>, u32, i64)> {
            let (pool, _store) = open().await?;
            let key = unique("tx-wait");
            let runs = Arc::new(Runs::default());
            let mut first = pool.begin().await.unwrap();
            pay(&mut first, &key, 199, &runs).await.unwrap();
            let duplicate = {
                let (pool, key, runs) = (pool.clone(), key.clone(), runs.clone());
                tokio::spawn(async move {
                    let mut tx = pool.begin().await.unwrap();
                    let answer = if bounded {
                        pay(&mut tx, &key, 500, &runs).await
                    } else {
                        pay_unbounded(&mut tx, &key, 500, &runs).await
                    };
                    tx.commit().await.unwrap();
                    answer
                })
            };
            tokio::time::sleep(Duration::from_millis(400)).await;
            assert!(
                !duplicate.is_finished(),
                "the duplicate waits while the first transaction is open"
            );
            if commit {
                first.commit().await.unwrap();
            } else {
                first.rollback().await.unwrap();
            }
            let answer = duplicate.await.unwrap();
            Some((answer, runs.count(), charges(&pool, &key).await))
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_duplicate_waits_for_the_commit_then_replays() {
            let Some((answer, runs, rows)) = duplicate_meets_an_open_transaction(true, true).await else {
                return;
            };
            assert_eq!((answer.unwrap(), runs, rows), (199, 1, 1));
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn without_wait_a_duplicate_waits_as_any_statement_then_replays() {
            let Some((answer, runs, rows)) = duplicate_meets_an_open_transaction(true, false).await else {
                return;
            };
            assert_eq!((answer.unwrap(), runs, rows), (199, 1, 1));
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_duplicate_claims_after_a_rollback() {
            let Some((answer, runs, rows)) = duplicate_meets_an_open_transaction(false, true).await else {
                return;
            };
            assert_eq!((answer.unwrap(), runs, rows), (500, 2, 1));
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_wait_that_runs_out_is_in_progress_and_keeps_the_transaction() {
            let Some((pool, _store)) = open().await else {
                return;
            };
            let (key, runs) = (unique("tx-busy"), Runs::default());
            let mut first = pool.begin().await.unwrap();
            pay(&mut first, &key, 199, &runs).await.unwrap();
            let mut second = pool.begin().await.unwrap();
            let setting = lock_wait_setting(&mut *second).await;
            let error = pay_briefly(&mut second, &key, &runs).await.unwrap_err();
            assert!(
                matches!(error, AppError::Idem(Error::InProgress { .. })),
                "{error:?}"
            );
            assert_eq!(
                lock_wait_setting(&mut *second).await,
                setting,
                "the wait bound is restored after it ran out"
            );
            let none: i64 = sqlx::query_scalar($count)
                .bind("none")
                .fetch_one(&mut *second)
                .await
                .unwrap();
            assert_eq!(none, 0, "the waiting transaction is still usable");
            second.commit().await.unwrap();
            first.commit().await.unwrap();
            assert_eq!(runs.count(), 1);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn errors_are_released_inside_the_transaction() {
            let Some((pool, _store)) = open().await else {
                return;
            };
            let key = unique("tx-error");
            let mut tx = pool.begin().await.unwrap();
            assert!(matches!(
                decline_released(&mut tx, &key).await,
                Err(AppError::Declined)
            ));
            assert_eq!(records_in(&mut tx, &key).await, 0, "released in the transaction");
            tx.commit().await.unwrap();
        }

        /// `OnError::Record` would commit a FAIL only with the caller's commit, beside
        /// the failed body's writes: the builder refuses it before anything is written
        /// (the attribute refuses it at compile time, `tests/ui/fail/tx_on_error_record.rs`).
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn recording_failures_in_a_transaction_is_refused_before_anything_is_written() {
            let Some((pool, _store)) = open().await else {
                return;
            };
            let key = unique("tx-record");
            let op = idem::Idempotent::new("tx.fail").on_error(idem::OnError::Record);
            let mut tx = pool.begin().await.unwrap();
            let runs = Arc::new(Runs::default());
            let (ran, written) = (runs.clone(), key.clone());
            let refused = idem::sql::execute_in(&op, &mut tx, &key, move |tx| {
                Box::pin(async move {
                    ran.hit();
                    sqlx::query($insert)
                        .bind(written)
                        .bind(1i64)
                        .execute(&mut **tx)
                        .await?;
                    Err::<i64, AppError>(AppError::Declined)
                })
            })
            .await
            .unwrap_err();
            match refused {
                AppError::Idem(Error::InvalidOption { option, reason, .. }) => {
                    assert_eq!(option, "on_error");
                    assert!(reason.contains("Release"), "{reason}");
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(runs.count(), 0, "the body did not run");
            assert_eq!(records_in(&mut tx, &key).await, 0, "nothing was claimed");
            tx.commit().await.unwrap();
            assert_eq!(charges(&pool, &key).await, 0);
        }

        /// A duplicate whose transaction runs at REPEATABLE READ and read before its
        /// claim, while the first call committed in between: never a second body; the
        /// replay, or (PostgreSQL) an error that says to run the transaction again,
        /// whose retry replays.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_duplicate_in_an_older_snapshot_runs_nothing_twice() {
            if $repeatable_read.is_empty() {
                return;
            }
            let Some((pool, _store)) = open().await else {
                return;
            };
            let (key, runs) = (unique("tx-snapshot"), Runs::default());
            let mut second = pool.begin().await.unwrap();
            sqlx::query($repeatable_read).execute(&mut *second).await.unwrap();
            assert_eq!(charges_in(&mut second, &key).await, 0, "the snapshot is taken");
            let mut first = pool.begin().await.unwrap();
            assert_eq!(pay(&mut first, &key, 42, &runs).await.unwrap(), 42);
            first.commit().await.unwrap();
            match pay(&mut second, &key, 42, &runs).await {
                Ok(answer) => {
                    assert!($replays_in_snapshot, "replayed where the database cannot");
                    assert_eq!(answer, 42, "the first call's answer");
                    second.commit().await.unwrap();
                }
                Err(AppError::Idem(Error::Store { source, .. })) if !$replays_in_snapshot => {
                    let said = crate::conformance::chain(&source);
                    assert!(said.contains("run the transaction again"), "{said}");
                    second.rollback().await.unwrap();
                    let mut again = pool.begin().await.unwrap();
                    assert_eq!(
                        pay(&mut again, &key, 42, &runs).await.unwrap(),
                        42,
                        "the retry replays"
                    );
                    again.commit().await.unwrap();
                }
                Err(other) => panic!("{other:?}"),
            }
            assert_eq!(runs.count(), 1, "one body");
            assert_eq!(charges(&pool, &key).await, 1);
        }

        async fn charges_in(tx: &mut Transaction<'_, $db>, key: &str) -> i64 {
            sqlx::query_scalar($count)
                .bind(key)
                .fetch_one(&mut **tx)
                .await
                .unwrap()
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn reject_and_payload_mismatch_work_as_in_the_leased_mode() {
            let Some((pool, _store)) = open().await else {
                return;
            };
            let key = unique("tx-reject");
            let mut tx = pool.begin().await.unwrap();
            pay_once(&mut tx, &key, 7).await.unwrap();
            tx.commit().await.unwrap();
            let mut tx = pool.begin().await.unwrap();
            let duplicate = pay_once(&mut tx, &key, 7).await.unwrap_err();
            assert!(
                matches!(duplicate, AppError::Idem(Error::Duplicate { .. })),
                "{duplicate:?}"
            );
            let other = pay_once(&mut tx, &key, 8).await.unwrap_err();
            assert!(
                matches!(other, AppError::Idem(Error::PayloadMismatch { .. })),
                "{other:?}"
            );
            tx.commit().await.unwrap();
            assert_eq!(charges(&pool, &key).await, 1);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn the_builder_runs_in_a_spawned_task_on_the_store_table() {
            let Some((pool, store)) = open().await else { return };
            let key = unique("tx-builder");
            let op = idem::Idempotent::new("tx.builder").store(Arc::new(store.clone()));
            let handle = tokio::spawn({
                let (pool, key) = (pool.clone(), key.clone());
                async move {
                    let mut tx = pool.begin().await.unwrap();
                    let order = key.clone();
                    let cents = idem::sql::execute_in(&op, &mut tx, &key, |tx| {
                        Box::pin(async move {
                            sqlx::query($insert)
                                .bind(order)
                                .bind(42i64)
                                .execute(&mut **tx)
                                .await?;
                            Ok::<_, AppError>(42i64)
                        })
                    })
                    .await;
                    tx.commit().await.unwrap();
                    cents
                }
            });
            assert_eq!(handle.await.unwrap().unwrap(), 42);
            let record = idem::IdempotencyStore::get(&store, "tx.builder", &key)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(record.status, Status::Succeeded);
            assert_eq!(charges(&pool, &key).await, 1);
        }
    };
}

mod sqlite {
    transactional_suite!(
        "sqlite",
        idem::sqlx::Sqlite,
        idem::SqliteStore,
        "INSERT INTO tx_charges (order_key, cents) VALUES (?, ?)",
        "SELECT COUNT(*) FROM tx_charges WHERE order_key = ?",
        "SELECT COUNT(*) FROM idempotent_record WHERE idempotent_key = ?",
        "SELECT CAST(timeout AS TEXT) FROM pragma_busy_timeout",
        "",
        true
    );
}

mod postgres {
    transactional_suite!(
        "postgres",
        idem::sqlx::Postgres,
        idem::PostgresStore,
        "INSERT INTO tx_charges (order_key, cents) VALUES ($1, $2)",
        "SELECT COUNT(*) FROM tx_charges WHERE order_key = $1",
        "SELECT COUNT(*) FROM idempotent_record WHERE idempotent_key = $1",
        "SELECT current_setting('lock_timeout')",
        "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        false
    );
}

mod mysql {
    transactional_suite!(
        "mysql",
        idem::sqlx::MySql,
        idem::MySqlStore,
        "INSERT INTO tx_charges (order_key, cents) VALUES (?, ?)",
        "SELECT COUNT(*) FROM tx_charges WHERE order_key = ?",
        "SELECT COUNT(*) FROM idempotent_record WHERE idempotent_key = ?",
        "SELECT CAST(@@SESSION.innodb_lock_wait_timeout AS CHAR)",
        "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        true
    );
}
