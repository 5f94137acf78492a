//! What sealing costs a call on each backend: a 1 KiB answer sealed on its first
//! execution and opened on each replay, beside the same calls unsealed, one of each in
//! turn so drift in the machine or the server touches both alike.

use std::sync::Arc;

use idem::seal::{SealKey, SealedStore, StaticKeyRing};
use idem::Idempotent;

use super::{alternate, micros, run_id, Backend};

async fn kibibyte(n: u64) -> Result<String, idem::Error> {
    Ok(format!("{n:>1024}"))
}

/// The table: per backend, the first execution and the replay, unsealed and sealed.
pub async fn report(backends: &[Backend], calls: usize) {
    println!("\n| backend | 1 KiB answer | unsealed p50 µs | sealed p50 µs | sealed − unsealed µs | sealed ÷ unsealed (p50) |");
    println!("|---|---|---|---|---|---|");
    let ring = StaticKeyRing::new(SealKey::new("bench", [7; 32]).expect("a valid key id"), []);
    for backend in backends {
        let run = run_id();
        let plain = Idempotent::new("bench.seal").store(backend.store.clone());
        let sealed =
            Idempotent::new("bench.seal").store(Arc::new(SealedStore::new(backend.store.clone(), ring.clone())));
        let ops = [&plain, &sealed];
        let first = alternate(
            calls,
            |variant, i| {
                let (op, run) = (ops[variant], &run);
                Box::pin(async move {
                    let answer = op.execute(format!("{run}-{variant}-{i}"), kibibyte(i as u64)).await;
                    drop(std::hint::black_box(answer.unwrap()));
                })
            },
            2,
        )
        .await;
        for (variant, op) in ops.iter().enumerate() {
            op.execute(format!("{run}-hot-{variant}"), kibibyte(0)).await.unwrap();
        }
        let replay = alternate(
            calls,
            |variant, _| {
                let (op, run) = (ops[variant], &run);
                Box::pin(async move {
                    let answer = op.execute(format!("{run}-hot-{variant}"), kibibyte(1)).await;
                    drop(std::hint::black_box(answer.unwrap()));
                })
            },
            2,
        )
        .await;
        for (what, p) in [("first execution", &first), ("replay", &replay)] {
            let (unsealed, sealed) = (p[0].p50, p[1].p50);
            println!(
                "| {} | {what} | {} | {} | {:.1} | {:.2}× |",
                backend.name,
                micros(unsealed),
                micros(sealed),
                (sealed.as_secs_f64() - unsealed.as_secs_f64()) * 1e6,
                sealed.as_secs_f64() / unsealed.as_secs_f64()
            );
        }
    }
}
