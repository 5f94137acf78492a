//! The store a URL names, and what each command asks of it.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use idem_runtime::redacted_url as redacted;
use idem_runtime::seal::{SealedStore, StaticKeyRing};
use idem_runtime::{error_chain as chain, IdempotencyStore, Record, StoreError};

use crate::args::Command;
use idem_store_redis::RedisStore;
use idem_store_sqlx::{BizStatus, MySqlStore, PostgresStore, SqliteStore};

/// The store a command works on: its backend, and the seal its values are opened with
/// when the application seals them (`--seal-keys`).
pub struct Store {
    backend: Backend,
    sealed: Option<SealedStore>,
}

/// One store, by kind: the SQL stores have the operator's lists; every store has the
/// trait.
pub enum Backend {
    Sqlite(SqliteStore),
    Postgres(PostgresStore),
    MySql(MySqlStore),
    Redis(RedisStore),
}

/// Forward one call to the store of whatever kind, as `$store`.
macro_rules! on_sql {
    ($self:expr, $store:ident => $call:expr, $what:literal) => {
        match &$self.backend {
            Backend::Sqlite($store) => $call,
            Backend::Postgres($store) => $call,
            Backend::MySql($store) => $call,
            Backend::Redis(_) => Err(StoreError::new(concat!($what, " is not available on Redis"))),
        }
    };
}

impl Backend {
    /// A handle on the backend's store (its pool shared), for a wrapper to own.
    fn to_shared(&self) -> Arc<dyn IdempotencyStore> {
        match self {
            Backend::Sqlite(store) => Arc::new(store.clone()),
            Backend::Postgres(store) => Arc::new(store.clone()),
            Backend::MySql(store) => Arc::new(store.clone()),
            Backend::Redis(store) => Arc::new(store.clone()),
        }
    }
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
    /// Connect to the store at `url`, on `table` (SQL), without migrating; with
    /// `seal_keys` (a key ring's text), values are opened with that ring, bound to
    /// `table`.
    pub async fn open(url: &str, table: &str, seal_keys: &str) -> Opened {
        let ring = match seal_keys.trim() {
            "" => None,
            keys => match StaticKeyRing::parse(keys, "--seal-keys") {
                Ok(ring) => Some(ring),
                Err(error) => return Opened::Usage(error.to_string()),
            },
        };
        match Self::connect(url, table).await {
            Ok(Some(backend)) => {
                let sealed = ring.map(|ring| SealedStore::new(backend.to_shared(), ring).table(table));
                Opened::Store(Store { backend, sealed })
            }
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
    async fn connect(url: &str, table: &str) -> Result<Option<Backend>, String> {
        let scheme = url.split_once(':').map_or("", |(scheme, _)| scheme);
        let failed = |e: StoreError| format!("{}: {}", redacted(url), chain(&e));
        let table_set = |e: StoreError| format!("table {table:?}: {}", chain(&e));
        Ok(Some(match scheme {
            "sqlite" => Backend::Sqlite(
                SqliteStore::connect(url)
                    .await
                    .map_err(failed)?
                    .with_table_name(table)
                    .map_err(table_set)?,
            ),
            "postgres" | "postgresql" => Backend::Postgres(
                PostgresStore::connect(url)
                    .await
                    .map_err(failed)?
                    .with_table_name(table)
                    .map_err(table_set)?,
            ),
            "mysql" | "mariadb" => Backend::MySql(
                MySqlStore::connect(&url.replacen("mariadb:", "mysql:", 1))
                    .await
                    .map_err(failed)?
                    .with_table_name(table)
                    .map_err(table_set)?,
            ),
            "redis" | "rediss" => Backend::Redis(RedisStore::connect(url).await.map_err(failed)?),
            _ => return Ok(None),
        }))
    }

    /// Why this store cannot run `command` (a usage error), or `None`.
    pub fn refuses(&self, command: &Command) -> Option<String> {
        match self.backend {
            Backend::Redis(_) if command.needs_sql() => Some(format!(
                "`idem {}` needs a SQL store (sqlite://, postgres://, mysql://); on Redis there are `show`, \
                 `release` and `purge`",
                command.name()
            )),
            _ => None,
        }
    }

    /// The backend's records, a page at a time, for a walk over all of them.
    pub fn pages(&self) -> &dyn idem_runtime::pages::RecordPages {
        match &self.backend {
            Backend::Sqlite(store) => store,
            Backend::Postgres(store) => store,
            Backend::MySql(store) => store,
            Backend::Redis(store) => store,
        }
    }

    /// The seal the application's values are opened with, when the keys were given.
    pub fn sealed(&self) -> Option<&SealedStore> {
        self.sealed.as_ref()
    }

    /// The store through the trait: sealed values opened (and what a repair writes
    /// sealed) when the command was given the keys.
    pub fn shared(&self) -> &dyn IdempotencyStore {
        if let Some(sealed) = &self.sealed {
            return sealed;
        }
        match &self.backend {
            Backend::Sqlite(store) => store,
            Backend::Postgres(store) => store,
            Backend::MySql(store) => store,
            Backend::Redis(store) => store,
        }
    }

    /// The backend, for what works on its tables directly (the outbox).
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// `records`, as a list query returned them, with their values opened when the
    /// command was given the keys.
    fn opened(&self, records: Vec<Record>) -> Result<Vec<Record>, StoreError> {
        records.into_iter().map(|record| self.open_record(record)).collect()
    }

    /// `record` with its values opened when the command was given the keys.
    fn open_record(&self, record: Record) -> Result<Record, StoreError> {
        match &self.sealed {
            Some(sealed) => sealed.open_record(record),
            None => Ok(record),
        }
    }

    /// The store and table, for messages.
    pub fn name(&self) -> String {
        match &self.backend {
            Backend::Sqlite(store) => format!("SQLite table {}", store.table_name()),
            Backend::Postgres(store) => format!("PostgreSQL table {}", store.table_name()),
            Backend::MySql(store) => format!("MySQL table {}", store.table_name()),
            Backend::Redis(_) => "Redis".to_owned(),
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
        let oldest = on_sql!(self, store => store.oldest_processing(biz).await, "stats")?;
        oldest.map(|record| self.open_record(record)).transpose()
    }

    pub async fn stuck(&self, biz: Option<&str>, older_than: Duration, limit: u32) -> Result<Vec<Record>, StoreError> {
        self.opened(on_sql!(self, store => store.stuck(biz, older_than, limit).await, "stuck")?)
    }

    pub async fn failed(&self, biz: Option<&str>, limit: u32) -> Result<Vec<Record>, StoreError> {
        self.opened(on_sql!(self, store => store.failed(biz, limit).await, "failed")?)
    }

    pub async fn unsettled(&self, biz: Option<&str>, limit: u32) -> Result<Vec<Record>, StoreError> {
        let records = match &self.backend {
            Backend::Sqlite(store) => store.unsettled(biz, limit).await,
            Backend::Postgres(store) => store.unsettled(biz, limit).await,
            Backend::MySql(store) => store.unsettled(biz, limit).await,
            Backend::Redis(store) => store.unsettled(biz, limit).await,
        }?;
        self.opened(records)
    }

    pub async fn forget_failed(&self, biz: &str, key: &str) -> Result<bool, StoreError> {
        on_sql!(self, store => store.forget_failed(biz, key).await, "retry-failed")
    }

    pub async fn migrate(&self) -> Result<(), StoreError> {
        on_sql!(self, store => store.migrate().await, "migrate")
    }

    pub async fn migration_sql(&self) -> Result<String, StoreError> {
        match &self.backend {
            Backend::Sqlite(store) => Ok(store.migration_sql()),
            Backend::Postgres(store) => Ok(store.migration_sql()),
            Backend::MySql(store) => store.migration_sql().await,
            Backend::Redis(_) => Err(StoreError::new("migrate is not available on Redis")),
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
