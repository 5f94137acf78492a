//! What idem's message consumers and outbox relays share, whatever the broker: the
//! table that turns a handler's answer into the broker's verdict on a delivery
//! ([`Disposition`]), the policy for a message that can never succeed ([`OnFailure`]),
//! the trait that lets a consumer read idem's error out of a handler's
//! ([`HandlerError`]), and the count that ends a poison message's loop ([`Attempts`]);
//! [`verdict`] puts them together for one delivery. Sessions that come back when the
//! broker goes away ([`session`]). With a database feature (`postgres`, `mysql`,
//! `sqlite`), the outbox table written in the business transaction, and the relay that
//! publishes it over a small [`relay::Broker`] trait (`Relay`), which each broker crate
//! implements: `idem-amqp` for RabbitMQ, `idem-nats` for NATS JetStream.
//!
//! ```
//! use idem_messaging::{Attempts, Disposition};
//!
//! // A handler answered with idem's `InProgress`: the message is redelivered later.
//! let answer: Result<(), idem_runtime::Error> = Err(idem_runtime::Error::InProgress {
//!     biz: "credit".into(),
//!     key: "order-7".into(),
//! });
//! assert_eq!(Disposition::of(&answer), Disposition::Redeliver);
//!
//! // A body that keeps failing is final at the bound.
//! let attempts = Attempts::new(2);
//! assert_eq!(attempts.count("order-8", Disposition::Redeliver, true, 0), Disposition::Redeliver);
//! assert_eq!(attempts.count("order-8", Disposition::Redeliver, true, 0), Disposition::Final);
//! ```
//!
//! Dependencies: `idem-runtime` (its error is what the table reads), `tracing` (a
//! message that failed for good is logged), `futures-util` (a handler's panic caught as
//! a failed run), `tokio` (pauses between sessions and rounds; a transaction's `BEGIN`
//! finished in a task of its own), `sqlx` (by feature: the outbox table), `async-trait`
//! (the outbox's per-database statements behind one trait), `serde`/`serde_json`
//! (outbox messages), `thiserror` (errors).

#![cfg_attr(docsrs, feature(doc_cfg))]

mod attempts;
mod backoff;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod begin;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod dialect;
mod disposition;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod outbox;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub mod relay;
pub mod session;
mod stats;
mod verdict;

pub use attempts::{Attempts, DEFAULT_MAX_ATTEMPTS};
pub use backoff::Backoff;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub use dialect::{Failure, OutboxDatabase};
pub use disposition::{Disposition, HandlerError, OnFailure};
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub use outbox::{DeadRow, InvalidTableName, Outbox, OutboxCounts, OutboxMessage, OutboxRow, DEFAULT_TABLE};
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub use relay::{Broker, Relay, RelayError, RelayStats};
pub use stats::{ConsumerStats, Counters};
pub use verdict::verdict;
