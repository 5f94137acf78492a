//! SQLite, PostgreSQL and MySQL/MariaDB stores for [`idem`](https://docs.rs/idem), each
//! behind the cargo feature of its name, on sqlx 0.8 with runtime queries (no
//! `DATABASE_URL` at build time).
//!
//! Every store keeps one table (default `idempotent_record`) whose primary key is
//! `(biz_type, idempotent_key)`: the unique constraint that holds when caches are lost
//! and processes restart. A store is built from the application's own pool
//! (`XStore::new(pool)`) or from a URL (`XStore::connect(url)`); `migrate()` creates
//! the table and its `expires_at` index idempotently, never touching the
//! application's `_sqlx_migrations`. The pool `connect` makes gives up acquiring after
//! [`ACQUIRE_TIMEOUT`] and lends a connection used in the last [`PING_IF_IDLE_FOR`]
//! without sqlx's ping (a round trip before every statement); a pool of your own keeps
//! its own settings.
//!
//! A claim takes a key atomically in one statement per dialect (`INSERT … ON CONFLICT …
//! DO UPDATE … WHERE <expired or lease lapsed> RETURNING` on PostgreSQL and SQLite; on
//! MySQL an `ON DUPLICATE KEY UPDATE` whose fence increment decides ownership). On
//! PostgreSQL and MySQL/MariaDB a first claim of a key runs a cheaper `INSERT` before it
//! (`ON CONFLICT DO NOTHING`, or a plain `INSERT` that fails with a duplicate key), which
//! changes nothing when a record stands: that record is read and answered, and the
//! statement that takes it over runs only when it is claimable. Every holder write
//! matches the lease's fence and `created_at`; completion is one `UPDATE`.
//!
//! ```no_run
//! # #[cfg(feature = "sqlite")]
//! # async fn example() -> Result<(), idem_runtime::StoreError> {
//! let store = idem_store_sqlx::SqliteStore::connect("sqlite://idem.db").await?;
//! store.migrate().await?;
//! idem_runtime::install(std::sync::Arc::new(store));
//! # Ok(()) }
//! ```
//!
//! Why `chrono`: sqlx encodes `TIMESTAMPTZ` and `DATETIME(6)` through it; `SystemTime`
//! is converted at the edge of each store.
#![cfg_attr(docsrs, feature(doc_cfg))]

/// Items that need a database driver: compiled with any of the features `sqlite`,
/// `postgres` and `mysql` (the one place that list is written).
macro_rules! cfg_driver {
    ($($item:item)*) => {
        $(
            #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
            #[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))))]
            $item
        )*
    };
}

cfg_driver! {
    mod claim;
    mod connection;
    mod dialect;
    mod error;
    mod migration;
    mod pooler;
    mod rollback;
    mod row;
    mod statements;
    mod store_api;
    mod store_impl;
    mod transaction;
}
mod open;
mod shape;
mod table;

#[cfg(feature = "postgres")]
mod listen;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use mysql::MySqlStore;
pub use open::{open, OpenOptions};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use postgres::PostgresStore;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use sqlite::SqliteStore;
pub use table::DEFAULT_TABLE;

/// How many records of one biz are in one status, and how many of those expired
/// (purgeable): a row of `stats()` on the SQL stores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BizStatus {
    /// The business namespace.
    pub biz: String,
    /// The status.
    pub status: idem_runtime::Status,
    /// Records of this biz in this status.
    pub records: u64,
    /// Of those, the ones whose `expires_at` has passed.
    pub expired: u64,
    /// Of those, the tombstones: records kept without their values, past their
    /// replay (stripped by the purge) or erased, until they expire.
    pub tombstones: u64,
}
cfg_driver! {
    pub use connection::{ACQUIRE_TIMEOUT, PING_IF_IDLE_FOR};
    pub use pooler::Pooler;
    pub use statements::numbered;
    pub use transaction::{
    admit, execute_in, transaction, Admitted, BodyFuture, InTransaction, StoreCheck, StoreOf, Table, TransactionCall,
    TransactionDatabase, TransactionParam, Write,
    };
}

/// The sqlx this crate is built on, so that applications name the same version.
pub use sqlx;
