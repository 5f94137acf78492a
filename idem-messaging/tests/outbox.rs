//! The outbox table on a real PostgreSQL server.

use idem_messaging::Outbox;
use idem_testkit::harness;

/// A migration under a timeout (a start-up that gave up), dropped at every point of its
/// round trips, leaves no connection of the pool inside a transaction: on a pool the
/// outbox shares with the application, the next borrower of that connection is the
/// application's own code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_cut_mid_round_trip_leave_the_connection_usable() {
    let Some(database) = idem_testkit::conformance::server_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL") else {
        return;
    };
    // One connection: every statement after a cut one runs on it.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&database)
        .await
        .unwrap();
    let outbox = Outbox::<sqlx::Postgres>::named(&format!("outbox_migrated_{}", std::process::id())).unwrap();
    outbox.migrate(&pool).await.unwrap();
    // Run again, its statements change nothing; each is cut at one of the points a whole
    // one waits at, in turn, or not at all: before, during or after the BEGIN, a
    // statement or the COMMIT.
    let mut cuts = harness::Cuts::default();
    for round in 0..400u64 {
        cuts.next(outbox.migrate(&pool)).await;
        assert!(
            !harness::lends_inside_a_transaction(&pool).await,
            "round {round}: the pooled connection was left inside a transaction"
        );
    }
    outbox.counts(&pool).await.expect("the table is there and readable");
    let cut = cuts.cut();
    println!(
        "a migration waits at most {} times; {cut} of 400 were cut",
        cuts.points()
    );
    assert!(cut > 100, "the migrations were cut mid-way ({cut} times)");
}
