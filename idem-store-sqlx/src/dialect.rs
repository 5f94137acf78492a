//! What differs between the SQL stores, as one crate-private trait, and what they share
//! over it: the parts every store holds, building them for a table, renaming the table.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use idem_runtime::notice::Notice;
use idem_runtime::{Claim, FenceCheck, Lease, LeaseClock, Record, StoreError};
use sqlx::{Database, Encode, Executor, IntoArguments, Pool, Type};
use tokio::sync::OnceCell;

use crate::claim::{FirstClaim, Inserted};
use idem_runtime::duplicates::{Duplicates, FirstLook};
use crate::error::driver_error;
use crate::pooler::on_pool;
use crate::pooler::Pooler;
use crate::row::Stamp;
use crate::shape::{Column, Need, UniqueKey};
use crate::statements::{ServerClock, StatementClock, Statements};
use crate::table::{checked_table_name, derived_name, quoted};

/// What every SQL store holds.
pub(crate) struct Parts<DB: Database> {
    pub pool: Pool<DB>,
    /// The statements every dialect shares, for this table. (Shared, as the claim's and
    /// the purge's, so that a clone of the store — one per call that records steps —
    /// copies no SQL.)
    pub sql: Arc<Statements>,
    /// The dialect's one-statement claim.
    pub upsert_sql: Arc<str>,
    /// The dialect's claim of a key nobody holds, tried first where it has one.
    pub insert_sql: Option<Arc<str>>,
    /// The same claim that also reads the record in its way, where the dialect has
    /// one (on MariaDB, learned with the server): tried first instead while claims
    /// often meet records.
    pub insert_and_read_sql: Arc<OnceLock<Arc<str>>>,
    /// How often the store's claims meet a record.
    pub duplicates: Arc<Duplicates>,
    /// The dialect's bounded purge.
    pub purge_sql: Arc<str>,
    /// The dialect's bounded strip of records past their replay to tombstones, run
    /// with the purge (and bound as it is).
    pub strip_sql: Arc<str>,
    /// The store's listener for completions, started by the first watch.
    #[cfg(feature = "postgres")]
    pub listening: Arc<OnceCell<crate::listen::Listening>>,
    /// Set once the table's shape was checked (at `migrate` or the first claim).
    pub table_checked: Arc<OnceCell<()>>,
    /// The statements as a server that applies its cluster's commits after they return
    /// (a Galera node) needs them, learned with the table's check: each waits until the
    /// server has applied what the cluster committed before it. Every read of a record
    /// runs so; a holder write the server refused runs so again, since a lagging node
    /// may not have the lease's claim yet.
    pub causal: Arc<OnceLock<Arc<Statements>>>,
}

impl<DB: Database> Parts<DB> {
    /// The statement a claim on the pool starts with, where the dialect has one: the
    /// insert that also reads what stands in its way while claims often (but not nearly
    /// always) meet records, the plain insert otherwise — after a plain read, when
    /// nearly every claim meets a record.
    pub fn first_claim(&self) -> Option<FirstClaim<'_>> {
        match self.insert_and_read_sql.get() {
            Some(reading) if self.duplicates.first_look(true) == FirstLook::InsertThatReads => Some(FirstClaim {
                sql: reading,
                reads: true,
            }),
            _ => self.insert_sql.as_deref().map(|sql| FirstClaim { sql, reads: false }),
        }
    }

    /// Run a holder write with the shared statements; refused where the server applies
    /// its cluster's commits late, run it again with the statements that wait for
    /// them. A node behind the cluster may not have the lease's claim yet: its refusal
    /// says nothing of the lease until it has caught up. (A write it let through on an
    /// old row needs no second look: the cluster rolls it back at certification.)
    pub async fn held<'s, F, Fut>(&'s self, write: F) -> Result<FenceCheck, StoreError>
    where
        F: Fn(&'s Statements) -> Fut,
        Fut: Future<Output = Result<FenceCheck, StoreError>>,
    {
        match (write(&self.sql).await, self.causal.get()) {
            (Ok(FenceCheck::Lost), Some(causal)) => write(causal).await,
            (written, _) => written,
        }
    }
}

impl<DB: Database> Clone for Parts<DB> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            sql: self.sql.clone(),
            upsert_sql: self.upsert_sql.clone(),
            insert_sql: self.insert_sql.clone(),
            insert_and_read_sql: self.insert_and_read_sql.clone(),
            duplicates: self.duplicates.clone(),
            purge_sql: self.purge_sql.clone(),
            strip_sql: self.strip_sql.clone(),
            #[cfg(feature = "postgres")]
            listening: self.listening.clone(),
            table_checked: self.table_checked.clone(),
            causal: self.causal.clone(),
        }
    }
}

impl<DB: Database> std::fmt::Debug for Parts<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parts")
            .field("pool", &self.pool)
            .field("table", &self.sql.table)
            .finish_non_exhaustive()
    }
}

/// What a dialect's claim statement came to.
pub(crate) enum Upserted {
    /// The key is ours.
    Granted(Lease),
    /// Refused; the record that stood in the way when the statement could return it.
    Refused(Option<Record>),
}

/// A SQL store: the [`Parts`] it holds, on its database. (`store_impl.rs` writes it.)
pub(crate) trait Stored: Sized + Send + Sync + 'static {
    type Db: Database + sqlx::database::HasStatementCache;
    fn from_parts(parts: Parts<Self::Db>) -> Self;
    fn parts(&self) -> &Parts<Self::Db>;

    /// What stands between the store and its server.
    fn pooler(&self) -> Pooler {
        if self.parts().sql.prepared {
            Pooler::None
        } else {
            Pooler::Transaction
        }
    }

    /// Whose clock the store's statements judge leases by.
    fn lease_clock(&self) -> LeaseClock {
        if self.parts().sql.server_clock {
            LeaseClock::Store
        } else {
            LeaseClock::Caller
        }
    }
}

/// A SQL dialect's store: everything that differs between SQLite, PostgreSQL and
/// MySQL/MariaDB. The trait impl, the public methods and the transactional claim
/// (`store_impl.rs`, `store_api.rs`, `transaction.rs`) are written once over it.
pub(crate) trait Dialect: Stored {
    /// How an instant is bound and read back.
    type Stamp: Stamp + Clone + Send + Sync;
    /// What [`lock_wait_begin`](Self::lock_wait_begin) replaced, for
    /// [`lock_wait_end`](Self::lock_wait_end) to restore.
    type LockWait: Send;
    /// How the dialect quotes an identifier.
    const QUOTE: char;
    /// `$1, $2, …` placeholders (PostgreSQL) instead of `?`.
    const NUMBERED: bool;
    /// The larger of two values: `GREATEST` or SQLite's scalar `MAX`.
    const GREATEST: &'static str;
    /// The select list: [`COLUMNS`](crate::table::COLUMNS), or the dialect's way of
    /// reading them as text.
    const COLUMNS: &'static str;
    /// `biz_type` as text, for the lists that group by it.
    const BIZ_TEXT: &'static str;
    /// What makes the read of a refused claim in the caller's transaction read the
    /// latest committed record rather than the transaction's snapshot (`LOCK IN SHARE
    /// MODE` on MySQL, whose REPEATABLE READ reads a snapshot; empty where the claim
    /// statement already did, or where nothing can).
    const LOCKING_READ: &'static str = "";
    /// The server's clock, which every statement judges leases and expiry by when the
    /// store's clock is asked for; `None` where the caller's instants are always bound
    /// (SQLite lives on its host's clock).
    const SERVER_CLOCK: Option<ServerClock>;
    /// The columns added since the first version of the table, each with the type
    /// `migrate` gives it when a table made before it lacks it.
    const ADDED_COLUMNS: &'static [(&'static str, &'static str)];

    /// The statement that adds `column` of type `ty` to the table `name` (written
    /// `quoted`), with the index it needs where the dialect makes it there.
    fn add_column_sql(name: &str, quoted: &str, column: &str, ty: &str) -> String {
        let _ = name;
        format!("ALTER TABLE {quoted} ADD COLUMN {column} {ty}")
    }
    /// What the statements need of each column.
    const NEEDS: &'static [Need];

    /// The one statement that claims a key of the table written `table` (quoted),
    /// judged by `clock` (the server's or the caller's). Binds:
    /// biz, key, fingerprint, request body, then on the caller's clock lease end, now,
    /// expiry, first fence — on the server's, the lease's and the record's lengths.
    fn claim_statement(table: &str, clock: StatementClock) -> String;
    /// A cheaper claim of a key nobody holds, tried on the store's pool before
    /// [`claim_statement`](Self::claim_statement) where the dialect has one: it inserts
    /// the record or, when one stands, changes nothing (the claim then reads it, and
    /// takes it over with the claim statement only if it is claimable). Binds as the
    /// claim statement's.
    fn insert_statement(table: &str, clock: StatementClock) -> Option<String> {
        let _ = (table, clock);
        None
    }

    /// [`insert_statement`](Self::insert_statement) that also returns the record in
    /// its way, with the server's instant of the statement — a replay in one round
    /// trip — where every server of the dialect has one (MariaDB's is learned with
    /// the server). Binds as the claim statement's.
    fn insert_and_read_statement(table: &str, clock: StatementClock) -> Option<String> {
        let _ = (table, clock);
        None
    }

    /// Run `insert` — [`insert_statement`](Self::insert_statement), or the one that
    /// also reads — on `conn`: the lease when it inserted the record, else the record
    /// in its way where it read it.
    fn insert_if_absent(
        conn: &mut <Self::Db as Database>::Connection,
        insert: FirstClaim<'_>,
        sql: &Statements,
        claim: &Claim<'_>,
    ) -> impl Future<Output = Result<Inserted, StoreError>> + Send {
        let _ = (conn, insert, sql, claim);
        std::future::ready(Err(StoreError::new("this dialect has no insert-if-absent claim")))
    }

    /// The bounded purge of the table written `table`, judged by `clock`. Binds: now (none
    /// on the server's clock; twice where the dialect repeats it), limit.
    fn purge_statement(table: &str, clock: StatementClock) -> String;

    /// The bounded strip of the finished records past their replay to expired
    /// tombstones ([`strippable`](crate::statements::strippable)), bound exactly as
    /// [`purge_statement`](Self::purge_statement) is.
    fn strip_statement(table: &str, clock: StatementClock) -> String;

    /// The purge binds the caller's `now` twice (MySQL's `?` cannot be used again).
    const PURGE_REPEATS_NOW: bool = false;

    /// Run the claim statement `upsert` on `conn`: granted, or refused with the record
    /// that stood in the way when the statement can tell (else the caller reads it,
    /// with `get`).
    fn upsert(
        conn: &mut <Self::Db as Database>::Connection,
        upsert: &str,
        get: &str,
        sql: &Statements,
        claim: &Claim<'_>,
    ) -> impl Future<Output = Result<Upserted, StoreError>> + Send;

    /// Bound a claim's wait for another transaction's lock on `conn` by `wait`.
    fn lock_wait_begin(
        conn: &mut <Self::Db as Database>::Connection,
        wait: Duration,
    ) -> impl Future<Output = Result<Self::LockWait, StoreError>> + Send;

    /// Restore what `lock_wait_begin` changed; `claimed` says whether the claim
    /// succeeded (else the dialect may undo its statement).
    fn lock_wait_end(
        conn: &mut <Self::Db as Database>::Connection,
        restore: Self::LockWait,
        claimed: bool,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The error of a lock wait that ran out.
    fn is_lock_wait(error: &sqlx::Error) -> bool;

    /// How many rows a statement changed.
    fn rows_changed(done: &<Self::Db as Database>::QueryResult) -> u64;

    /// The table's columns and unique keys, from the catalog.
    fn read_shape(&self) -> impl Future<Output = Result<(Vec<Column>, Vec<UniqueKey>), StoreError>> + Send;

    /// Delete up to `limit` records that expired by `now` — by the server's clock where
    /// the dialect has one — never a live claim, then strip up to `limit` records past
    /// their replay to tombstones; each run again while the server rolls it back.
    /// Returns how many were deleted.
    fn purge(&self, now: SystemTime, limit: u64) -> impl Future<Output = Result<u64, StoreError>> + Send
    where
        for<'c> &'c Pool<Self::Db>: Executor<'c, Database = Self::Db>,
        for<'c> &'c mut <Self::Db as Database>::Connection: Executor<'c, Database = Self::Db>,
        for<'q> <Self::Db as Database>::Arguments<'q>: IntoArguments<'q, Self::Db>,
        for<'q> Self::Stamp: Encode<'q, Self::Db> + Type<Self::Db>,
        for<'q> i64: Encode<'q, Self::Db> + Type<Self::Db>,
    {
        let now = Self::Stamp::of(now);
        let run = move |sql: &'static str, statement: Arc<str>| {
            let now = now.clone();
            move || {
                let (now, statement) = (now.clone(), statement.clone());
                async move {
                    let parts = self.parts();
                    let mut query = parts.sql.query(&statement);
                    if !parts.sql.server_clock {
                        query = query.bind(now.clone());
                        if Self::PURGE_REPEATS_NOW {
                            query = query.bind(now);
                        }
                    }
                    let query = query.bind(i64::try_from(limit).unwrap_or(i64::MAX));
                    let done = on_pool!(parts, sql, conn => async {
                        query.execute(conn).await.map_err(|e| driver_error(sql, e))
                    })
                    .await?;
                    Ok(Self::rows_changed(&done))
                }
            }
        };
        let (purge, strip) = (
            run("purge", self.parts().purge_sql.clone()),
            run("purge (tombstones)", self.parts().strip_sql.clone()),
        );
        // A purge the server rolled back (a deadlock, a Galera certification conflict
        // with another node's write) deleted nothing: it is run again, as a holder
        // write is. So is the strip.
        async move {
            let purged = crate::rollback::retrying(purge).await?;
            crate::rollback::retrying(strip).await?;
            Ok(purged)
        }
    }

    /// `write`, a holder write that ends a wait (completes, fails or frees a record of
    /// the table `name`), as it also tells the key's waiters in other processes, where
    /// the dialect can: the same write, where it cannot. The statement still reports
    /// one changed row when it wrote.
    fn announced(write: String, name: &str) -> String {
        let _ = name;
        write
    }

    /// Ask to be told when the record of `(biz, key)` finishes
    /// ([`IdempotencyStore::watch`](idem_runtime::IdempotencyStore::watch)): `None`
    /// where the dialect cannot tell.
    fn watch(&self, biz: &str, key: &str) -> impl Future<Output = Result<Option<Notice>, StoreError>> + Send {
        let _ = (biz, key);
        std::future::ready(Ok(None))
    }

    /// Learn what the statements depend on of the server (once, with the table's
    /// check): nothing, but on MySQL/MariaDB whether it is a Galera node.
    fn learn_server(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Ok(()))
    }

    /// The statement `get` runs: the shared one, unless the server needs another.
    fn get_statement(&self) -> &str {
        let parts = self.parts();
        parts.causal.get().map_or(&parts.sql.get, |causal| &causal.get)
    }
}

/// The quoted name of the index or constraint `suffix` of the table `name`, bounded
/// and distinct however long the table's name.
pub(crate) fn derived_identifier<D: Dialect>(name: &str, suffix: &str) -> String {
    quoted(&derived_name(name, suffix), D::QUOTE)
}

/// A store of dialect `D` on `pool` and the table `name` (already checked), judging
/// leases by the server's clock, its statements prepared.
pub(crate) fn on_table<D: Dialect>(pool: Pool<D::Db>, name: String) -> D {
    on_table_judged_by(pool, name, LeaseClock::Store, Pooler::None)
}

/// A store of dialect `D` on `pool` and the table `name` (already checked), judging
/// leases by `clock`, behind `pooler`.
pub(crate) fn on_table_judged_by<D: Dialect>(pool: Pool<D::Db>, name: String, clock: LeaseClock, pooler: Pooler) -> D {
    let table = quoted(&name, D::QUOTE);
    let clock = StatementClock::of::<D>(clock);
    let mut sql = Statements::new::<D>(&name, &table, clock);
    sql.prepared = pooler.prepares();
    D::from_parts(Parts {
        pool,
        sql: Arc::new(sql),
        upsert_sql: D::claim_statement(&table, clock).into(),
        insert_sql: D::insert_statement(&table, clock).map(Into::into),
        insert_and_read_sql: Arc::new(
            D::insert_and_read_statement(&table, clock).map_or_else(OnceLock::new, |sql| OnceLock::from(Arc::from(sql))),
        ),
        duplicates: Arc::default(),
        purge_sql: D::purge_statement(&table, clock).into(),
        strip_sql: D::strip_statement(&table, clock).into(),
        table_checked: Arc::default(),
        causal: Arc::default(),
        #[cfg(feature = "postgres")]
        listening: Arc::default(),
    })
}

/// `store` on the table `name` instead, once the name is checked.
pub(crate) fn renamed<D: Dialect>(store: D, name: &str) -> Result<D, StoreError> {
    Ok(on_table_judged_by(
        store.parts().pool.clone(),
        checked_table_name(name)?,
        store.lease_clock(),
        store.pooler(),
    ))
}

/// `store` judging leases by `clock` instead.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn judged_by<D: Dialect>(store: D, clock: LeaseClock) -> D {
    let parts = store.parts();
    on_table_judged_by(parts.pool.clone(), parts.sql.table.clone(), clock, store.pooler())
}

/// `store` behind `pooler` instead.
#[cfg(feature = "postgres")]
pub(crate) fn behind<D: Dialect>(store: D, pooler: Pooler) -> D {
    let parts = store.parts();
    on_table_judged_by(parts.pool.clone(), parts.sql.table.clone(), store.lease_clock(), pooler)
}
