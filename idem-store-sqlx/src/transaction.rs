//! Transactional mode on the SQL stores: the claim and the record written on the
//! caller's own `sqlx::Transaction`, committed or rolled back with the business writes.
//!
//! [`execute_in`] is the API; `#[idempotent(tx = ...)]` expands to the same two halves
//! ([`admit`], then [`TransactionCall::record`]).
//!
//! A duplicate whose first call's transaction is still open waits for it like any
//! statement of the connection waits for a lock: the claim is one statement in the
//! caller's transaction, and costs nothing else. When the operation sets `wait`, the
//! claim bounds its wait by it instead — at the price of two more round trips (one
//! more statement on SQLite's in-process connection), to set the bound and restore it:
//!
//! | database | without `wait`: the connection's own bound, and at its end | with `wait`: the bound | a claim that waited out `wait` |
//! |---|---|---|---|
//! | PostgreSQL | `lock_timeout` (default: none); the transaction is aborted, to be rolled back | `lock_timeout`, set under a savepoint and restored | rolled back to the savepoint, the transaction goes on |
//! | MySQL / MariaDB | `innodb_lock_wait_timeout` (default 50 s); InnoDB rolls back the statement alone | `innodb_lock_wait_timeout`, whole seconds (rounded up), restored | the statement alone is rolled back |
//! | SQLite | the connection's `busy_timeout` (sqlx's default 5 s; a store's own pool 10 s) | `busy_timeout`, restored | the statement alone |
//!
//! Either way, a claim that waited out is [`Error::InProgress`]. A deadlock rolls back
//! the whole transaction on PostgreSQL and MySQL, as it would for any statement.
//!
//! The isolation level is the caller's. At READ COMMITTED (PostgreSQL's default) a
//! duplicate replays the committed answer. At REPEATABLE READ (MySQL's default) a
//! duplicate whose transaction read before its claim, while the first call committed in
//! between, still replays on MySQL (the refused claim is read with a locking read, which
//! reads the latest commit); PostgreSQL cannot write in a snapshot older than the
//! record's commit and fails the claim with a serialization failure (SQLSTATE 40001,
//! kept in the error's chain, with a message saying to run the transaction again): the
//! transaction is aborted, and its retry replays. SQLite should claim before the
//! transaction reads anything (a read snapshot older than a concurrent commit makes
//! SQLite refuse the write, reported as [`Error::InProgress`]). No isolation level runs
//! a body twice.

use std::any::Any;
use std::fmt::Display;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use idem_runtime::{
    Admission, Claim, ClaimOutcome, Error, FenceCheck, IdempotencyStore, Idempotent, Lease, StoreError,
    TransactionClaim, TransactionStore,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::statements::Statements;

/// The statements of one table, as transactional mode writes them.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct Table {
    pub(crate) sql: Arc<Statements>,
    pub(crate) upsert_sql: Arc<str>,
}

/// A holder write in a transaction.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub enum Write<'a> {
    Complete(&'a str, SystemTime, Duration),
    Fail(&'a str, SystemTime, Duration),
    Release,
}

pub(crate) mod sealed {
    pub trait Sealed {}
}

/// The databases transactional mode runs on: `sqlx::Sqlite`, `sqlx::Postgres`,
/// `sqlx::MySql` (MySQL and MariaDB), each with its store's feature.
pub trait TransactionDatabase: sqlx::Database + sealed::Sealed {
    /// The database's name, for messages.
    #[doc(hidden)]
    const LABEL: &'static str;

    /// The table of `store`, when it is this database's store.
    #[doc(hidden)]
    fn table_of(store: &dyn Any) -> Option<Table>;

    /// The default table, `idempotent_record`.
    #[doc(hidden)]
    fn default_table() -> Table;

    /// The claim, its wait bounded by `wait` (else by the connection's own bound);
    /// `None` when the key stayed locked.
    #[doc(hidden)]
    fn claim_in(
        conn: &mut Self::Connection,
        table: &Table,
        claim: &Claim<'_>,
        wait: Option<Duration>,
    ) -> impl Future<Output = Result<Option<ClaimOutcome>, StoreError>> + Send;

    /// A holder write.
    #[doc(hidden)]
    fn write_in(
        conn: &mut Self::Connection,
        table: &Table,
        lease: &Lease,
        write: Write<'_>,
    ) -> impl Future<Output = Result<FenceCheck, StoreError>> + Send;
}

/// The table a transactional call of `op` writes: that of `store` (given to the call or
/// to the operation), else that of the installed store when it is a store of the same
/// database, else `idempotent_record`.
fn table_for<DB: TransactionDatabase>(op: &Idempotent, store: Option<&dyn IdempotencyStore>) -> Result<Table, Error> {
    let given = store.or_else(|| op.given_store().map(|store| &**store as &dyn IdempotencyStore));
    if given.map_or_else(|| idem_runtime::installed().is_some_and(|store| store.seals()), |store| store.seals()) {
        return Err(Error::InvalidOption {
            biz: op.biz().to_owned(),
            option: "store",
            reason: "the store seals its values, and a transactional call writes its record in the \
                     transaction, past the seal, in clear: leave `tx` out for a sealed record (leased \
                     mode, with steps for the effects), or give this call a store that does not seal"
                .to_owned(),
        });
    }
    match given {
        // Not given: the installed store's table when it is one of this database's.
        None => Ok(idem_runtime::installed()
            .and_then(|store| store.as_any().and_then(DB::table_of))
            .unwrap_or_else(DB::default_table)),
        Some(store) => store
            .as_any()
            .and_then(DB::table_of)
            .ok_or_else(|| Error::InvalidOption {
                biz: op.biz().to_owned(),
                option: "store",
                reason: format!(
                    "a transactional call on {} needs a {} store to find its table, and was given a `{}`: \
                     pass `store = ` a {} store of the transaction's database, or leave `store` out to use \
                     the installed one (or the table `idempotent_record`)",
                    DB::LABEL,
                    DB::LABEL,
                    store.kind(),
                    DB::LABEL
                ),
            }),
    }
}

/// The claim and the record of one call, written on one open transaction's connection.
#[doc(hidden)]
pub struct InTransaction<'c, DB: TransactionDatabase> {
    conn: &'c mut DB::Connection,
    table: &'c Table,
}

impl<DB: TransactionDatabase> TransactionStore for InTransaction<'_, DB> {
    async fn claim(&mut self, claim: &Claim<'_>, wait: Option<Duration>) -> Result<Option<ClaimOutcome>, StoreError> {
        DB::claim_in(self.conn, self.table, claim, wait).await
    }

    async fn complete(
        &mut self,
        lease: &Lease,
        response: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<FenceCheck, StoreError> {
        DB::write_in(self.conn, self.table, lease, Write::Complete(response, now, ttl)).await
    }

    async fn fail(
        &mut self,
        lease: &Lease,
        message: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<FenceCheck, StoreError> {
        DB::write_in(self.conn, self.table, lease, Write::Fail(message, now, ttl)).await
    }

    async fn release(&mut self, lease: &Lease) -> Result<FenceCheck, StoreError> {
        DB::write_in(self.conn, self.table, lease, Write::Release).await
    }
}

/// What [`admit`] came to.
#[doc(hidden)]
pub enum Admitted<'a, DB, T> {
    /// Claimed in the transaction: run the body, then record.
    Claimed(TransactionCall<'a, DB>),
    /// A committed call's value.
    Replayed(T),
}

/// A call claimed in a transaction.
#[doc(hidden)]
pub struct TransactionCall<'a, DB> {
    claim: TransactionClaim<'a>,
    table: Table,
    _db: PhantomData<fn() -> DB>,
}

/// The first half of a transactional call: resolve the table, claim `key` in `tx`, or
/// answer from the committed record.
#[doc(hidden)]
pub async fn admit<'a, DB, T>(
    op: &'a Idempotent,
    store: Option<&dyn IdempotencyStore>,
    tx: &mut sqlx::Transaction<'_, DB>,
    key: String,
) -> Result<Admitted<'a, DB, T>, Error>
where
    DB: TransactionDatabase,
    T: DeserializeOwned,
{
    let table = table_for::<DB>(op, store)?;
    let mut bound = InTransaction::<DB> {
        conn: &mut **tx,
        table: &table,
    };
    Ok(match op.admit_in(&mut bound, key).await? {
        Admission::Claimed(claim) => Admitted::Claimed(TransactionCall {
            claim,
            table,
            _db: PhantomData,
        }),
        Admission::Replayed(value) => Admitted::Replayed(value),
    })
}

impl<DB: TransactionDatabase> TransactionCall<'_, DB> {
    /// Run the body in the call's context.
    pub async fn run<F: Future>(&self, body: F) -> F::Output {
        self.claim.run(body).await
    }

    /// The second half: write the outcome in `tx`, then answer.
    pub async fn record<T, E>(
        self,
        tx: &mut sqlx::Transaction<'_, DB>,
        outcome: Result<T, E>,
        describe: fn(&E) -> String,
    ) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
    {
        let mut bound = InTransaction::<DB> {
            conn: &mut **tx,
            table: &self.table,
        };
        self.claim.record(&mut bound, outcome, describe).await
    }
}

/// The future of an [`execute_in`] body, boxed as sqlx's own `Connection::transaction`
/// takes it: a boxed future can borrow the transaction it is handed and still be `Send`
/// (an `async` closure's future cannot be proven `Send` for every borrow, so a task
/// could not be spawned on it).
pub type BodyFuture<'c, T, E> = std::pin::Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'c>>;

/// Run `body` at most once for `key`, in the caller's transaction `tx`: the claim, the
/// body's writes (on the `tx` it is handed) and the record commit together when the
/// caller commits `tx`, and vanish together if it rolls back, crashes or drops it.
///
/// A duplicate whose first call's transaction is still open waits for it in the
/// database, up to the operation's `wait` (else as long as the connection lets any
/// statement wait for a lock: PostgreSQL's `lock_timeout`, InnoDB's
/// `innodb_lock_wait_timeout`, SQLite's `busy_timeout`), then replays the committed
/// result — or claims, if the first rolled back — or fails with [`Error::InProgress`]. An `Err` from the body is released or recorded `FAIL` (per
/// `on_error`) in `tx` before it is returned. Any error from idem itself means `tx`
/// should be rolled back.
///
/// The table is the operation's store's (a store of `tx`'s database), else the installed
/// store's when it is one, else `idempotent_record`.
///
/// ```no_run
/// use idem_runtime::{Error, Idempotent};
/// use idem_store_sqlx::{execute_in, sqlx, TransactionDatabase};
///
/// // Any of the three databases: `tx` is the caller's open transaction.
/// async fn pay<DB: TransactionDatabase>(tx: &mut sqlx::Transaction<'_, DB>) -> Result<i64, Error> {
///     let pay = Idempotent::new("pay");
///     execute_in(&pay, tx, "order-7", |tx| {
///         Box::pin(async move {
///             let _ = tx; // the business writes go here: `sqlx::query(..).execute(&mut **tx)`
///             Ok::<_, Error>(199)
///         })
///     })
///     .await
///     // the caller commits `tx`: the writes and the SUCCESS record, or neither
/// }
/// ```
pub async fn execute_in<'t, DB, T, E, F>(
    op: &Idempotent,
    tx: &mut sqlx::Transaction<'t, DB>,
    key: impl Display,
    body: F,
) -> Result<T, E>
where
    DB: TransactionDatabase,
    T: Serialize + DeserializeOwned,
    E: From<Error>,
    F: for<'c> FnOnce(&'c mut sqlx::Transaction<'t, DB>) -> BodyFuture<'c, T, E>,
{
    let call = match admit::<DB, T>(op, None, tx, key.to_string()).await? {
        Admitted::Replayed(value) => return Ok(value),
        Admitted::Claimed(call) => call,
    };
    let outcome = call.run(body(&mut *tx)).await;
    let describe = |error: &E| {
        use idem_runtime::__private::DescribeByType;
        idem_runtime::__private::Describe(error).describe()
    };
    call.record(tx, outcome, describe).await
}

/// What `tx = ...` may name: the caller's open transaction, by mutable reference.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`tx` must name a `&mut sqlx::Transaction<'_, DB>` parameter, not `{Self}`",
    label = "the transaction the claim and the record are written in",
    note = "declare the parameter as `tx: &mut sqlx::Transaction<'_, sqlx::Postgres>` (or `Sqlite`, `MySql`) and \
            pass `&mut tx` from `pool.begin().await?`; the caller commits it"
)]
pub trait TransactionParam {
    /// The transaction.
    type Transaction;
    /// Itself.
    fn transaction(self) -> Self::Transaction;
}

impl<'t, 'c, DB: TransactionDatabase> TransactionParam for &'t mut sqlx::Transaction<'c, DB> {
    type Transaction = Self;
    fn transaction(self) -> Self {
        self
    }
}

/// The parameter `tx = ...` names, checked to be a transaction (a compile error on it
/// otherwise).
#[doc(hidden)]
pub fn transaction<T: TransactionParam>(tx: T) -> T::Transaction {
    tx.transaction()
}

/// A store whose table transactional mode may write in a transaction of `DB`: that
/// database's store, or a shared `dyn IdempotencyStore` (checked when the call runs).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`store = ...` is a `{Self}`, which is not a store of the transaction's database ({DB})",
    label = "a store of another database",
    note = "pass the `SqliteStore`, `PostgresStore` or `MySqlStore` of the transaction's database, or leave `store` \
            out to use the installed one"
)]
pub trait StoreOf<DB> {}

impl<DB> StoreOf<DB> for dyn IdempotencyStore {}
impl<DB, S: StoreOf<DB> + ?Sized> StoreOf<DB> for Arc<S> {}
impl<DB, S: StoreOf<DB> + ?Sized> StoreOf<DB> for &S {}

/// The database of `tx`, fixed first, so that a store of another one is reported as
/// such (a compile error on `store = ...`), not as a mismatched transaction.
#[doc(hidden)]
pub struct StoreCheck<DB>(PhantomData<fn() -> DB>);

impl<DB: TransactionDatabase> StoreCheck<DB> {
    /// The check for `tx`'s database.
    pub fn of(tx: &sqlx::Transaction<'_, DB>) -> Self {
        let _ = tx;
        StoreCheck(PhantomData)
    }

    /// `store` may serve a transaction of this database.
    pub fn store<S: StoreOf<DB> + ?Sized>(self, store: &S) {
        let _ = store;
    }
}

/// `TransactionDatabase` for one store's database (`$db`, its
/// [`Dialect::Db`](crate::dialect::Dialect::Db)), over the store's dialect: its
/// statements, its claim and its lock wait.
macro_rules! impl_transaction_database {
    ($store:ty, $db:ty, $label:literal) => {
        impl crate::transaction::sealed::Sealed for $db {}

        impl crate::transaction::StoreOf<$db> for $store {}

        impl crate::transaction::TransactionDatabase for $db {
            const LABEL: &'static str = $label;

            fn table_of(store: &dyn std::any::Any) -> Option<crate::transaction::Table> {
                store.downcast_ref::<$store>().map(|store| crate::transaction::Table {
                    sql: store.parts.sql.clone(),
                    upsert_sql: store.parts.upsert_sql.clone(),
                })
            }

            fn default_table() -> crate::transaction::Table {
                static DEFAULT: std::sync::LazyLock<crate::transaction::Table> = std::sync::LazyLock::new(|| {
                    use crate::dialect::Dialect;
                    let name = crate::table::DEFAULT_TABLE;
                    let quoted = crate::table::quoted(name, <$store>::QUOTE);
                    let clock = crate::statements::StatementClock::of::<$store>(idem_runtime::LeaseClock::Store);
                    crate::transaction::Table {
                        sql: std::sync::Arc::new(crate::statements::Statements::new::<$store>(name, &quoted, clock)),
                        upsert_sql: <$store>::claim_statement(&quoted, clock).into(),
                    }
                });
                DEFAULT.clone()
            }

            async fn claim_in(
                conn: &mut Self::Connection,
                table: &crate::transaction::Table,
                claim: &idem_runtime::Claim<'_>,
                wait: Option<std::time::Duration>,
            ) -> Result<Option<idem_runtime::ClaimOutcome>, idem_runtime::StoreError> {
                use crate::dialect::Dialect;
                // Without `wait`, the claim waits as every statement of the connection
                // does, and costs no statement besides its own.
                let restore = match wait {
                    Some(wait) => Some(<$store>::lock_wait_begin(&mut *conn, wait).await?),
                    None => None,
                };
                let mut site = crate::claim::OnConnection::<$store> {
                    conn: &mut *conn,
                    settled: None,
                    upsert: &table.upsert_sql,
                    get: &table.sql.get_in_transaction,
                    // In the caller's transaction the claim statement alone decides, as it
                    // always has: its row lock is the one a duplicate waits on.
                    insert: None,
                    duplicates: None,
                    sql: &table.sql,
                    pinned: true,
                };
                let outcome = crate::claim::claim_or_read(claim, &mut site, crate::claim::RolledBack::Aborted).await;
                let locked = matches!(&outcome, Err(error) if crate::error::caused_by(error, <$store>::is_lock_wait));
                if let Some(restore) = restore {
                    <$store>::lock_wait_end(&mut *conn, restore, outcome.is_ok()).await?;
                }
                match outcome {
                    Ok(outcome) => Ok(Some(outcome)),
                    Err(_) if locked => Ok(None),
                    Err(error) => Err(crate::rollback::in_transaction(error)),
                }
            }

            async fn write_in(
                conn: &mut Self::Connection,
                table: &crate::transaction::Table,
                lease: &idem_runtime::Lease,
                write: crate::transaction::Write<'_>,
            ) -> Result<idem_runtime::FenceCheck, idem_runtime::StoreError> {
                use crate::transaction::Write;
                match write {
                    Write::Complete(response, now, ttl) => {
                        let query = <$store>::finish(&table.sql, &table.sql.complete, response, now, ttl, lease);
                        <$store>::write_held(&mut *conn, "complete", query, lease).await
                    }
                    Write::Fail(message, now, ttl) => {
                        let query = <$store>::finish(&table.sql, &table.sql.fail, message, now, ttl, lease);
                        <$store>::write_held(&mut *conn, "fail", query, lease).await
                    }
                    Write::Release => <$store>::release_in(conn, &table.sql, lease).await,
                }
            }
        }
    };
}

pub(crate) use impl_transaction_database;
