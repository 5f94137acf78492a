//! The `idem` binary against a SQLite file and PostgreSQL filled with known records:
//! its figures against the rows, its JSON parsed, its exit codes, and a purge of
//! 100,000 expired records.

use std::process::{Command, Output};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_runtime::{Claim, ClaimOutcome, IdempotencyStore, Lease};
use serde_json::Value;

fn idem(url: &str, table: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["--database-url", url, "--table", table])
        .args(args)
        .output()
        .expect("run idem")
}

fn json(output: &Output) -> Value {
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stdout)))
}

fn unique(name: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("{name}_{}_{}", std::process::id(), nanos % 1_000_000_000)
}

async fn claimed(
    store: &dyn IdempotencyStore,
    biz: &str,
    key: &str,
    at: SystemTime,
    lease: Duration,
    ttl: Duration,
) -> Lease {
    match store.claim(&Claim::new(biz, key, at, lease, ttl)).await.unwrap() {
        ClaimOutcome::Acquired(lease) => lease,
        other => panic!("{other:?}"),
    }
}

/// The known records: `cli.pay` 3 live SUCCESS, 2 expired SUCCESS, 1 FAIL, 1 stuck
/// PROCESSING; `cli.sms` 2 SUCCESS.
async fn fill(store: &dyn IdempotencyStore) {
    let now = idem_runtime::now();
    let (hour, day) = (Duration::from_secs(3600), Duration::from_secs(86_400));
    for key in ["live-1", "live-2", "live-3"] {
        let lease = claimed(store, "cli.pay", key, now, hour, day).await;
        assert_eq!(
            store.complete(&lease, "\"ok\"", now, day).await.unwrap(),
            idem_runtime::FenceCheck::Held
        );
    }
    for key in ["old-1", "old-2"] {
        let lease = claimed(store, "cli.pay", key, now - 3 * day, hour, hour).await;
        assert_eq!(
            store.complete(&lease, "\"old\"", now - 3 * day, hour).await.unwrap(),
            idem_runtime::FenceCheck::Held
        );
    }
    let lease = claimed(store, "cli.pay", "declined", now, hour, day).await;
    assert_eq!(
        store.fail(&lease, "card declined", now, day).await.unwrap(),
        idem_runtime::FenceCheck::Held
    );
    claimed(store, "cli.pay", "stuck", now - hour, 2 * hour, day).await;
    for key in ["sms-1", "sms-2"] {
        let lease = claimed(store, "cli.sms", key, now, hour, day).await;
        assert_eq!(
            store.complete(&lease, "1", now, day).await.unwrap(),
            idem_runtime::FenceCheck::Held
        );
    }
}

async fn the_commands(url: &str, table: &str, store: &dyn IdempotencyStore) {
    fill(store).await;

    let stats = json(&idem(url, table, &["--json", "stats"]));
    let rows = stats["by_biz_and_status"].as_array().unwrap();
    let row = |biz: &str, status: &str| {
        rows.iter()
            .find(|r| r["biz"] == biz && r["status"] == status)
            .map(|r| (r["records"].as_u64().unwrap(), r["expired"].as_u64().unwrap()))
    };
    assert_eq!(row("cli.pay", "SUCCESS"), Some((5, 2)), "{stats}");
    assert_eq!(row("cli.pay", "FAIL"), Some((1, 0)));
    assert_eq!(row("cli.pay", "PROCESSING"), Some((1, 0)));
    assert_eq!(row("cli.sms", "SUCCESS"), Some((2, 0)));
    assert_eq!(stats["oldest_processing"]["key"], "stuck");
    let text = idem(url, table, &["stats", "--biz", "cli.sms"]);
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains("cli.sms") && !text.contains("cli.pay") && text.contains("2 records"),
        "{text}"
    );

    let stuck = json(&idem(url, table, &["--json", "stuck", "--older-than", "30m"]));
    assert_eq!(stuck.as_array().unwrap().len(), 1);
    assert_eq!(stuck[0]["key"], "stuck");
    let failed = json(&idem(url, table, &["--json", "failed", "--biz", "cli.pay"]));
    assert_eq!(
        (failed[0]["key"].as_str(), failed[0]["error_message"].as_str()),
        (Some("declined"), Some("card declined"))
    );
    let shown = json(&idem(url, table, &["--json", "show", "cli.pay", "live-2"]));
    assert_eq!(
        (shown[0]["status"].as_str(), shown[0]["response_body"].as_str()),
        (Some("SUCCESS"), Some("\"ok\""))
    );
    assert_eq!(idem(url, table, &["show", "cli.pay", "nope"]).status.code(), Some(1));

    // Repairs: asked for without --yes (no terminal answer: refused), done with it.
    let asked = idem(url, table, &["release", "cli.pay", "stuck"]);
    assert_eq!(asked.status.code(), Some(1));
    assert!(
        store.get("cli.pay", "stuck").await.unwrap().is_some(),
        "not released without a yes"
    );
    assert_eq!(
        idem(url, table, &["release", "cli.pay", "stuck", "--yes"])
            .status
            .code(),
        Some(0)
    );
    assert!(store.get("cli.pay", "stuck").await.unwrap().is_none());
    assert_eq!(
        idem(url, table, &["release", "cli.pay", "live-1", "--yes"])
            .status
            .code(),
        Some(1),
        "only PROCESSING"
    );
    assert_eq!(
        idem(url, table, &["retry-failed", "cli.pay", "declined", "--yes"])
            .status
            .code(),
        Some(0)
    );
    assert!(store.get("cli.pay", "declined").await.unwrap().is_none());
    assert_eq!(
        idem(url, table, &["retry-failed", "cli.pay", "live-1", "--yes"])
            .status
            .code(),
        Some(1)
    );

    let purged = json(&idem(url, table, &["--json", "purge", "--expired"]));
    assert_eq!(purged["purged"], 2);
    assert!(store.get("cli.pay", "old-1").await.unwrap().is_none());
    assert!(store.get("cli.pay", "live-1").await.unwrap().is_some());

    let check = idem(url, table, &["check"]);
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
}

fn failures(url: &str) {
    let unknown = idem("ftp://somewhere", "t", &["stats"]);
    assert_eq!(unknown.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("ftp://somewhere"));
    let bogus = unique("bogus");
    let check = idem(url, &bogus, &["check"]);
    assert_eq!(check.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&check.stderr).contains(&bogus),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let usage = idem(url, "t", &["stuck"]);
    assert_eq!(usage.status.code(), Some(2), "a missing --older-than is a usage error");
}

/// 100,000 expired records and 100 live ones: the purge reports its progress and
/// deletes exactly the expired.
fn purges_exactly_the_expired(url: &str, table: &str, fill_sql: &str) -> u64 {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store = idem_store_sqlx::open_table(url, table).await.unwrap();
        let now = idem_runtime::now();
        for i in 0..100 {
            let lease = claimed(
                &*store,
                "cli.bulk",
                &format!("live-{i}"),
                now,
                Duration::from_secs(60),
                Duration::from_secs(86_400),
            )
            .await;
            assert_eq!(
                store
                    .complete(&lease, "1", now, Duration::from_secs(86_400))
                    .await
                    .unwrap(),
                idem_runtime::FenceCheck::Held
            );
        }
        if url.starts_with("sqlite") {
            let pool = sqlx_pool_sqlite(url).await;
            sqlx_exec_sqlite(&pool, fill_sql).await;
        } else {
            let pool = sqlx_pool_postgres(url).await;
            sqlx_exec_postgres(&pool, fill_sql).await;
        }
    });
    let purge = idem(url, table, &["purge", "--expired", "--batch", "5000"]);
    let stderr = String::from_utf8_lossy(&purge.stderr);
    let stdout = String::from_utf8_lossy(&purge.stdout);
    assert!(purge.status.success(), "{stderr}");
    assert!(
        stderr.lines().filter(|l| l.starts_with("purged ")).count() >= 20,
        "a line per batch: {stderr}"
    );
    assert!(stdout.contains("purged 100000 expired records"), "{stdout}");
    let stats = json(&idem(url, table, &["--json", "stats", "--biz", "cli.bulk"]));
    let rows = stats["by_biz_and_status"].as_array().unwrap();
    rows.iter().map(|r| r["records"].as_u64().unwrap()).sum()
}

async fn sqlx_pool_sqlite(url: &str) -> idem_store_sqlx::sqlx::SqlitePool {
    idem_store_sqlx::sqlx::SqlitePool::connect(url).await.unwrap()
}

async fn sqlx_exec_sqlite(pool: &idem_store_sqlx::sqlx::SqlitePool, sql: &str) {
    idem_store_sqlx::sqlx::query(sql).execute(pool).await.unwrap();
}

async fn sqlx_pool_postgres(url: &str) -> idem_store_sqlx::sqlx::PgPool {
    idem_store_sqlx::sqlx::PgPool::connect(url).await.unwrap()
}

async fn sqlx_exec_postgres(pool: &idem_store_sqlx::sqlx::PgPool, sql: &str) {
    idem_store_sqlx::sqlx::query(sql).execute(pool).await.unwrap();
}

const COLUMNS: &str =
    "biz_type, idempotent_key, status, fence, lease_until, created_at, completed_at, expires_at, response_body";

#[test]
fn on_sqlite() {
    let path = std::env::temp_dir().join(format!("{}.db", unique("idem-cli")));
    let url = format!("sqlite://{}?mode=rwc", path.display());
    let table = "idempotent_record";
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let store = runtime.block_on(idem_store_sqlx::open_table(&url, table)).unwrap();
    runtime.block_on(the_commands(&url, table, &*store));
    failures(&url);
    let stamp = "'2020-01-01 00:00:00.000000'";
    let fill = format!(
        "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 100000) \
         INSERT INTO {table} ({COLUMNS}) SELECT 'cli.bulk', 'old-' || i, 'SUCCESS', 1, {stamp}, {stamp}, {stamp}, {stamp}, '1' FROM s"
    );
    assert_eq!(
        purges_exactly_the_expired(&url, table, &fill),
        100,
        "the 100 live records stay"
    );
}

#[test]
fn on_postgres() {
    let Ok(url) = std::env::var("IDEM_TEST_POSTGRES_URL") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run the CLI against PostgreSQL"
        );
        return;
    };
    let table = unique("idem_cli");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let store = runtime.block_on(idem_store_sqlx::open_table(&url, &table)).unwrap();
    runtime.block_on(the_commands(&url, &table, &*store));
    failures(&url);
    let stamp = "'2020-01-01 00:00:00+00'";
    let fill = format!(
        "INSERT INTO {table} ({COLUMNS}) SELECT 'cli.bulk', 'old-' || i, 'SUCCESS', 1, {stamp}, {stamp}, {stamp}, {stamp}, '1' \
         FROM generate_series(1, 100000) i"
    );
    assert_eq!(
        purges_exactly_the_expired(&url, &table, &fill),
        100,
        "the 100 live records stay"
    );
}
