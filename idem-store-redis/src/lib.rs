//! A Redis store for [idem](https://docs.rs/idem): the records, leases, fences and
//! expiry of the SQL stores, on Redis 7 or a Redis Cluster.
//!
//! ```no_run
//! use std::sync::Arc;
//! use idem_runtime::Idempotent;
//! use idem_store_redis::RedisStore;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379/0").await?;
//! let pay = Idempotent::new("pay").store(Arc::new(store));
//! let receipt: u64 = pay.execute("order-7", async { Ok::<_, idem_runtime::Error>(199) }).await?;
//! # Ok(()) }
//! ```
//!
//! # Layout
//!
//! One hash per record, at `{prefix}{<length of biz>:<biz>:<key>}` (`idem:{3:pay:order-7}`;
//! the prefix is `idem:` unless [`RedisStore::with_prefix`] says otherwise). Its fields
//! are the record's columns: `status`, `fence`, `fingerprint`, `request_body`,
//! `response_body`, `error_message`, `lease_until`, `created_at`, `completed_at`,
//! `expires_at` (instants in microseconds since the epoch), `steps`, `claimant` (the
//! claim call that holds it) and `written_by` (the write call that finished it). The braces are the cluster hash tag: one record is
//! one key, on one slot, and no script ever touches two records.
//!
//! Every change is one Lua script ([`redis::Script`]: `EVALSHA`, loaded on `NOSCRIPT`):
//! the claim (insert, take over after the lease or after expiry, or answer the record
//! in the way), and the holder's writes (renew, complete, fail, release, steps), each
//! checking the holder's fence and life inside the script. `expires_at` is checked by
//! the scripts; Redis deletes the hash itself [`keep_expired`](RedisStore::keep_expired)
//! later (24 h by default), and [`purge_expired`](idem_runtime::IdempotencyStore::purge_expired)
//! deletes expired records sooner with `SCAN` (every primary of a cluster), a script per
//! key.
//!
//! # Traps, and how the store meets them
//!
//! - *Fences after a restart without persistence.* A new record's fence is the claim's
//!   instant in microseconds, as on the SQL stores, never 1: a record lost with the
//!   server and claimed again starts above every fence handed out before.
//! - *Sent twice.* `ConnectionManager` gives back the error of a command in flight when
//!   its connection breaks, without knowing whether it ran; a cluster client resends on
//!   its own. The store resends a script whose reply was lost (up to 3 sends), and every
//!   script is written to be applied once: a claim recognizes its own claimant and
//!   answers with the lease it granted; a `complete` or `fail` that finds its own
//!   write recorded (by the id of the write call, kept as `written_by`) answers
//!   `Held`. Another call's write of the same lease is refused, as on the SQL stores.
//! - *Eviction.* Under any `maxmemory-policy` but `noeviction`, Redis may delete live
//!   records to make room, and a duplicate whose record was evicted runs again.
//!   Every constructor ([`RedisStore::connect`], [`RedisStore::connect_cluster`],
//!   [`RedisStore::from_manager`], [`RedisStore::from_cluster`]) reads the policy of
//!   every primary and refuses to start otherwise — the `volatile-*` policies too,
//!   since every record has a time to live.
//! - *CROSSSLOT.* A record is one key, tagged; the scripts take one key each.
//!
//! # What a claim on Redis guarantees
//!
//! A script runs atomically, so two claims of one key never both win on one server.
//! What survives a crash is Redis's persistence:
//!
//! - `appendonly yes` with `appendfsync always`: a claim acknowledged is on disk; a
//!   restarted server has it. Each write pays an fsync.
//! - `appendfsync everysec` (Redis's default with AOF): up to a second of claims and
//!   outcomes can be lost with the server. A duplicate arriving after the restart finds
//!   no record and runs again.
//! - no persistence: a restart loses every record.
//! - *failover*: replication is asynchronous. A claim acknowledged by a primary that
//!   fails before its replica received it is gone on the promoted replica, and a
//!   duplicate runs again (`WAIT` narrows the window; it does not close it).
//!
//! What the fence still protects in every case: a holder that lost its claim (its
//! record taken over, or gone and claimed again) can never write its outcome over the
//! new holder's, because the new record's fence differs. What it cannot protect is a
//! body run twice because the first claim vanished. When a second execution is not
//! acceptable after a crash or failover, choose a SQL store (a committed claim is
//! durable), or the SQL store behind a cache ([`CachedStore`](idem_runtime::CachedStore)):
//! the cache answers hot duplicates without a round trip, and the SQL claim stays the
//! decision.
//!
//! Duplicates that wait for a call in another process are told when it ends: the
//! holder's write publishes the record's key on `<prefix>notices` when a waiter marked
//! the record, and the store's one subscriber connection (opened at the first wait, on
//! the URL given to [`connect`](RedisStore::connect) or
//! [`connect_cluster`](RedisStore::connect_cluster), or to
//! [`listen_on`](RedisStore::listen_on) for a store on the application's own client)
//! wakes them. A notice lost to a dropped connection costs a read, never an answer.
//!
//! Why the dependencies: `redis` (async, with `ConnectionManager` for reconnection and
//! `cluster-async` for Redis Cluster) is the client the Rust ecosystem keeps;
//! `futures-util` reads its pub/sub stream.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod connection;
mod notice;
mod record;
mod store;

pub use redis;
pub use store::{RedisStore, DEFAULT_KEEP_EXPIRED, DEFAULT_PREFIX};
