//! idem's metrics in Prometheus's text format: a mix of calls (first executions,
//! retries, a double click while the first still runs, a retry with another amount),
//! then what `/metrics` would serve.
//!
//! ```text
//! cargo run --example metrics
//! ```
//!
//! The exporter is `metrics-exporter-prometheus`; any `metrics` recorder works. The
//! docs/OPERATIONS.md has the duplicate-rate and hit-rate queries.

use std::sync::Arc;
use std::time::Duration;

use idem::{Error, Idempotent, MemoryStore};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("install the Prometheus recorder");
    let store = Arc::new(MemoryStore::new());
    let pay = Idempotent::new("pay").store(store.clone());
    for order in 0..20 {
        let cents: u32 = pay
            .clone()
            .payload(&order)
            .execute(order, async move { Ok::<_, Error>(order * 100) })
            .await
            .unwrap();
        if order % 4 == 0 {
            // The gateway retried: replayed.
            let again: u32 = pay
                .clone()
                .payload(&order)
                .execute(order, async { Ok::<_, Error>(0) })
                .await
                .unwrap();
            assert_eq!(again, cents);
        }
    }
    // A double click while the bank is slow, and a retry with another amount.
    let slow = pay.execute("slow", async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok::<_, Error>(1u32)
    });
    let click = async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        pay.execute("slow", async { Ok::<_, Error>(2u32) }).await
    };
    let (_, click) = tokio::join!(slow, click);
    assert!(matches!(click, Err(Error::InProgress { .. })));
    let other: Result<u32, Error> = pay.clone().payload(&1).execute(0, async { Ok(1) }).await;
    assert!(matches!(other, Err(Error::PayloadMismatch { .. })));

    print!("{}", prometheus.render());
}
