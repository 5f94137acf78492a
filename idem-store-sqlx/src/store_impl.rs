//! The `IdempotencyStore` impl every SQL store shares.
//!
//! The three stores differ in their driver types, their claim statement and their
//! purge statement; everything else is the same code over [`Statements`]. sqlx's
//! generic `Database` bounds for that code would outweigh it, so a macro writes the
//! impl once per concrete store — the trait impl and the holder write it rests on,
//! nothing else (the stores' public methods are `store_api.rs`'s). A store provides:
//! `pool: Pool<$db>`, `sql: Statements`, `fn stamp(SystemTime) -> $stamp`,
//! `async fn upsert(&self, &Claim) -> Result<Upserted, StoreError>`,
//! `async fn purge(&self, SystemTime, u64) -> Result<u64, StoreError>` and, through
//! `store_api.rs`, `async fn ensure_table(&self)`.
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
                let query = sqlx::query(&self.parts.sql.renew).bind(until.clone()).bind(until);
                self.write_held("renew", query, lease).await
            }

            async fn complete(
                &self,
                lease: &idem_runtime::Lease,
                response: &str,
                now: std::time::SystemTime,
                ttl: std::time::Duration,
            ) -> Result<idem_runtime::FenceCheck, idem_runtime::StoreError> {
                let query = sqlx::query(&self.parts.sql.complete)
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
                let query = sqlx::query(&self.parts.sql.fail)
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
                match self.write_held("release", sqlx::query(&self.parts.sql.release), lease).await? {
                    idem_runtime::FenceCheck::Held => Ok(idem_runtime::FenceCheck::Held),
                    // Not deleted: the record holds steps (or the lease is lost).
                    idem_runtime::FenceCheck::Lost => {
                        self.write_held("release", sqlx::query(&self.parts.sql.park), lease).await
                    }
                }
            }

            async fn record_steps(
                &self,
                lease: &idem_runtime::Lease,
                steps: &str,
            ) -> Result<idem_runtime::FenceCheck, idem_runtime::StoreError> {
                let query = sqlx::query(&self.parts.sql.record_steps).bind(steps);
                self.write_held("record_steps", query, lease).await
            }

            async fn get(
                &self,
                biz: &str,
                key: &str,
            ) -> Result<Option<idem_runtime::Record>, idem_runtime::StoreError> {
                let row = sqlx::query(&self.parts.sql.get)
                    .bind(biz)
                    .bind(key)
                    .fetch_optional(&self.parts.pool)
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
                    .execute(&self.parts.pool)
                    .await
                    .map_err(|e| crate::row::driver_error(operation, e))?;
                Ok(if done.rows_affected() == 0 {
                    idem_runtime::FenceCheck::Lost
                } else {
                    idem_runtime::FenceCheck::Held
                })
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
