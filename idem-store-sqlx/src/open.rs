//! One door for all three stores: pick the store by the URL's scheme.

use std::sync::Arc;

use idem_runtime::{IdempotencyStore, LeaseClock, StoreError};

/// Connect to the database at `url` — `sqlite://…`, `postgres://…` (or
/// `postgresql://…`), `mysql://…` (or `mariadb://…`) — with the store of its kind,
/// and [`migrate`](crate::SqliteStore::migrate) its table. The store's cargo feature
/// must be on; a URL of a kind that is off or unknown is an error naming it.
pub async fn open(url: &str) -> Result<Arc<dyn IdempotencyStore>, StoreError> {
    open_table(url, crate::DEFAULT_TABLE).await
}

/// [`open`] on the table `table` instead of `idempotent_record`.
pub async fn open_table(url: &str, table: &str) -> Result<Arc<dyn IdempotencyStore>, StoreError> {
    store_at(url, table, true, LeaseClock::Store).await
}

/// [`open_table`] judging leases by `clock`: [`LeaseClock::Caller`] for tests that move
/// time against a database server (SQLite always judges by the caller's instants).
pub async fn open_table_judged_by(
    url: &str,
    table: &str,
    clock: LeaseClock,
) -> Result<Arc<dyn IdempotencyStore>, StoreError> {
    store_at(url, table, true, clock).await
}

/// A store on the table `table` at `url`, without migrating it: for a table that an
/// operator manages. Its shape is checked at the first claim
/// ([`check_table`](crate::SqliteStore::check_table)).
pub async fn connect_table(url: &str, table: &str) -> Result<Arc<dyn IdempotencyStore>, StoreError> {
    store_at(url, table, false, LeaseClock::Store).await
}

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
