//! What idem adds to a call, with no database in the way: the executor, key handling,
//! serialization and the store's bookkeeping, on `MemoryStore` and through
//! `CachedStore`; and what sealing a 1 KiB answer adds (`SealedStore`). `cargo bench`; the per-backend table is `cargo run --release
//! -p idem-lab --bin bench`.

// `criterion_group!` defines a public fn it cannot document.
#![allow(missing_docs)]

use std::sync::Arc;

use std::future::Future;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Bencher, Criterion};
use idem::{CachedStore, IdempotencyStore, Idempotent, MemoryStore};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use tokio::runtime::Runtime;

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

/// How many records a store holds at most while first executions are timed on it.
const STORE_RECORDS: u64 = 10_000;

/// Times first executions of `body` on stores `fresh` makes, a new one every
/// [`STORE_RECORDS`] calls: on one store that kept every key of criterion's millions of
/// iterations, the map's growth (a rehash of millions of records, pages first touched)
/// would be timed, not the call.
fn first_executions<T, Body, Answer>(
    b: &mut Bencher<'_>,
    runtime: &Runtime,
    fresh: impl Fn() -> Arc<dyn IdempotencyStore>,
    body: Body,
) where
    T: Serialize + DeserializeOwned + Send + 'static,
    Body: Fn(u64) -> Answer,
    Answer: Future<Output = Result<T, idem::Error>> + Send,
{
    b.to_async(runtime).iter_custom(|iters| {
        let (fresh, body) = (&fresh, &body);
        async move {
            let mut timed = Duration::ZERO;
            let mut done = 0;
            while done < iters {
                let op = Idempotent::new("bench").store(fresh());
                let calls = (iters - done).min(STORE_RECORDS);
                let started = Instant::now();
                for n in done..done + calls {
                    criterion::black_box(op.execute(format!("order-{n}"), body(n)).await.unwrap());
                }
                timed += started.elapsed();
                done += calls;
            }
            timed
        }
    });
}

fn overhead(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("per call");

    group.bench_function("bare fn", |b| b.to_async(&runtime).iter(|| bare(7)));

    group.bench_function("first execution, MemoryStore", |b| {
        first_executions(b, &runtime, || Arc::new(MemoryStore::new()), bare)
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
        let replay = Idempotent::new("bench").store(Arc::new(MemoryStore::new()));
        runtime.block_on(replay.execute("hot", bare(1))).unwrap();
        let mut run = || {
            group.bench_function(format!("first execution, {label}"), |b| {
                first_executions(b, &runtime, || Arc::new(MemoryStore::new()), bare)
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

/// Makes a fresh store.
type Fresh<'a> = dyn Fn() -> Arc<dyn IdempotencyStore> + 'a;

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
    let sealed =
        || -> Arc<dyn IdempotencyStore> { Arc::new(SealedStore::new(Arc::new(MemoryStore::new()), ring.clone())) };
    let stores: [(&str, &Fresh<'_>); 2] = [
        ("MemoryStore", &|| Arc::new(MemoryStore::new())),
        ("SealedStore over MemoryStore", &sealed),
    ];
    for (label, fresh) in stores {
        group.bench_function(format!("first execution, {label}"), |b| {
            first_executions(b, &runtime, fresh, kibibyte)
        });
        let op = Idempotent::new("bench").store(fresh());
        runtime.block_on(op.execute("hot", kibibyte(1))).unwrap();
        group.bench_function(format!("replay, {label}"), |b| {
            b.to_async(&runtime).iter(|| op.execute("hot", kibibyte(2)))
        });
    }
    group.finish();
}

criterion_group!(benches, overhead, metrics_cost, seal_cost);
criterion_main!(benches);
