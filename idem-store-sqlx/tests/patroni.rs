//! idem on a PostgreSQL cluster as services run it: three nodes under Patroni (etcd its
//! consensus store, synchronous mode), reached through HAProxy's primary port
//! (`.ci/start-patroni`).
//!
//! Two storms go on at once through the primary port, on the same keys' shapes: one in
//! leased mode (`Idempotent::execute`), one in transactional mode (the claim, a business
//! row and the record in one transaction, `idem::sql::execute_in`). Mid-storm the
//! cluster changes leader: by a planned switchover, and by the leader's node crashing
//! (Patroni and PostgreSQL `SIGKILL`ed). Every caller retries an error, as a client does.
//!
//! What it shows: every call is answered; every `Ok` is recorded as `SUCCESS` on the
//! new leader with the answer the caller got; in leased mode every body finished once;
//! in transactional mode every key has one business row, and every answer is its row.
//! And a store pointed at HAProxy's replica port (a real hot standby) is refused at
//! once, before any body runs.

use idem_testkit::conformance;
use idem_testkit::harness;
#[path = "../../tests/support/ci.rs"]
mod ci;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use harness::failover::Storm;
use idem::sqlx::{self, PgPool};
use idem::{IdempotencyStore, Idempotent, PostgresStore};

/// Tasks and keys of each storm (leased and transactional alike).
const TASKS: usize = 8;
const KEYS: usize = 600;

/// The leased storm's lease: a completion that met the old leader is written again
/// until it lands, and the lease must outlast the time writes stop (see `storms_through`).
const LEASE: Duration = Duration::from_secs(60);

/// Only one test changes the cluster at a time; each starts on a healthy one.
static CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `.ci/start-patroni <command>`; what it printed.
async fn cluster(args: &[&str]) -> String {
    let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ci::ci_script("start-patroni", &args)
    })
    .await
    .unwrap()
    .trim()
    .to_owned()
}

/// HAProxy's primary port, and the cluster healthy behind it.
async fn primary() -> Option<String> {
    let url = conformance::server_url("IDEM_TEST_PATRONI_URL", "Patroni")?;
    cluster(&["wait-healthy"]).await;
    Some(url)
}

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// A storm in transactional mode: each call opens a transaction through the primary
/// port, claims its key, writes a business row `(key, token)` and commits; an error
/// anywhere (the claim, the body, the commit) is retried, as a client retries.
#[derive(Default)]
struct TransactionStorm {
    answers: Mutex<Vec<(usize, String)>>,
    errors: AtomicUsize,
    failures: Mutex<std::collections::BTreeMap<String, usize>>,
}

impl TransactionStorm {
    fn start(op: Arc<Idempotent>, pool: PgPool, table: &'static str) -> (Arc<Self>, Vec<tokio::task::JoinHandle<()>>) {
        let storm = Arc::new(TransactionStorm::default());
        let handles = (0..TASKS)
            .map(|task| {
                let (op, pool, storm) = (op.clone(), pool.clone(), storm.clone());
                tokio::spawn(async move {
                    for i in 0..KEYS {
                        let k = (i + task / 2 * KEYS / (TASKS / 2)) % KEYS;
                        storm.call(&op, &pool, table, k, format!("{task}.{k}")).await;
                    }
                })
            })
            .collect();
        (storm, handles)
    }

    async fn call(&self, op: &Idempotent, pool: &PgPool, table: &str, k: usize, token: String) {
        let since = Instant::now();
        loop {
            match Self::pay(op, pool, table, k, &token).await {
                Ok(answer) => {
                    self.answers.lock().unwrap().push((k, answer));
                    return;
                }
                Err(AppError::Idem(idem::Error::InProgress { .. })) => {}
                Err(error) => {
                    self.errors.fetch_add(1, Ordering::SeqCst);
                    let chain = match &error {
                        AppError::Idem(e) => idem::error_chain(e),
                        AppError::Db(e) => format!("{e:#}"),
                    };
                    *self.failures.lock().unwrap().entry(chain).or_default() += 1;
                    assert!(since.elapsed() < Duration::from_secs(60), "key {k}: {error}");
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn pay(op: &Idempotent, pool: &PgPool, table: &str, k: usize, token: &str) -> Result<String, AppError> {
        let mut tx = pool.begin().await?;
        let insert = format!("INSERT INTO {table} (order_key, token) VALUES ($1, $2)");
        let (key, token) = (format!("k{k}"), token.to_owned());
        let answer = idem::sql::execute_in(op, &mut tx, &key.clone(), |tx| {
            Box::pin(async move {
                sqlx::query(&insert).bind(key).bind(&token).execute(&mut **tx).await?;
                tokio::time::sleep(Duration::from_millis(2)).await;
                Ok::<_, AppError>(token)
            })
        })
        .await?;
        tx.commit().await?;
        Ok(answer)
    }

    /// Every call answered; one business row per key on the leader now; every answer
    /// that row's token; every record `SUCCESS` with it.
    async fn check(&self, pool: &PgPool, table: &str, biz: &str, store: &dyn IdempotencyStore) {
        let answers = self.answers.lock().unwrap().clone();
        assert_eq!(answers.len(), TASKS * KEYS, "every transactional call was answered");
        let rows: Vec<(String, String)> = sqlx::query_as(&format!("SELECT order_key, token FROM {table}"))
            .fetch_all(pool)
            .await
            .unwrap();
        let mut by_key: HashMap<String, Vec<String>> = HashMap::new();
        for (key, token) in rows {
            by_key.entry(key).or_default().push(token);
        }
        for k in 0..KEYS {
            let tokens = by_key.get(&format!("k{k}")).cloned().unwrap_or_default();
            assert_eq!(tokens.len(), 1, "key {k}: {} business rows: {tokens:?}", tokens.len());
        }
        for (k, answer) in &answers {
            assert_eq!(
                answer,
                &by_key[&format!("k{k}")][0],
                "key {k}: a caller got another answer than its row"
            );
        }
        for k in 0..KEYS {
            let record = store.get(biz, &format!("k{k}")).await.unwrap().expect("record kept");
            assert_eq!(record.status, idem::Status::Succeeded, "key {k}");
            assert_eq!(
                record.response_body,
                Some(format!("\"{}\"", by_key[&format!("k{k}")][0])),
                "key {k}"
            );
        }
    }
}

/// What calls failed with, each kind once with its count: the key a message names
/// (`` key `k42` ``) left out.
fn failures(list: Vec<(String, usize)>) -> String {
    let mut kinds = std::collections::BTreeMap::<String, usize>::new();
    for (error, n) in list {
        let kind = match error.split_once("key `k") {
            Some((head, tail)) => format!("{head}key `…`{}", tail.split_once('`').map_or("", |(_, rest)| rest)),
            None => error,
        };
        *kinds.entry(kind).or_default() += n;
    }
    kinds
        .into_iter()
        .map(|(kind, n)| format!("{n} x {kind}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// How long after `from` (the change of leader began) both storms gave an answer again,
/// counting only answers after the change was done: the time writes stopped.
async fn answered_again(leased: &Storm, transactional: &TransactionStorm, from: Instant) -> Duration {
    let (a, b) = (leased.answered(), transactional.answers.lock().unwrap().len());
    loop {
        if leased.answered() > a && transactional.answers.lock().unwrap().len() > b {
            return from.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Both storms through the primary port; `change` changes the leader mid-storm. Checks
/// both storms on the new leader; returns the old leader's name and the figures.
async fn storms_through(url: &str, name: &str, change: &str) -> (String, String) {
    // Pools that give up on a connection after 2 s: a caller's error is retried.
    let store = harness::postgres_store_across_restarts(url).await;
    let table = if name == "switchover" {
        "patroni_switchover_rows"
    } else {
        "patroni_crash_rows"
    };
    let pool = store.pool().clone();
    sqlx::raw_sql(&format!(
        "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (order_key TEXT NOT NULL, token TEXT NOT NULL)"
    ))
    .execute(&pool)
    .await
    .unwrap();
    let (leased_biz, tx_biz) = (format!("patroni.{name}.leased"), format!("patroni.{name}.tx"));
    sqlx::query("DELETE FROM idempotent_record WHERE biz_type IN ($1, $2)")
        .bind(&leased_biz)
        .bind(&tx_biz)
        .execute(&pool)
        .await
        .unwrap();
    let shared: Arc<dyn IdempotencyStore> = Arc::new(store.clone());
    let tx_op = Arc::new(Idempotent::new(tx_biz.clone()).store(shared));

    let old_leader = cluster(&["leader"]).await;
    let started = Instant::now();
    // Each leased task on a handle of its own: the callers of a key claim at the server.
    // The caller waits half a lease for a completion that met the old leader, a task of
    // its own keeps writing it after that; writes stop for up to `ttl` (10 s) and a bit.
    let (leased, leased_tasks) = Storm::start_apart(&store, TASKS, KEYS, |handle| {
        Idempotent::new(leased_biz.clone()).store(handle).lease(LEASE)
    });
    let (transactional, tx_tasks) = TransactionStorm::start(tx_op, pool.clone(), table);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = (leased.answered(), transactional.answers.lock().unwrap().len());
    let changed_at = started.elapsed();
    let changed = Instant::now();
    let said = cluster(&[change]).await;
    let change_took = changed.elapsed();
    let gap = answered_again(&leased, &transactional, changed).await;
    Storm::join(leased_tasks, Duration::from_secs(300)).await;
    Storm::join(tx_tasks, Duration::from_secs(300)).await;
    let elapsed = started.elapsed();
    let leader_now = cluster(&["leader"]).await;
    assert_ne!(leader_now, old_leader, "the leader changed");
    assert!(
        before.0 > 0 && before.0 < TASKS * KEYS && before.1 > 0 && before.1 < TASKS * KEYS,
        "the change came mid-storm ({before:?} answers before it)"
    );
    // Read through the primary port: the new leader.
    let in_recovery: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(!in_recovery, "the primary port reaches the new leader");
    leased.check(TASKS, KEYS, &leased_biz, &store).await;
    transactional.check(&pool, table, &tx_biz, &store).await;
    let tx_failures: Vec<(String, usize)> = transactional
        .failures
        .lock()
        .unwrap()
        .iter()
        .map(|(e, n)| (e.clone(), *n))
        .collect();
    let figures = format!(
        "patroni {name}: leader {old_leader} -> {leader_now} ({change}: {said}) at {changed_at:.1?} ({} leased and {} transactional answers before), \
         done in {change_took:.1?}; both storms answered again {gap:.1?} after it began; {} x {KEYS} leased + {} x {KEYS} transactional calls in {elapsed:.1?}; \
         errors retried: leased {} [{}], transactional {} [{}]; every answer SUCCESS on the new leader; \
         leased bodies once each; one business row per transactional key",
        before.0,
        before.1,
        TASKS,
        TASKS,
        leased.errors.load(Ordering::SeqCst),
        failures(leased.failures()),
        transactional.errors.load(Ordering::SeqCst),
        failures(tx_failures),
    );
    (old_leader, figures)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_planned_switchover_mid_storm_loses_no_answer_and_runs_nothing_twice() {
    let _cluster = CLUSTER.lock().await;
    let Some(url) = primary().await else { return };
    let (_, figures) = storms_through(&url, "switchover", "switchover").await;
    harness::say(&figures);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_leader_killed_mid_storm_loses_no_answer_and_runs_nothing_twice() {
    let _cluster = CLUSTER.lock().await;
    let Some(url) = primary().await else { return };
    let (killed, figures) = storms_through(&url, "crash", "kill-leader").await;
    harness::say(&figures);
    // The crashed node rejoins as a replica (rewound to the new leader's timeline).
    cluster(&["start-node", killed.trim_start_matches("node")]).await;
    cluster(&["wait-healthy"]).await;
}

/// HAProxy's replica port reaches a hot standby: a store given it refuses at `connect`,
/// and a store on an application's pool of it refuses at its first call, before any
/// body runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replica_port_is_refused_before_any_body_runs() {
    let _cluster = CLUSTER.lock().await;
    let Some(url) = conformance::server_url("IDEM_TEST_PATRONI_REPLICA_URL", "Patroni") else {
        return;
    };
    cluster(&["wait-healthy"]).await;
    let refused = PostgresStore::connect(&url).await.unwrap_err();
    let text = format!("{refused:#}");
    assert!(text.contains("reached a read-only server"), "{text}");
    assert!(text.contains("hot standby"), "{text}");

    let pool = sqlx::postgres::PgPoolOptions::new().connect_lazy(&url).unwrap();
    let in_recovery: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(in_recovery, "the replica port reaches a standby");
    let chain = harness::refused_before_the_body(Arc::new(PostgresStore::new(pool))).await;
    assert!(chain.contains("reached a read-only server"), "{chain}");
}
