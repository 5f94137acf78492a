//! The conformance suite on a SQLite file.

use idem_testkit::conformance;
use idem_testkit::{conformance_suite, database_suite};

use std::sync::Arc;
use std::time::Duration;

use conformance::calls::Store;
use idem::SqliteStore;

fn database_url() -> String {
    let path = idem_testkit::scratch::path("store.db");
    format!("sqlite://{}", path.display())
}

async fn open() -> Option<SqliteStore> {
    let store = SqliteStore::connect(&database_url())
        .await
        .expect("open the SQLite file");
    store.migrate().await.expect("migrate");
    Some(store)
}

async fn open_dyn() -> Option<Store> {
    Some(Arc::new(open().await?))
}

/// Edit a record by hand: `UPDATE idempotent_record SET {set}` on `key`.
async fn edit(set: &'static str, key: String) {
    let store = open().await.unwrap();
    let sql = format!("UPDATE idempotent_record SET {set} WHERE idempotent_key = ?");
    idem::sqlx::query(&sql).bind(key).execute(store.pool()).await.unwrap();
}

async fn corrupt(key: String) {
    edit("response_body = '{\"charge_no\": \"one\"'", key).await;
}

fn unreachable() -> Store {
    let pool = idem::sqlx::sqlite::SqlitePoolOptions::new()
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy("sqlite:///nonexistent-dir/idem.db")
        .unwrap();
    Arc::new(SqliteStore::new(pool))
}

conformance_suite!(open_dyn());
database_suite!();

#[tokio::test]
async fn migrate_is_idempotent_and_table_names_are_checked() {
    let store = open().await.unwrap();
    store.migrate().await.expect("a second migrate changes nothing");
    let error = SqliteStore::new(store.pool().clone())
        .with_table_name("x; DROP TABLE y")
        .unwrap_err();
    assert!(error.to_string().contains("invalid table name"), "{error}");
    let other = SqliteStore::new(store.pool().clone())
        .with_table_name("idem_other")
        .unwrap();
    let error = other.check_table().await.unwrap_err().to_string();
    assert!(error.contains("idem_other") && error.contains("migrate()"), "{error}");
    other.migrate().await.unwrap();
    assert_eq!(other.table_name(), "idem_other");
    let migrations: i64 =
        idem::sqlx::query_scalar("SELECT COUNT(*) FROM sqlite_master WHERE name = '_sqlx_migrations'")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(migrations, 0, "the application's migration history is not touched");
}

/// Once the store has met duplicates, a replay is a read: it answers while another
/// connection holds the file's write lock (a claim statement would wait for it, up to
/// the store's 10 s busy timeout).
#[tokio::test]
async fn a_replay_reads_past_a_writer() {
    let path = idem_testkit::scratch::path("writer.db");
    let url = format!("sqlite://{}", path.display());
    let store = SqliteStore::connect(&url).await.expect("open the SQLite file");
    store.migrate().await.expect("migrate");
    let op = idem::Idempotent::new("read-past-a-writer").store(Arc::new(store));
    let call = || op.execute("paid", async { Ok::<_, idem::Error>(7_u32) });
    for _ in 0..10 {
        assert_eq!(call().await.expect("the call is answered"), 7);
    }
    let writer = SqliteStore::connect(&url).await.expect("open the file again");
    let mut writing = writer.pool().acquire().await.unwrap();
    idem::sqlx::raw_sql("BEGIN IMMEDIATE")
        .execute(&mut *writing)
        .await
        .expect("take the write lock");
    let replay = tokio::time::timeout(Duration::from_secs(3), call()).await;
    idem::sqlx::raw_sql("ROLLBACK").execute(&mut *writing).await.unwrap();
    assert_eq!(
        replay
            .expect("the replay waited for the writer")
            .expect("the replay is answered"),
        7
    );
    drop(writing);
    let _ = std::fs::remove_file(&path);
}

/// A claim that read first judges what it read: a lapsed lease and an expired record
/// are taken over.
#[tokio::test]
async fn the_read_before_the_claim_judges_what_it_read() {
    let store = open().await.unwrap();
    conformance::round_trips::the_insert_that_reads_judges_what_it_read(
        Arc::new(store),
        false,
        |key| edit("lease_until = '2000-01-01 00:00:00.000000'", key),
        |key| edit("expires_at = '2000-01-01 00:00:00.000000'", key),
    )
    .await;
}

/// The table refuses a status idem never writes, and checking it costs no temporary
/// index: neither an insert's program nor the completion's opens an ephemeral table (a
/// check written `status IN (…)` would build one on every write, 9–13 µs a claim and its completion). (The
/// claim's own program opens one for its `RETURNING` rows.)
#[tokio::test]
async fn the_status_check_refuses_other_statuses_and_builds_no_temporary_index() {
    use idem::sqlx::Row;
    let store = open().await.unwrap();
    let by_hand = |status: &str| {
        format!(
            "INSERT INTO idempotent_record (biz_type, idempotent_key, status, fence, created_at, expires_at) \
             VALUES ('by-hand', 'k', '{status}', 1, '2000-01-01 00:00:00.000000', '2000-01-01 00:00:00.000000')"
        )
    };
    for (what, sql) in [
        ("insert", by_hand("SUCCESS")),
        ("completion", store.complete_sql().to_owned()),
    ] {
        let program = idem::sqlx::raw_sql(&format!("EXPLAIN {sql}"))
            .fetch_all(store.pool())
            .await
            .unwrap();
        let opcodes: Vec<String> = program.iter().map(|op| op.get("opcode")).collect();
        assert!(
            opcodes.iter().any(|op| op == "Insert"),
            "{what}: not a write? {opcodes:?}"
        );
        assert!(
            !opcodes.iter().any(|op| op == "OpenEphemeral"),
            "the {what} builds a temporary index on every write: {opcodes:?}"
        );
    }
    let refused = idem::sqlx::query(&by_hand("DONE"))
        .execute(store.pool())
        .await
        .expect_err("a status idem never writes is refused");
    assert!(refused.to_string().contains("CHECK constraint failed"), "{refused}");
}
