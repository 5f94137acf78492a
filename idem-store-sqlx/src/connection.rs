//! Connecting to a server, and saying why a connection could not be had.
//!
//! A pool that cannot connect retries a refused connection until its acquire timeout
//! and then reports only the timeout ("pool timed out while waiting for an open
//! connection"), so the cause an operator needs — connection refused, a wrong
//! password, an unknown database — is lost. The stores connect once on their own first
//! (that error says why), and a call that meets a pool time-out makes one connection of
//! its own to find out why, and puts that under the store error.

use std::time::Duration;

use idem_runtime::StoreError;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use sqlx::{pool::PoolOptions, Connection};
use sqlx::{ConnectOptions, Database, Pool};

#[cfg(any(feature = "postgres", feature = "mysql"))]
use crate::error::driver_error;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use crate::error::refused;

/// How long a call waits for a pooled connection before it fails with
/// [`idem_runtime::Error::Store`] (sqlx's default is 30 s: behind an HTTP layer, every
/// write request would hang that long while the database is down). A pool given to a
/// store's `new(pool)` keeps its own.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// How long the connection that finds out why a pool timed out may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// A pooled connection that went back to the pool this recently is lent without a
/// ping; one idle longer is pinged first, and a dead one replaced. sqlx pings every
/// connection it lends by default: a round trip before every statement, which made a
/// replay two round trips and a first execution four. sqlx also pings each connection
/// as it goes back, so a connection broken while in use never returns to the pool; what
/// the window leaves unchecked is a server lost in the last half second, which meets
/// statements in flight too. (HikariCP skips its check for the same 500 ms.)
pub const PING_IF_IDLE_FOR: Duration = Duration::from_millis(500);

/// A pool connected to `url`, acquiring within [`ACQUIRE_TIMEOUT`]; the error names the
/// server (`label`), the URL (without its password) and the driver's cause. (SQLite
/// opens its file with options of its own.)
#[cfg(feature = "mysql")]
pub(crate) async fn connect<DB: Database>(url: &str, label: &str) -> Result<Pool<DB>, StoreError> {
    let options = url.parse().map_err(|e| connecting(label, url, e))?;
    connect_checked(url, label, options, None).await
}

/// What connecting to `label` at `url` failed with, the URL without its password.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn connecting(label: &str, url: &str, error: sqlx::Error) -> StoreError {
    driver_error(
        &format!("connecting to {label} at `{}`", idem_runtime::redacted_url(url)),
        error,
    )
}

/// A check every new connection must pass before the pool lends it (that the server
/// takes writes, say): its error refuses the connection.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) type Check<DB> =
    for<'c> fn(
        &'c mut <DB as Database>::Connection,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), sqlx::Error>> + Send + 'c>>;

/// [`connect`] with the driver's `options` (parsed from `url`, which names the server
/// in errors), each connection passing `check` where there is one.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn connect_checked<DB: Database>(
    url: &str,
    label: &str,
    options: <DB::Connection as Connection>::Options,
    check: Option<Check<DB>>,
) -> Result<Pool<DB>, StoreError> {
    let failed = |e| connecting(label, url, e);
    // One connection of our own first: a refused or unauthorised one fails at once and
    // says why, where the pool would retry it until its time-out.
    let mut first = tokio::time::timeout(ACQUIRE_TIMEOUT, options.connect())
        .await
        .map_err(|_| failed(sqlx::Error::PoolTimedOut))?
        .map_err(failed)?;
    if let Some(check) = check {
        let checked = check(&mut first).await;
        let _ = first.close().await;
        checked.map_err(|e| refused(&format!("connecting to {label} at `{}`", idem_runtime::redacted_url(url)), e))?;
    } else {
        let _ = first.close().await;
    }
    let pool = PoolOptions::<DB>::new()
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= PING_IF_IDLE_FOR {
                    conn.ping().await?;
                }
                Ok(true)
            })
        });
    let pool = match check {
        Some(check) => pool.after_connect(move |conn, _| check(conn)),
        None => pool,
    };
    Ok(pool.connect_lazy_with(options))
}

/// `result`, with the cause of a pool time-out found and chained under its error.
pub(crate) async fn explained<T, DB: Database>(
    pool: &Pool<DB>,
    result: Result<T, StoreError>,
) -> Result<T, StoreError> {
    let error = match result {
        Err(error) if timed_out(&error) => error,
        other => return other,
    };
    let probe = tokio::time::timeout(PROBE_TIMEOUT, pool.connect_options().connect()).await;
    match probe {
        Ok(Err(cause)) => Err(StoreError::with_source(
            format!(
                "{} (no pooled connection within {:?})",
                error.message(),
                pool.options().get_acquire_timeout()
            ),
            cause,
        )),
        // The server answers now, or did not answer the probe either: the time-out is
        // all there is to say.
        _ => Err(error),
    }
}

fn timed_out(error: &StoreError) -> bool {
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<sqlx::Error>())
        .is_some_and(|e| matches!(e, sqlx::Error::PoolTimedOut))
}
