//! The `IdempotencyStore` impl every SQL store shares.
//!
//! The three stores differ in their driver types, their claim statement and their
//! purge statement; everything else is the same code over [`Statements`]. sqlx's
//! generic `Database` bounds for that code would outweigh it, so a macro writes the
//! impl once per concrete store. A store provides:
//! `pool: Pool<$db>`, `sql: Statements`, `fn stamp(SystemTime) -> $stamp`,
//! `async fn upsert(&self, &Claim) -> Result<Option<Lease>, StoreError>` and
//! `async fn purge(&self, SystemTime, u64) -> Result<u64, StoreError>`.
//!
//! [`Statements`]: crate::statements::Statements

macro_rules! impl_idempotency_store {
    ($store:ty, $db:ty, $stamp:ty) => {
        #[async_trait::async_trait]
        impl idem_runtime::IdempotencyStore for $store {
            async fn claim(
                &self,
                claim: &idem_runtime::Claim<'_>,
            ) -> Result<idem_runtime::ClaimOutcome, idem_runtime::StoreError> {
                self.ensure_table().await?;
                crate::claim::claim_or_read(claim, || self.upsert(claim), || self.get(claim.biz, claim.key)).await
            }

            async fn renew(
                &self,
                lease: &idem_runtime::Lease,
                now: std::time::SystemTime,
                lease_for: std::time::Duration,
            ) -> Result<idem_runtime::FenceCheck, idem_runtime::StoreError> {
                let until = Self::stamp(now + lease_for);
                let query = sqlx::query(&self.sql.renew).bind(until.clone()).bind(until);
                self.write_held("renew", query, lease).await
            }

            async fn complete(
                &self,
                lease: &idem_runtime::Lease,
                response: &str,
                now: std::time::SystemTime,
                ttl: std::time::Duration,
            ) -> Result<idem_runtime::FenceCheck, idem_runtime::StoreError> {
                let query = sqlx::query(&self.sql.complete)
                    .bind(response)
                    .bind(Self::stamp(now))
                    .bind(Self::stamp(now))
                    .bind(Self::stamp(now + ttl));
                self.write_held("complete", query, lease).await
            }

            async fn fail(
                &self,
                lease: &idem_runtime::Lease,
                message: &str,
                now: std::time::SystemTime,
                ttl: std::time::Duration,
            ) -> Result<idem_runtime::FenceCheck, idem_runtime::StoreError> {
                let query = sqlx::query(&self.sql.fail)
                    .bind(message)
                    .bind(Self::stamp(now))
                    .bind(Self::stamp(now))
                    .bind(Self::stamp(now + ttl));
                self.write_held("fail", query, lease).await
            }

            async fn release(
                &self,
                lease: &idem_runtime::Lease,
            ) -> Result<idem_runtime::FenceCheck, idem_runtime::StoreError> {
                self.write_held("release", sqlx::query(&self.sql.release), lease)
                    .await
            }

            async fn get(
                &self,
                biz: &str,
                key: &str,
            ) -> Result<Option<idem_runtime::Record>, idem_runtime::StoreError> {
                let row = sqlx::query(&self.sql.get)
                    .bind(biz)
                    .bind(key)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(|e| crate::row::driver_error("get", e))?;
                row.as_ref()
                    .map(crate::row::record_from_row::<_, $stamp>)
                    .transpose()
            }

            async fn purge_expired(
                &self,
                now: std::time::SystemTime,
                limit: u64,
            ) -> Result<u64, idem_runtime::StoreError> {
                self.purge(now, limit).await
            }
        }

        impl $store {
            /// Bind the lease to a holder write and run it: one row changed means the
            /// lease still held.
            async fn write_held<'q>(
                &self,
                operation: &'static str,
                query: sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments<'q>>,
                lease: &'q idem_runtime::Lease,
            ) -> Result<idem_runtime::FenceCheck, idem_runtime::StoreError> {
                let fence = i64::try_from(lease.fence).unwrap_or(i64::MAX);
                let done = query
                    .bind(lease.biz.as_str())
                    .bind(lease.key.as_str())
                    .bind(fence)
                    .bind(Self::stamp(lease.created_at))
                    .execute(&self.pool)
                    .await
                    .map_err(|e| crate::row::driver_error(operation, e))?;
                Ok(if done.rows_affected() == 0 {
                    idem_runtime::FenceCheck::Lost
                } else {
                    idem_runtime::FenceCheck::Held
                })
            }

            /// `PROCESSING` records created at least `older_than` ago (the oldest
            /// first): claims whose holder may have died, for reconciliation.
            pub async fn stuck(
                &self,
                older_than: std::time::Duration,
                limit: u32,
            ) -> Result<Vec<idem_runtime::Record>, idem_runtime::StoreError> {
                let before = Self::stamp(idem_runtime::now() - older_than);
                self.list("stuck", &self.sql.stuck, before, limit).await
            }

            /// Live `FAIL` records (the oldest first), for reconciliation.
            pub async fn failed(&self, limit: u32) -> Result<Vec<idem_runtime::Record>, idem_runtime::StoreError> {
                self.list(
                    "failed",
                    &self.sql.failed,
                    Self::stamp(idem_runtime::now()),
                    limit,
                )
                .await
            }

            async fn list(
                &self,
                operation: &'static str,
                sql: &str,
                at: $stamp,
                limit: u32,
            ) -> Result<Vec<idem_runtime::Record>, idem_runtime::StoreError> {
                let rows = sqlx::query(sql)
                    .bind(at)
                    .bind(i64::from(limit))
                    .fetch_all(&self.pool)
                    .await
                    .map_err(|e| crate::row::driver_error(operation, e))?;
                rows.iter()
                    .map(crate::row::record_from_row::<_, $stamp>)
                    .collect()
            }

            /// Check that the table has the shape the statements rely on: every column
            /// with a type that holds what idem writes (microsecond instants, exact keys),
            /// a unique key on `(biz_type, idempotent_key)`, no column that would answer
            /// the claim in its place. The error names the table, each column at fault,
            /// what was found and what is needed. `migrate()` runs it, and so does the
            /// first claim of a store that was never migrated.
            pub async fn check_table(&self) -> Result<(), idem_runtime::StoreError> {
                let (columns, keys) = self.read_shape().await?;
                crate::shape::check(&self.sql.table, &columns, &keys, Self::NEEDS)
            }

            /// The table was checked once in this store's life (at `migrate` or the
            /// first claim).
            async fn ensure_table(&self) -> Result<(), idem_runtime::StoreError> {
                self.table_checked
                    .get_or_try_init(|| self.check_table())
                    .await
                    .map(drop)
            }

            /// Finish `migrate`: check the table, and when creating failed because a
            /// table of another shape was already there, say what is wrong with it.
            async fn verify_migration(
                &self,
                created: Result<(), idem_runtime::StoreError>,
            ) -> Result<(), idem_runtime::StoreError> {
                let checked = self.ensure_table().await;
                match created {
                    Ok(()) => checked,
                    Err(error) => Err(checked.err().unwrap_or(error)),
                }
            }

            /// The exact SQL of the claim, one statement. Binds, in order: biz, key,
            /// fingerprint, request body, lease end, now, expiry, first fence. For operators and for
            /// the benchmark that runs it by hand as the floor idem is held to.
            pub fn claim_sql(&self) -> &str {
                &self.upsert_sql
            }

            /// The exact SQL of recording a success, one statement. Binds, in order:
            /// response, lease end (now), completed at (now), expiry, biz, key, fence,
            /// created at.
            pub fn complete_sql(&self) -> &str {
                &self.sql.complete
            }

            /// The table this store uses.
            pub fn table_name(&self) -> &str {
                &self.sql.table
            }

            /// The pool this store runs on.
            pub fn pool(&self) -> &sqlx::Pool<$db> {
                &self.pool
            }
        }
    };
}

/// Bind a claim's values in the order every dialect's claim statement takes them:
/// biz, key, fingerprint, request body, lease end, now, expiry, first fence.
macro_rules! bind_claim {
    ($query:expr, $claim:expr, $stamp:path) => {
        $query
            .bind($claim.biz)
            .bind($claim.key)
            .bind($claim.fingerprint)
            .bind($claim.request_body)
            .bind($stamp($claim.lease_until()))
            .bind($stamp($claim.now))
            .bind($stamp($claim.expires_at()))
            .bind(i64::try_from($claim.first_fence()).unwrap_or(i64::MAX))
    };
}

pub(crate) use {bind_claim, impl_idempotency_store};
