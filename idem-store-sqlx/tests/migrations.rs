//! The table's DDL as migration files (`idem-store-sqlx/migrations/*.sql`, what `idem
//! migrate --print` prints): the files are the stores' own DDL, and a table created from
//! them by hand, as a migration tool would, passes `check_table()` on every database.
//!
//! `IDEM_BLESS=1 cargo test -p idem-store-sqlx --test migrations` writes the files from the stores' DDL.

use idem_testkit::conformance;
use idem_testkit::harness;

use std::path::PathBuf;

use idem::{MySqlStore, PostgresStore, SqliteStore};

fn file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("migrations").join(name)
}

/// `ddl` is the text of the migration file `name` (or, with `IDEM_BLESS`, becomes it).
fn matches_file(name: &str, ddl: &str) {
    let path = file(name);
    if std::env::var_os("IDEM_BLESS").is_some() {
        std::fs::write(&path, ddl).unwrap();
    }
    let shipped = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(
        shipped, ddl,
        "{name} differs from the store's DDL: run `IDEM_BLESS=1 cargo test -p idem-store-sqlx --test migrations` and read the diff"
    );
}

#[tokio::test]
async fn the_files_are_the_stores_ddl() {
    let sqlite = SqliteStore::new(idem::sqlx::SqlitePool::connect_lazy("sqlite::memory:").unwrap());
    matches_file("sqlite.sql", &sqlite.migration_sql());
    let postgres = PostgresStore::new(idem::sqlx::PgPool::connect_lazy("postgres://localhost/none").unwrap());
    matches_file("postgres.sql", &postgres.migration_sql());
    let mysql = MySqlStore::new(idem::sqlx::MySqlPool::connect_lazy("mysql://localhost/none").unwrap());
    matches_file("mariadb.sql", &mysql.migration_sql_for(true));
    matches_file("mysql.sql", &mysql.migration_sql_for(false));
}

/// The statements of a migration file, on `table` instead of `idempotent_record`.
fn statements_on(name: &str, table: &str) -> Vec<String> {
    let text = std::fs::read_to_string(file(name))
        .unwrap()
        .replace("idempotent_record", table);
    text.split(";\n")
        .map(str::trim)
        .filter(|statement| !statement.is_empty())
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn a_table_made_from_the_file_passes_the_check_on_sqlite() {
    let url = harness::backend_url("sqlite", "migrations").unwrap();
    let table = conformance::unique("mig").replace('-', "_");
    let pool = idem::sqlx::SqlitePool::connect(&format!("{url}?mode=rwc"))
        .await
        .unwrap();
    for statement in statements_on("sqlite.sql", &table) {
        idem::sqlx::query(&statement).execute(&pool).await.unwrap();
    }
    let store = SqliteStore::new(pool).with_table_name(&table).unwrap();
    store
        .check_table()
        .await
        .expect("the file's table has the shape the store needs");
}

#[tokio::test]
async fn a_table_made_from_the_file_passes_the_check_on_postgres() {
    let Some(url) = harness::backend_url("postgres", "migrations") else {
        return;
    };
    let table = conformance::unique("mig").replace('-', "_");
    let pool = idem::sqlx::PgPool::connect(&url).await.unwrap();
    for statement in statements_on("postgres.sql", &table) {
        idem::sqlx::query(&statement).execute(&pool).await.unwrap();
    }
    let store = PostgresStore::new(pool).with_table_name(&table).unwrap();
    store
        .check_table()
        .await
        .expect("the file's table has the shape the store needs");
}

#[tokio::test]
async fn a_table_made_from_the_file_passes_the_check_on_mariadb() {
    let Some(url) = harness::backend_url("mysql", "migrations") else {
        return;
    };
    let table = conformance::unique("mig").replace('-', "_");
    let pool = idem::sqlx::MySqlPool::connect(&url).await.unwrap();
    for statement in statements_on("mariadb.sql", &table) {
        idem::sqlx::query(&statement).execute(&pool).await.unwrap();
    }
    let store = MySqlStore::new(pool).with_table_name(&table).unwrap();
    store
        .check_table()
        .await
        .expect("the file's table has the shape the store needs");
}

/// The statements of the migration file `name` on `table` as the version before
/// tombstones wrote them: no `subject`, `replay_until` or `tombstone` column, no
/// subject index.
fn before_tombstones(name: &str, table: &str) -> Vec<String> {
    let added = ["subject", "replay_until", "tombstone"];
    let earlier = |line: &&str| {
        !line.contains("(subject)")
            && !added
                .iter()
                .any(|column| line.trim_start().starts_with(&format!("{column} ")))
    };
    statements_on(name, table)
        .into_iter()
        .map(|statement| statement.lines().filter(earlier).collect::<Vec<_>>().join("\n"))
        .filter(|statement| !statement.is_empty())
        .collect()
}

/// A table the version before tombstones made fails the check, naming a missing
/// column, until `migrate()` adds them; then it erases (none found) like any table.
macro_rules! upgrade_test {
    ($name:ident, $backend:literal, $file:literal, $pool:ty, $store:ty) => {
        #[tokio::test]
        async fn $name() {
            let Some(url) = harness::backend_url($backend, "migrations") else {
                return;
            };
            let url = if $backend == "sqlite" {
                format!("{url}?mode=rwc")
            } else {
                url
            };
            let table = conformance::unique("old").replace('-', "_");
            let pool = <$pool>::connect(&url).await.unwrap();
            for statement in before_tombstones($file, &table) {
                idem::sqlx::query(&statement).execute(&pool).await.unwrap();
            }
            let store = <$store>::new(pool).with_table_name(&table).unwrap();
            let refused = store.check_table().await.unwrap_err().to_string();
            assert!(refused.contains("subject"), "{refused}");
            store.migrate().await.expect("migrate adds the columns");
            store
                .check_table()
                .await
                .expect("the upgraded table has every column");
            store.migrate().await.expect("migrating again changes nothing");
            let erased = idem::IdempotencyStore::erase_subject(&store, "0".repeat(64).as_str()).await;
            assert_eq!(erased.unwrap(), 0);
        }
    };
}

upgrade_test!(
    a_table_from_before_tombstones_is_migrated_on_sqlite,
    "sqlite",
    "sqlite.sql",
    idem::sqlx::SqlitePool,
    SqliteStore
);
upgrade_test!(
    a_table_from_before_tombstones_is_migrated_on_postgres,
    "postgres",
    "postgres.sql",
    idem::sqlx::PgPool,
    PostgresStore
);
upgrade_test!(
    a_table_from_before_tombstones_is_migrated_on_mariadb,
    "mysql",
    "mariadb.sql",
    idem::sqlx::MySqlPool,
    MySqlStore
);
