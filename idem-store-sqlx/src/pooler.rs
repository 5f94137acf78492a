//! Statements through a connection pooler in transaction mode.
//!
//! A pooler in transaction mode (PgBouncer's `pool_mode = transaction`, and the
//! managed poolers that behave like it) lends a client one server connection for one
//! transaction, then gives that connection to whichever client asks next. sqlx runs a
//! statement with values in two exchanges (parse it, then bind and execute it), and by
//! default keeps it prepared on the server connection under a name (`sqlx_s_1`, …) for
//! the next call. Behind such a pooler the second exchange, or the next call, may
//! reach another server connection: the statement is missing there, or another
//! client's statement of the same name is (`prepared statement "sqlx_s_1" already
//! exists`, which the other client sees too; or that statement run with these values).
//!
//! With [`Pooler::Transaction`] a store prepares nothing under a name, and runs every
//! statement inside a transaction the pooler keeps on one server connection: nothing a
//! statement leaves on the server outlives its transaction.

use idem_runtime::StoreError;

/// What stands between a store and its PostgreSQL server.
///
/// ```no_run
/// # async fn demo() -> Result<(), idem_runtime::StoreError> {
/// use idem_store_sqlx::{Pooler, PostgresStore};
/// // PgBouncer in transaction mode on port 6432.
/// let store = PostgresStore::connect_with("postgres://app@pgbouncer:6432/shop", Pooler::Transaction).await?;
/// // The same, said in the URL (for `open`, the CLI and the outbox relay).
/// let store = idem_store_sqlx::open("postgres://app@pgbouncer:6432/shop?pooler=transaction").await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Pooler {
    /// The server itself, a pooler in session mode, or one that keeps prepared
    /// statements across its server connections (PgBouncer 1.21 and later with
    /// `max_prepared_statements` above 0): each statement is prepared once per
    /// connection and kept. The default.
    #[default]
    None,
    /// A pooler in transaction mode that does not keep prepared statements (PgBouncer
    /// before 1.21, or with `max_prepared_statements = 0`): every statement unnamed,
    /// inside a transaction of its own (or of the operation's). Costs round trips: see
    /// the benchmark's pooler row.
    Transaction,
}

/// The URL parameter that names the pooler: `?pooler=transaction`.
pub(crate) const URL_PARAMETER: &str = "pooler";

impl Pooler {
    /// Whether statements are prepared under a name and kept on the connection.
    pub(crate) fn prepares(self) -> bool {
        self == Pooler::None
    }

    /// The pooler `url` names with `pooler=none|transaction`, and the URL without that
    /// parameter (which the driver would not know). An unknown value is an error that
    /// says which are known.
    pub fn from_url(url: &str) -> Result<(Pooler, String), StoreError> {
        let Some((base, query)) = url.split_once('?') else {
            return Ok((Pooler::None, url.to_owned()));
        };
        let mut pooler = Pooler::None;
        let mut kept = Vec::new();
        for pair in query.split('&') {
            match pair.split_once('=') {
                Some((URL_PARAMETER, value)) => {
                    pooler = match value {
                        "none" | "session" => Pooler::None,
                        "transaction" => Pooler::Transaction,
                        other => {
                            return Err(StoreError::new(format!(
                                "the URL parameter `{URL_PARAMETER}={other}` names no pooler mode: use \
                                 `{URL_PARAMETER}=transaction` for a pooler in transaction mode (PgBouncer's \
                                 `pool_mode = transaction`), `{URL_PARAMETER}=none` (the default) for a direct \
                                 connection or a session-mode pooler"
                            )))
                        }
                    }
                }
                _ => kept.push(pair),
            }
        }
        let url = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        Ok((pooler, url))
    }
}

/// A connection of the store's pool, lent to one operation.
///
/// A transaction's `BEGIN` that did not finish — its future dropped while the round
/// trip was under way (a waiter that gave up, a heartbeat outrun by the body's end), or
/// an error — may leave the server inside a transaction the driver does not know of,
/// and so never rolls back. Handed to the pool's next borrower (which may be the
/// application's own code, on a pool it shares with the store), that connection would
/// run every later statement inside it, holding its locks, until one fails and fails
/// all the rest. Such a connection is closed when the operation lets it go (the server
/// rolls its transaction back), never returned to the pool.
pub(crate) struct Lent<DB: sqlx::Database> {
    /// The connection.
    pub conn: sqlx::pool::PoolConnection<DB>,
    /// No `BEGIN` on it is unfinished: it may go back to the pool.
    pub settled: bool,
}

impl<DB: sqlx::Database> Lent<DB> {
    /// `conn`, with no `BEGIN` under way.
    pub fn new(conn: sqlx::pool::PoolConnection<DB>) -> Self {
        Lent { conn, settled: true }
    }
}

impl<DB: sqlx::Database> Drop for Lent<DB> {
    fn drop(&mut self) {
        if !self.settled {
            self.conn.close_on_drop();
        }
    }
}

/// Run `$run` — statements on the connection `$conn`, a future of `Result<_,
/// StoreError>` — as one transaction on a connection of `$parts`' pool when its
/// statements are unprepared (`$parts.sql.prepared` false: the pooler lends a server
/// connection only for a transaction), else on the pool itself. `$operation` names the
/// begin's and commit's errors. A statement that fails rolls the transaction back; a
/// `BEGIN` that did not finish closes the connection ([`Lent`]).
macro_rules! on_pool {
    ($parts:expr, $operation:expr, $conn:ident => $run:expr) => {
        async {
            let parts = &$parts;
            if parts.sql.prepared {
                let $conn = &parts.pool;
                $run.await
            } else {
                let mut lent = crate::pooler::Lent::new(
                    parts
                        .pool
                        .acquire()
                        .await
                        .map_err(|e| crate::error::driver_error($operation, e))?,
                );
                let $conn = &mut *lent.conn;
                crate::pooler::within!(false, $operation, Some(&mut lent.settled), $conn => $run).await
            }
        }
    };
}

/// Run `$run` — statements on `$conn`, a `&mut` connection already held, a future of
/// `Result<_, StoreError>` — inside one transaction on it when `$prepared` is false, as
/// [`on_pool!`] does; as it is otherwise. `$settled` (an `Option<&mut bool>`: the
/// [`Lent::settled`] of a connection of the store's pool, `None` for the caller's) is
/// false while the `BEGIN` is under way, and stays false if it fails.
macro_rules! within {
    ($prepared:expr, $operation:expr, $settled:expr, $conn:ident => $run:expr) => {
        async {
            if $prepared {
                $run.await
            } else {
                let failed = |e| crate::error::driver_error($operation, e);
                let mut settled: Option<&mut bool> = $settled;
                if let Some(settled) = settled.as_deref_mut() {
                    *settled = false;
                }
                let mut transaction = sqlx::Connection::begin(&mut *$conn).await.map_err(failed)?;
                if let Some(settled) = settled {
                    *settled = true;
                }
                let result = {
                    let $conn = &mut *transaction;
                    $run.await
                };
                match result {
                    Ok(value) => transaction.commit().await.map(|()| value).map_err(failed),
                    Err(error) => Err(error),
                }
            }
        }
    };
}

pub(crate) use {on_pool, within};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_names_the_pooler_and_loses_the_parameter() {
        let plain = "postgres://app@db:6432/shop";
        assert_eq!(Pooler::from_url(plain).unwrap(), (Pooler::None, plain.to_owned()));
        assert_eq!(
            Pooler::from_url("postgres://app@db:6432/shop?pooler=transaction").unwrap(),
            (Pooler::Transaction, plain.to_owned())
        );
        assert_eq!(
            Pooler::from_url("postgres://app@db/shop?sslmode=require&pooler=transaction&application_name=x").unwrap(),
            (
                Pooler::Transaction,
                "postgres://app@db/shop?sslmode=require&application_name=x".to_owned()
            )
        );
        let wrong = Pooler::from_url("postgres://db/shop?pooler=statement").unwrap_err();
        assert!(wrong.to_string().contains("`pooler=statement` names no pooler mode"), "{wrong}");
        assert!(wrong.to_string().contains("pooler=transaction"), "{wrong}");
    }
}
