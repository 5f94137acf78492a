//! Idempotent NATS JetStream consumers over [`idem`](https://docs.rs/idem)'s stores.
//!
//! JetStream deduplicates publishes by their `Nats-Msg-Id` for its duplicate window
//! (two minutes by default), and delivers at least once. The [`Consumer`] runs an
//! idempotent handler keyed by the message's `Nats-Msg-Id` (or another header, or a
//! function of the message) and acks a message only once its outcome is recorded: a
//! redelivery, or a republish long after the stream's window, replays the first answer
//! and is acked without running again — idem's records are the longer memory.
//!
//! ```no_run
//! use idem_nats::{Consumer, Message};
//! use idem_runtime::Idempotent;
//! use serde::Deserialize;
//!
//! #[derive(Deserialize)]
//! struct OrderPlaced { order: i64, points: i64 }
//!
//! # async fn example(store: idem_runtime::MemoryStore) {
//! let credit = Idempotent::new("credit-points").store(std::sync::Arc::new(store));
//! Consumer::new("nats://127.0.0.1:4222", "ORDERS", "credit")
//!     .run(|message: Message<OrderPlaced>| {
//!         let credit = credit.clone();
//!         async move {
//!             credit.execute(&message.key, async {
//!                 // credit message.body.points to the order's customer …
//!                 Ok::<_, idem_runtime::Error>(message.body.points)
//!             }).await
//!         }
//!     })
//!     .await;
//! # }
//! ```
//!
//! Dependencies: `async-nats` (the official NATS client, with JetStream),
//! `idem-messaging` (the answer table and the poison count, shared with the RabbitMQ
//! consumer), `serde`/`serde_json` (message bodies), `futures-util` (a batch run
//! concurrently), `tokio`, `tracing`.

mod connection;
mod consumer;
mod message;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod relay;
mod window;

pub use connection::NatsError;
pub use consumer::{Consumer, DEFAULT_ACK_WAIT, DEFAULT_BATCH, DEFAULT_REDELIVER_AFTER};
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub use idem_messaging::relay::RelayStats;
pub use idem_messaging::{ConsumerStats, HandlerError, OnFailure, DEFAULT_MAX_ATTEMPTS};
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub use idem_messaging::{Outbox, OutboxMessage};
pub use message::{KeyFn, KeySource, Message, MSG_ID};
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub use relay::{JetStreamBroker, JetStreamSession, Relay, RelayError};
pub use window::DuplicateWindow;

/// The NATS client this crate is built on, for the types its API takes.
pub use async_nats;
