//! Statements the server rolled back: to break a deadlock (InnoDB, PostgreSQL), or
//! because another node's write to the same row certified first (Galera: `ERROR 1213
//! (40001)`). Such a statement changed nothing, so what it means is "another writer
//! got to this row first", never a failure of the store:
//!
//! - a claim that was rolled back **lost the race**: it reads the record that won
//!   (the claim loop, `claim.rs`), and answers with it — replay,
//!   `InProgress` or a wait — or claims again if nothing stands;
//! - a purge is run again: it deleted nothing, and what it deletes is expired either way;
//! - a holder write (renew, complete, fail, record steps, release) on the store's
//!   pool is run again: it matches its lease's fence and life, so a second run after a
//!   rollback is the first run — it finds the record as the winner left it, and a
//!   takeover answers `Lost`.
//!
//! Inside the caller's transaction neither applies: the server rolled back the whole
//! transaction (or, on Galera, refuses its `COMMIT`), which is the caller's to retry.

use std::future::Future;
use std::time::Duration;

use idem_runtime::StoreError;

use crate::error::caused_by;

/// How often a holder write the server rolled back is run again.
const WRITE_ATTEMPTS: u32 = 8;

/// SQLSTATE 40001 (serialization failure: InnoDB's deadlock, Galera's certification
/// conflict, PostgreSQL's serializable conflict) or 40P01 (PostgreSQL's deadlock).
fn is_rollback(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("40001" | "40P01")))
}

/// Whether the claim statement that failed with `error` was rolled back by the
/// server: the claim lost the race to another writer of the key.
pub(crate) fn lost_race(error: &StoreError) -> bool {
    let lost = caused_by(error, is_rollback);
    if lost {
        tracing::debug!(target: "idem", %error, "claim rolled back: another writer of the key came first");
    }
    lost
}

/// Run the holder write `write` again while the server rolls it back, a bounded
/// number of times with a short pause between runs.
pub(crate) async fn retrying<T, F, Fut>(mut write: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut attempt = 1;
    loop {
        match write().await {
            Err(error) if attempt < WRITE_ATTEMPTS && caused_by(&error, is_rollback) => {
                tracing::debug!(target: "idem", %error, attempt, "holder write rolled back; running it again");
                tokio::time::sleep(Duration::from_millis(u64::from(attempt) * 2)).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// A claim in the caller's transaction that the server rolled back: the caller's whole
/// transaction is aborted (PostgreSQL refuses to write in a REPEATABLE READ or
/// SERIALIZABLE snapshot older than the record's commit; a deadlock or a Galera
/// conflict rolls it back). Say so, and what to do; the driver's error stays the
/// cause, so code that retries on SQLSTATE 40001 keeps working.
pub(crate) fn in_transaction(error: StoreError) -> StoreError {
    if !caused_by(&error, is_rollback) {
        return error;
    }
    let message = format!(
        "{}: the server rolled back the caller's transaction (a concurrent call committed this key after the \
         transaction's snapshot was taken, or a deadlock): roll back and run the transaction again — the retry \
         replays the committed answer — or claim first thing in the transaction at READ COMMITTED",
        error.message()
    );
    StoreError::with_source(message, error)
}
