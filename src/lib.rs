//! `idem` makes an async service function idempotent with one attribute: the key is
//! claimed atomically in a store before the body runs, the body runs once, and every
//! duplicate gets the first result replayed — or a clear rejection.
//!
//! ```
//! use std::sync::Arc;
//! use idem::{idempotent, MemoryStore};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct PayRequest { request_id: String, cents: u64 }
//!
//! #[derive(Debug, PartialEq, Serialize, Deserialize)]
//! struct Receipt { charged_cents: u64 }
//!
//! #[derive(Debug, thiserror::Error)]
//! enum PayError {
//!     #[error(transparent)]
//!     Idem(#[from] idem::Error),
//! }
//!
//! struct Payments { charges: std::sync::atomic::AtomicU32 }
//!
//! impl Payments {
//!     #[idempotent(key = "req.request_id", biz = "pay", ttl = "24h", mode = ReturnFirst)]
//!     async fn pay(&self, req: PayRequest) -> Result<Receipt, PayError> {
//!         self.charges.fetch_add(1, std::sync::atomic::Ordering::SeqCst); // the bank call
//!         Ok(Receipt { charged_cents: req.cents })
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), PayError> {
//! idem::install(Arc::new(MemoryStore::new()));
//! let payments = Payments { charges: Default::default() };
//! let click = || PayRequest { request_id: "req-42".into(), cents: 19900 };
//! let first = payments.pay(click()).await?;
//! let second = payments.pay(click()).await?; // the impatient second click
//! assert_eq!(first, second);
//! assert_eq!(payments.charges.into_inner(), 1); // charged once
//! # Ok(()) }
//! ```
//!
//! # The attribute
//!
//! Every option (`key`, `biz`, `ttl`, `mode`, `lease`, `clock_tolerance`, `on_error`,
//! `wait`, `payload`, `store`, `tx`, `on_takeover`, `outcome_policy`, `crate`) is
//! documented once, on the attribute: [`idempotent`](macro@idempotent#options).
//!
//! The function must be an `async fn` returning `Result<T, E>` with
//! `T: Serialize + DeserializeOwned` (the replayed value) and `E: From<idem::Error>`.
//! The same operation without the attribute is [`Idempotent`] and its `execute`.
//!
//! # Semantics
//!
//! 1. The options and the key are checked first: durations positive and at most
//!    [`MAX_DURATION`] (100 years; the attribute refuses others at compile time, the
//!    builder with [`Error::InvalidOption`]); the key non-empty, at most 255 bytes, no
//!    control characters ([`Error::InvalidKey`]); not the key of a body running on
//!    this task ([`Error::Reentrant`], instead of waiting on itself). The body does not
//!    run.
//! 2. `(biz, key)` is claimed atomically. The claim is granted when no live record
//!    exists, when the record expired, or when it is PROCESSING with a lapsed lease
//!    (a takeover). A new record's fence is the claim's instant in microseconds; every
//!    later grant adds one, so the fence of a key only grows, across purges too.
//! 3. Otherwise the existing record answers: another payload → `PayloadMismatch`;
//!    SUCCESS → replay or `Duplicate`; PROCESSING → wait or `InProgress`; FAIL →
//!    `PreviousFailed` with the recorded message. A waiting duplicate reads the record
//!    (it never writes while it waits) and `wait` bounds the waiting.
//! 4. A claim that waited (for a pool connection, a lock) past a third of its lease
//!    renews it before the body starts, so a body always starts with two thirds of its
//!    lease ahead. The body runs inside a task-local [`Context`] ([`context()`]) while
//!    a heartbeat renews the lease (a failed renewal is retried within a quarter beat).
//!    If a renewal finds the key taken over, [`Context::lease_held`] turns false and
//!    [`Context::lease_lost`] resolves, so a long body can stop.
//! 5. Every write of a holder names its fence: a holder whose claim was taken over
//!    changes nothing and gets [`Error::LeaseLost`] (and a `tracing` warning).
//! 6. A call dropped or panicking *mid-body* leaves the claim PROCESSING; the heartbeat
//!    stops with the call's future, so the lease lapses and a retry takes over.
//! 7. Once the body has finished, its outcome (SUCCESS, FAIL or release) is recorded
//!    whatever happens to the caller: the write is retried (renewing the lease) while
//!    the caller waits — half a lease — and goes on in a task of its own if the caller
//!    is dropped or stops waiting (it then got [`Error::Store`]). Until it is recorded,
//!    duplicates get `InProgress` or wait; never a second run. A write whose reply was
//!    lost but which committed is recognised as the caller's own.
//! 8. An unreachable store at the claim is [`Error::Store`], and the body does not run.
//!
//! ## What the `Ok` type and the payload must satisfy
//!
//! A replay equals the first answer. The `Ok` value is stored as JSON and, before it
//! is recorded, read back into its type and compared with the original through serde's
//! data model: a value JSON cannot carry (NaN, ±∞, `Some(None)` of an
//! `Option<Option<T>>`, an `untagged` enum variant that reads back as another) fails
//! the first call with [`Error::Encode`] and is recorded FAIL (the body ran; it will not
//! run again). Floats replay with their exact bits; a `HashMap` or `HashSet` is
//! compared in any order. `T` must therefore serialize to JSON (map keys as strings)
//! and deserialize back to an equal value.
//!
//! Equal payloads fingerprint equal, different payloads differ: the fingerprint is
//! SHA-256 over serde's data model with map and struct fields sorted, lists in their
//! order (`[1, 2]` and `[2, 1]` are two payloads: reordered payees are another
//! request), integers of any width (`u128` included). serde cannot tell a set from a
//! list: mark a `HashSet`, or a `Vec` whose order means nothing, with [`Unordered`] or
//! `#[serde(serialize_with = "idem::unordered")]` (a `BTreeSet` is sorted already). Only the
//! fingerprint is stored; `keep_request = true` keeps the payload's JSON (up to
//! [`MAX_REQUEST_BODY`]) in `request_body` too.
//!
//! ## Faults, and what each does
//!
//! | fault | outcome |
//! |---|---|
//! | store down at the claim | [`Error::Store`]; the body does not run |
//! | store slow to grant the claim | the lease is renewed before the body starts |
//! | renewals failing while the body runs | retried within a quarter beat; the lease survives blips shorter than two thirds of it |
//! | key taken over while the body runs | [`Context::lease_lost`] resolves; the body's outcome is refused: [`Error::LeaseLost`] |
//! | `complete`/`fail`/`release` failing after the body | retried (at least twenty times a lease, at most a second apart), renewing the lease; past half a lease the caller gets [`Error::Store`] and the write goes on without it; a response refused for twenty leases is recorded FAIL instead (duplicates get [`Error::PreviousFailed`]) |
//! | the store unreachable from a finished holder until its lease lapses | the one window of leased mode: nothing can tell the finished holder from a dead one, and a retry that reaches the store first runs the body again (the holder gets [`Error::LeaseLost`]). The lease runs at least two thirds of `lease` past the last moment the store was reached (the heartbeat renews it every third), so a shorter outage runs nothing twice. Transactional mode has no such window; steps with effect keys make the second run harmless |
//! | caller dropped after the body | the outcome is still recorded |
//! | a write that committed but whose reply was lost | recognised as the caller's own: the caller gets its result |
//! | process killed mid-body | the lease lapses; a retry takes over and runs the body (put the business write in the same database transaction to make that safe) |
//! | a table of another shape | `migrate()` and the first claim refuse it, naming table, column, found and needed |
//!
//! Decisions where the design is silent: a record written without a payload
//! fingerprint matches any payload; the body's `Err` is always returned to the caller
//! as it was; under `on_error = Record` the FAIL record keeps the error's `Display`
//! text (its type name where it has none, and always through the builder). A database
//! server judges leases and expiry by its own clock, so hosts whose clocks disagree
//! never take over each other's running bodies; `MemoryStore` by a steady clock of its
//! own; SQLite by the host's wall clock (docs/RELIABILITY.md, "Clocks", states each
//! window).

//! # In an axum handler
//!
//! Put the attribute on the service method, whose `Ok` type is plain data, and let the
//! handler turn it into a response: the replayed value is the data, not the response.
//!
//! ```
//! use std::sync::Arc;
//! use axum::{extract::State, http::StatusCode, response::IntoResponse, routing::post, Json, Router};
//! use idem::{idempotent, MemoryStore};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Clone, Serialize, Deserialize)]
//! struct PayRequest { request_id: String, cents: u64 }
//!
//! #[derive(Serialize, Deserialize)]
//! struct Receipt { charged_cents: u64 }
//!
//! #[derive(Debug, thiserror::Error)]
//! enum PayError {
//!     #[error(transparent)]
//!     Idem(#[from] idem::Error),
//! }
//!
//! impl IntoResponse for PayError {
//!     fn into_response(self) -> axum::response::Response {
//!         let status = match &self {
//!             PayError::Idem(idem::Error::InProgress { .. }) => StatusCode::CONFLICT,
//!             PayError::Idem(idem::Error::PayloadMismatch { .. }) => StatusCode::UNPROCESSABLE_ENTITY,
//!             PayError::Idem(_) => StatusCode::SERVICE_UNAVAILABLE,
//!         };
//!         (status, self.to_string()).into_response()
//!     }
//! }
//!
//! struct Payments { store: Arc<MemoryStore> }
//!
//! impl Payments {
//!     #[idempotent(key = "req.request_id", biz = "pay", payload = "req", store = "self.store")]
//!     async fn pay(&self, req: PayRequest) -> Result<Receipt, PayError> {
//!         Ok(Receipt { charged_cents: req.cents })
//!     }
//! }
//!
//! async fn pay(State(payments): State<Arc<Payments>>, Json(req): Json<PayRequest>) -> Result<Json<Receipt>, PayError> {
//!     payments.pay(req).await.map(Json)
//! }
//!
//! let app: Router = Router::new()
//!     .route("/pay", post(pay))
//!     .with_state(Arc::new(Payments { store: Arc::new(MemoryStore::new()) }));
//! # let _ = app;
//! ```
//!
//! Where the handler itself must carry the attribute, return a `#[serde(transparent)]`
//! newtype that is both replayable and a response (`impl IntoResponse for Paid { … Json(self.0) … }`).
//! `axum::Json<T>` itself cannot be the `Ok` type: it does not deserialize.
//!
//! # Implementing a store
//!
//! A store keeps one record per `(biz, key)` and applies the claim rule atomically; the
//! rule itself is written once, in [`store::Claim::admits`] and [`store::Claim::granted`],
//! and every holder write checks [`store::Lease::holds`]. A store must be `Clone` (a
//! cheap handle) to be passed as `store = &s`, so a finished call can be recorded after
//! its caller is gone; `Arc<YourStore>` works either way. Here, a complete one over a
//! mutex-guarded map:
//!
//! ```
//! use std::collections::HashMap;
//! use std::sync::{Arc, Mutex};
//! use std::time::{Duration, SystemTime};
//!
//! use idem::store::{Claim, ClaimOutcome, FenceCheck, IdempotencyStore, Lease, Record, Status, StoreError};
//!
//! #[derive(Debug, Clone, Default)]
//! struct MapStore(Arc<Mutex<HashMap<(String, String), Record>>>);
//!
//! impl MapStore {
//!     fn write(&self, lease: &Lease, change: impl FnOnce(&mut Record)) -> FenceCheck {
//!         let mut map = self.0.lock().unwrap();
//!         match map.get_mut(&(lease.biz.clone(), lease.key.clone())) {
//!             Some(record) if lease.holds(record) => { change(record); FenceCheck::Held }
//!             _ => FenceCheck::Lost,
//!         }
//!     }
//! }
//!
//! #[async_trait::async_trait]
//! impl IdempotencyStore for MapStore {
//!     async fn claim(&self, claim: &Claim<'_>) -> Result<ClaimOutcome, StoreError> {
//!         let mut map = self.0.lock().unwrap();
//!         let slot = (claim.biz.to_owned(), claim.key.to_owned());
//!         match map.get(&slot) {
//!             Some(existing) if !claim.admits(existing) => Ok(ClaimOutcome::Existing(existing.clone())),
//!             existing => {
//!                 let record = claim.granted(existing);
//!                 let lease = Lease::of(&record);
//!                 map.insert(slot, record);
//!                 Ok(ClaimOutcome::Acquired(lease))
//!             }
//!         }
//!     }
//!     async fn renew(&self, lease: &Lease, now: SystemTime, lease_for: Duration) -> Result<FenceCheck, StoreError> {
//!         Ok(self.write(lease, |r| {
//!             r.lease_until = Some(now + lease_for);
//!             r.expires_at = r.expires_at.max(now + lease_for);
//!         }))
//!     }
//!     async fn complete(&self, lease: &Lease, response: &str, now: SystemTime, ttl: Duration) -> Result<FenceCheck, StoreError> {
//!         Ok(self.write(lease, |r| {
//!             (r.status, r.response_body) = (Status::Succeeded, Some(response.to_owned()));
//!             (r.lease_until, r.completed_at, r.expires_at) = (Some(now), Some(now), now + ttl);
//!         }))
//!     }
//!     async fn fail(&self, lease: &Lease, message: &str, now: SystemTime, ttl: Duration) -> Result<FenceCheck, StoreError> {
//!         Ok(self.write(lease, |r| {
//!             (r.status, r.error_message) = (Status::Failed, Some(message.to_owned()));
//!             (r.lease_until, r.completed_at, r.expires_at) = (Some(now), Some(now), now + ttl);
//!         }))
//!     }
//!     async fn release(&self, lease: &Lease) -> Result<FenceCheck, StoreError> {
//!         let mut map = self.0.lock().unwrap();
//!         let slot = (lease.biz.clone(), lease.key.clone());
//!         match map.get(&slot) {
//!             Some(record) if lease.holds(record) => { map.remove(&slot); Ok(FenceCheck::Held) }
//!             _ => Ok(FenceCheck::Lost),
//!         }
//!     }
//!     async fn get(&self, biz: &str, key: &str) -> Result<Option<Record>, StoreError> {
//!         Ok(self.0.lock().unwrap().get(&(biz.to_owned(), key.to_owned())).cloned())
//!     }
//!     async fn purge_expired(&self, now: SystemTime, limit: u64) -> Result<u64, StoreError> {
//!         let mut map = self.0.lock().unwrap();
//!         let doomed: Vec<_> = map.iter()
//!             .filter(|(_, r)| r.is_expired(now) && (r.status != Status::Processing || r.lease_lapsed(now)))
//!             .map(|(slot, _)| slot.clone())
//!             .take(limit as usize)
//!             .collect();
//!         for slot in &doomed { map.remove(slot); }
//!         Ok(doomed.len() as u64)
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
//! let store = MapStore::default();
//! let pay = idem::Idempotent::new("pay").store(Arc::new(store.clone()));
//! let first: u32 = pay.execute("k", async { Ok::<_, idem::Error>(1) }).await?;
//! let again: u32 = pay.execute("k", async { Ok::<_, idem::Error>(2) }).await?;
//! assert_eq!((first, again), (1, 1));
//! # Ok(()) }
//! ```
//!
//! The crate `idem-testkit` certifies a store: `conformance_suite!` makes one test of
//! every scenario idem's own stores pass, against yours (its docs show a whole store
//! certified by it).
//!
//! # Stores and features
//!
//! [`MemoryStore`] is always there. Cargo features add the database stores, each
//! keeping one `idempotent_record` table: `sqlite` (default, [`SqliteStore`]),
//! `postgres` (`PostgresStore`), `mysql` (`MySqlStore`, MySQL 8 and MariaDB 10.11);
//! [`sql::open`] picks one by URL. `sweeper` (default) adds
//! [`Sweeper::continuously_purge`]; `cache` adds `CachedStore`, a bounded local tier
//! that replays finished records without a round trip (the answer to hot keys).
//! `redis` adds `RedisStore` (one Redis server or a Redis Cluster). `metrics` counts
//! every call through the `metrics` facade ([`observe`] lists the metrics).
//! `http` adds `idem::http`, the `Idempotency-Key` layer for tower and axum, and
//! `http-reqwest` its outgoing-key helper on `reqwest::RequestBuilder` and
//! `KeyedClient`, `http-tonic` the `GrpcRetryLayer` for tonic clients. `amqp` adds
//! `idem::amqp`: RabbitMQ consumers that ack only what is recorded, and the outbox
//! relay; `nats` adds `idem::nats`, the same for NATS JetStream.
//!
//! # Dependencies, and why
//!
//! `tokio` (task-local context, heartbeat and `wait` timers), `serde`/`serde_json`
//! (responses are stored as JSON; `float_roundtrip` so floats replay exactly),
//! `serde-content` (serde's data model as a value: the replay check and the payload
//! fingerprint compare through it), `thiserror` (the error enum), `tracing` (lease-lost
//! and retry warnings), `async-trait` (a dyn-compatible store trait), `sha2` (payload
//! fingerprints), `sqlx` (the database stores), `redis` (the Redis store), `metrics` (the metrics
//! facade, feature `metrics`), `getrandom` (form tokens, and the nonces of sealed values),
//! `chacha20poly1305` (RustCrypto's AEAD, feature `seal`, with `base64` to store sealed
//! values as text), `chrono` (sqlx's timestamp types),
//! `quick_cache` (the cache tier, feature `cache`), `syn`/`quote`/`proc-macro2` (the
//! attribute), `strsim` ("did you mean" hints for misspelt options), and with feature
//! `http` the layer's own (`http`, `http-body-util`, `tower-layer`, `sfv` for the
//! header's structured-field syntax, `base64` for binary bodies in the record), and with
//! feature `amqp` `lapin` (the AMQP client) and `futures-util`, with feature `nats`
//! `async-nats` (the official NATS client, with JetStream); both share
//! `idem-messaging`. The
//! tests and examples add `idem-testkit` (the conformance suite and harness every store
//! is tested with), `proptest` (the model test), `rand` (the pipeline test's random
//! kills) and `clap` (the pipeline example's flags). The lab tools (the chaos runner, the
//! probes, the bench, the benchmarks) are the unpublished crate `idem-lab`.

#![cfg_attr(docsrs, feature(doc_cfg))]

/// The README's examples, compiled and run as doctests: its quick start must work.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

pub use idem_macros::idempotent;
pub use idem_runtime::digest;
pub use idem_runtime::observe;
pub use idem_runtime::pages;
pub use idem_runtime::repair;
pub use idem_runtime::scoped_key;
pub use idem_runtime::subject;
pub use idem_runtime::token;
pub use idem_runtime::unknown;
pub use idem_runtime::unordered;
pub use idem_runtime::{
    context, error_chain, install, installed, step, AfterExpiry, Context, Error, IdempotencyStore, Idempotent, Intent,
    IntoSharedStore, LeaseClock, Lookup, MemoryStore, Mode, OnError, Record, Status, Step, TieredStore, Tombstone,
    Unordered, DEFAULT_LEASE, DEFAULT_TTL, MAX_BIZ_CHARS, MAX_DURATION, MAX_KEY_BYTES, MAX_REQUEST_BODY,
};

#[cfg(feature = "cache")]
#[cfg_attr(docsrs, doc(cfg(feature = "cache")))]
pub use idem_runtime::CachedStore;

#[cfg(feature = "sweeper")]
#[cfg_attr(docsrs, doc(cfg(feature = "sweeper")))]
pub use idem_runtime::Sweeper;

pub use idem_runtime::sweeper;

/// What a store implementation needs: the claim and its outcome, the lease a holder
/// writes under, and the store's own error. Applications need none of it.
pub mod store {
    pub use idem_runtime::notice::{Notice, Notices};
    pub use idem_runtime::{
        fingerprints_agree, now, redacted_url, Admission, Claim, ClaimOutcome, FenceCheck, IdempotencyStore, Lease,
        OwnedStore, Record, Retention, Status, StoreError, Tombstone, TransactionClaim, TransactionStore,
        UnknownStatus, UnknownTombstone,
    };
}

/// What `#[idempotent]` expands to. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use idem_runtime::__private::*;
    #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
    pub use idem_store_sqlx::{admit, transaction, Admitted, StoreCheck};

    /// A `store = ...` handle as the store trait object transactional mode looks into.
    pub fn store_of<'a>(handle: &'a StoreHandle<'_>) -> &'a dyn crate::IdempotencyStore {
        &**handle
    }
}

/// sqlx itself, the version the database stores are built on, so an application names
/// one version of it: `idem::sqlx::PgPool`.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))))]
pub use idem_store_sqlx::sqlx;

/// Stored values encrypted and authenticated at rest (feature `seal`): wrap any store in
/// a [`seal::SealedStore`] with the application's keys.
#[cfg(feature = "seal")]
#[cfg_attr(docsrs, doc(cfg(feature = "seal")))]
pub use idem_runtime::seal;

/// Records in Redis or a Redis Cluster (feature `redis`): see the
/// [`idem_store_redis`] crate docs for the layout and what a claim on Redis survives.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use idem_store_redis::RedisStore;

/// The `redis` crate the Redis store is built on (feature `redis`), to name the same
/// version.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use idem_store_redis::redis;

/// The `Idempotency-Key` layer for tower and axum (feature `http`): `IdempotencyLayer`
/// over any store, [`http::started`] for handlers, [`http::IdempotencyKeyExt`] for the
/// requests a handler sends on. See the [`idem_http`] crate docs.
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub use idem_http as http;

/// Idempotent RabbitMQ consumers and the outbox relay (feature `amqp`): a
/// [`amqp::Consumer`] that acks a delivery only once its outcome is recorded, an
/// [`amqp::Outbox`] written in the business transaction and the [`amqp::Relay`] that
/// publishes it with confirms (the outbox on each database feature that is on). See the
/// [`idem_amqp`] crate docs.
#[cfg(feature = "amqp")]
#[cfg_attr(docsrs, doc(cfg(feature = "amqp")))]
pub use idem_amqp as amqp;

/// Idempotent NATS JetStream consumers and the outbox relay to JetStream (feature
/// `nats`): a [`nats::Consumer`] that acks a message only once its outcome is recorded,
/// keyed by its `Nats-Msg-Id`, and the [`nats::Relay`] that publishes an outbox with the
/// row id as `Nats-Msg-Id` (the outbox on each database feature that is on). See the
/// [`idem_nats`] crate docs.
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub use idem_nats as nats;

/// The database stores' helpers: a store picked by URL ([`sql::open`]), the default
/// table name, what stands between a PostgreSQL store and its server ([`sql::Pooler`]).
/// The stores themselves are at the crate root.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))))]
pub mod sql {
    pub use idem_store_sqlx::{
        execute_in, numbered, open, BodyFuture, OpenOptions, Pooler, TransactionDatabase, DEFAULT_TABLE,
    };
}

#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use idem_store_sqlx::MySqlStore;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use idem_store_sqlx::PostgresStore;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use idem_store_sqlx::SqliteStore;
