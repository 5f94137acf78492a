//! A replay against one read of its record by primary key on the same pool — the
//! least a replay can cost — and, on PostgreSQL and MariaDB, against the two
//! statements a replay took before its claim read the record in its way (the store's
//! plain insert, which met the record, then the read), typed by hand. One call of
//! each in turn, on a store that has met duplicates.

use std::hint::black_box;

use idem::sqlx;
use idem::Idempotent;

use super::{alternate, bare, length_micros, micros, run_id, Backend, Floor, Percentiles, BIZ, LEASE, NO_TEXT, TTL};

/// The rows of every backend a replay reads a server for.
pub async fn report(backends: &[Backend], calls: usize) {
    println!(
        "\n| backend | read by primary key (p50 µs) | idem replay | replay ÷ read | insert, then read, by hand | replay ÷ by hand | \
         the read on a pool with sqlx's defaults | replay ÷ that read |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for backend in backends {
        if backend.floor.is_none() && backend.redis_floor.is_none() {
            continue;
        }
        let by_hand = match &backend.floor {
            Some(floor @ (Floor::Postgres(_) | Floor::MySql(_))) => Some(floor),
            _ => None,
        };
        let key = format!("{}-replayed", run_id());
        let op = Idempotent::new(BIZ).store(backend.store.clone());
        op.execute(key.clone(), bare(0)).await.unwrap();
        let (op, key) = (&op, key.as_str());
        // The variants in turn: the read, the replay, then those this backend has.
        let extra: Vec<Extra<'_>> = by_hand
            .map(Extra::ByHand)
            .into_iter()
            .chain(backend.defaults.as_ref().map(Extra::OnDefaults))
            .collect();
        let extra = &extra;
        let measured = alternate(
            calls,
            |variant, _| {
                Box::pin(async move {
                    match variant {
                        0 => drop(black_box(backend.store.get(BIZ, key).await.unwrap())),
                        1 => drop(black_box(op.execute(key, bare(1)).await.unwrap())),
                        v => match extra[v - 2] {
                            Extra::ByHand(floor) => insert_then_read(floor, key).await,
                            Extra::OnDefaults(defaults) => drop(black_box(defaults.get(key).await)),
                        },
                    }
                })
            },
            2 + extra.len(),
        )
        .await;
        let ratio = |a: &Percentiles, b: &Percentiles| format!("{:.2}×", a.p50.as_secs_f64() / b.p50.as_secs_f64());
        let (read, replay) = (&measured[0], &measured[1]);
        let column = |which: fn(&Extra<'_>) -> bool| {
            extra
                .iter()
                .position(which)
                .map_or(("—".to_owned(), "—".to_owned()), |i| {
                    let other = &measured[2 + i];
                    (micros(other.p50), ratio(replay, other))
                })
        };
        let (hand, over_hand) = column(|extra| matches!(extra, Extra::ByHand(_)));
        let (defaults, over_defaults) = column(|extra| matches!(extra, Extra::OnDefaults(_)));
        println!(
            "| {} | {} | {} | {} | {hand} | {over_hand} | {defaults} | {over_defaults} |",
            backend.name,
            micros(read.p50),
            micros(replay.p50),
            ratio(replay, read)
        );
    }
}

/// A variant of the replay table beyond the read and the replay.
enum Extra<'a> {
    /// The store's plain insert, then its read, by hand.
    ByHand(&'a Floor),
    /// The read on a pool with sqlx's defaults.
    OnDefaults(&'a Floor),
}

/// The store's plain insert, which meets the record (on PostgreSQL returning no row,
/// on MariaDB failing with a duplicate key), then the store's read of it: a replay's
/// two statements.
async fn insert_then_read(floor: &Floor, key: &str) {
    macro_rules! insert {
        ($store:expr) => {
            sqlx::query($store.claim_sql())
                .bind(BIZ)
                .bind(key)
                .bind(NO_TEXT)
                .bind(NO_TEXT)
                .bind(length_micros(LEASE))
                .bind(length_micros(TTL))
                .fetch_optional($store.pool())
                .await
        };
    }
    match floor {
        Floor::Postgres(store) => assert!(insert!(store).unwrap().is_none(), "the record stood"),
        Floor::MySql(store) => drop(insert!(store).expect_err("the record stood")),
        Floor::Sqlite(_) => unreachable!("SQLite claims with its upsert alone"),
    }
    black_box(floor.get(key).await);
}
