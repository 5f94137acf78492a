//! The store trait every backend implements.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::claim::{Claim, ClaimOutcome, FenceCheck, Lease};
use crate::error::StoreError;
use crate::notice::Notice;
use crate::record::Record;

/// Where idempotency records live.
///
/// Dyn-compatible (`Arc<dyn IdempotencyStore>` works) and independent of any backend.
/// Every call carries the caller's instant (`now`) and the lengths that count from it
/// (lease, TTL). A store on one host (`MemoryStore`, SQLite) judges by that instant, so
/// tests can move it; a store with a clock of its own (a database server) should judge
/// every lease, expiry and grant by its own clock and take only the lengths from the
/// caller: application hosts' clocks disagree (a VM resumed from suspend, a broken NTP),
/// and a host whose clock runs ahead would otherwise take over running bodies.
///
/// Implementations must make [`claim`](Self::claim) atomic (one statement, no
/// read-then-write window) and apply [`Claim::admits`] and [`Claim::granted`] exactly;
/// every holder write must match [`Lease::holds`].
#[async_trait]
pub trait IdempotencyStore: Send + Sync + Debug + 'static {
    /// Claim `(biz, key)`: insert a `Processing` record, take over an expired one or a
    /// lapsed lease, or return the live record that stands in the way.
    async fn claim(&self, claim: &Claim<'_>) -> Result<ClaimOutcome, StoreError>;

    /// Extend the holder's lease to `now + lease`.
    async fn renew(&self, lease: &Lease, now: SystemTime, lease_for: Duration) -> Result<FenceCheck, StoreError>;

    /// Record `Succeeded` with `response` (JSON), expiring at `now + ttl`.
    async fn complete(
        &self,
        lease: &Lease,
        response: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<FenceCheck, StoreError>;

    /// Record `Failed` with `message`, expiring at `now + ttl`.
    async fn fail(
        &self,
        lease: &Lease,
        message: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<FenceCheck, StoreError>;

    /// Free the key so that a retry runs again: delete the holder's record — or, when
    /// it holds finished [steps](Record::steps), keep it and let its lease lapse at once
    /// (`lease_until = created_at`), so the next claim takes it over with its steps.
    async fn release(&self, lease: &Lease) -> Result<FenceCheck, StoreError>;

    /// The store's kind, for messages: its type's name (`idem_store_sqlx::PostgresStore`),
    /// which an error names instead of the store's `Debug` (that may print a whole pool).
    fn kind(&self) -> &'static str {
        std::any::type_name::<Self>()
    }

    /// The store as `Any`, for integrations that work only with one kind of store (the
    /// SQL stores' transactional mode finds its table through it). `None` by default.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }

    /// Whether the store seals the values it writes ([`SealedStore`](crate::seal), or a
    /// wrapper around one). Transactional mode, which writes the record in the body's
    /// transaction past any wrapper, refuses such a store rather than write in clear.
    /// A wrapper forwards its inner store's answer; `false` by default.
    fn seals(&self) -> bool {
        false
    }

    /// Where this store lives, so that the callers of one key waiting on it in this
    /// process share one look at the store. The default, the store's own address, fits
    /// every store; a handle that forwards to another (as `Arc<S>` does) gives its
    /// target's.
    fn instance(&self) -> *const () {
        (self as *const Self).cast()
    }

    /// Ask to be told when the record of `(biz, key)`, still `Processing`, finishes
    /// elsewhere (another process completes, fails or releases it): the
    /// [`Notice`] arrives then, or when the store may have missed telling (its listening
    /// connection dropped). The waiters of the key in this process read the record when
    /// it arrives instead of polling for it; they still read it once as soon as this
    /// call answers (it may have finished meanwhile) and before each deadline (a notice
    /// can be lost).
    ///
    /// `Ok(None)` where the store cannot tell — the default; waiters then read on a
    /// schedule fitted to how long the biz's calls take. A wrapper forwards its inner
    /// store's answer.
    async fn watch(&self, biz: &str, key: &str) -> Result<Option<Notice>, StoreError> {
        let _ = (biz, key);
        Ok(None)
    }

    /// Save the finished steps of the holder's call (`steps`, the whole JSON object of
    /// [`Record::steps`]), fenced like every holder write.
    ///
    /// The default refuses: a store written before steps existed keeps compiling, and
    /// [`step`](crate::step) on it fails with this error instead of running effects it
    /// cannot record.
    async fn record_steps(&self, lease: &Lease, steps: &str) -> Result<FenceCheck, StoreError> {
        let _ = (lease, steps);
        Err(StoreError::new(format!(
            "the store `{}` does not record steps (its `IdempotencyStore` impl has no `record_steps`)",
            std::any::type_name::<Self>()
        )))
    }

    /// The record of `(biz, key)` as stored, expired or not.
    async fn get(&self, biz: &str, key: &str) -> Result<Option<Record>, StoreError>;

    /// Delete at most `limit` records that expired at `now`, never a `Processing`
    /// record whose lease is still running. Returns how many were deleted.
    ///
    /// The same purge strips, also at most `limit`, the finished records past their
    /// [replay](Record::replay_until) but not yet expired to tombstones
    /// ([`Record::strip`] with [`Tombstone::Expired`](crate::Tombstone::Expired)), as
    /// [`Record::strippable`] says.
    async fn purge_expired(&self, now: SystemTime, limit: u64) -> Result<u64, StoreError>;

    /// Erase the data subject whose keyed hash is `subject` ([`crate::subject`]): strip
    /// every finished record of that subject, of every biz, to an
    /// [`Erased`](crate::Tombstone::Erased) tombstone ([`Record::strip`]), which a retry
    /// of its call meets instead of running again. Returns how many records were
    /// stripped (a record erased before is not counted again).
    ///
    /// The default refuses: a store written before erasure existed keeps compiling, and
    /// an erasure on it fails with this error instead of reporting none found.
    async fn erase_subject(&self, subject: &str) -> Result<u64, StoreError> {
        let _ = subject;
        Err(StoreError::new(format!(
            "the store `{}` cannot erase a data subject (its `IdempotencyStore` impl has no `erase_subject`)",
            std::any::type_name::<Self>()
        )))
    }
}

/// The boxed future of a store method, as `async_trait` declares it.
type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

// The calls a running call makes hand on the inner store's future as it is: an
// `async fn` here would box a second future around it on every call.
#[async_trait]
impl<S: IdempotencyStore + ?Sized> IdempotencyStore for Arc<S> {
    fn claim<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        claim: &'life1 Claim<'life2>,
    ) -> StoreFuture<'async_trait, ClaimOutcome>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        Self: 'async_trait,
    {
        (**self).claim(claim)
    }

    fn renew<'life0, 'life1, 'async_trait>(
        &'life0 self,
        lease: &'life1 Lease,
        now: SystemTime,
        lease_for: Duration,
    ) -> StoreFuture<'async_trait, FenceCheck>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        (**self).renew(lease, now, lease_for)
    }

    fn complete<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        lease: &'life1 Lease,
        response: &'life2 str,
        now: SystemTime,
        ttl: Duration,
    ) -> StoreFuture<'async_trait, FenceCheck>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        Self: 'async_trait,
    {
        (**self).complete(lease, response, now, ttl)
    }

    fn fail<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        lease: &'life1 Lease,
        message: &'life2 str,
        now: SystemTime,
        ttl: Duration,
    ) -> StoreFuture<'async_trait, FenceCheck>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        Self: 'async_trait,
    {
        (**self).fail(lease, message, now, ttl)
    }

    fn release<'life0, 'life1, 'async_trait>(
        &'life0 self,
        lease: &'life1 Lease,
    ) -> StoreFuture<'async_trait, FenceCheck>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        (**self).release(lease)
    }

    fn get<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        biz: &'life1 str,
        key: &'life2 str,
    ) -> StoreFuture<'async_trait, Option<Record>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        Self: 'async_trait,
    {
        (**self).get(biz, key)
    }

    async fn record_steps(&self, lease: &Lease, steps: &str) -> Result<FenceCheck, StoreError> {
        (**self).record_steps(lease, steps).await
    }

    async fn watch(&self, biz: &str, key: &str) -> Result<Option<Notice>, StoreError> {
        (**self).watch(biz, key).await
    }

    fn kind(&self) -> &'static str {
        (**self).kind()
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        (**self).as_any()
    }

    fn seals(&self) -> bool {
        (**self).seals()
    }

    fn instance(&self) -> *const () {
        (**self).instance()
    }

    async fn purge_expired(&self, now: SystemTime, limit: u64) -> Result<u64, StoreError> {
        (**self).purge_expired(now, limit).await
    }

    async fn erase_subject(&self, subject: &str) -> Result<u64, StoreError> {
        (**self).erase_subject(subject).await
    }
}

/// A store that can hand out an owned, shareable handle of itself.
///
/// A body that has finished must have its outcome recorded even when its caller is
/// dropped meanwhile (a client disconnect, a `timeout`): the write then goes on in a
/// task of its own, which needs a store it owns. Every `Clone` store is one — the SQL
/// stores are handles on a pool, `MemoryStore` and `CachedStore` share their state —
/// and so is `Arc<dyn IdempotencyStore>`, whose handle is a clone of itself.
pub trait OwnedStore: IdempotencyStore {
    /// An owned handle on the same records.
    fn to_owned_store(&self) -> Arc<dyn IdempotencyStore>;
}

impl<S: IdempotencyStore + Clone> OwnedStore for S {
    fn to_owned_store(&self) -> Arc<dyn IdempotencyStore> {
        // A shared handle is owned already: a clone of it, not an `Arc` around it.
        if let Some(shared) = (self as &dyn std::any::Any).downcast_ref::<Arc<dyn IdempotencyStore>>() {
            return Arc::clone(shared);
        }
        Arc::new(self.clone())
    }
}
