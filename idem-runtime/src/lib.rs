//! Runtime of [`idem`](https://docs.rs/idem): the store trait, the in-memory store, the
//! operation behind `#[idempotent]` and its execution, errors and the task-local context.
//!
//! Applications depend on the `idem` facade, which re-exports everything here; store
//! crates depend on this crate alone.
//!
//! ```
//! use std::sync::Arc;
//! use idem_runtime::{Idempotent, MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_runtime::Error> {
//! let pay = Idempotent::new("pay").store(Arc::new(MemoryStore::new()));
//! let receipt: String = pay.execute("req-1", async { Ok::<_, idem_runtime::Error>("r-1".to_owned()) }).await?;
//! assert_eq!(receipt, "r-1");
//! # Ok(()) }
//! ```
//!
//! Why the dependencies: `async-trait` makes the store trait dyn-compatible
//! (`Arc<dyn IdempotencyStore>`), which native async trait methods are not;
//! `sha2` computes payload fingerprints; `getrandom` draws form tokens from the
//! operating system's random source (and the nonces of sealed values); `tokio` provides the task-local context and the
//! timers of the heartbeat and of `wait`; `quick_cache` (feature `cache`) is the bounded
//! concurrent cache behind `CachedStore`, chosen for reads that do no housekeeping;
//! `serde-content` gives serde's data model as a value (it keeps `Some(None)` apart
//! from `None`, 128-bit integers, tuples and structs), which the payload fingerprint
//! and the replay check (a replay equals the first answer) compare; serde_json is built
//! with `float_roundtrip` so a replayed float has the first answer's exact bits;
//! `chacha20poly1305` (RustCrypto's AEAD, feature `seal`) seals stored values, with
//! `base64` to write them as text (and to read keys); `hmac` computes the keyed hash a
//! record keeps of its data subject; `foldhash` hashes a key to its slot in the claim
//! gate, on every call, for a few nanoseconds (and a biz name to its shelf in
//! `MemoryStore`: biz names are the service's own, never its callers'); `hashbrown` is
//! the map of `MemoryStore` (std's, with `entry_ref`: a claim hashes its key once and
//! copies it only to insert).
#![cfg_attr(docsrs, feature(doc_cfg))]

mod bounds;
#[cfg(feature = "cache")]
mod cache;
mod call;
mod claim;
mod clock;
mod context;
mod default_store;
pub mod digest;
pub mod duplicates;
mod error;
mod fingerprint;
mod key;
mod memory;
mod model;
pub mod notice;
pub mod observe;
mod operation;
pub mod pages;
mod policy;
mod record;
pub mod repair;
mod replay;
mod retention;
pub mod scoped_key;
#[cfg(feature = "seal")]
#[cfg_attr(docsrs, doc(cfg(feature = "seal")))]
pub mod seal;
mod step;
mod store;
pub mod subject;
pub mod sweeper;
mod tiered;
pub mod token;
pub mod unknown;

#[doc(hidden)]
pub mod __private;

pub use bounds::MAX_DURATION;
#[cfg(feature = "cache")]
#[cfg_attr(docsrs, doc(cfg(feature = "cache")))]
pub use cache::CachedStore;
pub use call::transaction::{Admission, TransactionClaim, TransactionStore};
pub use claim::{fingerprints_agree, Claim, ClaimOutcome, FenceCheck, Lease};
pub use clock::{now, LeaseClock};
pub use context::{context, Context};
pub use default_store::{install, installed, IntoSharedStore};
pub use error::{error_chain, redacted_url, Error, StoreError};
pub use fingerprint::{unordered, Unordered};
pub use key::{MAX_BIZ_CHARS, MAX_KEY_BYTES, TOKEN_NAMESPACE};
pub use memory::MemoryStore;
pub use operation::{Idempotent, DEFAULT_LEASE, DEFAULT_TTL, MAX_REQUEST_BODY};
pub use policy::{Mode, OnError};
pub use record::{Record, Status, UnknownStatus};
pub use retention::{AfterExpiry, Retention, Tombstone, UnknownTombstone};
pub use step::{step, Step};
pub use store::{IdempotencyStore, OwnedStore};
#[cfg(feature = "sweeper")]
#[cfg_attr(docsrs, doc(cfg(feature = "sweeper")))]
pub use sweeper::Sweeper;
pub use tiered::TieredStore;
pub use unknown::{Intent, Lookup};
