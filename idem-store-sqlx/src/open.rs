//! One door for all three stores: pick the store by the URL's scheme.

use std::sync::Arc;

use idem_runtime::{IdempotencyStore, LeaseClock, StoreError};

/// Connect to the database at `url` — `sqlite://…`, `postgres://…` (or
/// `postgresql://…`), `mysql://…` (or `mariadb://…`) — with the store of its kind,
/// and [`migrate`](crate::SqliteStore::migrate) its table. The store's cargo feature
/// must be on; a URL of a kind that is off or unknown is an error naming it.
/// [`OpenOptions`] opens another table, without migrating, or judging leases by the
/// caller's clock.
pub async fn open(url: &str) -> Result<Arc<dyn IdempotencyStore>, StoreError> {
    OpenOptions::new().open(url).await
}

/// How [`open`] opens a store: which table, whether to migrate it, whose clock judges
/// leases. As `std::fs::OpenOptions`, set what differs from the defaults and call
/// [`open`](Self::open).
///
/// ```no_run
/// # async fn demo() -> Result<(), idem_runtime::StoreError> {
/// // An operator's table, migrated by the team's own migrations: only checked.
/// let store = idem_store_sqlx::OpenOptions::new()
///     .table("payments_idempotency")
///     .migrate(false)
///     .open("postgres://app@db/shop")
///     .await?;
/// # let _ = store; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct OpenOptions {
    table: String,
    migrate: bool,
    clock: LeaseClock,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl OpenOptions {
    /// The table `idempotent_record`, migrated, leases judged by the store's clock.
    pub fn new() -> Self {
        Self {
            table: crate::DEFAULT_TABLE.to_owned(),
            migrate: true,
            clock: LeaseClock::Store,
        }
    }

    /// The table to keep the records in (default `idempotent_record`).
    pub fn table(mut self, table: &str) -> Self {
        self.table = table.to_owned();
        self
    }

    /// Whether to create the table and its index when missing (default `true`). Without
    /// it, a table an operator manages is only checked, at the first claim
    /// ([`check_table`](crate::SqliteStore::check_table)).
    pub fn migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    /// Whose clock judges leases and expiry (default [`LeaseClock::Store`]):
    /// [`LeaseClock::Caller`] for tests that move time against a database server
    /// (SQLite always judges by the caller's instants).
    pub fn lease_clock(mut self, clock: LeaseClock) -> Self {
        self.clock = clock;
        self
    }

    /// Connect to the database at `url` (a URL as [`open`] takes) with these options.
    pub async fn open(&self, url: &str) -> Result<Arc<dyn IdempotencyStore>, StoreError> {
        store_at(url, &self.table, self.migrate, self.clock).await
    }
}

// With no driver feature every URL is refused, and the options go unread.
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(unused_variables)
)]
async fn store_at(
    url: &str,
    table: &str,
    migrate: bool,
    clock: LeaseClock,
) -> Result<Arc<dyn IdempotencyStore>, StoreError> {
    let scheme = url.split_once(':').map_or("", |(scheme, _)| scheme);
    match scheme {
        #[cfg(feature = "sqlite")]
        "sqlite" => {
            let _ = clock; // one host: the caller's instants
            let store = crate::SqliteStore::connect(url).await?.with_table_name(table)?;
            if migrate {
                store.migrate().await?;
            }
            Ok(Arc::new(store))
        }
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => {
            let store = crate::PostgresStore::connect(url)
                .await?
                .with_table_name(table)?
                .with_lease_clock(clock);
            if migrate {
                store.migrate().await?;
            }
            Ok(Arc::new(store))
        }
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => {
            let store = crate::MySqlStore::connect(&url.replacen("mariadb:", "mysql:", 1))
                .await?
                .with_table_name(table)?
                .with_lease_clock(clock);
            if migrate {
                store.migrate().await?;
            }
            Ok(Arc::new(store))
        }
        other => Err(StoreError::new(format!(
            "no idempotency store for URL scheme `{other}:` in this build: use sqlite://, postgres:// or mysql:// \
             with the cargo feature of the same name (on: {})",
            enabled_features()
        ))),
    }
}

fn enabled_features() -> String {
    let features = [
        (cfg!(feature = "sqlite"), "sqlite"),
        (cfg!(feature = "postgres"), "postgres"),
        (cfg!(feature = "mysql"), "mysql"),
    ];
    let on: Vec<&str> = features.iter().filter(|(on, _)| *on).map(|(_, name)| *name).collect();
    if on.is_empty() {
        "none".to_owned()
    } else {
        on.join(", ")
    }
}
