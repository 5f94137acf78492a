//! Certify an idem store: the conformance suite every store in idem passes, a wrapper
//! store that injects faults into one call, storms of duplicate calls across OS
//! processes, and a checker of call histories recorded under chaos.
//!
//! A store for a backend idem does not ship (DynamoDB, Spanner, CockroachDB, Valkey, a
//! company's own) proves itself with a few lines in its own tests — the same suites,
//! scenario for scenario, that idem's memory, SQLite, PostgreSQL, MariaDB and Redis
//! stores pass. Here a third-party store, a map behind a lock, is certified (the whole
//! store, every method written out, is `tests/third_party_store.rs` of this crate):
//!
//! ```no_run
//! // tests/conformance.rs of the store's crate
//! use std::collections::BTreeMap;
//! use std::sync::{Arc, Mutex};
//! use std::time::{Duration, SystemTime};
//!
//! use idem::store::{Claim, ClaimOutcome, FenceCheck, IdempotencyStore, Lease, Record, Status, StoreError};
//! use idem_testkit::conformance_suite;
//!
//! /// Records in a map, under one lock: every claim and write is atomic.
//! #[derive(Debug, Clone, Default)]
//! pub struct BTreeStore(Arc<Mutex<BTreeMap<(String, String), Record>>>);
//!
//! #[async_trait::async_trait]
//! impl IdempotencyStore for BTreeStore {
//!     async fn claim(&self, claim: &Claim<'_>) -> Result<ClaimOutcome, StoreError> {
//!         let mut records = self.0.lock().unwrap();
//!         let id = (claim.biz.to_owned(), claim.key.to_owned());
//!         match records.get(&id) {
//!             Some(existing) if !claim.admits(existing) => Ok(ClaimOutcome::Existing(existing.clone())),
//!             existing => {
//!                 let granted = claim.granted(existing);
//!                 records.insert(id, granted.clone());
//!                 Ok(ClaimOutcome::Acquired(Lease::of(&granted)))
//!             }
//!         }
//!     }
//!     // … renew, complete, fail, release, record_steps, get, purge_expired: see the example
//! #   async fn renew(&self, _: &Lease, _: SystemTime, _: Duration) -> Result<FenceCheck, StoreError> { todo!() }
//! #   async fn complete(&self, _: &Lease, _: &str, _: SystemTime, _: Duration) -> Result<FenceCheck, StoreError> { todo!() }
//! #   async fn fail(&self, _: &Lease, _: &str, _: SystemTime, _: Duration) -> Result<FenceCheck, StoreError> { todo!() }
//! #   async fn release(&self, _: &Lease) -> Result<FenceCheck, StoreError> { todo!() }
//! #   async fn get(&self, _: &str, _: &str) -> Result<Option<Record>, StoreError> { todo!() }
//! #   async fn purge_expired(&self, _: SystemTime, _: u64) -> Result<u64, StoreError> { todo!() }
//! }
//!
//! // One `#[tokio::test]` per scenario (claims, replays, leases, takeovers, fences,
//! // payloads, expiry, purges, steps, tokens, and faults injected into each call).
//! conformance_suite!(async { Some(Arc::new(BTreeStore::default()) as idem_testkit::conformance::calls::Store) });
//! ```
//!
//! What is here:
//!
//! - [`conformance`]: the scenarios, through the `#[idempotent]` attribute and the store
//!   trait, and the macros that make one test of each: [`conformance_suite!`] for any
//!   store, [`shared_store_suite!`] for two handles on one backend (a takeover race has
//!   one winner), [`database_suite!`] for a SQL table, [`store_clock_suite!`] for a
//!   store with a clock of its own (callers minutes ahead and behind it).
//! - [`conformance::faulty::FaultyStore`]: wraps a store and fails, delays, or commits
//!   then fails one chosen call — the faults that break a store's promises.
//! - [`harness`] (feature `harness`): worker processes (the test binary run again on one test), the
//!   business table a body writes ([`harness::Effects`]), libfaketime clock skew for a
//!   worker, a TCP forwarder that can move or cut a store's address, and the storm of
//!   concurrent calls through a failover ([`harness::failover::Storm`]).
//! - [`chaos`] (feature `chaos`): the history of calls a chaos run records, and the checker that reads it
//!   with the business effects and the faults injected: at most one effect per key
//!   beyond the runs a fault cut off while they ran, every answer the first, none for
//!   another payload, no success lost, no lease lost without a fault.
//! - [`mutants`]: broken stores — a correct map store that can carry one of eleven
//!   bugs, and a real store with short leases — that the kit and the checker are shown
//!   to fail.
//! - [`scratch`]: where tests put the SQLite files and logs they make, a folder per
//!   test process that later processes remove once it has ended.
//!
//! With its default features the kit builds on `idem` without a store backend: a store
//! written in a crate of its own is certified without compiling sqlx or redis.
//!
//! Dependencies: `idem` (the attribute and the store trait; the harness turns on idem's
//! own stores), `async-trait`
//! (the fault-injecting store implements the store trait), `tokio` (the runtime of the
//! tests and workers, the partitionable link), `futures` (races of concurrent calls are
//! joined), `sqlx` (feature `harness`: the business table, one pool for SQLite, PostgreSQL and MariaDB
//! through its `Any` driver), `serde`/`serde_json` (payloads and histories), `thiserror`
//! (the test application's error).

#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "chaos")]
#[cfg_attr(docsrs, doc(cfg(feature = "chaos")))]
pub mod chaos;
pub mod conformance;
#[cfg(feature = "harness")]
#[cfg_attr(docsrs, doc(cfg(feature = "harness")))]
pub mod harness;
pub mod mutants;
pub mod scratch;
