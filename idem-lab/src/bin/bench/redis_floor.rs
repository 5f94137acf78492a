//! Redis: the hand-written floor (idem's two scripts, claim and complete, called by
//! hand on one connection), and the side-by-side figures against AWS Powertools
//! (`--powertools-side`: means, interleaved as `../shared/anchors/powertools_redis_bench.py`
//! measures them).

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::redis::aio::ConnectionManager;
use idem::{CachedStore, Idempotent, RedisStore};

use super::{bare, run_id};

/// The two scripts, by hand.
#[derive(Clone)]
pub struct RedisFloor {
    conn: ConnectionManager,
    store: RedisStore,
}

impl RedisFloor {
    pub async fn connect(url: &str, store: RedisStore) -> Self {
        let conn = idem::redis::Client::open(url)
            .unwrap()
            .get_connection_manager()
            .await
            .unwrap();
        RedisFloor { conn, store }
    }

    pub async fn claim_and_record(&self, key: &str) {
        let mut conn = self.conn.clone();
        let record = self.store.record_key("floor", key);
        let mut claim = RedisStore::claim_script().prepare_invoke();
        claim
            .key(&record)
            .arg(Duration::from_secs(30).as_micros().to_string())
            .arg(Duration::from_secs(86_400).as_micros().to_string())
            .arg("")
            .arg("")
            .arg(key)
            .arg("86400000000");
        let granted: Vec<String> = claim.invoke_async(&mut conn).await.unwrap();
        let mut complete = RedisStore::write_script().prepare_invoke();
        complete
            .key(&record)
            .arg("complete")
            .arg(&granted[1])
            .arg(&granted[2])
            .arg(r#"{"charge_id":1,"cents":19900}"#)
            .arg(Duration::from_secs(86_400).as_micros().to_string())
            .arg("86400000000")
            .arg(key);
        let applied: i64 = complete.invoke_async(&mut conn).await.unwrap();
        assert_eq!(applied, 1);
    }
}

/// Mean µs of idem on Redis — first execution, replay, replay through `CachedStore`,
/// and the floor — interleaved per key as the Powertools script does, one line.
pub async fn powertools_side(url: &str, calls: usize) {
    let store = RedisStore::connect(url).await.unwrap();
    let floor = RedisFloor::connect(url, store.clone()).await;
    let op = Idempotent::new("bench").store(Arc::new(store.clone()));
    let cached = Idempotent::new("bench.cached").store(Arc::new(CachedStore::new(Arc::new(store), 10_000)));
    let run = run_id();
    let (mut first, mut replay, mut cached_replay, mut floor_t) =
        (Duration::ZERO, Duration::ZERO, Duration::ZERO, Duration::ZERO);
    for i in 0..calls {
        let key = format!("{run}-{i}");
        let t = Instant::now();
        std::hint::black_box(op.execute(&key, bare(i as u64)).await.unwrap());
        first += t.elapsed();
        let t = Instant::now();
        std::hint::black_box(op.execute(&key, bare(i as u64)).await.unwrap());
        replay += t.elapsed();
        // The cache answers the duplicates of calls that went through it, as
        // Powertools's local cache does.
        std::hint::black_box(cached.execute(&key, bare(i as u64)).await.unwrap());
        let t = Instant::now();
        std::hint::black_box(cached.execute(&key, bare(i as u64)).await.unwrap());
        cached_replay += t.elapsed();
        let t = Instant::now();
        floor.claim_and_record(&key).await;
        floor_t += t.elapsed();
    }
    let us = |d: Duration| d.as_secs_f64() * 1e6 / calls as f64;
    println!(
        "idem_redis first_us={:.1} replay_us={:.1} cached_replay_us={:.1} floor_us={:.1} ratio_first={:.2}",
        us(first),
        us(replay),
        us(cached_replay),
        us(floor_t),
        first.as_secs_f64() / floor_t.as_secs_f64()
    );
}
