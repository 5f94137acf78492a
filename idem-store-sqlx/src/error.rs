//! Driver errors as store errors, and what a store error was caused by.

use idem_runtime::StoreError;

/// A driver error as the backend-independent [`StoreError`], its cause kept.
pub(crate) fn driver_error(operation: &str, error: sqlx::Error) -> StoreError {
    StoreError::with_source(format!("{operation} failed"), error)
}

/// Whether `error` was caused by a driver error that `is` recognizes.
pub(crate) fn caused_by(error: &StoreError, is: fn(&sqlx::Error) -> bool) -> bool {
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<sqlx::Error>())
        .is_some_and(is)
}
