//! Bad input, on every store: each gets a clear error naming what was wrong, and
//! nothing already recorded is lost. (Empty, oversized and control-character keys are
//! in the conformance suite, on every store.)

use idem_testkit::conformance;
use idem_testkit::harness;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use harness::{AppError, Effects};
use idem::{idempotent, Error, IdempotencyStore, Status};

type Store = Arc<dyn IdempotencyStore>;

/// JSON maps need string keys: this `Ok` value cannot be serialized.
#[idempotent(key = key, biz = "bad", store = store)]
async fn unencodable(store: &Store, key: &str, runs: &AtomicU32) -> Result<HashMap<(u8, u8), u8>, AppError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(HashMap::from([((1, 2), 3)]))
}

#[idempotent(key = key, biz = "bad", store = store)]
async fn large(store: &Store, key: &str, size: usize, runs: &AtomicU32) -> Result<String, AppError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok("é".repeat(size / 2))
}

#[idempotent(key = key, biz = "bad", store = store)]
async fn plain(store: &Store, key: &str, runs: &AtomicU32) -> Result<u32, AppError> {
    Ok(runs.fetch_add(1, Ordering::SeqCst) + 1)
}

fn unwrap_idem<T: std::fmt::Debug>(result: Result<T, AppError>) -> Error {
    match result {
        Err(AppError::Idem(error)) => error,
        other => panic!("expected an idem error, got {other:?}"),
    }
}

async fn open(url: &str) -> (Store, Effects) {
    (idem::sql::open(url).await.expect("open"), Effects::open(url).await)
}

async fn response_that_does_not_serialize(store: &Store) {
    let (key, runs) = (conformance::unique("unencodable"), AtomicU32::new(0));
    let error = unwrap_idem(unencodable(store, &key, &runs).await);
    assert!(matches!(&error, Error::Encode { what: "response", .. }), "{error:?}");
    let message = conformance::chain(&error);
    assert!(
        message.contains("response") && message.contains(&key) && message.contains("key must be a string"),
        "{message}"
    );
    assert!(
        !error.to_string().contains("key must be a string"),
        "the cause is the source, not repeated in the message: {error}"
    );
    let record = store.get("bad", &key).await.unwrap().unwrap();
    assert_eq!(record.status, Status::Failed, "recorded, so the body is not run again");
    assert!(record.error_message.unwrap().contains("could not be recorded"));
    let again = unwrap_idem(unencodable(store, &key, &runs).await);
    assert!(matches!(again, Error::PreviousFailed { .. }), "{again:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

async fn ten_mib_response(store: &Store) {
    let (key, runs) = (conformance::unique("large"), AtomicU32::new(0));
    let size = 10 * 1024 * 1024;
    let first = large(store, &key, size, &runs).await.unwrap();
    assert_eq!(first.len(), size);
    let again = large(store, &key, 1, &runs).await.unwrap();
    assert!(again == first, "the 10 MiB response replays byte for byte");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

async fn negative_fence_is_unreadable(store: &Store, db: &Effects) {
    let (key, runs) = (conformance::unique("fence"), AtomicU32::new(0));
    plain(store, &key, &runs).await.unwrap();
    db.execute(
        "UPDATE idempotent_record SET fence = -5 WHERE biz_type = 'bad' AND idempotent_key = ?",
        &[&key],
    )
    .await
    .unwrap();
    let error = store.get("bad", &key).await.unwrap_err().to_string();
    assert!(
        error.contains("bad") && error.contains(&key) && error.contains("negative fence -5"),
        "{error}"
    );
    let error = unwrap_idem(plain(store, &key, &runs).await);
    assert!(
        matches!(error, Error::Store { .. }),
        "a record that cannot be read is never guessed at: {error:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body did not run again");
    let rows = db
        .execute(
            "UPDATE idempotent_record SET fence = 1 WHERE idempotent_key = ?",
            &[&key],
        )
        .await
        .unwrap();
    assert_eq!(rows, 1, "the row is still there");
    assert_eq!(plain(store, &key, &runs).await.unwrap(), 1, "and replays once repaired");
}

/// Tables idem did not create: missing, lacking columns, or of a shape whose columns are
/// all there and still break the statements (issue 8.4: the seed article's DDL with an
/// `AUTO_INCREMENT` id and second-precision `DATETIME`; keys compared case- or
/// pad-insensitively; instants without microseconds or time zone). `migrate()` refuses
/// each, naming the table, the column, what it found and what it needs; a store that
/// was never migrated refuses its first claim the same way, and no body runs.
async fn foreign_tables_are_refused(url: &str, db: &Effects) {
    let name = |what: &str| format!("idem_{what}_{}", std::process::id());
    let instants =
        |ty: &str| format!("lease_until {ty}, created_at {ty} NOT NULL, completed_at {ty}, expires_at {ty} NOT NULL");
    let body = "fingerprint VARCHAR(64), request_body TEXT, response_body TEXT, error_message TEXT";
    let (lacking, foreign) = (name("lacking"), name("foreign"));
    let mut tables = vec![(
        lacking.clone(),
        format!("CREATE TABLE {lacking} (biz_type VARCHAR(64), idempotent_key VARCHAR(255))"),
        vec!["column `status` is missing", "no primary key or unique index"],
    )];
    tables.push(match url.split(':').next().unwrap() {
        "sqlite" => (
            foreign.clone(),
            format!(
                "CREATE TABLE {foreign} (biz_type TEXT NOT NULL COLLATE NOCASE, idempotent_key TEXT NOT NULL \
                 COLLATE RTRIM, status TEXT NOT NULL, fence REAL NOT NULL, {body}, {}, \
                 PRIMARY KEY (biz_type, idempotent_key))",
                instants("TEXT")
            ),
            vec![
                "compares `biz_type` with the collation NOCASE",
                "compares `idempotent_key` with the collation RTRIM",
                "column `fence` is REAL, idem needs INTEGER",
            ],
        ),
        "postgres" => (
            foreign.clone(),
            format!(
                "CREATE TABLE {foreign} (biz_type CHAR(64) NOT NULL, idempotent_key VARCHAR(255) NOT NULL, \
                 status VARCHAR(16) NOT NULL, fence BIGINT NOT NULL, {body}, lease_until TIMESTAMP, \
                 created_at TIMESTAMPTZ(3) NOT NULL, completed_at TIMESTAMPTZ, expires_at TIMESTAMPTZ NOT NULL, \
                 PRIMARY KEY (biz_type, idempotent_key))"
            ),
            vec![
                "column `biz_type` is character(64)",
                "column `lease_until` is timestamp without time zone",
                "column `created_at` is timestamp(3) with time zone",
            ],
        ),
        _ => (
            // The seed article's table, with the columns idem adds.
            foreign.clone(),
            format!(
                "CREATE TABLE {foreign} (id BIGINT PRIMARY KEY AUTO_INCREMENT, biz_type VARCHAR(50) NOT NULL, \
                 idempotent_key VARCHAR(128) NOT NULL COLLATE utf8mb4_general_ci, status VARCHAR(20) NOT NULL, \
                 fence BIGINT NOT NULL, {body}, {}, UNIQUE KEY uk_biz_key (biz_type, idempotent_key)) \
                 DEFAULT CHARSET = utf8mb4 COLLATE utf8mb4_bin",
                instants("DATETIME")
            ),
            vec![
                "column `id` is AUTO_INCREMENT",
                "column `idempotent_key` is varchar(128) with collation utf8mb4_general_ci",
                "column `biz_type` is varchar(50) with collation utf8mb4_bin",
                "column `created_at` is datetime, idem needs DATETIME(6)",
                "column `response_body` is text with collation utf8mb4_bin, idem needs LONGTEXT",
            ],
        ),
    });
    let runs = AtomicU32::new(0);
    for (table, create, says) in &tables {
        db.execute(create, &[]).await.unwrap();
        let error = idem::sql::OpenOptions::new()
            .table(table)
            .open(url)
            .await
            .unwrap_err()
            .to_string();
        for part in says.iter().chain([&format!("`{table}`").as_str()]) {
            assert!(error.contains(part), "{url}: `{part}` in: {error}");
        }
        let unmigrated = idem::sql::OpenOptions::new()
            .table(table)
            .migrate(false)
            .open(url)
            .await
            .unwrap();
        let error = unwrap_idem(plain(&unmigrated, "k", &runs).await);
        assert!(matches!(&error, Error::Store { operation: "claim", .. }), "{error:?}");
        let cause = std::error::Error::source(&error).unwrap().to_string();
        assert!(cause.contains(says[0]), "the first claim says it too: {cause}");
        db.execute(&format!("DROP TABLE {table}"), &[]).await.unwrap();
    }
    let missing = idem::sql::OpenOptions::new()
        .table(&name("missing"))
        .migrate(false)
        .open(url)
        .await
        .unwrap();
    let error = unwrap_idem(plain(&missing, "k", &runs).await);
    let cause = std::error::Error::source(&error).unwrap().to_string();
    assert!(
        cause.contains("does not exist") && cause.contains("migrate()"),
        "{cause}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "no body ran");
}

/// Table names that are reserved words, or long enough that derived index names would
/// overflow or collide, work; a SQLite `schema.table` is refused up front.
async fn awkward_table_names(url: &str, db: &Effects) {
    let quote = if url.starts_with("mysql") { '`' } else { '"' };
    let long = |last: char| format!("{}{last}", "t".repeat(62));
    let runs = AtomicU32::new(0);
    for table in ["order".to_owned(), long('a'), long('b')] {
        let store = idem::sql::OpenOptions::new()
            .table(&table)
            .open(url)
            .await
            .unwrap_or_else(|e| panic!("{url} table {table}: {e}"));
        assert_eq!(plain(&store, "k", &runs).await.unwrap(), runs.load(Ordering::SeqCst));
        assert_eq!(
            plain(&store, "k", &runs).await.unwrap(),
            runs.load(Ordering::SeqCst),
            "replayed"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3, "one body per table");
    for table in ["order".to_owned(), long('a'), long('b')] {
        db.execute(&format!("DROP TABLE {quote}{table}{quote}"), &[])
            .await
            .unwrap();
    }
    if url.starts_with("sqlite") {
        let store = idem::SqliteStore::connect(url).await.unwrap();
        let error = store.with_table_name("main.idem").unwrap_err().to_string();
        assert!(error.contains("for SQLite"), "{error}");
    }
}

/// A URL of the wrong kind, or a file that cannot be opened: the error names the URL
/// (without its password).
#[tokio::test]
async fn connect_errors_name_the_url() {
    let error = idem::SqliteStore::connect("postgres://idem:secret@127.0.0.1:1/idem")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("postgres://idem:***@127.0.0.1:1/idem") && !error.contains("secret"),
        "{error}"
    );
    let error = idem::SqliteStore::connect("sqlite:///nonexistent-dir/idem.db")
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("/nonexistent-dir/idem.db"), "{error}");
}

async fn biz_too_long(store: &Store) {
    biz_refused(store, "b".repeat(65), "65 characters").await;
    // The form tokens' namespace: an operation there would share their records.
    biz_refused(store, "token.order.submit".to_owned(), "form tokens").await;
}

/// An operation in `biz` is refused with a reason containing `why`; its body does not run.
async fn biz_refused(store: &Store, biz: String, why: &str) {
    let op = idem::Idempotent::new(biz).store(store.clone());
    let ran = AtomicU32::new(0);
    let error = op
        .execute("k", async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<u8, Error>(1)
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&error, Error::InvalidBiz { reason, .. } if reason.contains(why)),
        "{error:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

async fn every_case(backend: &str) {
    let Some(url) = harness::backend_url(backend, "bad") else {
        return;
    };
    let (store, db) = open(&url).await;
    response_that_does_not_serialize(&store).await;
    ten_mib_response(&store).await;
    negative_fence_is_unreadable(&store, &db).await;
    foreign_tables_are_refused(&url, &db).await;
    awkward_table_names(&url, &db).await;
    biz_too_long(&store).await;
}

#[tokio::test]
async fn bad_input_on_sqlite() {
    every_case("sqlite").await;
}

#[tokio::test]
async fn bad_input_on_postgres() {
    every_case("postgres").await;
}

#[tokio::test]
async fn bad_input_on_mysql() {
    every_case("mysql").await;
}

#[tokio::test]
async fn bad_input_on_memory() {
    let store: Store = Arc::new(idem::MemoryStore::new());
    response_that_does_not_serialize(&store).await;
    ten_mib_response(&store).await;
    biz_too_long(&store).await;
}

/// SQLite stores whatever bytes it is given: a stored column that is not UTF-8 is an
/// error naming the record, never a guess. (PostgreSQL and MariaDB refuse such bytes
/// in a text column themselves, which is tested too.)
#[tokio::test]
async fn non_utf8_column() {
    for backend in ["sqlite", "postgres", "mysql"] {
        let Some(url) = harness::backend_url(backend, "utf8") else {
            continue;
        };
        let (store, db) = open(&url).await;
        let (key, runs) = (conformance::unique("utf8"), AtomicU32::new(0));
        plain(&store, &key, &runs).await.unwrap();
        let corrupt = match backend {
            "sqlite" => "UPDATE idempotent_record SET response_body = CAST(X'FFFE41' AS TEXT) WHERE idempotent_key = ?",
            "postgres" => "UPDATE idempotent_record SET response_body = convert_from('\\xfffe41', 'UTF8') WHERE idempotent_key = ?",
            _ => "UPDATE idempotent_record SET response_body = X'FFFE41' WHERE idempotent_key = ?",
        };
        match db.execute(corrupt, &[&key]).await {
            Ok(_) => {
                let error = store.get("bad", &key).await.unwrap_err().to_string();
                assert!(
                    error.contains(&key) && error.contains("unreadable"),
                    "{backend}: {error}"
                );
                let error = unwrap_idem(plain(&store, &key, &runs).await);
                assert!(matches!(error, Error::Store { .. }), "{backend}: {error:?}");
                assert_eq!(runs.load(Ordering::SeqCst), 1, "{backend}: the body did not run again");
                harness::say(&format!(
                    "non-UTF-8 on {backend}: stored, then read back as an error naming the record"
                ));
            }
            Err(refused) => {
                assert_ne!(backend, "sqlite", "SQLite accepts any bytes");
                let record = store.get("bad", &key).await.unwrap().unwrap();
                assert_eq!(
                    record.response_body.as_deref(),
                    Some("1"),
                    "{backend} refused ({refused}); record intact"
                );
                harness::say(&format!(
                    "non-UTF-8 on {backend}: the server refused the bytes ({refused})"
                ));
            }
        }
    }
}
