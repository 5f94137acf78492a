//! Idempotent RabbitMQ consumers and a transactional outbox relay, over
//! [`idem`](https://docs.rs/idem)'s stores.
//!
//! Brokers deliver at least once: a consumer that dies before it acks gets the message
//! again, and a producer that loses a confirm publishes again. This crate makes the
//! pair exactly-once in effect:
//!
//! - the **outbox**: the business transaction writes its message into an outbox table
//!   ([`Outbox::push`]) in the same commit as its rows and its idempotency record
//!   (`#[idempotent(tx = tx)]`), so a message exists exactly when the change does;
//! - the **relay** ([`Relay`]) publishes each row with publisher confirms, its row id as
//!   the message id, and marks it sent only after the broker confirmed it — at least
//!   once, never lost;
//! - the **consumer** ([`Consumer`]) runs an idempotent handler keyed by the message
//!   id, and acks a delivery only after its outcome is recorded: a redelivery of a
//!   finished message replays the first answer and is acked without running again.
//!
//! ```no_run
//! use idem_amqp::{AmqpBroker, Consumer, HandlerError, Message, Outbox, OutboxMessage, Relay};
//! use idem_runtime::Idempotent;
//! use lapin::options::QueueDeclareOptions;
//! use lapin::types::FieldTable;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct OrderPlaced { order: i64, points: i64 }
//!
//! # async fn example(pool: sqlx::PgPool, store: idem_runtime::MemoryStore) -> Result<(), Box<dyn std::error::Error>> {
//! let amqp = "amqp://guest:guest@127.0.0.1:5672/%2f";
//! let declare = |channel: lapin::Channel| async move {
//!     channel.queue_declare("orders".into(), QueueDeclareOptions { durable: true, ..Default::default() }, FieldTable::default()).await?;
//!     Ok(())
//! };
//!
//! // In the business transaction: the message, committed with the order.
//! let outbox = Outbox::<sqlx::Postgres>::new();
//! outbox.migrate(&pool).await?;
//! let mut tx = pool.begin().await?;
//! outbox.push(&mut tx, &OutboxMessage::json("", "orders", &OrderPlaced { order: 7, points: 70 })?).await?;
//! tx.commit().await?;
//!
//! // The relay: rows to the broker, confirmed.
//! let relay = Relay::new(pool.clone(), outbox, AmqpBroker::new(amqp).on_connect(declare));
//! tokio::spawn(async move { relay.run().await });
//!
//! // The consumer: one credit per message, however often it is delivered.
//! let credit = Idempotent::new("credit-points").store(std::sync::Arc::new(store));
//! Consumer::new(amqp, "orders")
//!     .on_connect(declare)
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
//! # Ok(()) }
//! ```
//!
//! When the handler's effect lives in the same database as the records, make it
//! transactional (`#[idempotent(key = message.key, biz = …, tx = tx)]`): the effect and
//! its record commit together, so a consumer killed at any point leaves either both or
//! neither, and the redelivery finds the record. A handler whose effect is elsewhere (an
//! SMS gateway, another service) runs in leased mode; a consumer killed after the
//! effect and before the record is the one window where the effect can happen twice,
//! as for any leased call (see idem's reliability notes).
//!
//! What a handler's answer does to its delivery is in [`Consumer`]'s table. Features
//! `postgres`, `mysql` and `sqlite` bring the outbox and the relay on that database.
//!
//! Connections: the consumer and the relay open their own, with the application's
//! lapin `ConnectionProperties` when it gives them (`connection_properties(..)`: client
//! properties, an authentication provider, the locale; TLS comes with the `amqps://`
//! URL and lapin's TLS features). They reconnect by a loop of their own rather than
//! lapin's `auto_recover`, because a session is more than a connection: each new channel
//! declares the topology again ([`Consumer::on_connect`]), sets its prefetch, and
//! starts consuming or publishing afresh, and each lost session is counted
//! ([`ConsumerStats`], [`RelayStats`], [`observe`]) for the operator to see.
//!
//! Why the dependencies: `lapin` is the maintained AMQP 0-9-1 client for tokio;
//! `futures-util` runs a channel's deliveries concurrently up to its prefetch;
//! `sqlx` (by feature) reads and writes the outbox table; `async-trait` keeps the
//! outbox's per-database statements behind one trait; `serde_json` decodes message
//! bodies and encodes outbox messages; `thiserror` and `tracing` for errors and logs;
//! `metrics` (feature `metrics`) exports the consumer's and the relay's counters
//! ([`observe`]).
#![cfg_attr(docsrs, feature(doc_cfg))]

mod answer;
mod connection;
mod consumer;
mod message;
pub mod observe;
mod stall;

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod relay;

pub use connection::DEFAULT_CONNECT_TIMEOUT;
pub use consumer::{Consumer, DEFAULT_PREFETCH, DEFAULT_REDELIVER_AFTER, DEFAULT_STALL_CHECK};
pub use idem_messaging::{ConsumerStats, HandlerError, OnFailure, DEFAULT_MAX_ATTEMPTS};
pub use message::{KeyFn, KeySource, Message};

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub use idem_messaging::relay::{
    RelayStats, DEFAULT_BATCH, DEFAULT_IDLE, DEFAULT_KEEP_SENT, DEFAULT_RELAY_ATTEMPTS, DEFAULT_RETRY_AFTER,
    LONGEST_RETRY,
};
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub use idem_messaging::OutboxDatabase;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub use idem_messaging::{DeadRow, InvalidTableName, Outbox, OutboxCounts, OutboxMessage, DEFAULT_TABLE};
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub use relay::{AmqpBroker, AmqpSession, Relay, RelayError, DEFAULT_CONFIRM_TIMEOUT};

/// The AMQP client, re-exported as is: channels, declarations and options.
pub use lapin;
