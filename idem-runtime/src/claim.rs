//! Claiming a key: the request, its outcome, and the rule that decides between them.
//!
//! The rule lives here, in plain Rust, so that every store implements the same thing:
//! [`MemoryStore`](crate::MemoryStore) applies it under a lock, the SQL stores encode it
//! in the `WHERE` of one upsert statement, and the model tests compare both to it.

use std::time::{Duration, SystemTime};

use crate::record::{Record, Status};
use crate::retention::Retention;

/// A request to claim `(biz, key)` for one execution.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Claim<'a> {
    /// Business namespace.
    pub biz: &'a str,
    /// Idempotency key (already validated).
    pub key: &'a str,
    /// Payload fingerprint, when the call declared a payload.
    pub fingerprint: Option<&'a str>,
    /// Optional copy of the request, stored for reconciliation.
    pub request_body: Option<&'a str>,
    /// The instant of the claim, by the caller's clock. Stores on one host
    /// ([`MemoryStore`](crate::MemoryStore), SQLite) compare leases and expiry against
    /// it; stores with a clock of their own (a database server) use theirs and take
    /// only the lengths below from the claim.
    pub now: SystemTime,
    /// How long the granted lease lasts before a retry may take it over.
    pub lease: Duration,
    /// How long the record answers duplicates; a claim is kept at least this long.
    pub ttl: Duration,
    /// When `now` was read, on tokio's clock, when the runtime read it: a store that
    /// judges by a steady clock of its own counts from it instead of reading the clock.
    pub(crate) read: Option<tokio::time::Instant>,
}

impl<'a> Claim<'a> {
    /// A claim of `(biz, key)` at `now` for `lease`, kept for `ttl`.
    pub fn new(biz: &'a str, key: &'a str, now: SystemTime, lease: Duration, ttl: Duration) -> Self {
        Self {
            biz,
            key,
            fingerprint: None,
            request_body: None,
            now,
            lease,
            ttl,
            read: None,
        }
    }

    /// The same claim carrying a payload fingerprint.
    pub fn with_fingerprint(mut self, fingerprint: Option<&'a str>) -> Self {
        self.fingerprint = fingerprint;
        self
    }

    /// The same claim, its `now` read at `read` on tokio's clock.
    pub(crate) fn read_at(mut self, read: tokio::time::Instant) -> Self {
        self.read = Some(read);
        self
    }

    /// The same claim carrying a copy of the request.
    pub fn with_request_body(mut self, request_body: Option<&'a str>) -> Self {
        self.request_body = request_body;
        self
    }

    /// End of the lease this claim would be granted.
    pub fn lease_until(&self) -> SystemTime {
        self.now + self.lease
    }

    /// The fence of a record this claim creates: the claim's instant in microseconds
    /// since the epoch. A key purged and claimed again so starts above every fence of
    /// its earlier lives (each takeover adds one, and lives are far more than that many
    /// microseconds apart), so the fence a downstream service is handed never goes back.
    pub fn first_fence(&self) -> u64 {
        let micros = self
            .now
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros();
        u64::try_from(micros).unwrap_or(u64::MAX).max(1)
    }

    /// Expiry of a record claimed now: `ttl` from now, and never before the lease ends.
    pub fn expires_at(&self) -> SystemTime {
        self.now + self.ttl.max(self.lease)
    }

    /// The claim rule: may this claim take `existing`?
    ///
    /// Yes when the record expired, or when it is `Processing` with a lapsed lease and
    /// the payloads do not contradict each other (a takeover). Never for a finished
    /// record that has not expired, nor for a `Processing` record without a lease.
    pub fn admits(&self, existing: &Record) -> bool {
        if existing.is_expired(self.now) {
            return true;
        }
        existing.lease_lapsed(self.now) && fingerprints_agree(existing.fingerprint.as_deref(), self.fingerprint)
    }

    /// Whether a copy of `record` (a cache's, a pre-check store's) may answer this claim
    /// as the store itself would: succeeded, not expired at the claim's instant, and of
    /// a payload that agrees.
    ///
    /// A `FAIL` record is never answered from a copy: an operator may delete it in the
    /// store that decides (`idem retry-failed`) so that the next call runs again, and a
    /// copy would go on answering `PreviousFailed` until it expired. A copy that is a
    /// tombstone, or past its replay, answers as the store would: the caller's answer
    /// to a finished record checks that first.
    pub fn answered_by(&self, record: &Record) -> bool {
        record.status == Status::Succeeded
            && !record.is_expired(self.now)
            && fingerprints_agree(record.fingerprint.as_deref(), self.fingerprint)
    }

    /// The record a granted claim leaves behind. A fresh record starts at
    /// [`first_fence`](Self::first_fence); a re-claim after expiry begins a new life
    /// (new `created_at`) at its first fence too, or one above the old life's fence when
    /// that is higher; a takeover keeps the life and its `created_at`, and increments
    /// the fence.
    pub fn granted(&self, existing: Option<&Record>) -> Record {
        Record {
            biz: self.biz.to_owned(),
            key: self.key.to_owned(),
            ..self.granted_unnamed(existing)
        }
    }

    /// [`granted`](Self::granted), with its biz and key left empty (no copies made):
    /// for a store that keeps them beside the record.
    pub(crate) fn granted_unnamed(&self, existing: Option<&Record>) -> Record {
        let (fence, created_at, fingerprint, steps) = match existing {
            None => (self.first_fence(), self.now, self.fingerprint.map(str::to_owned), None),
            Some(old) if old.is_expired(self.now) => (
                (old.fence + 1).max(self.first_fence()),
                self.now,
                self.fingerprint.map(str::to_owned),
                None,
            ),
            Some(old) => (
                old.fence + 1,
                old.created_at,
                self.fingerprint.map(str::to_owned).or_else(|| old.fingerprint.clone()),
                old.steps.clone(),
            ),
        };
        Record {
            biz: String::new(),
            key: String::new(),
            status: Status::Processing,
            fence,
            fingerprint,
            request_body: self.request_body.map(str::to_owned),
            response_body: None,
            error_message: None,
            lease_until: Some(self.lease_until()),
            created_at,
            completed_at: None,
            expires_at: self.expires_at(),
            steps,
            subject: None,
            replay_until: None,
            tombstone: None,
        }
    }
}

/// Two fingerprints contradict each other only when both are present and differ: a
/// record written by a call that declared no payload cannot be checked.
pub fn fingerprints_agree(stored: Option<&str>, offered: Option<&str>) -> bool {
    match (stored, offered) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    }
}

/// What a claim came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The key is ours: run the body, then write through this lease.
    Acquired(Lease),
    /// A live record exists and was not taken over; here it is.
    Existing(Record),
}

/// Proof of holding a claim. Every write of the holder names it, and a store applies
/// the write only while the record still carries the same fence and life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// Business namespace.
    pub biz: String,
    /// Idempotency key.
    pub key: String,
    /// The fence granted by the claim.
    pub fence: u64,
    /// `created_at` of the record's life the claim belongs to. Together with the fence
    /// it tells this holder from the holder of a record purged and created again.
    pub created_at: SystemTime,
    /// What the holder's outcome keeps beyond its answer (the subject's hash, a
    /// tombstone's window): set by the runtime after the claim, written by
    /// [`complete`](crate::IdempotencyStore::complete) and
    /// [`fail`](crate::IdempotencyStore::fail). Fence checks do not look at it.
    pub retention: Retention,
}

impl Lease {
    /// The lease a granted `record` stands for.
    pub fn of(record: &Record) -> Self {
        Self::new(&record.biz, &record.key, record.fence, record.created_at)
    }

    /// The lease of `(biz, key)` at `fence` in the life that began at `created_at`, as
    /// a store's claim grants it (with no [retention](Self::retention) asked yet).
    pub fn new(biz: &str, key: &str, fence: u64, created_at: SystemTime) -> Self {
        Self {
            biz: biz.to_owned(),
            key: key.to_owned(),
            fence,
            created_at,
            retention: Retention::default(),
        }
    }

    /// The same lease, with what its outcome keeps beyond the answer.
    pub fn with_retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }

    /// Whether the claim that granted this lease took a record over (from a holder
    /// whose lease lapsed) rather than starting a life: a life's first fence is its
    /// `created_at` in microseconds, and a takeover adds one to the fence.
    pub fn took_over(&self) -> bool {
        let first = self
            .created_at
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| u64::try_from(since.as_micros()).unwrap_or(u64::MAX));
        self.fence != first.max(1)
    }

    /// Whether `record` is still held under this lease (same life, same fence, still
    /// `Processing`).
    pub fn holds(&self, record: &Record) -> bool {
        record.status == Status::Processing && record.fence == self.fence && record.created_at == self.created_at
    }
}

/// Whether a holder's write was applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum FenceCheck {
    /// The record still carried this holder's fence; the write is done.
    Held,
    /// The record was taken over (or is gone); the write changed nothing.
    Lost,
}
