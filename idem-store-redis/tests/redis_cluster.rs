//! The conformance suite on a Redis Cluster of 3 primaries and 3 replicas
//! (`IDEM_TEST_REDIS_CLUSTER_URLS`, comma-separated; `.ci/start-databases` starts
//! one): every record one key on one slot, every script on that key's primary.

use idem_testkit::conformance;
use idem_testkit::harness;
use idem_testkit::{conformance_suite, shared_store_suite};

use std::sync::Arc;

use conformance::calls::Store;
use idem::RedisStore;

async fn open() -> Option<RedisStore> {
    let urls = conformance::server_url("IDEM_TEST_REDIS_CLUSTER_URLS", "Redis Cluster")?;
    let urls: Vec<&str> = urls.split(',').collect();
    Some(
        RedisStore::connect_cluster(&urls)
            .await
            .expect("connect to the Redis Cluster")
            // The suites move time by the instants they pass: the store judges by them.
            .with_lease_clock(idem::LeaseClock::Caller),
    )
}

async fn open_dyn() -> Option<Store> {
    Some(Arc::new(open().await?))
}

conformance_suite!(open_dyn());

shared_store_suite!();

/// A storm of duplicate calls across the cluster while one replica takes over its
/// primary (`CLUSTER FAILOVER`, the coordinated kind: the replica catches up before it
/// switches). Every key must run once; what the callers saw is written down.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storm_through_a_failover_runs_every_key_once() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use idem::redis;
    use idem::Idempotent;

    let Some(store) = open().await else { return };
    let urls = std::env::var("IDEM_TEST_REDIS_CLUSTER_URLS").unwrap();
    let effects = harness::Effects::open("redis://effects").await;
    let run = conformance::unique("failover");
    let keys = 300;
    let errors = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..12)
        .map(|task| {
            // Each task on a handle of its own, as separate processes hold them: the
            // callers of a key claim at the cluster, not one at a time through this
            // process's claim gate.
            let op = Idempotent::new("cluster.storm")
                .store(Arc::new(store.clone()))
                .wait(Duration::from_secs(20));
            let (effects, run, errors) = (effects.clone(), run.clone(), errors.clone());
            tokio::spawn(async move {
                for k in 0..keys {
                    let key = format!("{run}-{k}");
                    let (effects, run, token) = (effects.clone(), run.clone(), format!("{task}.{k}"));
                    let outcome: Result<String, harness::AppError> = op
                        .execute(&key, {
                            let key = key.clone();
                            async move {
                                effects.record(&run, &key, &token).await?;
                                tokio::time::sleep(Duration::from_millis(2)).await;
                                Ok(token)
                            }
                        })
                        .await;
                    if outcome.is_err() {
                        errors.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();

    // A replica takes over its primary while the storm runs.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let any = urls.split(',').next().unwrap();
    let mut conn = redis::Client::open(any)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let nodes: String = redis::cmd("CLUSTER").arg("NODES").query_async(&mut conn).await.unwrap();
    let replica = nodes
        .lines()
        .find(|line| {
            line.split_whitespace()
                .nth(2)
                .is_some_and(|flags| flags.contains("slave"))
        })
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|address| address.split('@').next())
        .expect("a replica")
        .to_owned();
    let mut replica_conn = redis::Client::open(format!("redis://{replica}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .query_async(&mut replica_conn)
        .await
        .unwrap();
    let mut promoted = false;
    for _ in 0..100 {
        let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut replica_conn).await.unwrap();
        if matches!(role.first(), Some(redis::Value::BulkString(bytes)) if bytes.as_slice() == b"master") {
            promoted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(promoted, "the replica {replica} was not promoted");

    for task in tasks {
        task.await.unwrap();
    }
    let rows = effects.tokens(&run).await;
    let doubled: Vec<_> = rows.iter().filter(|(_, tokens)| tokens.len() > 1).collect();
    assert_eq!(rows.len(), keys, "every key ran");
    assert!(doubled.is_empty(), "keys run twice across the failover: {doubled:?}");
    harness::say(&format!(
        "redis cluster failover: {replica} promoted mid-storm; 12 tasks x {keys} keys in {:.1?}; \
         every key run once; {} calls answered with an error during the switch",
        started.elapsed(),
        errors.load(Ordering::SeqCst)
    ));
}

/// A store on the application's own cluster connection (built with its own timeouts):
/// the eviction check runs on every primary, and a call runs once and replays.
#[tokio::test]
async fn a_user_built_cluster_connection_is_a_store() {
    use idem::{redis, Error, Idempotent};

    let Some(urls) = conformance::server_url("IDEM_TEST_REDIS_CLUSTER_URLS", "Redis Cluster") else {
        return;
    };
    let client = redis::cluster::ClusterClientBuilder::new(urls.split(',').collect::<Vec<_>>())
        .response_timeout(std::time::Duration::from_secs(2))
        .build()
        .unwrap();
    let conn = client.get_async_connection().await.unwrap();
    let store = RedisStore::from_cluster(conn).await.unwrap();
    let op = Idempotent::new("cluster.user").store(Arc::new(store));
    let key = conformance::unique("k");
    let runs = std::sync::atomic::AtomicU32::new(0);
    let pay = || async {
        runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok::<_, Error>(7u64)
    };
    assert_eq!(op.execute(&key, pay()).await.unwrap(), 7);
    assert_eq!(op.execute(&key, pay()).await.unwrap(), 7);
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A waiter on another store is told when the holder's record finishes: the holder's
/// write publishes on the record's node, the waiter's subscriber hears it on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_elsewhere_is_told_when_the_record_finishes() {
    let Some(holding) = open().await else {
        return;
    };
    let waiting = open().await.unwrap();
    conformance::notices::a_waiter_elsewhere_is_told(Arc::new(holding), Arc::new(waiting)).await;
}
