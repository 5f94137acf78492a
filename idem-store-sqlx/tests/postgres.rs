//! The conformance suite on PostgreSQL (`IDEM_TEST_POSTGRES_URL`; `.ci/start-databases`
//! starts a throwaway server).

use idem_testkit::conformance;
use idem_testkit::{conformance_suite, database_suite, store_clock_suite};

use std::sync::Arc;
use std::time::Duration;

use conformance::calls::Store;
use idem::{LeaseClock, PostgresStore};

async fn open() -> Option<PostgresStore> {
    Some(open_on_store_clock().await?.with_lease_clock(LeaseClock::Caller))
}

/// The store as production runs it: leases judged by the server's clock.
async fn open_on_store_clock() -> Option<PostgresStore> {
    let url = conformance::server_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL")?;
    let store = PostgresStore::connect(&url).await.expect("connect to PostgreSQL");
    store.migrate().await.expect("migrate");
    Some(store)
}

async fn open_dyn() -> Option<Store> {
    Some(Arc::new(open().await?))
}

store_clock_suite!(async { Some(Arc::new(open_on_store_clock().await?) as Store) });

/// Edit a record by hand: `UPDATE idempotent_record SET {set}` on `key`.
async fn edit(set: &'static str, key: String) {
    let store = open().await.unwrap();
    let sql = format!("UPDATE idempotent_record SET {set} WHERE idempotent_key = $1");
    idem::sqlx::query(&sql).bind(key).execute(store.pool()).await.unwrap();
}

async fn corrupt(key: String) {
    edit("response_body = '[1, 2'", key).await;
}

fn unreachable() -> Store {
    let pool = idem::sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy("postgres://idem@127.0.0.1:1/idem")
        .unwrap();
    Arc::new(PostgresStore::new(pool))
}

conformance_suite!(open_dyn());
database_suite!();

#[tokio::test]
async fn timestamps_are_native_and_migrations_untouched() {
    let Some(store) = open().await else { return };
    store.migrate().await.expect("a second migrate changes nothing");
    let types: Vec<(String, String)> = idem::sqlx::query_as(
        "SELECT column_name::text, data_type::text FROM information_schema.columns \
         WHERE table_name = 'idempotent_record' AND (column_name LIKE '%_at' OR column_name = 'lease_until') \
         ORDER BY column_name",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert!(!types.is_empty());
    assert!(
        types.iter().all(|(_, ty)| ty == "timestamp with time zone"),
        "{types:?}"
    );
    let history: Option<String> = idem::sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations')::text")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(history, None, "the application's migration history is not touched");
}

/// A thousand callers waiting on one key share one reader of the record and one claim:
/// a pool that may open 50 connections opens a few, not one per waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_waiters_use_a_few_connections() {
    let Some(url) = conformance::server_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL") else {
        return;
    };
    let pool = idem::sqlx::postgres::PgPoolOptions::new()
        .max_connections(50)
        .connect(&url)
        .await
        .expect("connect to PostgreSQL");
    let store = PostgresStore::new(pool);
    store.migrate().await.expect("migrate");
    let op = Arc::new(
        idem::Idempotent::new("waiters-connections")
            .store(Arc::new(store.clone()))
            .wait(Duration::from_secs(30)),
    );
    let key = format!("k-{}", std::process::id());
    let bodies = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let calls: Vec<_> = (0..1000)
        .map(|i| {
            let (op, key, bodies) = (op.clone(), key.clone(), bodies.clone());
            tokio::spawn(async move {
                op.execute(key, async move {
                    bodies.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Ok::<_, idem::Error>(format!("answer of caller {i}"))
                })
                .await
            })
        })
        .collect();
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap().expect("every waiter is answered"));
    }
    assert_eq!(bodies.load(std::sync::atomic::Ordering::SeqCst), 1, "one body ran");
    assert!(
        answers.iter().all(|answer| *answer == answers[0]),
        "every caller got the first answer"
    );
    // The holder's claim and completion, a duplicate's claim or two, the reader: a few.
    // Without the gate or the shared reader, the pool grows toward its 50.
    let opened = store.pool().size();
    assert!(
        opened <= 8,
        "the pool opened {opened} connections for a thousand waiters of one key"
    );
}

/// Short calls stormed on two handles of one store (each handle's waiters share a
/// reader, so every key has two): most readers find the record finished while their
/// watch is still on its way and drop it. A dropped watch leaves no connection behind:
/// every call of a pool of 4 is answered (without the guard, the pool runs dry and
/// calls fail with `PoolTimedOut` after 2 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_dropped_on_their_way_leave_the_pool_whole() {
    let Some(url) = conformance::server_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL") else {
        return;
    };
    let pool = idem::sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(2))
        .connect(&url)
        .await
        .expect("connect to PostgreSQL");
    let store = PostgresStore::new(pool);
    store.migrate().await.expect("migrate");
    let biz = conformance::unique("dropped-watches");
    let handles = [store.clone(), store.clone()].map(|handle| {
        Arc::new(
            idem::Idempotent::new(biz.clone())
                .store(Arc::new(handle))
                .wait(Duration::from_secs(30)),
        )
    });
    for round in 0..3 {
        let mut calls = tokio::task::JoinSet::new();
        for caller in 0..6 {
            for key in 0..24 {
                let op = handles[(caller + key) % 2].clone();
                calls.spawn(async move {
                    op.execute(format!("r{round}-k{key}"), async move {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        Ok::<_, idem::Error>(key)
                    })
                    .await
                });
            }
        }
        while let Some(answer) = calls.join_next().await {
            answer
                .unwrap()
                .unwrap_or_else(|e| panic!("a call failed: {}", idem::error_chain(&e)));
        }
    }
}

/// A waiter whose store is another pool (as another process's would be) is told by the
/// server when the holder's record finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_elsewhere_is_told_when_the_record_finishes() {
    let Some(holding) = open_on_store_clock().await else {
        return;
    };
    let waiting = open_on_store_clock().await.unwrap();
    conformance::notices::a_waiter_elsewhere_is_told(Arc::new(holding), Arc::new(waiting)).await;
}

/// The waiter's listener loses its connection and cannot connect again while the
/// holder finishes: its store connects as a role of its own, which is refused logins
/// and its listener's backend terminated, then let in again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_that_lost_its_connection_costs_a_read_not_an_answer() {
    let Some(url) = conformance::server_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL") else {
        return;
    };
    let holding = open_on_store_clock().await.unwrap();
    let admin = holding.pool().clone();
    let run = |sql: &'static str| {
        let admin = admin.clone();
        async move {
            idem::sqlx::query(sql).execute(&admin).await.unwrap();
        }
    };
    // Made once per server; an earlier run may have left it refused.
    idem::sqlx::query("CREATE ROLE idem_watcher SUPERUSER")
        .execute(&admin)
        .await
        .ok();
    run("ALTER ROLE idem_watcher LOGIN").await;
    let watcher_url = url.replacen("postgres://postgres@", "postgres://idem_watcher@", 1);
    assert_ne!(watcher_url, url, "the test's URL names the user `postgres`: {url}");
    let waiting = PostgresStore::connect(&watcher_url)
        .await
        .expect("connect as idem_watcher");
    let cut = || async {
        run("ALTER ROLE idem_watcher NOLOGIN").await;
        let killed = idem::sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE usename = 'idem_watcher' AND application_name = 'idem listener') AS killed",
        )
        .fetch_one(&admin)
        .await
        .unwrap();
        assert_eq!(killed, 1, "one listener of the waiter's store");
    };
    let mend = || run("ALTER ROLE idem_watcher LOGIN");
    conformance::notices::a_lost_notice_costs_a_read(Arc::new(holding), Arc::new(waiting), cut, mend).await;
}

idem_testkit::sql_round_trip_test!(
    PostgresStore,
    idem::sqlx::postgres::PgConnectOptions,
    idem::sqlx::postgres::PgPoolOptions,
    "IDEM_TEST_POSTGRES_URL",
    "PostgreSQL",
    "SELECT * FROM idempotent_record WHERE biz_type = $1 AND idempotent_key = $2"
);

/// A replay's claim statement reads what it met, judged as a read's would be.
#[tokio::test]
async fn the_insert_that_reads_judges_what_it_read() {
    let Some(store) = open_on_store_clock().await else {
        return;
    };
    conformance::round_trips::the_insert_that_reads_judges_what_it_read(
        Arc::new(store),
        true,
        |key| edit("lease_until = statement_timestamp() - INTERVAL '1 minute'", key),
        |key| edit("expires_at = statement_timestamp() - INTERVAL '1 minute'", key),
    )
    .await;
}

/// The table has no check on `status` (PostgreSQL would build it again for every write):
/// a status written by hand is refused by the store's read instead. The call fails
/// naming the record, the body does not run again, and the row stays as it was.
#[tokio::test]
async fn a_status_written_by_hand_fails_its_calls_and_runs_nothing() {
    let Some(postgres) = open().await else { return };
    let store: Store = Arc::new(postgres.clone());
    // A table an older version made still has the check.
    idem::sqlx::query("ALTER TABLE idempotent_record DROP CONSTRAINT IF EXISTS idempotent_record_status_check")
        .execute(postgres.pool())
        .await
        .unwrap();
    let key = conformance::unique("status");
    let runs = conformance::calls::Runs::default();
    conformance::calls::pay(&store, &key, &runs, Duration::ZERO)
        .await
        .unwrap();
    edit("status = 'DONE'", key.clone()).await;
    let error = conformance::calls::pay(&store, &key, &runs, Duration::ZERO)
        .await
        .expect_err("an unknown status is not replayed nor run");
    assert!(error.to_string().contains(&key), "{error}");
    assert!(
        format!("{error:?}").contains("DONE"),
        "the cause names the status: {error:?}"
    );
    assert_eq!(runs.count(), 1, "the body ran once");
    let status: String =
        idem::sqlx::query_scalar("SELECT status::text FROM idempotent_record WHERE idempotent_key = $1")
            .bind(&key)
            .fetch_one(postgres.pool())
            .await
            .unwrap();
    assert_eq!(status, "DONE", "the row stays");
}
