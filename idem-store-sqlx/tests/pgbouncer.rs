//! The PostgreSQL store through a real PgBouncer (`.ci/start-pgbouncer`: Debian's 1.18,
//! four server connections per database, far fewer than the clients, each transaction
//! given the one idle longest).
//!
//! In transaction mode (`?pooler=transaction`) the conformance suite, a storm beside a
//! neighbour client of the same pooler, and a transactional call; in session mode the
//! suite with the store's defaults. The faults (the pooler restarted, server connections
//! recycled or ended) are `pgbouncer_faults.rs`.

use idem_testkit::conformance;
use idem_testkit::harness;
use idem_testkit::{conformance_suite, store_clock_suite};

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance::calls::Store;
use harness::failover::Storm;
use idem::sqlx::{self, Connection};
use idem::{IdempotencyStore, Idempotent, LeaseClock, PostgresStore};

/// The pooler in transaction mode, said in the URL.
fn pooled_url() -> Option<String> {
    let url = conformance::server_url("IDEM_TEST_PGBOUNCER_URL", "PgBouncer")?;
    Some(format!("{url}?pooler=transaction"))
}

/// The store through the pooler in transaction mode on its own table, migrated.
async fn pooled(table: &str) -> Option<PostgresStore> {
    let store = PostgresStore::connect(&pooled_url()?)
        .await
        .expect("connect through PgBouncer")
        .with_table_name(table)
        .unwrap();
    store.migrate().await.expect("migrate through PgBouncer");
    Some(store)
}

/// [`pooled`] on a table emptied first, for a storm that counts every run.
async fn pooled_afresh(table: &str) -> Option<PostgresStore> {
    let store = pooled(table).await?;
    sqlx::raw_sql(&format!("TRUNCATE {table}"))
        .execute(store.pool())
        .await
        .unwrap();
    Some(store)
}

async fn pooled_dyn() -> Option<Store> {
    Some(Arc::new(
        pooled("idem_pooled_suite").await?.with_lease_clock(LeaseClock::Caller),
    ))
}

mod transaction_mode {
    use super::*;
    conformance_suite!(pooled_dyn());
    store_clock_suite!(async { Some(Arc::new(pooled("idem_pooled_clock").await?) as Store) });
}

mod session_mode {
    use super::*;

    /// The store's defaults (prepared statements kept) through the pooler in session mode.
    async fn session() -> Option<Store> {
        let url = conformance::server_url("IDEM_TEST_PGBOUNCER_SESSION_URL", "PgBouncer")?;
        let store = PostgresStore::connect(&url)
            .await
            .expect("connect through PgBouncer")
            .with_table_name("idem_session_suite")
            .unwrap()
            .with_lease_clock(LeaseClock::Caller);
        store.migrate().await.expect("migrate");
        Some(Arc::new(store))
    }

    conformance_suite!(session());
}

/// A connection of its own to the pooler at `url`, keeping no statement.
async fn client_of_the_pooler(url: &str) -> sqlx::PgConnection {
    sqlx::PgConnection::connect_with(
        &url.parse::<sqlx::postgres::PgConnectOptions>()
            .unwrap()
            .statement_cache_capacity(0)
            .extra_float_digits(None),
    )
    .await
    .unwrap()
}

/// A neighbour of the store on the same pooler: in one transaction it prepares the
/// names sqlx gives its statements (`sqlx_s_1`, …) and drops them. A name a store left
/// on a server connection makes its `PREPARE` fail ("already exists"), as another
/// client's prepared statements would. Runs until `stop`; the failures it met.
async fn neighbour(url: String, stop: Arc<AtomicBool>) -> Vec<String> {
    let mut conn = client_of_the_pooler(&url).await;
    let names: Vec<String> = (1..=40).map(|n| format!("sqlx_s_{n}")).collect();
    let prepare: String = names.iter().map(|n| format!("PREPARE {n} AS SELECT 1; ")).collect();
    let script = format!("BEGIN; {prepare}DEALLOCATE ALL; COMMIT");
    let mut failures = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        // One message, the simple protocol: one server connection for all of it.
        if let Err(error) = sqlx::Executor::execute(&mut conn, script.as_str()).await {
            failures.push(error.to_string());
            let _ = sqlx::Executor::execute(&mut conn, "ROLLBACK").await;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    failures
}

const TASKS: usize = 16;
const KEYS: usize = 300;

/// A storm of 16 tasks on 300 keys (each key called by every task) through the pooler:
/// every call answered with its key's one run, every record `SUCCESS`, and a neighbour
/// client of the pooler never meets a statement the store left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storm_through_the_pooler_runs_each_key_once_and_leaves_nothing_on_the_servers() {
    let Some(store) = pooled_afresh("idem_pooled_storm").await else {
        return;
    };
    let stop = Arc::new(AtomicBool::new(false));
    let beside = tokio::spawn(neighbour(
        conformance::server_url("IDEM_TEST_PGBOUNCER_URL", "PgBouncer").unwrap(),
        stop.clone(),
    ));
    let started = Instant::now();
    // Each task on a handle of its own: the callers of a key claim through the pooler.
    let (storm, tasks) = Storm::start_apart(&store, TASKS, KEYS, |handle| {
        Idempotent::new("pooled").store(handle).lease(Duration::from_secs(10))
    });
    Storm::join(tasks, Duration::from_secs(300)).await;
    let elapsed = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let failures = beside.await.unwrap();
    storm.check(TASKS, KEYS, "pooled", &store).await;
    assert_eq!(
        storm.errors.load(Ordering::SeqCst),
        0,
        "no call failed: {:?}",
        storm.failures()
    );
    assert!(
        failures.is_empty(),
        "the neighbour met {} failures, first: {:?}",
        failures.len(),
        failures.first()
    );
    harness::say(&format!(
        "PgBouncer transaction mode: {TASKS} tasks x {KEYS} keys in {elapsed:.1?} on 4 server connections; \
         every body once, every answer recorded; the neighbour client met no statement left behind"
    ));
}

/// A pooler that hands each transaction the server connection idle longest
/// (`server_round_robin`, two of them here): a statement the driver sends in two
/// exchanges outside a transaction (its parse, then its bind and execute) would meet
/// the other server connection for its second, which never saw the first. One task,
/// every operation of a call in turn — each runs its statements in a transaction of
/// its own, on one server connection, and succeeds.
#[tokio::test]
async fn every_statement_stays_on_one_server_connection_when_the_pooler_rotates_them() {
    let Some(url) = conformance::server_url("IDEM_TEST_PGBOUNCER_ROTATING_URL", "PgBouncer") else {
        return;
    };
    let store = PostgresStore::connect(&format!("{url}?pooler=transaction"))
        .await
        .expect("connect through PgBouncer")
        .with_table_name("idem_rotating")
        .unwrap();
    store.migrate().await.expect("migrate through PgBouncer");
    sqlx::raw_sql("TRUNCATE idem_rotating")
        .execute(store.pool())
        .await
        .unwrap();
    // Both server connections open and idle: two transactions held at once.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut conn = client_of_the_pooler(&url).await;
        sqlx::Executor::execute(&mut conn, "BEGIN; SELECT 1").await.unwrap();
        held.push(conn);
    }
    for mut conn in held {
        sqlx::Executor::execute(&mut conn, "COMMIT").await.unwrap();
    }
    let runs = Arc::new(AtomicUsize::new(0));
    let op = Idempotent::new("rotating").store(Arc::new(store.clone()));
    for n in 0..20 {
        let key = format!("rotating-{n}");
        for _ in 0..2 {
            let runs = runs.clone();
            let answer: u64 = op
                .execute(key.clone(), async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, idem::Error>(n)
                })
                .await
                .unwrap_or_else(|e| panic!("call {n} through the rotating pooler: {e}"));
            assert_eq!(answer, n);
        }
        let record = store.get("rotating", &key).await.unwrap().expect("recorded");
        assert_eq!(record.status, idem::store::Status::Succeeded);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 20, "each key's body ran once");
}

/// Without `?pooler=transaction` behind a transaction-mode pooler the store's named
/// statements meet other clients' (the failure the pooler mode exists for), and the
/// error says what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prepared_statements_behind_a_transaction_pooler_fail_with_the_fix_named() {
    // Server connections of their own: the statements it leaves there reach no other test.
    let Some(url) = conformance::server_url("IDEM_TEST_PGBOUNCER_MISUSED_URL", "PgBouncer") else {
        return;
    };
    let store = PostgresStore::connect(&url)
        .await
        .unwrap()
        .with_table_name("idem_unpooled")
        .unwrap();
    // Even the migration may meet it (its statements run on several connections). A
    // statement of another shape under the same name can make the driver panic on the
    // row it did not expect: that counts as the misuse showing, not as the test failing.
    // (The migration runs on a thread of its own, where such a panic stays.)
    let failed = Arc::new(AtomicUsize::new(0));
    let migrating = url.clone();
    let migrated = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let store = PostgresStore::connect(&migrating)
                .await
                .unwrap()
                .with_table_name("idem_unpooled")
                .unwrap();
            store.migrate().await.err().map(|e| idem::error_chain(&e))
        })
    })
    .join();
    let named = migrated.unwrap_or_else(|_| {
        failed.fetch_add(1, Ordering::SeqCst);
        None
    });
    let shared: Arc<dyn idem::IdempotencyStore> = Arc::new(store);
    let op = Arc::new(Idempotent::new("unpooled").store(shared));
    let named = Arc::new(std::sync::Mutex::new(named));
    let tasks: Vec<_> = (0..16)
        .map(|task| {
            let (op, failed, named) = (op.clone(), failed.clone(), named.clone());
            tokio::spawn(async move {
                for i in 0..40 {
                    let outcome: Result<u32, idem::Error> = op.execute(&format!("{task}.{i}"), async { Ok(1) }).await;
                    if let Err(error) = outcome {
                        failed.fetch_add(1, Ordering::SeqCst);
                        let text = idem::error_chain(&error);
                        if text.contains("pooler=transaction") {
                            *named.lock().unwrap() = Some(text);
                        }
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        if let Err(panicked) = task.await {
            assert!(panicked.is_panic(), "a task was not cancelled");
            failed.fetch_add(1, Ordering::SeqCst);
        }
    }
    assert!(
        failed.load(Ordering::SeqCst) > 0,
        "named statements break behind the pooler"
    );
    let named = named.lock().unwrap().clone();
    assert!(named.is_some(), "an error names the fix");
    harness::say(&format!(
        "PgBouncer transaction mode without `pooler=transaction`: {} of 640 calls failed; e.g. {}",
        failed.load(Ordering::SeqCst),
        named.unwrap()
    ));
}

/// A transactional call through the pooler: the claim, the business write and the
/// record commit together (the business's own statements unnamed, as every statement
/// behind such a pooler must be), and a duplicate replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transactional_call_through_the_pooler_commits_with_the_record() {
    let Some(store) = pooled("idem_pooled_tx").await else {
        return;
    };
    let pool = store.pool().clone();
    sqlx::raw_sql("CREATE TABLE IF NOT EXISTS pooled_charges (order_key TEXT PRIMARY KEY, cents BIGINT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let shared: Arc<dyn idem::IdempotencyStore> = Arc::new(store.clone());
    let op = Idempotent::new("pooled.tx").store(shared);
    let key = conformance::unique("order");
    let runs = Arc::new(AtomicUsize::new(0));
    for _ in 0..3 {
        let mut tx = pool.begin().await.unwrap();
        let runs = runs.clone();
        let key_for_body = key.clone();
        let cents: i64 = idem::sql::execute_in(&op, &mut tx, &key, move |tx| {
            Box::pin(async move {
                runs.fetch_add(1, Ordering::SeqCst);
                sqlx::query("INSERT INTO pooled_charges (order_key, cents) VALUES ($1, 250)")
                    .persistent(false)
                    .bind(&key_for_body)
                    .execute(&mut **tx)
                    .await?;
                Ok::<_, AppError>(250)
            })
        })
        .await
        .unwrap();
        tx.commit().await.unwrap();
        assert_eq!(cents, 250);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
    // Read inside a transaction too: outside one the pooler may parse an unnamed
    // statement on one server connection and run it on another.
    let mut tx = pool.begin().await.unwrap();
    let (charges,): (i64,) = sqlx::query_as("SELECT count(*) FROM pooled_charges WHERE order_key = $1")
        .persistent(false)
        .bind(&key)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(charges, 1);
    let record = idem::IdempotencyStore::get(&store, "pooled.tx", &key)
        .await
        .unwrap()
        .expect("the record committed");
    assert_eq!(record.status, idem::Status::Succeeded);
}

/// The application's error: idem's, or its database's.
#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// A store pointed at a read-only server is refused when it connects, with an error
/// that says so; so is a store on an application's pool at its first call, before any
/// body runs. (A session-level read-only default stands for the standby here; the
/// cluster suite points a store at a real standby.)
#[tokio::test]
async fn a_read_only_server_is_refused_before_any_body_runs() {
    // (PgBouncer passes no `options` to the server: straight to it.)
    let Some(url) = conformance::server_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL") else {
        return;
    };
    let read_only = format!("{url}?options=-c%20default_transaction_read_only%3Don");
    let refused = PostgresStore::connect(&read_only).await.unwrap_err();
    let text = format!("{refused:#}");
    assert!(text.contains("reached a read-only server"), "{text}");
    assert!(text.contains("primary"), "{text}");

    let pool = sqlx::postgres::PgPoolOptions::new().connect_lazy(&read_only).unwrap();
    let store = PostgresStore::new(pool).with_table_name("idem_ro").unwrap();
    let chain = harness::refused_before_the_body(Arc::new(store)).await;
    assert!(chain.contains("reached a read-only server"), "{chain}");
}

/// A store behind the pooler on the table `table`, migrated, whose pool holds one
/// connection: every operation after a cancelled one runs on that connection.
async fn on_one_connection(table: &str) -> Option<PostgresStore> {
    let (pooler, url) = idem::sql::Pooler::from_url(&pooled_url()?).unwrap();
    let options: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options.extra_float_digits(None))
        .await
        .unwrap();
    let store = PostgresStore::new(pool)
        .with_pooler(pooler)
        .with_table_name(table)
        .unwrap();
    store.migrate().await.unwrap();
    Some(store)
}

/// Fails round `round` when the store's one connection is inside a transaction (as a
/// cancelled `BEGIN` handed back to the pool leaves it) or the next read on it fails.
async fn assert_outside_any_transaction(store: &PostgresStore, round: u64, key: &str) {
    assert!(
        !harness::lends_inside_a_transaction(store.pool()).await,
        "round {round}: the pooled connection was left inside a transaction"
    );
    store
        .get("pooled.cancelled", key)
        .await
        .unwrap_or_else(|e| panic!("round {round}: the operation after a cancelled one failed: {e:#}"));
}

/// Operations dropped at every point of their round trips (a waiter that gave up, a
/// heartbeat outrun by the body's end) leave no connection of the store's pool inside a
/// transaction: the next operation on that one connection works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_cancelled_mid_round_trip_leave_the_connection_usable() {
    let Some(store) = on_one_connection("idem_pooled_cancelled").await else {
        return;
    };
    let op = Idempotent::new("pooled.cancelled").store(Arc::new(store.clone()));
    // Each call and read is dropped at one of the points it waits at, in turn, or not at
    // all: before, during or after the BEGIN, a statement or the COMMIT.
    let (mut calls, mut reads) = (harness::Cuts::default(), harness::Cuts::default());
    for round in 0..400u64 {
        let key = format!("k{}", round % 20);
        calls
            .next(op.execute(&key, async move { Ok::<_, idem::Error>(round) }))
            .await;
        reads.next(store.get("pooled.cancelled", &key)).await;
        assert_outside_any_transaction(&store, round, &key).await;
    }
    let cancelled = calls.cut() + reads.cut();
    println!(
        "a call waits at most {} times, a read {}; {cancelled} of 800 calls and reads were cut",
        calls.points(),
        reads.points()
    );
    assert!(
        cancelled > 100,
        "the operations were cancelled mid-way ({cancelled} times)"
    );
}

/// A migration under a timeout (a start-up that gave up), dropped at every point of its
/// round trips, leaves no connection of the store's pool inside a transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_cancelled_mid_round_trip_leave_the_connection_usable() {
    let Some(store) = on_one_connection("idem_pooled_migrated").await else {
        return;
    };
    // Run again, its statements change nothing; each is cut at one of the points a
    // whole one waits at, in turn, or not at all.
    let mut cuts = harness::Cuts::default();
    for round in 0..400u64 {
        cuts.next(store.migrate()).await;
        assert_outside_any_transaction(&store, round, "k").await;
    }
    let cancelled = cuts.cut();
    println!(
        "a migration waits at most {} times; {cancelled} of 400 were cut",
        cuts.points()
    );
    assert!(
        cancelled > 100,
        "the migrations were cancelled mid-way ({cancelled} times)"
    );
}

/// A page's rewrites (a `rekey` under a timeout) dropped at every point of their round
/// trips leave no connection of the store's pool inside a transaction, and each page
/// either lands whole or not at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewrites_cancelled_mid_round_trip_leave_the_connection_usable() {
    use idem::pages::{RecordPages, Rewrite};
    let Some(store) = on_one_connection("idem_pooled_rewritten").await else {
        return;
    };
    let op = Idempotent::new("pooled.cancelled").store(Arc::new(store.clone()));
    const KEYS: [&str; 2] = ["rewritten-a", "rewritten-b"];
    for key in KEYS {
        op.execute(key, async { Ok::<_, idem::Error>(0u64) }).await.unwrap();
    }
    // The page that gives both records the answer `n`.
    let store = &store;
    let page = |n: u64| async move {
        let mut page = Vec::new();
        for key in KEYS {
            let read = store.get("pooled.cancelled", key).await.unwrap().unwrap();
            let mut with = read.clone();
            with.response_body = Some(n.to_string());
            page.push(Rewrite { read, with });
        }
        page
    };
    // The answers the page's records hold now.
    let answers = || async {
        let mut answers = Vec::new();
        for key in KEYS {
            let record = store.get("pooled.cancelled", key).await.unwrap().unwrap();
            answers.push(record.response_body);
        }
        answers
    };
    let mut cuts = harness::Cuts::default();
    for round in 1..=400u64 {
        let page = page(round).await;
        let before: Vec<_> = page.iter().map(|rewrite| rewrite.read.response_body.clone()).collect();
        // Cut at one of the points a whole page waits at, in turn, or not at all:
        // before, during or after the BEGIN, a statement or the COMMIT.
        cuts.next(store.replace_values(&page)).await;
        assert_outside_any_transaction(store, round, KEYS[0]).await;
        let after = answers().await;
        assert!(
            after == before || after == [Some(round.to_string()), Some(round.to_string())],
            "round {round}: the page landed in part: {before:?} became {after:?}"
        );
    }
    let cancelled = cuts.cut();
    println!(
        "a page waits at most {} times; {cancelled} of 400 were cut",
        cuts.points()
    );
    assert!(
        cancelled > 100,
        "the rewrites were cancelled mid-way ({cancelled} times)"
    );
}
