//! The store a URL names, and what each command asks of it.

use std::time::{Duration, SystemTime};

use idem_runtime::redacted_url as redacted;
use idem_runtime::{error_chain as chain, IdempotencyStore, Record, StoreError};

use crate::args::Command;
use idem_store_redis::RedisStore;
use idem_store_sqlx::{BizStatus, MySqlStore, PostgresStore, SqliteStore};

/// One store, by kind: the SQL stores have the operator's lists; every store has the
/// trait.
pub enum Store {
    Sqlite(SqliteStore),
    Postgres(PostgresStore),
    MySql(MySqlStore),
    Redis(RedisStore),
}

/// Forward one call to the store of whatever kind, as `$store`.
macro_rules! on_sql {
    ($self:expr, $store:ident => $call:expr, $what:literal) => {
        match $self {
            Store::Sqlite($store) => $call,
            Store::Postgres($store) => $call,
            Store::MySql($store) => $call,
            Store::Redis(_) => Err(StoreError::new(concat!($what, " is not available on Redis"))),
        }
    };
}

/// What opening the store a URL names came to.
pub enum Opened {
    Store(Store),
    /// No URL, or one of no kind of store idem has: bad usage.
    Usage(String),
    /// The store could not be reached or its table is unusable.
    Failed(String),
}

impl Store {
    /// Connect to the store at `url`, on `table` (SQL), without migrating.
    pub async fn open(url: &str, table: &str) -> Opened {
        match Self::connect(url, table).await {
            Ok(Some(store)) => Opened::Store(store),
            Ok(None) if url.is_empty() => {
                Opened::Usage("no store: give --database-url URL or set DATABASE_URL".to_owned())
            }
            Ok(None) => Opened::Usage(format!(
                "{}: unknown kind of store; use sqlite://, postgres://, mysql:// (or mariadb://) or redis://",
                redacted(url)
            )),
            Err(error) => Opened::Failed(error),
        }
    }

    /// The store at `url`, or `None` for a URL of no kind of store idem has.
    async fn connect(url: &str, table: &str) -> Result<Option<Self>, String> {
        let scheme = url.split_once(':').map_or("", |(scheme, _)| scheme);
        let failed = |e: StoreError| format!("{}: {}", redacted(url), chain(&e));
        let table_set = |e: StoreError| format!("table {table:?}: {}", chain(&e));
        Ok(Some(match scheme {
            "sqlite" => Store::Sqlite(
                SqliteStore::connect(url)
                    .await
                    .map_err(failed)?
                    .with_table_name(table)
                    .map_err(table_set)?,
            ),
            "postgres" | "postgresql" => Store::Postgres(
                PostgresStore::connect(url)
                    .await
                    .map_err(failed)?
                    .with_table_name(table)
                    .map_err(table_set)?,
            ),
            "mysql" | "mariadb" => Store::MySql(
                MySqlStore::connect(&url.replacen("mariadb:", "mysql:", 1))
                    .await
                    .map_err(failed)?
                    .with_table_name(table)
                    .map_err(table_set)?,
            ),
            "redis" | "rediss" => Store::Redis(RedisStore::connect(url).await.map_err(failed)?),
            _ => return Ok(None),
        }))
    }

    /// Why this store cannot run `command` (a usage error), or `None`.
    pub fn refuses(&self, command: &Command) -> Option<String> {
        match self {
            Store::Redis(_) if command.needs_sql() => Some(format!(
                "`idem {}` needs a SQL store (sqlite://, postgres://, mysql://); on Redis there are `show`, \
                 `release` and `purge`",
                command.name()
            )),
            _ => None,
        }
    }

    pub fn shared(&self) -> &dyn IdempotencyStore {
        match self {
            Store::Sqlite(store) => store,
            Store::Postgres(store) => store,
            Store::MySql(store) => store,
            Store::Redis(store) => store,
        }
    }

    /// The store and table, for messages.
    pub fn name(&self) -> String {
        match self {
            Store::Sqlite(store) => format!("SQLite table {}", store.table_name()),
            Store::Postgres(store) => format!("PostgreSQL table {}", store.table_name()),
            Store::MySql(store) => format!("MySQL table {}", store.table_name()),
            Store::Redis(_) => "Redis".to_owned(),
        }
    }

    /// `error` with its causes, and where.
    pub fn describe(&self, error: &StoreError) -> String {
        format!("{}: {}", self.name(), chain(error))
    }

    pub async fn stats(&self, biz: Option<&str>) -> Result<Vec<BizStatus>, StoreError> {
        on_sql!(self, store => store.stats(biz).await, "stats")
    }

    pub async fn oldest_processing(&self, biz: Option<&str>) -> Result<Option<Record>, StoreError> {
        on_sql!(self, store => store.oldest_processing(biz).await, "stats")
    }

    pub async fn stuck(&self, biz: Option<&str>, older_than: Duration, limit: u32) -> Result<Vec<Record>, StoreError> {
        on_sql!(self, store => store.stuck(biz, older_than, limit).await, "stuck")
    }

    pub async fn failed(&self, biz: Option<&str>, limit: u32) -> Result<Vec<Record>, StoreError> {
        on_sql!(self, store => store.failed(biz, limit).await, "failed")
    }

    pub async fn unsettled(&self, biz: Option<&str>, limit: u32) -> Result<Vec<Record>, StoreError> {
        match self {
            Store::Sqlite(store) => store.unsettled(biz, limit).await,
            Store::Postgres(store) => store.unsettled(biz, limit).await,
            Store::MySql(store) => store.unsettled(biz, limit).await,
            Store::Redis(store) => store.unsettled(biz, limit).await,
        }
    }

    pub async fn forget_failed(&self, biz: &str, key: &str) -> Result<bool, StoreError> {
        on_sql!(self, store => store.forget_failed(biz, key).await, "retry-failed")
    }

    pub async fn migrate(&self) -> Result<(), StoreError> {
        on_sql!(self, store => store.migrate().await, "migrate")
    }

    pub async fn migration_sql(&self) -> Result<String, StoreError> {
        match self {
            Store::Sqlite(store) => Ok(store.migration_sql()),
            Store::Postgres(store) => Ok(store.migration_sql()),
            Store::MySql(store) => store.migration_sql().await,
            Store::Redis(_) => Err(StoreError::new("migrate is not available on Redis")),
        }
    }

    pub async fn check(&self) -> Result<(), StoreError> {
        on_sql!(self, store => store.check_table().await, "check")
    }

    pub async fn get(&self, biz: &str, key: &str) -> Result<Option<Record>, StoreError> {
        self.shared().get(biz, key).await
    }

    pub async fn purge(&self, batch: u64) -> Result<u64, StoreError> {
        self.shared().purge_expired(SystemTime::now(), batch).await
    }
}
