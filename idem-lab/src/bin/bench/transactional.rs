//! Transactional mode against the same business transaction without idem, on each
//! database, in one run. Three rows a database, each one transaction a call:
//!
//! - the business alone: `BEGIN; INSERT INTO bench_charge ..; COMMIT`;
//! - the floor: the business plus idem's claim insert and record update, typed by hand;
//! - idem: the business through `idem::sql::execute_in`, without `wait` (the claim
//!   waits as any statement of the connection) and with it (two more round trips to
//!   set the bound and restore it).
//!
//! The target is idem (without `wait`) ≤ 1.15× the floor at p50.

use idem::sql::{execute_in, TransactionDatabase};
use idem::Idempotent;

use super::{business_insert, micros, run_id, sample, Backend, Floor, Percentiles};

/// The business table, and its insert, in each dialect.
fn business_sql(floor: &Floor) -> (&'static str, &'static str) {
    match floor {
        Floor::Sqlite(_) => (
            "CREATE TABLE IF NOT EXISTS bench_charge (id TEXT PRIMARY KEY, cents INTEGER NOT NULL)",
            "INSERT INTO bench_charge (id, cents) VALUES (?, ?)",
        ),
        Floor::Postgres(_) => (
            "CREATE TABLE IF NOT EXISTS bench_charge (id TEXT PRIMARY KEY, cents BIGINT NOT NULL)",
            "INSERT INTO bench_charge (id, cents) VALUES ($1, $2)",
        ),
        Floor::MySql(_) => (
            "CREATE TABLE IF NOT EXISTS bench_charge (id VARCHAR(128) PRIMARY KEY, cents BIGINT NOT NULL) ENGINE=InnoDB",
            "INSERT INTO bench_charge (id, cents) VALUES (?, ?)",
        ),
    }
}

/// The business alone, idem around it without `wait` and with it, on one database's pool.
async fn business_and_idem<DB>(
    pool: &idem::sqlx::Pool<DB>,
    ops: [&Idempotent; 2],
    insert: &'static str,
    calls: usize,
) -> [Percentiles; 3]
where
    DB: TransactionDatabase,
    for<'c> &'c mut DB::Connection: idem::sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: idem::sqlx::IntoArguments<'q, DB>,
    for<'q> String: idem::sqlx::Encode<'q, DB> + idem::sqlx::Type<DB>,
    for<'q> i64: idem::sqlx::Encode<'q, DB> + idem::sqlx::Type<DB>,
{
    let run = run_id();
    let alone = sample(calls, |i| async move {
        let mut tx = pool.begin().await.unwrap();
        business_insert::<DB>(&mut tx, insert, &format!("alone-{run}-{i}")).await;
        tx.commit().await.unwrap();
    })
    .await;
    let mut with_idem = Vec::new();
    for op in ops {
        let run = run_id();
        with_idem.push(
            sample(calls, |i| async move {
                let key = format!("idem-{run}-{i}");
                let charge = key.clone();
                let mut tx = pool.begin().await.unwrap();
                let cents = execute_in(op, &mut tx, key, |tx| {
                    Box::pin(async move {
                        business_insert::<DB>(tx, insert, &charge).await;
                        Ok::<_, idem::Error>(19_900u64)
                    })
                })
                .await
                .unwrap();
                std::hint::black_box(cents);
                tx.commit().await.unwrap();
            })
            .await,
        );
    }
    let [unbounded, bounded] = <[Percentiles; 2]>::try_from(with_idem).ok().unwrap();
    [alone, unbounded, bounded]
}

/// The rows of one database.
async fn rows(backend: &Backend, floor: &Floor, calls: usize) {
    let (create, insert) = business_sql(floor);
    let op = Idempotent::new("bench-tx").store(backend.store.clone());
    let bounded = Idempotent::new("bench-tx-wait")
        .store(backend.store.clone())
        .wait(std::time::Duration::from_secs(5));
    let ops = [&op, &bounded];
    let [alone, unbounded, bounded] = match floor {
        Floor::Sqlite(store) => {
            idem::sqlx::query(create).execute(store.pool()).await.unwrap();
            business_and_idem(store.pool(), ops, insert, calls).await
        }
        Floor::Postgres(store) => {
            idem::sqlx::query(create).execute(store.pool()).await.unwrap();
            business_and_idem(store.pool(), ops, insert, calls).await
        }
        Floor::MySql(store) => {
            idem::sqlx::query(create).execute(store.pool()).await.unwrap();
            business_and_idem(store.pool(), ops, insert, calls).await
        }
    };
    let run = run_id();
    let floor_p = sample(calls, |i| async move {
        floor.claim_business_record(&format!("floor-{run}-{i}"), insert).await
    })
    .await;
    let ratio = |p: &Percentiles, base: &Percentiles| format!("{:.2}×", p.p50.as_secs_f64() / base.p50.as_secs_f64());
    let row = |what: &str, p: &Percentiles, over_alone: String, over_floor: String| {
        println!(
            "| {} | {what} | {} | {} | {over_alone} | {over_floor} |",
            backend.name,
            micros(p.p50),
            micros(p.p99)
        );
    };
    row("business transaction alone", &alone, "1.00×".into(), "—".into());
    row(
        "floor: business + claim insert + record update",
        &floor_p,
        ratio(&floor_p, &alone),
        "1.00×".into(),
    );
    row(
        "idem transactional mode (`execute_in`)",
        &unbounded,
        ratio(&unbounded, &alone),
        ratio(&unbounded, &floor_p),
    );
    row(
        "idem transactional mode with `wait = 5s`",
        &bounded,
        ratio(&bounded, &alone),
        ratio(&bounded, &floor_p),
    );
}

/// The table of transactional mode, for every SQL backend.
pub async fn report(backends: &[Backend], calls: usize) {
    println!("\n| backend | one transaction a call | p50 µs | p99 µs | ÷ business (p50) | ÷ floor (p50) |");
    println!("|---|---|---|---|---|---|");
    for backend in backends {
        if let Some(floor) = &backend.floor {
            rows(backend, floor, calls).await;
        }
    }
}
