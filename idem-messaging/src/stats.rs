//! What a consumer did: its counters, and the snapshot an operator reads.

use std::sync::atomic::{AtomicU64, Ordering};

/// A consumer's counters, shared by its clones.
#[derive(Debug, Default)]
pub struct Counters {
    /// Deliveries received.
    pub deliveries: AtomicU64,
    /// Of those, deliveries the broker flagged as redelivered.
    pub redelivered: AtomicU64,
    /// Deliveries acked after their outcome was recorded.
    pub acked: AtomicU64,
    /// Deliveries handed back to be delivered again after the pause.
    pub requeued: AtomicU64,
    /// Deliveries that failed for good.
    pub failed: AtomicU64,
    /// Sessions that ended and were started again.
    pub sessions_lost: AtomicU64,
}

impl Counters {
    /// What the counters hold now.
    pub fn snapshot(&self) -> ConsumerStats {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ConsumerStats {
            deliveries: read(&self.deliveries),
            redelivered: read(&self.redelivered),
            acked: read(&self.acked),
            requeued: read(&self.requeued),
            failed: read(&self.failed),
            sessions_lost: read(&self.sessions_lost),
        }
    }
}

/// What a consumer did since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerStats {
    /// Deliveries received.
    pub deliveries: u64,
    /// Of those, deliveries the broker flagged as redelivered.
    pub redelivered: u64,
    /// Deliveries acked after their outcome was recorded.
    pub acked: u64,
    /// Deliveries handed back to be delivered again after the pause (not settled: in
    /// progress elsewhere, a store error, the body's own error).
    pub requeued: u64,
    /// Deliveries that failed for good (by the failure policy: dead-lettered,
    /// terminated or dropped).
    pub failed: u64,
    /// Sessions that ended (the broker went away) and were started again.
    pub sessions_lost: u64,
}
