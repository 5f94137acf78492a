//! What idem adds to a call, with no database in the way: the executor, key handling,
//! serialization and the store's bookkeeping, on `MemoryStore` and through
//! `CachedStore`. `cargo bench`; the per-backend table is `cargo run --release
//! --example bench`.

// `criterion_group!` defines a public fn it cannot document.
#![allow(missing_docs)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use idem::{CachedStore, Idempotent, MemoryStore};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Receipt {
    charge_id: u64,
    cents: u64,
}

async fn bare(n: u64) -> Result<Receipt, idem::Error> {
    Ok(Receipt {
        charge_id: n,
        cents: 19_900,
    })
}

fn overhead(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("per call");

    group.bench_function("bare fn", |b| b.to_async(&runtime).iter(|| bare(7)));

    let first = Idempotent::new("bench").store(Arc::new(MemoryStore::new()));
    let next = AtomicU64::new(0);
    group.bench_function("first execution, MemoryStore", |b| {
        b.to_async(&runtime).iter(|| {
            let n = next.fetch_add(1, Ordering::Relaxed);
            first.execute(format!("order-{n}"), bare(n))
        })
    });

    let replay = Idempotent::new("bench").store(Arc::new(MemoryStore::new()));
    runtime.block_on(replay.execute("hot", bare(1))).unwrap();
    group.bench_function("replay, MemoryStore", |b| {
        b.to_async(&runtime).iter(|| replay.execute("hot", bare(2)))
    });

    let cached = Idempotent::new("bench").store(Arc::new(CachedStore::new(MemoryStore::new(), 1_000)));
    runtime.block_on(cached.execute("hot", bare(1))).unwrap();
    runtime.block_on(cached.execute("hot", bare(1))).unwrap();
    group.bench_function("replay, CachedStore", |b| {
        b.to_async(&runtime).iter(|| cached.execute("hot", bare(2)))
    });
    group.finish();
}

criterion_group!(benches, overhead);
criterion_main!(benches);
