//! Where the time idem adds to its store's two calls goes: idem's first execution
//! against the store's `claim` and `complete` called by hand, and against the same two
//! calls with, between them, either the library's whole work on warm caches (a
//! first execution on a `MemoryStore`) or a spin that touches no memory, of the same
//! length or of 20 µs. One call of each in turn, on every backend with a server or a
//! file. Then idem's own time between its claim's answer and its completion's request,
//! timed by a wrapper store.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use idem::store::{now, Claim, ClaimOutcome, FenceCheck, Lease, Record, StoreError};
use idem::{IdempotencyStore, Idempotent, MemoryStore};

use super::{alternate, bare, micros, percentiles, run_id, Backend, Receipt, LEASE, TTL};

/// The length of the short spin: about what a first execution on `MemoryStore` takes.
const SPIN: Duration = Duration::from_nanos(1_500);
/// The length of the long spin.
const LONG_SPIN: Duration = Duration::from_micros(20);
const BIZ: &str = "gap";

/// What sits between the claim and the completion called by hand.
#[derive(Clone, Copy)]
enum Between {
    Nothing,
    MemoryCall,
    Spin(Duration),
}

/// What sits between the two calls by hand, in the order of the variants 1 to 4.
const BY_HAND: [Between; 4] = [
    Between::Nothing,
    Between::MemoryCall,
    Between::Spin(SPIN),
    Between::Spin(LONG_SPIN),
];

/// The rows of every backend but memory.
pub async fn report(backends: &[Backend], calls: usize) {
    println!("\n| backend | what | p50 µs | p99 µs | − claim and complete by hand (p50) |");
    println!("|---|---|---|---|---|");
    for backend in backends.iter().filter(|backend| backend.name != "memory") {
        let run = run_id();
        let op = Idempotent::new(BIZ).store(backend.store.clone());
        let memory = Idempotent::new(BIZ).store(Arc::new(MemoryStore::new()));
        let between_timed = Arc::new(BetweenTimed::new(backend.store.clone()));
        let timed = Idempotent::new(BIZ).store(between_timed.clone());
        let (op, memory, timed, between_timed) = (&op, &memory, &timed, &between_timed);
        let measured = alternate(
            calls,
            |variant, i| {
                Box::pin(async move {
                    let key = format!("{run}-gap-{i}");
                    match variant {
                        0 => drop(black_box(op.execute(key, bare(i as u64)).await.unwrap())),
                        5 => {
                            // The warm-up's calls count down from the top of the range.
                            between_timed.counting(i < usize::MAX / 2);
                            let receipt: Receipt = timed.execute(key, bare(i as u64)).await.unwrap();
                            black_box(receipt);
                        }
                        by_hand_with => by_hand(backend, &key, BY_HAND[by_hand_with - 1], memory, i).await,
                    }
                })
            },
            6,
        )
        .await;
        let hand = &measured[1];
        for (what, row) in [
            ("the store's claim and complete, by hand", hand),
            ("idem first execution", &measured[0]),
            ("by hand, a first execution on MemoryStore between them", &measured[2]),
            ("by hand, a 1.5 µs spin between them", &measured[3]),
            ("by hand, a 20 µs spin between them", &measured[4]),
        ] {
            println!(
                "| {} | {what} | {} | {} | {:+.1} |",
                backend.name,
                micros(row.p50),
                micros(row.p99),
                (row.p50.as_secs_f64() - hand.p50.as_secs_f64()) * 1e6
            );
        }
        let between = between_timed.between();
        println!(
            "| {} | idem's own time between its claim's answer and its completion's request | {} | {} | |",
            backend.name,
            micros(between.p50),
            micros(between.p99)
        );
    }
}

/// The store's claim of `key`, the answer written as idem writes it, `between`, then
/// the store's completion: what idem's first execution sends, without the library.
async fn by_hand(backend: &Backend, key: &str, between: Between, memory: &Idempotent, i: usize) {
    let claim = Claim::new(BIZ, key, now(), LEASE, TTL);
    let ClaimOutcome::Acquired(lease) = backend.store.claim(&claim).await.unwrap() else {
        panic!("a new key was not granted");
    };
    let answer = serde_json::to_string(&bare(i as u64).await.unwrap()).unwrap();
    match between {
        Between::Nothing => {}
        Between::MemoryCall => {
            let receipt: Receipt = memory.execute(key, bare(i as u64)).await.unwrap();
            black_box(receipt);
        }
        Between::Spin(length) => {
            let started = Instant::now();
            while started.elapsed() < length {
                std::hint::spin_loop();
            }
        }
    }
    let written = backend.store.complete(&lease, &answer, now(), TTL).await.unwrap();
    assert_eq!(
        written,
        FenceCheck::Held,
        "the completion of a lease just granted was refused"
    );
}

/// A store that forwards to another and times what its caller does between a claim's
/// answer and the completion that follows: idem's own work between its two round trips,
/// on the caches they leave.
#[derive(Debug)]
struct BetweenTimed {
    inner: Arc<dyn IdempotencyStore>,
    answered: Mutex<Option<Instant>>,
    between: Mutex<Vec<Duration>>,
    counting: AtomicBool,
}

impl BetweenTimed {
    fn new(inner: Arc<dyn IdempotencyStore>) -> Self {
        Self {
            inner,
            answered: Mutex::new(None),
            between: Mutex::new(Vec::new()),
            counting: AtomicBool::new(false),
        }
    }

    /// Whether the calls from now on are counted (not the warm-up's).
    fn counting(&self, counting: bool) {
        self.counting.store(counting, Ordering::Relaxed);
    }

    /// The times counted.
    fn between(&self) -> super::Percentiles {
        percentiles(std::mem::take(&mut *self.between.lock().unwrap()))
    }
}

#[async_trait]
impl IdempotencyStore for BetweenTimed {
    async fn claim(&self, claim: &Claim<'_>) -> Result<ClaimOutcome, StoreError> {
        let claimed = self.inner.claim(claim).await;
        *self.answered.lock().unwrap() = Some(Instant::now());
        claimed
    }

    async fn renew(&self, lease: &Lease, now: SystemTime, lease_for: Duration) -> Result<FenceCheck, StoreError> {
        self.inner.renew(lease, now, lease_for).await
    }

    async fn complete(
        &self,
        lease: &Lease,
        response: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<FenceCheck, StoreError> {
        let answered = self.answered.lock().unwrap().take();
        if let Some(answered) = answered.filter(|_| self.counting.load(Ordering::Relaxed)) {
            self.between.lock().unwrap().push(answered.elapsed());
        }
        self.inner.complete(lease, response, now, ttl).await
    }

    async fn fail(
        &self,
        lease: &Lease,
        message: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<FenceCheck, StoreError> {
        self.inner.fail(lease, message, now, ttl).await
    }

    async fn release(&self, lease: &Lease) -> Result<FenceCheck, StoreError> {
        self.inner.release(lease).await
    }

    async fn get(&self, biz: &str, key: &str) -> Result<Option<Record>, StoreError> {
        self.inner.get(biz, key).await
    }

    async fn purge_expired(&self, now: SystemTime, limit: u64) -> Result<u64, StoreError> {
        self.inner.purge_expired(now, limit).await
    }
}
