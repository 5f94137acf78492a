//! The store on PostgreSQL.

use std::time::SystemTime;

use chrono::{DateTime, Utc};
use idem_runtime::{Claim, StoreError};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::Row;

use crate::claim::Upserted;
use crate::row::{driver_error, granted_lease, record_from_row, utc};
use crate::statements::{upsert_on_conflict, Flavor, Statements};
use crate::store_impl::{bind_claim, impl_idempotency_store};
use crate::table::{checked_table_name, index_prefix, COLUMNS, DEFAULT_TABLE};

/// Where the claim statement's result row holds the granted fence and `created_at`,
/// after the columns of the record that stood in the way.
const GRANTED_AT: usize = 12;

/// Idempotency records in PostgreSQL, instants as `TIMESTAMPTZ`.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
    sql: Statements,
    upsert_sql: String,
    purge_sql: String,
}

impl PostgresStore {
    /// A store on the application's own pool, using the table `idempotent_record`.
    pub fn new(pool: PgPool) -> Self {
        Self::build(pool, DEFAULT_TABLE.to_owned())
    }

    /// Connect a pool to `url` (`postgres://user:pass@host/db`).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let pool = PgPoolOptions::new()
            .connect(url)
            .await
            .map_err(|e| driver_error("connecting to PostgreSQL", e))?;
        Ok(Self::new(pool))
    }

    /// Use the table `name` instead (`table` or `schema.table`).
    pub fn with_table_name(self, name: &str) -> Result<Self, StoreError> {
        Ok(Self::build(self.pool, checked_table_name(name)?))
    }

    fn build(pool: PgPool, table: String) -> Self {
        let flavor = Flavor {
            numbered: true,
            greatest: "GREATEST",
            columns: COLUMNS,
        };
        let sql = Statements::new(&table, &flavor);
        let upsert_sql = upsert_on_conflict(&table, &flavor);
        let stood: Vec<String> = COLUMNS.split(", ").map(|column| format!("stood.{column}")).collect();
        let upsert_sql = format!(
            "WITH granted AS ({upsert_sql}) \
             SELECT {}, granted.fence, granted.created_at \
             FROM (SELECT 1) AS one \
             LEFT JOIN granted ON TRUE \
             LEFT JOIN {table} AS stood ON granted.fence IS NULL AND stood.biz_type = $1 AND stood.idempotent_key = $2",
            stood.join(", ")
        );
        // SKIP LOCKED: a purge never waits behind a claim in flight.
        let purge_sql = format!(
            "DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} \
             WHERE expires_at <= $1 AND (status <> 'PROCESSING' OR lease_until <= $1) \
             LIMIT $2 FOR UPDATE SKIP LOCKED))"
        );
        Self {
            pool,
            sql,
            upsert_sql,
            purge_sql,
        }
    }

    /// Create the table and its `expires_at` index if they do not exist (under an
    /// advisory lock, so concurrent start-ups do not race), then check its columns.
    /// Writes nothing to the application's `_sqlx_migrations`.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let created = self.create_table().await;
        self.verify_migration(created).await
    }

    async fn create_table(&self) -> Result<(), StoreError> {
        let table = &self.sql.table;
        let failed = |e| driver_error("creating the idempotency table", e);
        let mut tx = self.pool.begin().await.map_err(failed)?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
            .bind(table)
            .execute(&mut *tx)
            .await
            .map_err(failed)?;
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {table} (\
               biz_type VARCHAR(64) NOT NULL, \
               idempotent_key VARCHAR(255) NOT NULL, \
               status VARCHAR(16) NOT NULL CHECK (status IN ('PROCESSING', 'SUCCESS', 'FAIL')), \
               fence BIGINT NOT NULL, \
               fingerprint VARCHAR(64), \
               request_body TEXT, \
               response_body TEXT, \
               error_message TEXT, \
               lease_until TIMESTAMPTZ, \
               created_at TIMESTAMPTZ NOT NULL, \
               completed_at TIMESTAMPTZ, \
               expires_at TIMESTAMPTZ NOT NULL, \
               PRIMARY KEY (biz_type, idempotent_key))"
        );
        let index = format!(
            "CREATE INDEX IF NOT EXISTS {}_expires_at ON {table} (expires_at)",
            index_prefix(table)
        );
        for statement in [create, index] {
            sqlx::query(&statement).execute(&mut *tx).await.map_err(failed)?;
        }
        tx.commit().await.map_err(failed)
    }

    fn stamp(at: SystemTime) -> DateTime<Utc> {
        utc(at)
    }

    /// One round trip either way: the claim statement runs in a CTE, and the same
    /// statement returns the record that stood in the way when it refused (as of the
    /// statement's snapshot; a row committed after it is read separately).
    async fn upsert(&self, claim: &Claim<'_>) -> Result<Upserted, StoreError> {
        let row = crate::claim::upsert_retrying_deadlocks(|| {
            bind_claim!(sqlx::query(&self.upsert_sql), claim, Self::stamp).fetch_one(&self.pool)
        })
        .await
        .map_err(|e| driver_error("claim", e))?;
        if let Some(lease) = granted_lease::<_, DateTime<Utc>>(claim, &row, GRANTED_AT)? {
            return Ok(Upserted::Granted(lease));
        }
        let stood: Option<String> = row.try_get(0).map_err(|e| driver_error("claim", e))?;
        match stood {
            Some(_) => Ok(Upserted::Refused(Some(record_from_row::<_, DateTime<Utc>>(&row)?))),
            None => Ok(Upserted::Refused(None)),
        }
    }

    async fn purge(&self, now: SystemTime, limit: u64) -> Result<u64, StoreError> {
        let done = sqlx::query(&self.purge_sql)
            .bind(Self::stamp(now))
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .execute(&self.pool)
            .await
            .map_err(|e| driver_error("purge", e))?;
        Ok(done.rows_affected())
    }
}

impl_idempotency_store!(PostgresStore, sqlx::Postgres, DateTime<Utc>);
