//! What idem adds to a call, with no database in the way: the executor, key handling,
//! serialization and the store's bookkeeping, on `MemoryStore` and through
//! `CachedStore`; and what sealing a 1 KiB answer adds (`SealedStore`). `cargo bench`; the per-backend table is `cargo run --release
//! -p idem-lab --bin bench`.

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

/// A recorder that keeps nothing, of non-zero size: idem cannot tell it from a real one,
/// so it builds every label key as it would for one. Before idem recognised the
/// `metrics` no-op recorder, every call paid this with no recorder installed.
struct Discarding(#[allow(dead_code)] u8);

impl metrics::Recorder for Discarding {
    fn describe_counter(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_gauge(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_histogram(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::noop()
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

/// What observing costs a call with feature `metrics` on: with no recorder (the label
/// keys are not built), and with a recorder that discards everything (they are).
fn metrics_cost(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("metrics");
    let discarding = Discarding(0);
    for (label, recorder) in [
        ("no recorder", None),
        ("a discarding recorder", Some(&discarding as &dyn metrics::Recorder)),
    ] {
        let first = Idempotent::new("bench").store(Arc::new(MemoryStore::new()));
        let next = AtomicU64::new(0);
        let replay = Idempotent::new("bench").store(Arc::new(MemoryStore::new()));
        runtime.block_on(replay.execute("hot", bare(1))).unwrap();
        let mut run = || {
            group.bench_function(format!("first execution, {label}"), |b| {
                b.to_async(&runtime).iter(|| {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    first.execute(format!("order-{n}"), bare(n))
                })
            });
            group.bench_function(format!("replay, {label}"), |b| {
                b.to_async(&runtime).iter(|| replay.execute("hot", bare(2)))
            });
        };
        match recorder {
            Some(recorder) => metrics::with_local_recorder(recorder, run),
            None => run(),
        }
    }
    group.finish();
}

/// A 1 KiB answer, whose body does nothing else.
async fn kibibyte(n: u64) -> Result<String, idem::Error> {
    Ok(format!("{n:>1024}"))
}

/// What sealing costs a call on `MemoryStore`: a 1 KiB answer sealed on its first
/// execution and opened on each replay, beside the same calls unsealed.
fn seal_cost(c: &mut Criterion) {
    use idem::seal::{SealKey, SealedStore, StaticKeyRing};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("seal, 1 KiB answer");
    let ring = StaticKeyRing::new(SealKey::new("k1", [7; 32]).unwrap(), []);
    let stores: [(&str, Arc<dyn idem::IdempotencyStore>); 2] = [
        ("MemoryStore", Arc::new(MemoryStore::new())),
        (
            "SealedStore over MemoryStore",
            Arc::new(SealedStore::new(Arc::new(MemoryStore::new()), ring)),
        ),
    ];
    for (label, store) in stores {
        let op = Idempotent::new("bench").store(store);
        let next = AtomicU64::new(0);
        group.bench_function(format!("first execution, {label}"), |b| {
            b.to_async(&runtime).iter(|| {
                let n = next.fetch_add(1, Ordering::Relaxed);
                op.execute(format!("order-{n}"), kibibyte(n))
            })
        });
        runtime.block_on(op.execute("hot", kibibyte(1))).unwrap();
        group.bench_function(format!("replay, {label}"), |b| {
            b.to_async(&runtime).iter(|| op.execute("hot", kibibyte(2)))
        });
    }
    group.finish();
}

criterion_group!(benches, overhead, metrics_cost, seal_cost);
criterion_main!(benches);
