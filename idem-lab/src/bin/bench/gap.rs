//! Where the time idem adds to its store's two calls goes: idem's first execution
//! against the store's `claim` and `complete` called by hand, and against the same two
//! calls with, between them, either the library's whole work on warm caches (a
//! first execution on a `MemoryStore`) or a spin of the same length that touches no
//! memory. One call of each in turn, on every backend with a server or a file.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::store::{now, Claim, ClaimOutcome, FenceCheck};
use idem::{Idempotent, MemoryStore};

use super::{alternate, bare, micros, run_id, Backend, Receipt, LEASE, TTL};

/// The length of the spin: about what a first execution on `MemoryStore` takes.
const SPIN: Duration = Duration::from_nanos(1_500);
const BIZ: &str = "gap";

/// What sits between the claim and the completion called by hand.
#[derive(Clone, Copy)]
enum Between {
    Nothing,
    MemoryCall,
    Spin,
}

/// The rows of every backend but memory.
pub async fn report(backends: &[Backend], calls: usize) {
    println!("\n| backend | what | p50 µs | p99 µs | − claim and complete by hand (p50) |");
    println!("|---|---|---|---|---|");
    for backend in backends.iter().filter(|backend| backend.name != "memory") {
        let run = run_id();
        let op = Idempotent::new(BIZ).store(backend.store.clone());
        let memory = Idempotent::new(BIZ).store(Arc::new(MemoryStore::new()));
        let (op, memory) = (&op, &memory);
        let measured = alternate(
            calls,
            |variant, i| {
                Box::pin(async move {
                    let key = format!("{run}-gap-{i}");
                    let between = [Between::Nothing, Between::MemoryCall, Between::Spin];
                    match variant {
                        0 => drop(black_box(op.execute(key, bare(i as u64)).await.unwrap())),
                        by_hand_with => by_hand(backend, &key, between[by_hand_with - 1], memory, i).await,
                    }
                })
            },
            4,
        )
        .await;
        let hand = &measured[1];
        for (what, row) in [
            ("the store's claim and complete, by hand", hand),
            ("idem first execution", &measured[0]),
            ("by hand, a first execution on MemoryStore between them", &measured[2]),
            ("by hand, a 1.5 µs spin between them", &measured[3]),
        ] {
            println!(
                "| {} | {what} | {} | {} | {:+.1} |",
                backend.name,
                micros(row.p50),
                micros(row.p99),
                (row.p50.as_secs_f64() - hand.p50.as_secs_f64()) * 1e6
            );
        }
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
        Between::Spin => {
            let started = Instant::now();
            while started.elapsed() < SPIN {
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
