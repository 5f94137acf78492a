//! A transaction's `BEGIN`, carried to its end whatever becomes of its caller.
//!
//! sqlx 0.8 counts a transaction only once the server has answered its `BEGIN`. A
//! caller dropped during that round trip (a relay stopped by `run_until` mid-round, an
//! outbox read under a timeout) hands the connection back to the pool with the server
//! inside a transaction that nothing rolls back. The pool's next borrower — the
//! application's own code, on a pool it shares with the relay — would then run every
//! statement inside it, holding its locks, until one fails and fails all the rest.
//!
//! Here the `BEGIN` runs in a task of its own: a caller that goes away leaves that task
//! to finish it, and the transaction it opened is dropped as any other, rolled back
//! before its connection goes back to the pool.

use sqlx::{Database, Pool, Transaction};

/// A transaction on `pool`, opened with `statement` (or the database's own `BEGIN`).
pub(crate) async fn begin<DB: Database>(
    pool: &Pool<DB>,
    statement: Option<&'static str>,
) -> Result<Transaction<'static, DB>, sqlx::Error> {
    let begun = tokio::spawn(opening(pool.clone(), statement));
    match begun.await {
        Ok(transaction) => transaction,
        Err(failed) if failed.is_panic() => std::panic::resume_unwind(failed.into_panic()),
        Err(failed) => Err(sqlx::Error::Io(std::io::Error::other(format!(
            "the runtime shut down while a transaction began: {failed}"
        )))),
    }
}

/// The transaction `statement` opens on `pool`.
async fn opening<DB: Database>(
    pool: Pool<DB>,
    statement: Option<&'static str>,
) -> Result<Transaction<'static, DB>, sqlx::Error> {
    match statement {
        Some(statement) => pool.begin_with(statement).await,
        None => pool.begin().await,
    }
}
