//! What differs between the SQL stores, as one crate-private trait, and what they share
//! over it: the parts every store holds, building them for a table, renaming the table.

use std::sync::Arc;

use idem_runtime::StoreError;
use sqlx::{Database, Pool};
use tokio::sync::OnceCell;

use crate::statements::Statements;
use crate::table::{checked_table_name, derived_name, quoted};

/// What every SQL store holds.
pub(crate) struct Parts<DB: Database> {
    pub pool: Pool<DB>,
    /// The statements every dialect shares, for this table. (Shared, as the claim's and
    /// the purge's, so that a clone of the store — one per call that records steps —
    /// copies no SQL.)
    pub sql: Arc<Statements>,
    /// The dialect's one-statement claim.
    pub upsert_sql: Arc<str>,
    /// The dialect's bounded purge.
    pub purge_sql: Arc<str>,
    /// Set once the table's shape was checked (at `migrate` or the first claim).
    pub table_checked: Arc<OnceCell<()>>,
}

impl<DB: Database> Clone for Parts<DB> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            sql: self.sql.clone(),
            upsert_sql: self.upsert_sql.clone(),
            purge_sql: self.purge_sql.clone(),
            table_checked: self.table_checked.clone(),
        }
    }
}

impl<DB: Database> std::fmt::Debug for Parts<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parts")
            .field("pool", &self.pool)
            .field("table", &self.sql.table)
            .finish_non_exhaustive()
    }
}

/// One SQL dialect's store.
pub(crate) trait Dialect: Sized {
    type Db: Database;
    /// How the dialect quotes an identifier.
    const QUOTE: char;
    /// The statements for the table `name`, written `table` (quoted): the shared ones,
    /// the claim, the purge.
    fn statements(name: &str, table: &str) -> (Statements, String, String);
    fn from_parts(parts: Parts<Self::Db>) -> Self;
    fn into_parts(self) -> Parts<Self::Db>;
    fn parts(&self) -> &Parts<Self::Db>;

    /// Learn what the statements depend on of the server (once, with the table's
    /// check): nothing, but on MySQL/MariaDB whether it is a Galera node.
    fn learn_server(&self) -> impl std::future::Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Ok(()))
    }

    /// The statement `get` runs: the shared one, but on a Galera node a causal read.
    fn get_statement(&self) -> &str {
        &self.parts().sql.get
    }
}

/// The quoted name of the index or constraint `suffix` of the table `name`, bounded
/// and distinct however long the table's name.
pub(crate) fn derived_identifier<D: Dialect>(name: &str, suffix: &str) -> String {
    quoted(&derived_name(name, suffix), D::QUOTE)
}

/// A store of dialect `D` on `pool` and the table `name` (already checked).
pub(crate) fn on_table<D: Dialect>(pool: Pool<D::Db>, name: String) -> D {
    let table = quoted(&name, D::QUOTE);
    let (sql, upsert_sql, purge_sql) = D::statements(&name, &table);
    D::from_parts(Parts {
        pool,
        sql: Arc::new(sql),
        upsert_sql: upsert_sql.into(),
        purge_sql: purge_sql.into(),
        table_checked: Arc::default(),
    })
}

/// `store` on the table `name` instead, once the name is checked.
pub(crate) fn renamed<D: Dialect>(store: D, name: &str) -> Result<D, StoreError> {
    Ok(on_table(store.into_parts().pool, checked_table_name(name)?))
}
