//! Connection faults behind PgBouncer in transaction mode (`.ci/start-pgbouncer`), each
//! in the middle of a storm: the pooler killed and started again, its server
//! connections recycled every second (`server_lifetime`), the server connections ended
//! by `pg_terminate_backend`. Each call either gets its key's one answer or an error
//! that names its cause, and is retried; no body runs twice; nothing hangs past the
//! storm's bound. The faults take the whole pooler, so they run one at a time.

use idem_testkit::conformance;
use idem_testkit::harness;
#[path = "../../tests/support/ci.rs"]
mod ci;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use harness::failover::Storm;
use idem::sqlx;
use idem::{Idempotent, PostgresStore};

const TASKS: usize = 8;
const KEYS: usize = 1000;

/// One fault at a time: each takes the whole pooler.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What every failure a fault caused must say of its cause (beside the driver's words).
const NAMED_CAUSES: &[&str] = &[
    "the connection to the server (or to its pooler) was lost",
    "the pooler refused or ended the connection",
    "the server ended the connection",
    "no pooled connection within",
];

/// A storm through the pooler, `fault` run 1.5 s into it; the storm checked, its
/// figures said; how many calls failed (and were retried).
async fn storm_through(name: &str, fault: impl std::future::Future<Output = ()>) -> usize {
    let Some(url) = conformance::server_url("IDEM_TEST_PGBOUNCER_URL", "PgBouncer") else {
        return 0;
    };
    let _alone = ONE_AT_A_TIME.lock().await;
    let biz: &'static str = Box::leak(format!("fault.{name}").into_boxed_str());
    let table = format!("idem_fault_{name}");
    let store = PostgresStore::connect(&format!("{url}?pooler=transaction"))
        .await
        .unwrap()
        .with_table_name(&table)
        .unwrap();
    store.migrate().await.unwrap();
    sqlx::raw_sql(&format!("TRUNCATE {table}"))
        .execute(store.pool())
        .await
        .unwrap();
    let started = Instant::now();
    // Each task on a handle of its own: the callers of a key claim through the pooler.
    let (storm, tasks) = Storm::start_apart(&store, TASKS, KEYS, |handle| {
        Idempotent::new(biz).store(handle).lease(Duration::from_secs(10))
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = storm.answered();
    fault.await;
    Storm::join(tasks, Duration::from_secs(180)).await;
    let elapsed = started.elapsed();
    assert!(
        before > 0 && before < TASKS * KEYS,
        "the fault came mid-storm ({before} answers before it)"
    );
    storm.check(TASKS, KEYS, biz, &store).await;
    let failures = storm.failures();
    for (failure, _) in &failures {
        assert!(
            NAMED_CAUSES.iter().any(|cause| failure.contains(cause)),
            "a failure that does not name its cause: {failure}"
        );
    }
    let by_cause: Vec<String> = NAMED_CAUSES
        .iter()
        .map(|cause| {
            (
                cause,
                failures
                    .iter()
                    .filter(|(f, _)| f.contains(cause))
                    .map(|(_, n)| n)
                    .sum::<usize>(),
            )
        })
        .filter(|(_, n)| *n > 0)
        .map(|(cause, n)| format!("{n} x \"{cause}\""))
        .collect();
    harness::say(&format!(
        "PgBouncer fault `{name}`: {TASKS} tasks x {KEYS} keys in {elapsed:.1?} ({before} answers before the \
         fault); {} calls failed and were retried ({}); every body once, every answer recorded",
        storm.errors.load(Ordering::SeqCst),
        by_cause.join(", ")
    ));
    storm.errors.load(Ordering::SeqCst)
}

/// `.ci/start-pgbouncer command…`, off the runtime's threads.
async fn pooler(args: &'static [&'static str]) {
    tokio::task::spawn_blocking(move || ci::ci_script("start-pgbouncer", args))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_pooler_killed_and_restarted_mid_storm() {
    storm_through("restart", pooler(&["restart"])).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_connections_recycled_every_second_mid_storm() {
    let failed = storm_through("lifetime", async {
        pooler(&["lifetime", "1"]).await;
        tokio::time::sleep(Duration::from_secs(4)).await;
        pooler(&["lifetime", "3600"]).await;
    })
    .await;
    // The pooler closes a server connection past its lifetime only between
    // transactions: no client sees it.
    assert_eq!(failed, 0, "recycling server connections failed calls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_connections_ended_by_the_server_mid_storm() {
    let Some(direct) = conformance::server_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL") else {
        return;
    };
    storm_through("terminate", async move {
        let pool = sqlx::PgPool::connect(&direct).await.unwrap();
        // The first round comes mid-storm (the storm checks it); the later ones end what
        // the pooler opened again, if the storm is still running.
        for round in 0..3 {
            let ended: Vec<(bool,)> = sqlx::query_as(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = 'idem_pooled' AND pid <> pg_backend_pid()",
            )
            .fetch_all(&pool)
            .await
            .unwrap();
            assert!(
                round > 0 || !ended.is_empty(),
                "the pooler had no server connections to end mid-storm"
            );
            tokio::time::sleep(Duration::from_millis(700)).await;
        }
    })
    .await;
}
