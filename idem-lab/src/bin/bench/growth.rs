//! Claim and purge with 10⁴, 10⁵ and 10⁶ records in the table, and the plans that say
//! why the claim stays flat: a primary-key lookup, and the purge walking the
//! `expires_at` index.

use std::time::{Duration, Instant, SystemTime};

use idem::store::Claim;
use idem::IdempotencyStore;

use super::{percentiles, Backend, Floor};

const SIZES: [u64; 3] = [10_000, 100_000, 1_000_000];

/// Fill the growth table up to `rows` finished records, one in ten of them expired
/// long ago (as in a table whose sweeper runs now and then), the others live.
async fn fill(floor: &Floor, from: u64, rows: u64) {
    let stamp = "'2020-01-01 00:00:00.000000'";
    let expires = |i: &str| format!("CASE WHEN {i} % 10 = 0 THEN {stamp} ELSE '2100-01-01 00:00:00.000000' END");
    match floor {
        Floor::Sqlite(store) => drop(
            idem::sqlx::query(&format!(
                "WITH RECURSIVE s(i) AS (SELECT ?1 UNION ALL SELECT i + 1 FROM s WHERE i < ?2) \
                 INSERT INTO idem_growth SELECT 'growth', 'k' || i, 'SUCCESS', 1, NULL, NULL, '1', NULL, \
                 {stamp}, {stamp}, {stamp}, {} FROM s",
                expires("i")
            ))
            .bind(from as i64 + 1)
            .bind(rows as i64)
            .execute(store.pool())
            .await
            .unwrap(),
        ),
        Floor::Postgres(store) => drop(
            idem::sqlx::query(&format!(
                "INSERT INTO idem_growth SELECT 'growth', 'k' || i, 'SUCCESS', 1, NULL, NULL, '1', NULL, \
                 {stamp}, {stamp}, {stamp}, ({})::timestamptz FROM generate_series($1::bigint, $2::bigint) i",
                expires("i")
            ))
            .bind(from as i64 + 1)
            .bind(rows as i64)
            .execute(store.pool())
            .await
            .unwrap(),
        ),
        Floor::MySql(store) => drop(
            idem::sqlx::query(&format!(
                "INSERT INTO idem_growth SELECT 'growth', CONCAT('k', seq), 'SUCCESS', 1, NULL, NULL, '1', NULL, \
                 {stamp}, {stamp}, {stamp}, {} FROM seq_{}_to_{rows}",
                expires("seq"),
                from + 1
            ))
            .execute(store.pool())
            .await
            .unwrap(),
        ),
    }
}

/// Fresh statistics, as autovacuum would gather them, so the planner knows how few
/// records have expired.
async fn analyze(floor: &Floor) {
    if let Floor::Postgres(store) = floor {
        idem::sqlx::query("ANALYZE idem_growth")
            .execute(store.pool())
            .await
            .unwrap();
    }
}

/// The plan of the claim's key lookup and of the purge's scan, one line each.
async fn plans(floor: &Floor) -> Vec<String> {
    let lookup = "SELECT fence FROM idem_growth WHERE biz_type = 'growth' AND idempotent_key = 'k77'";
    let purge = "SELECT biz_type FROM idem_growth WHERE expires_at <= '2021-01-01 00:00:00.000000' \
                 AND (status <> 'PROCESSING' OR lease_until <= '2021-01-01 00:00:00.000000') LIMIT 1000";
    let mut lines = Vec::new();
    for query in [lookup, purge] {
        let plan: Vec<String> = match floor {
            Floor::Sqlite(store) => {
                idem::sqlx::query_as::<_, (i64, i64, i64, String)>(&format!("EXPLAIN QUERY PLAN {query}"))
                    .fetch_all(store.pool())
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|row| row.3)
                    .collect()
            }
            Floor::Postgres(store) => {
                let query = query.replace("'2021-01-01 00:00:00.000000'", "'2021-01-01 00:00:00+00'");
                idem::sqlx::query_as::<_, (String,)>(&format!("EXPLAIN {query}"))
                    .fetch_all(store.pool())
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|row| row.0.trim().to_owned())
                    .collect()
            }
            Floor::MySql(store) => {
                use idem::sqlx::Row;
                idem::sqlx::query(&format!("EXPLAIN {query}"))
                    .fetch_all(store.pool())
                    .await
                    .unwrap()
                    .iter()
                    .map(|row| {
                        let key: Option<String> = row.try_get("key").ok().flatten();
                        let kind: Option<String> = row.try_get("type").ok().flatten();
                        format!(
                            "type={} key={}",
                            kind.unwrap_or_default(),
                            key.unwrap_or_else(|| "NULL".into())
                        )
                    })
                    .collect()
            }
        };
        lines.push(plan.join(" / "));
    }
    lines
}

/// Start from no growth table: an earlier run's rows would collide, and deleting a
/// million rows would leave the server busy cleaning up while we measure.
async fn drop_table(floor: &Floor) {
    let sql = "DROP TABLE IF EXISTS idem_growth";
    match floor {
        Floor::Sqlite(store) => drop(idem::sqlx::query(sql).execute(store.pool()).await.unwrap()),
        Floor::Postgres(store) => drop(idem::sqlx::query(sql).execute(store.pool()).await.unwrap()),
        Floor::MySql(store) => drop(idem::sqlx::query(sql).execute(store.pool()).await.unwrap()),
    }
}

async fn growth_store(floor: &Floor) -> Box<dyn IdempotencyStore> {
    match floor {
        Floor::Sqlite(store) => {
            let store = idem::SqliteStore::new(store.pool().clone())
                .with_table_name("idem_growth")
                .unwrap();
            store.migrate().await.unwrap();
            Box::new(store)
        }
        Floor::Postgres(store) => {
            let store = idem::PostgresStore::new(store.pool().clone())
                .with_table_name("idem_growth")
                .unwrap();
            store.migrate().await.unwrap();
            Box::new(store)
        }
        Floor::MySql(store) => {
            let store = idem::MySqlStore::new(store.pool().clone())
                .with_table_name("idem_growth")
                .unwrap();
            store.migrate().await.unwrap();
            Box::new(store)
        }
    }
}

pub async fn report(backends: &[Backend]) {
    println!("\n| backend | records in table | claim p50 µs | claim p99 µs | purge of 1,000 expired ms | claim p50 during purges µs |");
    println!("|---|---|---|---|---|---|");
    let mut all_plans = Vec::new();
    for backend in backends {
        let Some(floor) = &backend.floor else { continue };
        drop_table(floor).await;
        let store = growth_store(floor).await;
        let run = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        // Filler keys written so far, and how many of them purges took: the table
        // holds `size` expired records when a size is measured.
        let (mut written, mut purged_total) = (0, 0);
        for size in SIZES {
            fill(floor, written, size + purged_total).await;
            written = size + purged_total;
            analyze(floor).await;
            let now = idem::store::now();
            let mut samples = Vec::new();
            for i in 0..300 {
                let key = format!("new-{run}-{size}-{i}");
                let claim = Claim::new("growth", &key, now, Duration::from_secs(30), Duration::from_secs(3600));
                let started = Instant::now();
                store.claim(&claim).await.unwrap();
                samples.push(started.elapsed());
            }
            let claims = percentiles(samples);
            // A purge batch, with claims running beside it.
            let started = Instant::now();
            let (purged, beside) = tokio::join!(store.purge_expired(now, 1000), async {
                let mut samples = Vec::new();
                for i in 0..50 {
                    let key = format!("beside-{run}-{size}-{i}");
                    let claim = Claim::new("growth", &key, now, Duration::from_secs(30), Duration::from_secs(3600));
                    let began = Instant::now();
                    store.claim(&claim).await.unwrap();
                    samples.push(began.elapsed());
                }
                percentiles(samples)
            });
            let purge_ms = started.elapsed().as_secs_f64() * 1e3;
            assert_eq!(purged.unwrap(), 1000);
            purged_total += 1000;
            println!(
                "| {} | {size} | {:.1} | {:.1} | {purge_ms:.1} | {:.1} |",
                backend.name,
                claims.p50.as_secs_f64() * 1e6,
                claims.p99.as_secs_f64() * 1e6,
                beside.p50.as_secs_f64() * 1e6
            );
        }
        all_plans.push((backend.name, plans(floor).await));
    }
    println!("\nQuery plans at 10⁶ records:");
    for (name, plans) in all_plans {
        println!("- {name}: claim lookup: `{}`; purge scan: `{}`", plans[0], plans[1]);
    }
}
