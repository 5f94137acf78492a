//! A store that injects faults into another: fail, delay, commit-then-fail, or fence out
//! the next calls of one trait operation. It wraps the backend under test, so each fault is met
//! by the real store (SQLite, PostgreSQL, MariaDB, memory) around it. The fault probe
//! (`idem-lab/src/bin/probes.rs`) uses it too.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use idem::store::{Claim, ClaimOutcome, FenceCheck, Lease, StoreError};
use idem::{IdempotencyStore, Record};

/// The store under test, shared.
pub type Store = Arc<dyn IdempotencyStore>;

/// A trait operation of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `IdempotencyStore::claim`.
    Claim,
    /// `IdempotencyStore::renew`.
    Renew,
    /// `IdempotencyStore::complete`.
    Complete,
    /// `IdempotencyStore::fail`.
    Fail,
    /// `IdempotencyStore::release`.
    Release,
    /// `IdempotencyStore::record_steps`.
    RecordSteps,
    /// `IdempotencyStore::get`.
    Get,
    /// `IdempotencyStore::purge_expired`.
    Purge,
    /// `IdempotencyStore::erase_subject`.
    Erase,
}

impl Op {
    /// Every operation.
    pub const ALL: [Op; 9] = [
        Op::Claim,
        Op::Renew,
        Op::Complete,
        Op::Fail,
        Op::Release,
        Op::RecordSteps,
        Op::Get,
        Op::Purge,
        Op::Erase,
    ];
}

/// What happens to a call that meets the fault.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// Answer with an error; the inner store is not called.
    Fail,
    /// Wait, then call the inner store.
    Delay(Duration),
    /// Call the inner store (its write commits), then answer with an error, as a
    /// connection lost before the reply would.
    CommitThenFail,
    /// Answer a fenced write (renew, complete, fail, release, record_steps) with
    /// [`FenceCheck::Lost`], as if a newer holder had taken the key over; the inner
    /// store is not called. Another operation that meets it answers with an error.
    Fenced,
}

#[derive(Debug, Default)]
struct Plan {
    /// Faults still to meet, per operation: (fault, calls left).
    faults: HashMap<Op, Vec<(Fault, u32)>>,
    calls: HashMap<Op, u32>,
    errors: HashMap<Op, u32>,
}

/// The wrapper. Clones share the plan and the counts.
#[derive(Debug, Clone)]
pub struct FaultyStore {
    inner: Store,
    plan: Arc<Mutex<Plan>>,
}

impl FaultyStore {
    /// A store that passes every call to `inner` until a fault is armed.
    pub fn new(inner: &Store) -> Self {
        Self {
            inner: inner.clone(),
            plan: Arc::default(),
        }
    }

    /// The next `times` calls of `op` meet `fault`.
    pub fn inject(&self, op: Op, fault: Fault, times: u32) -> &Self {
        self.plan
            .lock()
            .unwrap()
            .faults
            .entry(op)
            .or_default()
            .push((fault, times));
        self
    }

    /// Every call of every operation fails until [`heal`](Self::heal): the store is
    /// down, or this process is cut off from it.
    pub fn cut_off(&self) {
        for op in Op::ALL {
            self.inject(op, Fault::Fail, u32::MAX);
        }
    }

    /// No more faults.
    pub fn heal(&self) {
        self.plan.lock().unwrap().faults.clear();
    }

    /// How many calls of `op` reached this store (faulty or not).
    pub fn calls(&self, op: Op) -> u32 {
        self.plan.lock().unwrap().calls.get(&op).copied().unwrap_or(0)
    }

    /// How many calls of `op` answered with an error (injected or the inner store's).
    pub fn errors(&self, op: Op) -> u32 {
        self.plan.lock().unwrap().errors.get(&op).copied().unwrap_or(0)
    }

    /// As a shared store for the decorated functions.
    pub fn shared(&self) -> Store {
        Arc::new(self.clone())
    }

    fn next_fault(&self, op: Op) -> Option<Fault> {
        let mut plan = self.plan.lock().unwrap();
        *plan.calls.entry(op).or_default() += 1;
        let queue = plan.faults.get_mut(&op)?;
        let (fault, left) = queue.first_mut()?;
        let fault = *fault;
        *left -= 1;
        if *left == 0 {
            queue.remove(0);
        }
        Some(fault)
    }

    async fn call<T>(
        &self,
        op: Op,
        inner: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.answered(op, inner, None).await
    }

    /// [`call`](Self::call) for a fenced write, which a [`Fault::Fenced`] answers `Lost`.
    async fn fenced(
        &self,
        op: Op,
        inner: impl std::future::Future<Output = Result<FenceCheck, StoreError>>,
    ) -> Result<FenceCheck, StoreError> {
        self.answered(op, inner, Some(FenceCheck::Lost)).await
    }

    async fn answered<T>(
        &self,
        op: Op,
        inner: impl std::future::Future<Output = Result<T, StoreError>>,
        lost: Option<T>,
    ) -> Result<T, StoreError> {
        let answer = self.answer(op, inner, lost).await;
        if answer.is_err() {
            *self.plan.lock().unwrap().errors.entry(op).or_default() += 1;
        }
        answer
    }

    async fn answer<T>(
        &self,
        op: Op,
        inner: impl std::future::Future<Output = Result<T, StoreError>>,
        lost: Option<T>,
    ) -> Result<T, StoreError> {
        let injected = || StoreError::new(format!("injected fault on {op:?}"));
        match self.next_fault(op) {
            None => inner.await,
            Some(Fault::Fail) => Err(injected()),
            Some(Fault::Delay(pause)) => {
                tokio::time::sleep(pause).await;
                inner.await
            }
            Some(Fault::CommitThenFail) => {
                inner.await?;
                Err(injected())
            }
            Some(Fault::Fenced) => lost.ok_or_else(|| {
                StoreError::new(format!("Fault::Fenced injected on {op:?}, which is not a fenced write"))
            }),
        }
    }
}

#[async_trait]
impl IdempotencyStore for FaultyStore {
    async fn claim(&self, claim: &Claim<'_>) -> Result<ClaimOutcome, StoreError> {
        self.call(Op::Claim, self.inner.claim(claim)).await
    }

    async fn renew(&self, lease: &Lease, now: SystemTime, lease_for: Duration) -> Result<FenceCheck, StoreError> {
        self.fenced(Op::Renew, self.inner.renew(lease, now, lease_for)).await
    }

    async fn complete(
        &self,
        lease: &Lease,
        response: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<FenceCheck, StoreError> {
        self.fenced(Op::Complete, self.inner.complete(lease, response, now, ttl))
            .await
    }

    async fn fail(
        &self,
        lease: &Lease,
        message: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<FenceCheck, StoreError> {
        self.fenced(Op::Fail, self.inner.fail(lease, message, now, ttl)).await
    }

    async fn release(&self, lease: &Lease) -> Result<FenceCheck, StoreError> {
        self.fenced(Op::Release, self.inner.release(lease)).await
    }

    async fn record_steps(&self, lease: &Lease, steps: &str) -> Result<FenceCheck, StoreError> {
        self.fenced(Op::RecordSteps, self.inner.record_steps(lease, steps))
            .await
    }

    fn seals(&self) -> bool {
        self.inner.seals()
    }

    async fn watch(&self, biz: &str, key: &str) -> Result<Option<idem::store::Notice>, StoreError> {
        self.inner.watch(biz, key).await
    }

    async fn get(&self, biz: &str, key: &str) -> Result<Option<Record>, StoreError> {
        self.call(Op::Get, self.inner.get(biz, key)).await
    }

    async fn purge_expired(&self, now: SystemTime, limit: u64) -> Result<u64, StoreError> {
        self.call(Op::Purge, self.inner.purge_expired(now, limit)).await
    }

    async fn erase_subject(&self, subject: &str) -> Result<u64, StoreError> {
        self.call(Op::Erase, self.inner.erase_subject(subject)).await
    }
}

/// `count` finite doubles spread over the whole bit space (xorshift from `seed`): the
/// values a JSON round trip gets wrong when it is not exact.
pub fn random_doubles(mut seed: u64, count: usize) -> Vec<f64> {
    std::iter::from_fn(|| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        Some(f64::from_bits(seed))
    })
    .filter(|v| v.is_finite())
    .take(count)
    .collect()
}
