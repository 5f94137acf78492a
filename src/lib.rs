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
//! | option | value | default | meaning |
//! |---|---|---|---|
//! | `key` | expression, as a string `"req.id"` or bare | required | evaluated by reference before the body; its value must implement `Display` |
//! | `biz` | string literal, 1..=64 chars | required | business namespace; `(biz, key)` is unique |
//! | `ttl` | duration string (`ms s m h d`, combinable: `"1h30m"`) | `"24h"` | how long a finished record answers duplicates, counted from completion |
//! | `mode` | `ReturnFirst` or `Reject` | `ReturnFirst` | a duplicate of a finished call gets the first `Ok` value, or [`Error::Duplicate`] |
//! | `lease` | duration string | `"30s"` | how long a PROCESSING claim is respected; a heartbeat renews it while the body runs |
//! | `on_error` | `Release` or `Record` | `Release` | body returned `Err`: delete the claim (a retry runs again), or record FAIL ([`Error::PreviousFailed`] until `ttl`) |
//! | `wait` | duration string | none | a duplicate that finds the first call running waits this long for its outcome instead of [`Error::InProgress`] |
//! | `payload` | `Serialize` expression | none | its fingerprint (SHA-256 of canonical JSON) is stored; same key, other payload → [`Error::PayloadMismatch`] |
//! | `store` | `&S`, `Arc<S>` or `Arc<dyn IdempotencyStore>` | the [`install`]ed store | which store to use |
//! | `crate` | path | `::idem` | where this crate is, when renamed |
//!
//! The function must be an `async fn` returning `Result<T, E>` with
//! `T: Serialize + DeserializeOwned` (the replayed value) and `E: From<idem::Error>`.
//! The same operation without the attribute is [`Idempotent`] and its `execute`.
//!
//! # Semantics
//!
//! 1. The key is checked first: non-empty, at most 255 bytes, no control characters —
//!    else [`Error::InvalidKey`], and the body does not run.
//! 2. `(biz, key)` is claimed atomically. The claim is granted when no live record
//!    exists, when the record expired, or when it is PROCESSING with a lapsed lease
//!    (a takeover). Every grant increments the record's *fence*.
//! 3. Otherwise the existing record answers: another payload → `PayloadMismatch`;
//!    SUCCESS → replay or `Duplicate`; PROCESSING → wait or `InProgress`; FAIL →
//!    `PreviousFailed`.
//! 4. The body runs inside a task-local [`Context`] ([`context()`]) while a heartbeat
//!    renews the lease. Its `Ok` value is stored before it is returned.
//! 5. Every write of a holder names its fence: a holder whose claim was taken over
//!    changes nothing and gets [`Error::LeaseLost`] (and a `tracing` warning).
//! 6. A call dropped or panicking mid-body leaves the claim PROCESSING; the heartbeat
//!    stops with the call's future, so the lease lapses and a retry takes over.
//! 7. An unreachable store is [`Error::Store`], and the body does not run.
//!
//! Decisions where the design is silent: a record written without a payload
//! fingerprint matches any payload; the body's `Err` is always returned to the caller
//! as it was (a failed release is logged); a response that cannot be serialized is
//! recorded as FAIL so the body is not run again, and the caller gets
//! [`Error::Encode`]; all instants come from the caller's clock (hosts must keep their
//! clocks in sync to well within a lease).

//!
//! # Stores and features
//!
//! [`MemoryStore`] is always there. Cargo features add the database stores, each
//! keeping one `idempotent_record` table: `sqlite` (default, [`SqliteStore`]),
//! `postgres` (`PostgresStore`), `mysql` (`MySqlStore`, MySQL 8 and MariaDB 10.11);
//! [`sqlx::open`] picks one by URL. `sweeper` (default) adds
//! [`Sweeper::continuously_purge`]; `cache` adds `CachedStore`, a bounded local tier
//! that replays finished records without a round trip (the answer to hot keys).
//!
//! # Dependencies, and why
//!
//! `tokio` (task-local context, heartbeat and `wait` timers), `serde`/`serde_json`
//! (responses are stored as JSON), `thiserror` (the error enum), `tracing` (lease-lost
//! and retry warnings), `async-trait` (a dyn-compatible store trait), `sha2` (payload
//! fingerprints), `sqlx` (the database stores), `chrono` (sqlx's timestamp types),
//! `quick_cache` (the cache tier, feature `cache`), `syn`/`quote`/`proc-macro2` (the
//! attribute) and `strsim` ("did you mean" hints for misspelt options).

pub use idem_macros::idempotent;
pub use idem_runtime::*;

#[cfg(feature = "mysql")]
pub use idem_store_sqlx::MySqlStore;
#[cfg(feature = "postgres")]
pub use idem_store_sqlx::PostgresStore;
#[cfg(feature = "sqlite")]
pub use idem_store_sqlx::SqliteStore;

/// The database stores (by feature: `sqlite`, `postgres`, `mysql`) next to the sqlx
/// they are built on, so an application names one version of both:
/// `idem::sqlx::SqlitePool`, `idem::sqlx::SqliteStore`.
pub mod sqlx {
    pub use idem_store_sqlx::sqlx::*;
    pub use idem_store_sqlx::*;
}
