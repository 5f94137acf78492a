//! What the consumer and the relay count, as [`ConsumerStats`](crate::ConsumerStats)
//! and [`RelayStats`](crate::RelayStats) say it, exported — feature `metrics` — through
//! the [`metrics`](https://docs.rs/metrics) facade, beside idem's own call metrics.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `idem_amqp_deliveries_total` | counter | `queue`, `outcome`: `acked`, `requeued`, `failed` (dead-lettered or dropped by the [`OnFailure`](crate::OnFailure) policy) |
//! | `idem_amqp_redeliveries_total` | counter | `queue`: deliveries the broker flagged as delivered before |
//! | `idem_amqp_relay_rows_total` | counter | `outbox`, `outcome`: `published`, `sent` (confirmed and marked), `returned`, `refused`, `retried_later`, `parked`, `purged` |
//! | `idem_amqp_sessions_lost_total` | counter | `role` (`consumer`, `relay`), `name` (the queue, the outbox table) |
//!
//! Never labelled by key or message id: they are unbounded.

/// `n` rows of `outbox` came to `outcome`.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) fn relay_rows(outbox: &str, outcome: &'static str, n: u64) {
    #[cfg(feature = "metrics")]
    if n > 0 {
        metrics::counter!("idem_amqp_relay_rows_total", "outbox" => outbox.to_owned(), "outcome" => outcome)
            .increment(n);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (outbox, outcome, n);
}

/// A delivery from `queue` was settled as `outcome`.
pub(crate) fn delivery(queue: &str, outcome: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_amqp_deliveries_total", "queue" => queue.to_owned(), "outcome" => outcome).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (queue, outcome);
}

/// A delivery from `queue` came flagged as redelivered.
pub(crate) fn redelivery(queue: &str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_amqp_redeliveries_total", "queue" => queue.to_owned()).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = queue;
}

/// A broker session of the `role` (`consumer`, `relay`) of `name` ended.
pub(crate) fn session_lost(role: &'static str, name: &str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_amqp_sessions_lost_total", "role" => role, "name" => name.to_owned()).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (role, name);
}
