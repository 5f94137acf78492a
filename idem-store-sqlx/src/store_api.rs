//! The public methods every SQL store has beyond the store trait: the table's check,
//! reconciliation lists, the statements for operators, the pool. Written once by a
//! macro over each concrete store's [`Dialect`](crate::dialect::Dialect), like the
//! trait impl (`store_impl.rs`) and for the same reason.

macro_rules! impl_store_api {
    ($store:ty, $db:ty) => {
        impl $store {
            /// Stuck claims, the oldest first: `PROCESSING` records created at least
            /// `older_than` ago whose lease has lapsed (or that have none) — claims
            /// whose holder is gone, for reconciliation (`idem stuck`). A claim whose
            /// lease still runs is a body at work (its heartbeat renews the lease) and
            /// is not listed; nor are form tokens. `biz` limits the list to one biz.
            pub async fn stuck(
                &self,
                biz: Option<&str>,
                older_than: std::time::Duration,
                limit: u32,
            ) -> Result<Vec<idem_runtime::Record>, idem_runtime::StoreError> {
                let now = idem_runtime::now();
                let biz = biz.unwrap_or("");
                let sql = &self.parts.sql;
                let query = Self::bind_after(
                    sql,
                    sql.query(&sql.stuck),
                    now,
                    crate::row::Offset::Before(older_than),
                );
                let query = Self::bind_now(sql, query, now)
                    .bind(biz)
                    .bind(biz)
                    .bind(i64::from(limit));
                self.list("stuck", query).await
            }

            /// Records whose outcome is unknown, the oldest first: held by a step that
            /// failed closed until an operator settles them (`idem unknown`,
            /// [`repair::settle`](idem_runtime::repair::settle)). `biz` limits the list
            /// to one biz.
            pub async fn unsettled(
                &self,
                biz: Option<&str>,
                limit: u32,
            ) -> Result<Vec<idem_runtime::Record>, idem_runtime::StoreError> {
                let biz = biz.unwrap_or("");
                let query = self.parts.sql.query(&self.parts.sql.unsettled)
                    .bind(biz)
                    .bind(biz)
                    .bind(i64::from(limit));
                let records = self.list("unsettled", query).await?;
                Ok(records
                    .into_iter()
                    .filter(|record| idem_runtime::unknown::awaits_settling(record))
                    .collect())
            }

            /// The oldest `PROCESSING` record (of `biz`, or of any), running or not;
            /// form tokens are not counted. For `idem stats`.
            pub async fn oldest_processing(
                &self,
                biz: Option<&str>,
            ) -> Result<Option<idem_runtime::Record>, idem_runtime::StoreError> {
                let biz = biz.unwrap_or("");
                let query = self.parts.sql.query(&self.parts.sql.oldest_processing).bind(biz).bind(biz);
                // The statement has `LIMIT 1`.
                Ok(self.list("oldest_processing", query).await?.into_iter().next())
            }

            /// Live `FAIL` records (the oldest first), for reconciliation; `biz` limits
            /// the list to one biz.
            pub async fn failed(
                &self,
                biz: Option<&str>,
                limit: u32,
            ) -> Result<Vec<idem_runtime::Record>, idem_runtime::StoreError> {
                let biz = biz.unwrap_or("");
                let sql = &self.parts.sql;
                let query = Self::bind_now(sql, sql.query(&sql.failed), idem_runtime::now())
                    .bind(biz)
                    .bind(biz)
                    .bind(i64::from(limit));
                self.list("failed", query).await
            }

            /// The records a listing statement (`query`, bound) selects, in its order.
            async fn list<'q>(
                &self,
                operation: &'static str,
                query: sqlx::query::Query<
                    'q,
                    <Self as crate::dialect::Stored>::Db,
                    <<Self as crate::dialect::Stored>::Db as sqlx::Database>::Arguments<'q>,
                >,
            ) -> Result<Vec<idem_runtime::Record>, idem_runtime::StoreError> {
                let rows = crate::pooler::on_pool!(self.parts, operation, conn => async {
                    query.fetch_all(conn).await.map_err(|e| crate::error::driver_error(operation, e))
                })
                .await?;
                rows.iter()
                    .map(crate::row::record_from_row::<_, <Self as crate::dialect::Dialect>::Stamp>)
                    .collect()
            }

            /// How many records each biz (or only `biz`) has in each status, and how
            /// many of them expired (purgeable), for operators: `idem stats`. Form
            /// tokens are listed under their namespace, `token.<biz>`.
            pub async fn stats(&self, biz: Option<&str>) -> Result<Vec<crate::BizStatus>, idem_runtime::StoreError> {
                let biz = biz.unwrap_or("");
                let stats = sqlx::query_as(&self.parts.sql.stats).persistent(self.parts.sql.prepared);
                let stats = if self.parts.sql.server_clock {
                    stats
                } else {
                    stats.bind(Self::stamp(idem_runtime::now()))
                };
                let stats = stats.bind(biz).bind(biz);
                let rows: Vec<(String, String, i64, i64, i64)> = crate::pooler::on_pool!(self.parts, "stats", conn => async {
                    stats.fetch_all(conn).await.map_err(|e| crate::error::driver_error("stats", e))
                })
                .await?;
                rows.into_iter()
                    .map(|(biz, status, records, expired, tombstones)| {
                        Ok(crate::BizStatus {
                            biz,
                            status: status
                                .parse()
                                .map_err(|e| idem_runtime::StoreError::with_source("stats", e))?,
                            records: u64::try_from(records).unwrap_or(0),
                            expired: u64::try_from(expired).unwrap_or(0),
                            tombstones: u64::try_from(tombstones).unwrap_or(0),
                        })
                    })
                    .collect()
            }

            /// Strip every finished record of the data subject whose keyed hash is
            /// `subject` to an erased tombstone, as
            /// [`IdempotencyStore::erase_subject`](idem_runtime::IdempotencyStore::erase_subject).
            async fn erase_records_of(&self, subject: &str) -> Result<u64, idem_runtime::StoreError> {
                use crate::dialect::Dialect;
                let erase = || async {
                    let erase = self.parts.sql.query(&self.parts.sql.erase_subject).bind(subject);
                    let done = crate::pooler::on_pool!(self.parts, "erase_subject", conn => async {
                        erase.execute(conn).await.map_err(|e| crate::error::driver_error("erase_subject", e))
                    })
                    .await?;
                    Ok(Self::rows_changed(&done))
                };
                crate::rollback::retrying(erase).await
            }

            /// Delete the `FAIL` record of `(biz, key)` so that the next call runs the
            /// body again; `false` when there was none (no record, or not `FAIL`).
            pub async fn forget_failed(&self, biz: &str, key: &str) -> Result<bool, idem_runtime::StoreError> {
                let forget = self.parts.sql.query(&self.parts.sql.forget_failed).bind(biz).bind(key);
                let done = crate::pooler::on_pool!(self.parts, "forget_failed", conn => async {
                    forget.execute(conn).await.map_err(|e| crate::error::driver_error("forget_failed", e))
                })
                .await?;
                Ok(done.rows_affected() > 0)
            }

            /// Check that the table has the shape the statements rely on: every column
            /// with a type that holds what idem writes (microsecond instants, exact keys),
            /// a unique key on `(biz_type, idempotent_key)`, no column that would answer
            /// the claim in its place. The error names the table, each column at fault,
            /// what was found and what is needed. `migrate()` runs it, and so does the
            /// first claim of a store that was never migrated.
            pub async fn check_table(&self) -> Result<(), idem_runtime::StoreError> {
                let (columns, keys) = <Self as crate::dialect::Dialect>::read_shape(self).await?;
                crate::shape::check(
                    &self.parts.sql.table,
                    &columns,
                    &keys,
                    <Self as crate::dialect::Dialect>::NEEDS,
                )
            }

            /// The table was checked (and the server's kind learned) once in this store's
            /// life (at `migrate` or the first claim).
            async fn ensure_table(&self) -> Result<(), idem_runtime::StoreError> {
                self.parts
                    .table_checked
                    .get_or_try_init(|| async {
                        // The server first: a standby is refused before its table is read.
                        <Self as crate::dialect::Dialect>::learn_server(self).await?;
                        self.check_table().await
                    })
                    .await
                    .map(drop)
            }

            /// `migrate`: bring a table made by an earlier version up to date (the
            /// columns added since), run `create` (the DDL, which makes a table that is
            /// not there and its indexes), then check the table; when creating failed
            /// because a table of another shape was already there, say what is wrong
            /// with it.
            async fn migrate_table(
                &self,
                create: impl std::future::Future<Output = Result<(), idem_runtime::StoreError>>,
            ) -> Result<(), idem_runtime::StoreError> {
                let created = match self.add_missing_columns().await {
                    Ok(()) => create.await,
                    Err(error) => Err(error),
                };
                let checked = self.ensure_table().await;
                match created {
                    Ok(()) => checked,
                    Err(error) => Err(checked.err().unwrap_or(error)),
                }
            }

            /// A table made before some columns existed (steps, a subject, a
            /// tombstone) gets them (`migrate` is how a table is brought up to date);
            /// no table yet, nothing to do. A concurrent start-up that added one first
            /// is not an error.
            async fn add_missing_columns(&self) -> Result<(), idem_runtime::StoreError> {
                use crate::dialect::Dialect;
                let has = |columns: &[crate::shape::Column], name: &str| {
                    columns.is_empty() || columns.iter().any(|c| c.name.eq_ignore_ascii_case(name))
                };
                let columns = self.read_shape().await?.0;
                for (column, ty) in Self::ADDED_COLUMNS {
                    if has(&columns, column) {
                        continue;
                    }
                    let alter = Self::add_column_sql(&self.parts.sql.table, &self.parts.sql.quoted, column, ty);
                    // No values: sent as text, nothing prepared (as behind a pooler).
                    match sqlx::raw_sql(&alter).execute(&self.parts.pool).await {
                        Ok(_) => {}
                        Err(_) if has(&self.read_shape().await?.0, column) => {}
                        Err(e) => {
                            return Err(crate::error::driver_error(
                                if *column == "steps" { "adding the `steps` column" } else { "adding a column" },
                                e,
                            ))
                        }
                    }
                }
                Ok(())
            }

            /// The exact SQL a first claim of a key runs, one statement. Binds, in
            /// order: biz, key, fingerprint, request body, then — judged by the server's
            /// clock, the default on PostgreSQL and MySQL — the lease's and the record's
            /// lengths in microseconds (`i64`), or — on the caller's clock, and always
            /// on SQLite — lease end, now, expiry, first fence. For operators and for the benchmark that runs it by hand as the
            /// floor idem is held to. (On PostgreSQL it inserts a record nobody holds and
            /// returns its fence and `created_at`; a record in the way is read, and taken
            /// over by [`takeover_sql`](Self::takeover_sql) only if it is claimable.
            /// While a store's claims often meet records, PostgreSQL's starts instead
            /// with the same insert that also reads the record in its way, a replay
            /// in one round trip. Elsewhere it is that statement.)
            pub fn claim_sql(&self) -> &str {
                self.parts.insert_sql.as_deref().unwrap_or(&self.parts.upsert_sql)
            }

            /// The exact SQL of the claim that also takes over an expired record or a
            /// lapsed lease, one atomic statement; binds as [`claim_sql`](Self::claim_sql)'s.
            pub fn takeover_sql(&self) -> &str {
                &self.parts.upsert_sql
            }

            /// The exact SQL of recording a success, one statement. Binds, in order:
            /// response, then the record's length in microseconds (on the server's
            /// clock) or lease end (now), completed at (now) and expiry (on the
            /// caller's), then biz, key, fence, created at.
            pub fn complete_sql(&self) -> &str {
                &self.parts.sql.complete
            }

            /// The table this store uses.
            pub fn table_name(&self) -> &str {
                &self.parts.sql.table
            }

            /// The pool this store runs on.
            pub fn pool(&self) -> &sqlx::Pool<$db> {
                &self.parts.pool
            }
        }
    };
}

/// [`RecordPages`](idem_runtime::pages::RecordPages) on a SQL store: `(biz, key)` order
/// (`Page::by_key`).
macro_rules! impl_record_pages {
    ($store:ty) => {
        #[async_trait::async_trait]
        impl idem_runtime::pages::RecordPages for $store {
            async fn page(&self, cursor: &str, limit: u32) -> Result<idem_runtime::pages::Page, idem_runtime::StoreError> {
                let (biz, key) = idem_runtime::pages::Page::after_key(cursor).unwrap_or(("", ""));
                let query = self.parts.sql.query(&self.parts.sql.page)
                    .bind(biz)
                    .bind(biz)
                    .bind(key)
                    .bind(i64::from(limit));
                Ok(idem_runtime::pages::Page::by_key(self.list("page", query).await?, limit))
            }

            /// The rewrites of a page in one transaction.
            async fn replace_values(
                &self,
                rewrites: &[idem_runtime::pages::Rewrite],
            ) -> Result<u64, idem_runtime::StoreError> {
                let failed = |e| crate::error::driver_error("replace_values", e);
                let replace = || async {
                    // Dropped during its `BEGIN`, the call closes the connection
                    // (`Lent`) instead of handing the pool a transaction.
                    let mut lent = crate::pooler::Lent::new(self.parts.pool.acquire().await.map_err(failed)?);
                    let conn = &mut *lent.conn;
                    crate::pooler::within!(false, "replace_values", Some(&mut lent.settled), conn => async {
                        let mut replaced = 0;
                        for idem_runtime::pages::Rewrite { read, with } in rewrites {
                            let done = self.parts.sql.query(&self.parts.sql.replace_values)
                                .bind(with.request_body.as_deref())
                                .bind(with.response_body.as_deref())
                                .bind(with.error_message.as_deref())
                                .bind(with.steps.as_deref())
                                .bind(read.biz.as_str())
                                .bind(read.key.as_str())
                                .bind(i64::try_from(read.fence).unwrap_or(i64::MAX))
                                .bind(Self::stamp(read.created_at))
                                .bind(read.status.as_str())
                                .bind(read.request_body.as_deref())
                                .bind(read.response_body.as_deref())
                                .bind(read.error_message.as_deref())
                                .bind(read.steps.as_deref())
                                .execute(&mut *conn)
                                .await
                                .map_err(failed)?;
                            replaced += <Self as crate::dialect::Dialect>::rows_changed(&done);
                        }
                        Ok(replaced)
                    })
                    .await
                };
                crate::rollback::retrying(replace).await
            }
        }
    };
}

pub(crate) use {impl_record_pages, impl_store_api};
