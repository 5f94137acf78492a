//! The `IdempotencyStore` impl every SQL store shares, over its [`Dialect`].
//!
//! Everything but the dialect is the same code over [`Statements`]; sqlx's generic
//! `Database` bounds for that code would outweigh it, so a macro writes the impl once
//! per concrete store (as sqlx writes its per-database impls) — the trait impl and the
//! holder write it rests on, nothing else (the stores' public methods are
//! `store_api.rs`'s).
//!
//! [`Dialect`]: crate::dialect::Dialect
//! [`Statements`]: crate::statements::Statements

macro_rules! impl_idempotency_store {
    ($store:ty, $db:ty) => {
        impl crate::dialect::Stored for $store {
            type Db = $db;

            fn from_parts(parts: crate::dialect::Parts<$db>) -> Self {
                Self { parts }
            }

            fn parts(&self) -> &crate::dialect::Parts<$db> {
                &self.parts
            }
        }

        #[async_trait::async_trait]
        impl idem_runtime::IdempotencyStore for $store {
            async fn claim(
                &self,
                claim: &idem_runtime::Claim<'_>,
            ) -> Result<idem_runtime::ClaimOutcome, idem_runtime::StoreError> {
                use crate::dialect::Dialect;
                let claimed = async {
                    self.ensure_table().await?;
                    let mut lent = crate::pooler::Lent::new(self.connection("claim").await?);
                    let mut site = crate::claim::OnConnection::<Self> {
                        conn: &mut *lent.conn,
                        settled: Some(&mut lent.settled),
                        upsert: &self.parts.upsert_sql,
                        get: self.get_statement(),
                        insert: self.parts.first_claim(),
                        duplicates: Some(&self.parts.duplicates),
                        sql: &self.parts.sql,
                        pinned: false,
                    };
                    crate::claim::claim_or_read(claim, &mut site, crate::claim::RolledBack::LostRace).await
                };
                crate::connection::explained(&self.parts.pool, claimed.await).await
            }

            async fn renew(
                &self,
                lease: &idem_runtime::Lease,
                now: std::time::SystemTime,
                lease_for: std::time::Duration,
            ) -> Result<idem_runtime::FenceCheck, idem_runtime::StoreError> {
                self.write_held_on_pool(
                    "renew",
                    |sql| Self::bind_after(sql, Self::bind_after(sql, sql.query(&sql.renew), now, lease_for), now, lease_for),
                    lease,
                )
                .await
            }

            async fn complete(
                &self,
                lease: &idem_runtime::Lease,
                response: &str,
                now: std::time::SystemTime,
                ttl: std::time::Duration,
            ) -> Result<idem_runtime::FenceCheck, idem_runtime::StoreError> {
                self.write_held_on_pool("complete", |sql| Self::finish(sql, &sql.complete, response, now, ttl, lease), lease)
                    .await
            }

            async fn fail(
                &self,
                lease: &idem_runtime::Lease,
                message: &str,
                now: std::time::SystemTime,
                ttl: std::time::Duration,
            ) -> Result<idem_runtime::FenceCheck, idem_runtime::StoreError> {
                self.write_held_on_pool("fail", |sql| Self::finish(sql, &sql.fail, message, now, ttl, lease), lease)
                    .await
            }

            async fn release(
                &self,
                lease: &idem_runtime::Lease,
            ) -> Result<idem_runtime::FenceCheck, idem_runtime::StoreError> {
                let released = self.parts.held(|sql| {
                    crate::rollback::retrying(move || async move {
                        let mut lent = crate::pooler::Lent::new(self.connection("release").await?);
                        let conn = &mut *lent.conn;
                        crate::pooler::within!(sql.prepared, "release", Some(&mut lent.settled), conn => {
                            Self::release_in(conn, sql, lease)
                        })
                        .await
                    })
                });
                crate::connection::explained(&self.parts.pool, released.await).await
            }

            async fn record_steps(
                &self,
                lease: &idem_runtime::Lease,
                steps: &str,
            ) -> Result<idem_runtime::FenceCheck, idem_runtime::StoreError> {
                self.write_held_on_pool("record_steps", |sql| sql.query(&sql.record_steps).bind(steps), lease)
                    .await
            }

            fn as_any(&self) -> Option<&dyn std::any::Any> {
                Some(self)
            }

            async fn watch(
                &self,
                biz: &str,
                key: &str,
            ) -> Result<Option<idem_runtime::notice::Notice>, idem_runtime::StoreError> {
                <Self as crate::dialect::Dialect>::watch(self, biz, key).await
            }

            async fn get(
                &self,
                biz: &str,
                key: &str,
            ) -> Result<Option<idem_runtime::Record>, idem_runtime::StoreError> {
                let get = <Self as crate::dialect::Dialect>::get_statement(self);
                let sql = &self.parts.sql;
                let read = crate::pooler::on_pool!(self.parts, "get", conn => Self::read(conn, sql, get, biz, key));
                crate::connection::explained(&self.parts.pool, read.await).await
            }

            async fn purge_expired(
                &self,
                now: std::time::SystemTime,
                limit: u64,
            ) -> Result<u64, idem_runtime::StoreError> {
                <Self as crate::dialect::Dialect>::purge(self, now, limit).await
            }

            async fn erase_subject(&self, subject: &str) -> Result<u64, idem_runtime::StoreError> {
                self.erase_records_of(subject).await
            }
        }

        impl crate::claim::ClaimSite for crate::claim::OnConnection<'_, $store> {
            fn on_server_clock(&self) -> bool {
                self.sql.server_clock
            }

            fn inserts_first(&self) -> bool {
                self.insert.is_some()
            }

            async fn insert(
                &mut self,
                claim: &idem_runtime::Claim<'_>,
            ) -> Result<crate::claim::Inserted, idem_runtime::StoreError> {
                let insert = self.insert.expect("a site that inserts first has the statement");
                let (conn, sql) = (&mut *self.conn, self.sql);
                crate::pooler::within!(sql.prepared || self.pinned, "claim", self.settled.as_deref_mut(), conn => {
                    <$store as crate::dialect::Dialect>::insert_if_absent(conn, insert, sql, claim)
                })
                .await
            }

            fn reads_first(&self) -> bool {
                let insert_reads = self.insert.is_some_and(|insert| insert.reads);
                self.duplicates.is_some_and(|duplicates| {
                    duplicates.first_look(insert_reads) == idem_runtime::duplicates::FirstLook::Read
                })
            }

            fn observe(&self, met: bool) {
                if let Some(duplicates) = self.duplicates {
                    duplicates.observe(met);
                }
            }

            async fn upsert(
                &mut self,
                claim: &idem_runtime::Claim<'_>,
            ) -> Result<crate::dialect::Upserted, idem_runtime::StoreError> {
                let (conn, sql) = (&mut *self.conn, self.sql);
                crate::pooler::within!(sql.prepared || self.pinned, "claim", self.settled.as_deref_mut(), conn => {
                    <$store as crate::dialect::Dialect>::upsert(conn, self.upsert, self.get, sql, claim)
                })
                .await
            }

            async fn read(
                &mut self,
                claim: &idem_runtime::Claim<'_>,
            ) -> Result<(Option<idem_runtime::Record>, Option<std::time::SystemTime>), idem_runtime::StoreError> {
                let (conn, sql, get) = (&mut *self.conn, self.sql, self.get);
                let row = crate::pooler::within!(sql.prepared || self.pinned, "get", self.settled.as_deref_mut(), conn => async {
                    sql.query(get)
                        .bind(claim.biz)
                        .bind(claim.key)
                        .fetch_optional(&mut *conn)
                        .await
                        .map_err(|e| crate::error::driver_error("get", e))
                })
                .await?;
                let Some(row) = row else { return Ok((None, None)) };
                let record = crate::row::record_from_row::<_, <$store as crate::dialect::Dialect>::Stamp>(&row)?;
                let read_at = if self.sql.server_clock {
                    Some(crate::row::read_at::<
                        _,
                        <$store as crate::dialect::Dialect>::Stamp,
                    >(&row)?)
                } else {
                    None
                };
                Ok((Some(record), read_at))
            }
        }

        impl $store {
            /// A connection of the store's pool, for `operation`'s statements.
            async fn connection(
                &self,
                operation: &'static str,
            ) -> Result<sqlx::pool::PoolConnection<$db>, idem_runtime::StoreError> {
                self.parts
                    .pool
                    .acquire()
                    .await
                    .map_err(|e| crate::error::driver_error(operation, e))
            }

            /// `at` as the dialect binds an instant.
            fn stamp(at: std::time::SystemTime) -> <Self as crate::dialect::Dialect>::Stamp {
                crate::row::Stamp::of(at)
            }

            /// A holder write on the store's pool: `query` (of the statements it is
            /// given) bound to the lease, run again while the server rolls it back (see
            /// `rollback.rs`), and once more after a refusal where the server applies its
            /// cluster's commits late ([`Parts::held`](crate::dialect::Parts::held)).
            async fn write_held_on_pool<'q>(
                &'q self,
                operation: &'static str,
                query: impl Fn(
                    &'q crate::statements::Statements,
                ) -> sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments<'q>>,
                lease: &'q idem_runtime::Lease,
            ) -> Result<idem_runtime::FenceCheck, idem_runtime::StoreError> {
                let written = self.parts.held(|sql| {
                    let query = &query;
                    crate::rollback::retrying(move || {
                        crate::pooler::on_pool!(self.parts, operation, conn => Self::write_held(conn, operation, query(sql), lease))
                    })
                });
                crate::connection::explained(&self.parts.pool, written.await).await
            }

            /// Bind the lease to a holder write and run it on `executor` (the pool, or
            /// the caller's transaction): one row changed means the lease still held.
            async fn write_held<'q, 'e, X>(
                executor: X,
                operation: &'static str,
                query: sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments<'q>>,
                lease: &'q idem_runtime::Lease,
            ) -> Result<idem_runtime::FenceCheck, idem_runtime::StoreError>
            where
                X: sqlx::Executor<'e, Database = $db>,
            {
                let fence = i64::try_from(lease.fence).unwrap_or(i64::MAX);
                let done = query
                    .bind(lease.biz.as_str())
                    .bind(lease.key.as_str())
                    .bind(fence)
                    .bind(Self::stamp(lease.created_at))
                    .execute(executor)
                    .await
                    .map_err(|e| crate::error::driver_error(operation, e))?;
                Ok(if done.rows_affected() == 0 {
                    idem_runtime::FenceCheck::Lost
                } else {
                    idem_runtime::FenceCheck::Held
                })
            }

            /// `complete` or `fail` (`sql`) with its text and what `lease` asks the
            /// record to keep beyond it, before the lease's binds.
            fn finish<'q>(
                statements: &crate::statements::Statements,
                sql: &'q str,
                text: &'q str,
                now: std::time::SystemTime,
                ttl: std::time::Duration,
                lease: &'q idem_runtime::Lease,
            ) -> sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments<'q>> {
                let retention = &lease.retention;
                let finish = statements.query(sql).bind(text);
                let finish = Self::bind_now(statements, Self::bind_now(statements, finish, now), now);
                let finish = Self::bind_after(statements, finish, now, retention.record_length(ttl));
                // The end of the replay, or NULL: a NULL length where the server adds it.
                let replay = retention.replay_until(now, ttl).map(|_| ttl);
                let finish = if statements.server_clock {
                    finish.bind(replay.map(crate::row::micros))
                } else {
                    finish.bind(replay.map(|ttl| Self::stamp(now + ttl)))
                };
                finish.bind(retention.subject.as_deref())
            }

            /// Bind "now" where a statement has it: the caller's `now`, or nothing where
            /// the statement reads the server's clock.
            fn bind_now<'q>(
                statements: &crate::statements::Statements,
                query: sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments<'q>>,
                now: std::time::SystemTime,
            ) -> sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments<'q>> {
                if statements.server_clock {
                    query
                } else {
                    query.bind(Self::stamp(now))
                }
            }

            /// Bind an instant `by` after `now` (before it, when `by` is negative): the
            /// caller's instant, or the microseconds the server adds to its own.
            fn bind_after<'q>(
                statements: &crate::statements::Statements,
                query: sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments<'q>>,
                now: std::time::SystemTime,
                by: impl Into<crate::row::Offset>,
            ) -> sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments<'q>> {
                let by = by.into();
                if statements.server_clock {
                    query.bind(by.micros())
                } else {
                    query.bind(Self::stamp(by.from(now)))
                }
            }

            /// Delete the holder's record; one with steps is kept, its lease lapsed.
            async fn release_in(
                conn: &mut <$db as sqlx::Database>::Connection,
                sql: &crate::statements::Statements,
                lease: &idem_runtime::Lease,
            ) -> Result<idem_runtime::FenceCheck, idem_runtime::StoreError> {
                match Self::write_held(&mut *conn, "release", sql.query(&sql.release), lease).await? {
                    idem_runtime::FenceCheck::Held => Ok(idem_runtime::FenceCheck::Held),
                    // Not deleted: the record holds steps (or the lease is lost).
                    idem_runtime::FenceCheck::Lost => {
                        Self::write_held(&mut *conn, "release", sql.query(&sql.park), lease).await
                    }
                }
            }

            /// The record of `(biz, key)`, read by `get` (a `get` statement of `sql`) on
            /// `executor` (the pool, or a transaction's connection).
            async fn read<'e, X>(
                executor: X,
                sql: &crate::statements::Statements,
                get: &str,
                biz: &str,
                key: &str,
            ) -> Result<Option<idem_runtime::Record>, idem_runtime::StoreError>
            where
                X: sqlx::Executor<'e, Database = $db>,
            {
                let row = sql
                    .query(get)
                    .bind(biz)
                    .bind(key)
                    .fetch_optional(executor)
                    .await
                    .map_err(|e| crate::error::driver_error("get", e))?;
                row.as_ref()
                    .map(crate::row::record_from_row::<_, <Self as crate::dialect::Dialect>::Stamp>)
                    .transpose()
            }
        }
    };
}

/// Bind a claim's values in the order every dialect's claim statement takes them:
/// biz, key, fingerprint, request body, lease end, now, expiry, first fence.
macro_rules! bind_claim {
    ($query:expr, $server_clock:expr, $claim:expr) => {{
        let query = $query
            .bind($claim.biz)
            .bind($claim.key)
            .bind($claim.fingerprint)
            .bind($claim.request_body);
        if $server_clock {
            // On the server's clock: the lengths of the lease and of the record.
            query
                .bind(crate::row::micros($claim.lease))
                .bind(crate::row::micros($claim.ttl.max($claim.lease)))
        } else {
            query
                .bind(Self::stamp($claim.lease_until()))
                .bind(Self::stamp($claim.now))
                .bind(Self::stamp($claim.expires_at()))
                .bind(i64::try_from($claim.first_fence()).unwrap_or(i64::MAX))
        }
    }};
}

pub(crate) use {bind_claim, impl_idempotency_store};
