//! The conformance suite on a Redis Cluster of 3 primaries and 3 replicas
//! (`IDEM_TEST_REDIS_CLUSTER_URLS`, comma-separated; `.ci/start-databases` starts
//! one): every record one key on one slot, every script on that key's primary.

mod conformance;

use std::sync::Arc;

use conformance::calls::Store;
use idem::RedisStore;

async fn open() -> Option<RedisStore> {
    let urls = conformance::server_url("IDEM_TEST_REDIS_CLUSTER_URLS", "Redis Cluster")?;
    let urls: Vec<&str> = urls.split(',').collect();
    Some(
        RedisStore::connect_cluster(&urls)
            .await
            .expect("connect to the Redis Cluster"),
    )
}

async fn open_dyn() -> Option<Store> {
    Some(Arc::new(open().await?))
}

conformance_suite!(open_dyn());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_see_one_record() {
    if let (Some(a), Some(b)) = (open_dyn().await, open_dyn().await) {
        conformance::database::two_stores_see_one_record(&a, &b).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_race_has_one_winner() {
    if let (Some(a), Some(b)) = (open_dyn().await, open_dyn().await) {
        conformance::database::takeover_race_has_one_winner(&a, &b).await;
    }
}
