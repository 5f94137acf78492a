//! Driver errors as store errors, and what a store error was caused by.

use idem_runtime::StoreError;

/// A driver error as the backend-independent [`StoreError`], its cause kept, and named
/// where it is one an operator meets on a cluster or behind a pooler.
pub(crate) fn driver_error(operation: &str, error: sqlx::Error) -> StoreError {
    match named_cause(&error) {
        Some(cause) => StoreError::with_source(format!("{operation} failed: {cause}"), error),
        None => StoreError::with_source(format!("{operation} failed"), error),
    }
}

/// A connection a check refused (`sqlx::Error::Configuration`, which says why) as a
/// store error that says it first: `{operation}: {why}`.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn refused(operation: &str, error: sqlx::Error) -> StoreError {
    match &error {
        sqlx::Error::Configuration(why) => {
            let why = why.to_string();
            StoreError::with_source(format!("{operation}: {why}"), error)
        }
        _ => driver_error(operation, error),
    }
}

/// What an operator should read into `error`, when it is a connection's or a
/// server's rather than the statement's.
fn named_cause(error: &sqlx::Error) -> Option<&'static str> {
    let code = match error {
        sqlx::Error::Io(_) => {
            return Some(
                "the connection to the server (or to its pooler) was lost: the server, the pooler or the proxy \
                 restarted or closed it; the statement's outcome is unknown to this call",
            )
        }
        sqlx::Error::Database(db) => db.code(),
        _ => return None,
    };
    Some(match code.as_deref()? {
        "42P05" | "26000" => {
            "the statement's server connection changed between two messages of one statement: the address is a \
             pooler in transaction mode; say so with `?pooler=transaction` in the URL (`Pooler::Transaction`), or \
             let the pooler keep prepared statements (PgBouncer 1.21 or later: `max_prepared_statements`)"
        }
        "25006" => {
            "the server is read-only: a standby, or a primary that a failover demoted; give the store the primary's \
             address (the HA proxy's primary port)"
        }
        "57P01" => "the server ended the connection (pg_terminate_backend, a shutdown, or a failover)",
        "57P02" | "57P03" => "the server is shutting down or starting up (a restart or a failover)",
        "08P01" => "the pooler refused or ended the connection (a pooler restarting, pausing or recycling it)",
        _ => return None,
    })
}

/// Whether `error` was caused by a driver error that `is` recognizes.
pub(crate) fn caused_by(error: &StoreError, is: fn(&sqlx::Error) -> bool) -> bool {
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<sqlx::Error>())
        .is_some_and(is)
}
