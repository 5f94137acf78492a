//! The conformance suite on MySQL/MariaDB (`IDEM_TEST_MYSQL_URL`; `.ci/start-databases`
//! starts a throwaway MariaDB), and again through one node of a Galera cluster
//! (`IDEM_TEST_GALERA_URLS`; `.ci/start-galera`).

use idem_testkit::conformance;
use idem_testkit::{conformance_suite, database_suite, store_clock_suite};

use std::sync::Arc;
use std::time::Duration;

use conformance::calls::Store;
use idem::store::{Claim, ClaimOutcome};
use idem::IdempotencyStore;
use idem::{LeaseClock, MySqlStore};

/// A migrated store on the server at the URL in `var` (its first URL when the variable
/// lists several, comma-separated).
/// The suites move time by the instants they pass: the store judges by them.
async fn open_at(var: &str, backend: &str) -> Option<MySqlStore> {
    Some(
        open_on_store_clock(var, backend)
            .await?
            .with_lease_clock(LeaseClock::Caller),
    )
}

/// The store as production runs it: leases judged by the server's clock.
async fn open_on_store_clock(var: &str, backend: &str) -> Option<MySqlStore> {
    let urls = conformance::server_url(var, backend)?;
    let url = urls.split(',').next().unwrap();
    let store = MySqlStore::connect(url).await.expect("connect to MariaDB");
    store.migrate().await.expect("migrate");
    Some(store)
}

/// What the suites need of a backend, over the `open()` in scope.
macro_rules! mysql_backend {
    () => {
        async fn open_dyn() -> Option<Store> {
            Some(Arc::new(open().await?))
        }

        /// Edit a record by hand: `UPDATE idempotent_record SET {set}` on `key`. On a
        /// Galera node a concurrent write to the table (another test's purge) can roll
        /// it back at certification (1213, 40001): it is run again.
        async fn edit(set: &'static str, key: String) {
            let store = open().await.unwrap();
            let sql = format!("UPDATE idempotent_record SET {set} WHERE idempotent_key = ?");
            for attempt in 1.. {
                match idem::sqlx::query(&sql).bind(&key).execute(store.pool()).await {
                    Ok(_) => return,
                    Err(idem::sqlx::Error::Database(error))
                        if error.code().as_deref() == Some("40001") && attempt < 10 =>
                    {
                        tokio::time::sleep(Duration::from_millis(20 * attempt)).await;
                    }
                    Err(error) => panic!("{sql}: {error}"),
                }
            }
        }

        async fn corrupt(key: String) {
            edit("response_body = 'not json'", key).await;
        }

        fn unreachable() -> Store {
            let pool = idem::sqlx::mysql::MySqlPoolOptions::new()
                .acquire_timeout(Duration::from_secs(2))
                .connect_lazy("mysql://idem:idem@127.0.0.1:1/idem")
                .unwrap();
            Arc::new(MySqlStore::new(pool))
        }

        conformance_suite!(open_dyn());
        database_suite!();
    };
}

async fn open() -> Option<MySqlStore> {
    open_at("IDEM_TEST_MYSQL_URL", "MySQL/MariaDB").await
}

mysql_backend!();

store_clock_suite!(async {
    let store = open_on_store_clock("IDEM_TEST_MYSQL_URL", "MySQL/MariaDB").await?;
    Some(Arc::new(store) as Store)
});

/// The same suites through one node of a three-node Galera cluster
/// (`IDEM_TEST_GALERA_URLS`; `.ci/start-galera` starts one). The cross-node tests are
/// `idem-store-sqlx/tests/galera.rs`.
mod galera_node {
    use super::*;

    async fn open() -> Option<MySqlStore> {
        open_at("IDEM_TEST_GALERA_URLS", "Galera").await
    }

    mysql_backend!();
}

/// sqlx reports found rows, so "inserted" and "left unchanged" both say one row:
/// a claim on a live lease must still be refused, and say whose record it is.
#[tokio::test]
async fn live_lease_conflict_is_refused_despite_found_rows() {
    let Some(store) = open().await else { return };
    let biz = conformance::unique("found-rows");
    let now = idem::store::now();
    let claim = Claim::new(&biz, "k", now, Duration::from_secs(30), Duration::from_secs(60));
    let ClaimOutcome::Acquired(lease) = store.claim(&claim).await.unwrap() else {
        panic!("first claim")
    };
    assert_eq!(lease.fence, claim.first_fence());
    for _ in 0..3 {
        match store.claim(&claim).await.unwrap() {
            ClaimOutcome::Existing(record) => assert_eq!(record.fence, lease.fence),
            other => panic!("a live lease was taken: {other:?}"),
        }
    }
    let later = Claim::new(
        &biz,
        "k",
        now + Duration::from_secs(31),
        Duration::from_secs(30),
        Duration::from_secs(60),
    );
    let ClaimOutcome::Acquired(taken) = store.claim(&later).await.unwrap() else {
        panic!("takeover")
    };
    assert_eq!(
        (taken.fence, taken.created_at),
        (lease.fence + 1, lease.created_at),
        "a takeover keeps the record's life"
    );
}

/// Keys compare byte for byte: case and trailing spaces make different keys.
#[tokio::test]
async fn keys_are_exact() {
    let Some(store) = open().await else { return };
    let biz = conformance::unique("exact");
    let now = idem::store::now();
    for key in ["Key", "key", "key "] {
        let claim = Claim::new(&biz, key, now, Duration::from_secs(30), Duration::from_secs(60));
        assert!(
            matches!(store.claim(&claim).await.unwrap(), ClaimOutcome::Acquired(_)),
            "{key:?}"
        );
    }
}

idem_testkit::sql_round_trip_test!(
    MySqlStore,
    idem::sqlx::mysql::MySqlConnectOptions,
    idem::sqlx::mysql::MySqlPoolOptions,
    "IDEM_TEST_MYSQL_URL",
    "MySQL/MariaDB",
    "SELECT * FROM idempotent_record WHERE biz_type = ? AND idempotent_key = ?"
);

/// A replay's claim statement reads what it met, judged as a read's would be.
#[tokio::test]
async fn the_insert_that_reads_judges_what_it_read() {
    let Some(store) = open_on_store_clock("IDEM_TEST_MYSQL_URL", "MySQL/MariaDB").await else {
        return;
    };
    conformance::round_trips::the_insert_that_reads_judges_what_it_read(
        Arc::new(store),
        true,
        |key| edit("lease_until = UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE", key),
        |key| edit("expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE", key),
    )
    .await;
}
