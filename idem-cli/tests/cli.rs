//! The `idem` binary against a SQLite file, PostgreSQL, MariaDB and Redis filled with
//! known records: its figures against the rows, its JSON parsed, its exit codes, a
//! claim whose body is running (never listed as stuck, never released), and a purge of
//! 100,000 expired records.

use std::process::{Command, Output};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::sync::Arc;

use idem_runtime::{Claim, ClaimOutcome, IdempotencyStore, Idempotent, Lease};
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
/// PROCESSING (its lease lapsed), 1 running PROCESSING (its lease runs); `cli.sms` 2
/// SUCCESS; `cli.other` 1 FAIL older than `cli.pay`'s; one open form token.
async fn fill(store: &dyn IdempotencyStore) {
    let now = idem_runtime::now();
    let (minute, hour, day) = (
        Duration::from_secs(60),
        Duration::from_secs(3600),
        Duration::from_secs(86_400),
    );
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
    let lease = claimed(store, "cli.other", "older-failure", now - 2 * hour, hour, day).await;
    assert_eq!(
        store.fail(&lease, "timed out", now - 2 * hour, day).await.unwrap(),
        idem_runtime::FenceCheck::Held
    );
    let lease = claimed(store, "cli.pay", "declined", now, hour, day).await;
    assert_eq!(
        store.fail(&lease, "card declined", now, day).await.unwrap(),
        idem_runtime::FenceCheck::Held
    );
    claimed(store, "cli.pay", "stuck", now - hour, 10 * minute, day).await;
    claimed(store, "cli.pay", "running", now - 50 * minute, 2 * hour, day).await;
    for key in ["sms-1", "sms-2"] {
        let lease = claimed(store, "cli.sms", key, now, hour, day).await;
        assert_eq!(
            store.complete(&lease, "1", now, day).await.unwrap(),
            idem_runtime::FenceCheck::Held
        );
    }
    idem_runtime::token::issue_on(store, "cli.form", hour).await.unwrap();
    // A token whose time ran out: PROCESSING, its lease lapsed, never a stuck claim.
    idem_runtime::token::issue_on(store, "cli.spent-form", Duration::from_millis(1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
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
    assert_eq!(row("cli.pay", "PROCESSING"), Some((2, 0)));
    assert_eq!(row("cli.sms", "SUCCESS"), Some((2, 0)));
    assert!(
        rows.iter().all(|r| !r["biz"].as_str().unwrap().starts_with("token.")),
        "form tokens are counted apart: {stats}"
    );
    assert_eq!(stats["tokens"][0]["biz"], "token.cli.form", "{stats}");
    assert_eq!(stats["tokens"][0]["status"], "PROCESSING");
    assert_eq!(stats["oldest_processing"]["key"], "stuck");
    assert!(
        stats["oldest_processing"]["created_at"]
            .as_str()
            .unwrap()
            .ends_with('Z'),
        "RFC 3339: {stats}"
    );
    let text = idem(url, table, &["stats", "--biz", "cli.sms"]);
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains("cli.sms") && !text.contains("cli.pay") && text.contains("2 records"),
        "{text}"
    );

    // Stuck: the lapsed claim only — not the running one, not the open form token.
    let stuck = json(&idem(url, table, &["--json", "stuck", "--older-than", "30m"]));
    let keys: Vec<&str> = stuck
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["stuck"], "{stuck}");
    assert!(stuck[0]["lease_until"].as_str().unwrap().ends_with('Z'));
    let every = json(&idem(url, table, &["--json", "stuck"]));
    let keys: Vec<&str> = every
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["stuck"], "no form token is a stuck claim: {every}");
    let none = json(&idem(url, table, &["--json", "stuck", "--biz", "cli.sms"]));
    assert_eq!(none.as_array().unwrap().len(), 0, "the biz filter is exact: {none}");
    // The biz filter runs before the limit: the oldest FAIL of another biz does not
    // take the one place.
    let failed = json(&idem(
        url,
        table,
        &["--json", "failed", "--biz", "cli.pay", "--limit", "1"],
    ));
    assert_eq!(
        (failed[0]["key"].as_str(), failed[0]["error_message"].as_str()),
        (Some("declined"), Some("card declined")),
        "{failed}"
    );
    let shown = json(&idem(url, table, &["--json", "show", "cli.pay", "live-2"]));
    assert_eq!(
        (shown[0]["status"].as_str(), shown[0]["response_body"].as_str()),
        (Some("SUCCESS"), Some("\"ok\""))
    );
    let shown = idem(url, table, &["show", "cli.pay", "declined"]);
    let shown = String::from_utf8(shown.stdout).unwrap();
    for field in ["expires_at", "lease_until", "steps", "request_body", "card declined"] {
        assert!(shown.contains(field), "`show` prints every field: {shown}");
    }
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
    let refused = idem(url, table, &["release", "cli.pay", "running", "--yes"]);
    assert_eq!(refused.status.code(), Some(1), "a running lease is not released");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("runs until") && said.contains("--force"), "{said}");
    assert!(store.get("cli.pay", "running").await.unwrap().is_some());
    assert_eq!(
        idem(url, table, &["release", "cli.pay", "running", "--yes", "--force"])
            .status
            .code(),
        Some(0),
        "--force frees it"
    );
    assert!(store.get("cli.pay", "running").await.unwrap().is_none());
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
    assert_eq!(purged["purged"], 3, "the two expired records and the expired token");
    assert!(store.get("cli.pay", "old-1").await.unwrap().is_none());
    assert!(store.get("cli.pay", "live-1").await.unwrap().is_some());

    let check = idem(url, table, &["check"]);
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
}

/// A body at work, its lease renewed by the heartbeat past its first lease: `stuck`
/// does not list it (on a SQL store, `lists`) and `release` refuses it, so the next
/// call does not run beside it.
async fn a_running_body_is_neither_stuck_nor_released(
    url: &str,
    table: &str,
    store: Arc<dyn IdempotencyStore>,
    lists: bool,
) {
    let key = unique("running-body");
    let body = {
        let (store, key) = (store.clone(), key.clone());
        tokio::spawn(async move {
            Idempotent::new("cli.live")
                .store(store)
                .lease(Duration::from_secs(1))
                .execute(&key, async {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    Ok::<_, idem_runtime::Error>(7u32)
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (url, table, probe_key) = (url.to_owned(), table.to_owned(), key.clone());
    tokio::task::spawn_blocking(move || {
        if lists {
            let stuck = json(&idem(
                &url,
                &table,
                &["--json", "stuck", "--older-than", "1s", "--biz", "cli.live"],
            ));
            assert_eq!(
                stuck.as_array().unwrap().len(),
                0,
                "a renewed claim is not stuck: {stuck}"
            );
        }
        let released = idem(&url, &table, &["release", "cli.live", &probe_key, "--yes"]);
        assert_eq!(
            released.status.code(),
            Some(1),
            "{}",
            String::from_utf8_lossy(&released.stderr)
        );
    })
    .await
    .unwrap();
    assert_eq!(
        body.await.unwrap().unwrap(),
        7,
        "the body kept its claim and recorded its answer"
    );
    let record = store.get("cli.live", &key).await.unwrap().unwrap();
    assert_eq!(record.status, idem_runtime::Status::Succeeded);
}

/// A store whose server refuses connections fails in about a second (not after a pool's
/// 30 s time-out) and says why.
fn unreachable_fails_fast(url: &str) {
    let started = std::time::Instant::now();
    let down = idem(url, "t", &["stats"]);
    assert_eq!(down.status.code(), Some(3));
    let said = String::from_utf8_lossy(&down.stderr).to_lowercase();
    assert!(said.contains("refused"), "the driver's cause is kept: {said}");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
}

fn failures(url: &str) {
    let unknown = idem("ftp://somewhere", "t", &["stats"]);
    assert_eq!(
        unknown.status.code(),
        Some(2),
        "an unknown kind of store is a usage error"
    );
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("ftp://somewhere"));
    let no_url = Command::new(env!("CARGO_BIN_EXE_idem"))
        .arg("stats")
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert_eq!(no_url.status.code(), Some(2), "no store URL is a usage error");
    assert!(String::from_utf8_lossy(&no_url.stderr).contains("DATABASE_URL"));
    let bogus = unique("bogus");
    let check = idem(url, &bogus, &["check"]);
    assert_eq!(check.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&check.stderr).contains(&bogus),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let usage = idem(url, "t", &["stuck", "--older-than", "soon"]);
    assert_eq!(usage.status.code(), Some(2), "a bad --older-than is a usage error");
}

/// A store that writes records at the instants it is given (hours in the past), for
/// the commands — which judge by the server's clock — to find.
async fn past_writer(url: &str, table: &str) -> Arc<dyn IdempotencyStore> {
    idem_store_sqlx::OpenOptions::new()
        .table(table)
        .lease_clock(idem_runtime::LeaseClock::Caller)
        .open(url)
        .await
        .unwrap()
}

/// 100,000 expired records and 100 live ones: the purge reports its progress and
/// deletes exactly the expired.
fn purges_exactly_the_expired(url: &str, table: &str, fill_sql: &str) -> u64 {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store = past_writer(url, table).await;
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
        use idem_store_sqlx::sqlx;
        if url.starts_with("sqlite") {
            let pool = sqlx::SqlitePool::connect(url).await.unwrap();
            sqlx::query(fill_sql).execute(&pool).await.unwrap();
        } else if url.starts_with("postgres") {
            let pool = sqlx::PgPool::connect(url).await.unwrap();
            sqlx::query(fill_sql).execute(&pool).await.unwrap();
        } else {
            let pool = sqlx::MySqlPool::connect(url).await.unwrap();
            sqlx::query(fill_sql).execute(&pool).await.unwrap();
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

const COLUMNS: &str =
    "biz_type, idempotent_key, status, fence, lease_until, created_at, completed_at, expires_at, response_body";

/// Every command and failure on the SQL store at `url` (`table` is created), and a
/// purge of 100,000 expired records written by `fill_sql` (`{table}` in it).
fn on_sql(url: &str, table: &str, fill_sql: &str) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let store = runtime.block_on(past_writer(url, table));
    runtime.block_on(the_commands(url, table, &*store));
    runtime.block_on(a_running_body_is_neither_stuck_nor_released(
        url,
        table,
        store.clone(),
        true,
    ));
    failures(url);
    assert_eq!(
        purges_exactly_the_expired(url, table, &fill_sql.replace("{table}", table)),
        100,
        "the 100 live records stay"
    );
}

#[test]
fn on_sqlite() {
    let path = idem_testkit::scratch::path(&format!("{}.db", unique("cli")));
    let url = format!("sqlite://{}?mode=rwc", path.display());
    let stamp = "'2020-01-01 00:00:00.000000'";
    on_sql(
        &url,
        "idempotent_record",
        &format!(
            "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 100000) \
             INSERT INTO {{table}} ({COLUMNS}) SELECT 'cli.bulk', 'old-' || i, 'SUCCESS', 1, {stamp}, {stamp}, {stamp}, {stamp}, '1' FROM s"
        ),
    );
}

#[test]
fn on_postgres() {
    let Some(url) = idem_testkit::conformance::server_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL") else {
        return;
    };
    let stamp = "'2020-01-01 00:00:00+00'";
    on_sql(
        &url,
        &unique("idem_cli"),
        &format!(
            "INSERT INTO {{table}} ({COLUMNS}) SELECT 'cli.bulk', 'old-' || i, 'SUCCESS', 1, {stamp}, {stamp}, {stamp}, {stamp}, '1' \
             FROM generate_series(1, 100000) i"
        ),
    );
    unreachable_fails_fast("postgres://postgres@127.0.0.1:1/postgres");
}

/// Pointed at a hot standby (a Patroni cluster's replica port behind HAProxy), the
/// command refuses before it reads or changes anything, and says why.
#[test]
fn a_standby_is_refused() {
    let Some(url) = idem_testkit::conformance::server_url("IDEM_TEST_PATRONI_REPLICA_URL", "Patroni replica") else {
        return;
    };
    for args in [&["stats"][..], &["purge", "--expired"][..]] {
        let output = idem(&url, "idempotent_record", args);
        assert!(!output.status.success(), "{args:?} on a standby succeeded");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("reached a read-only server, a hot standby"),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn on_mariadb() {
    let Some(url) = idem_testkit::conformance::server_url("IDEM_TEST_MYSQL_URL", "MariaDB") else {
        return;
    };
    let stamp = "'2020-01-01 00:00:00'";
    on_sql(
        &url,
        &unique("idem_cli"),
        &format!(
            "INSERT INTO {{table}} ({COLUMNS}) SELECT 'cli.bulk', CONCAT('old-', seq), 'SUCCESS', 1, {stamp}, {stamp}, {stamp}, {stamp}, '1' \
             FROM seq_1_to_100000"
        ),
    );
    unreachable_fails_fast("mysql://idem:idem@127.0.0.1:1/idem");
}

#[test]
fn on_redis() {
    let Some(url) = idem_testkit::conformance::server_url("IDEM_TEST_REDIS_URL", "Redis") else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let store: Arc<dyn IdempotencyStore> =
        // It writes records hours in the past, at the instants it is given.
        Arc::new(
            runtime
                .block_on(idem_store_redis::RedisStore::connect(&url))
                .unwrap()
                .with_lease_clock(idem_runtime::LeaseClock::Caller),
        );
    let biz = unique("cli.redis");
    let now = idem_runtime::now();
    let (minute, hour) = (Duration::from_secs(60), Duration::from_secs(3600));
    runtime.block_on(async {
        claimed(&*store, &biz, "stuck", now - hour, 10 * minute, hour).await;
        claimed(&*store, &biz, "running", now - hour, 2 * hour, hour).await;
    });
    let shown = json(&idem(&url, "t", &["--json", "show", &biz, "running"]));
    assert_eq!(shown[0]["status"], "PROCESSING");
    assert_eq!(
        idem(&url, "t", &["release", &biz, "running", "--yes"]).status.code(),
        Some(1)
    );
    assert_eq!(
        idem(&url, "t", &["release", &biz, "stuck", "--yes"]).status.code(),
        Some(0)
    );
    runtime.block_on(async {
        assert!(store.get(&biz, "stuck").await.unwrap().is_none());
        assert!(store.get(&biz, "running").await.unwrap().is_some());
    });
    assert!(idem(&url, "t", &["purge", "--expired"]).status.success());
    for command in [
        &["stats"][..],
        &["stuck"],
        &["failed"],
        &["retry-failed", "b", "k", "--yes"],
        &["check"],
        &["migrate"],
    ] {
        let refused = idem(&url, "t", command);
        assert_eq!(refused.status.code(), Some(2), "{command:?} is not a Redis command");
        assert!(String::from_utf8_lossy(&refused.stderr).contains("needs a SQL store"));
    }
    runtime.block_on(a_running_body_is_neither_stuck_nor_released(&url, "t", store, false));
}

/// `idem outbox …` on a SQLite outbox with a row parked, a row sent a day ago and a
/// row pending: the counts, the parked row and why, giving it back, deleting the sent.
#[test]
fn outbox_commands_on_sqlite() {
    use idem_amqp::{Outbox, OutboxMessage};
    let path = idem_testkit::scratch::path(&format!("{}.db", unique("cli-outbox")));
    let url = format!("sqlite://{}?mode=rwc", path.display());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
        let outbox = Outbox::<sqlx::Sqlite>::new();
        outbox.migrate(&pool).await.unwrap();
        let mut connection = pool.acquire().await.unwrap();
        for n in 0..3 {
            let message = OutboxMessage::json("orders", "placed", &serde_json::json!({ "n": n })).unwrap();
            outbox.push(&mut connection, &message).await.unwrap();
        }
        sqlx::query(
            "UPDATE idem_outbox SET attempts = 10, dead_at = '2026-01-01T00:00:00.000Z', \
             last_error = 'exchange \"orders\" does not exist' WHERE id = 1",
        )
        .execute(&mut *connection)
        .await
        .unwrap();
        sqlx::query("UPDATE idem_outbox SET sent_at = '2020-01-01T00:00:00.000Z' WHERE id = 2")
            .execute(&mut *connection)
            .await
            .unwrap();
    });
    let table = "idempotent_record";
    // The record table need not exist for the outbox commands.
    let counts = json(&idem(&url, table, &["--json", "outbox", "counts"]));
    assert_eq!(
        counts,
        serde_json::json!({"pending": 1, "retrying": 0, "sent": 1, "dead": 1})
    );
    let dead = json(&idem(&url, table, &["--json", "outbox", "dead"]));
    assert_eq!(dead[0]["id"], 1);
    assert_eq!(dead[0]["attempts"], 10);
    assert_eq!(dead[0]["error"], "exchange \"orders\" does not exist");
    let listed = idem(&url, table, &["outbox", "dead"]);
    assert!(String::from_utf8_lossy(&listed.stdout).contains("does not exist"));

    let refused = idem(&url, table, &["outbox", "retry-dead", "--id", "3", "--yes"]);
    assert_eq!(refused.status.code(), Some(1), "row 3 is not parked");
    let revived = json(&idem(
        &url,
        table,
        &["--json", "outbox", "retry-dead", "--all", "--yes"],
    ));
    assert_eq!(revived, serde_json::json!({"revived": 1}));
    let purged = json(&idem(
        &url,
        table,
        &["--json", "outbox", "purge-sent", "--older-than", "1d", "--batch", "1"],
    ));
    assert_eq!(purged, serde_json::json!({"purged": 1}));
    let counts = json(&idem(&url, table, &["--json", "outbox", "counts"]));
    assert_eq!(
        counts,
        serde_json::json!({"pending": 2, "retrying": 0, "sent": 0, "dead": 0})
    );
    let usage = idem(&url, table, &["outbox", "retry-dead", "--yes"]);
    assert_eq!(usage.status.code(), Some(2), "neither --id nor --all");
    let _ = std::fs::remove_file(path);
}

/// `idem show --http "POST /payments" --caller alice pay order-7` finds the record the
/// HTTP layer keeps for alice's key (`POST /payments 5:alice order-7`), with a tenant
/// too; a scope that is not whole is a usage error.
#[test]
fn show_finds_an_http_record_by_the_clients_key() {
    let path = idem_testkit::scratch::path(&format!("{}.db", unique("cli-http")));
    let url = format!("sqlite://{}?mode=rwc", path.display());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let table = "idempotent_record";
    runtime.block_on(async {
        let store = idem_store_sqlx::SqliteStore::connect(&url).await.unwrap();
        store.migrate().await.unwrap();
        for (key, answer) in [
            ("POST /payments 5:alice order-7", "alice"),
            ("POST /payments 9:4:acmebob order-7", "bob"),
        ] {
            let op = Idempotent::new("pay").store(Arc::new(store.clone()));
            let _: String = op
                .execute(key, async { Ok::<_, idem_runtime::Error>(answer.to_owned()) })
                .await
                .unwrap();
        }
    });
    let show = |scope: &[&str]| {
        let args: Vec<&str> = ["--json", "show", "--http"]
            .iter()
            .chain(scope)
            .chain(&["pay", "order-7"])
            .copied()
            .collect();
        json(&idem(&url, table, &args))
    };
    assert_eq!(
        show(&["POST /payments", "--caller", "alice"])[0]["response_body"],
        "\"alice\""
    );
    assert_eq!(
        show(&["post /payments", "--caller", "bob", "--tenant", "acme"])[0]["response_body"],
        "\"bob\""
    );
    let missing = idem(
        &url,
        table,
        &[
            "show",
            "--http",
            "POST /payments",
            "--caller",
            "carol",
            "pay",
            "order-7",
        ],
    );
    assert_eq!(missing.status.code(), Some(1));
    let whole = idem(&url, table, &["show", "--http", "POST /payments", "pay", "order-7"]);
    assert_eq!(whole.status.code(), Some(2), "no caller");
    assert!(String::from_utf8_lossy(&whole.stderr).contains("--caller"));
    let _ = std::fs::remove_file(path);
}

/// A record sealed by the application (`SealedStore`), waiting to be settled: without
/// the key ring `idem unknown` says one is sealed and `idem show` prints only sealed
/// text; with `--seal-keys` it is listed and shown in clear, and `idem settle` writes
/// the value sealed, as the application reads it back.
#[test]
fn sealed_records_are_read_and_settled_with_the_key_ring() {
    use idem_runtime::seal::{SealKey, SealedStore, StaticKeyRing, SEALED_PREFIX};
    let path = idem_testkit::scratch::path(&format!("{}.db", unique("cli-seal")));
    let url = format!("sqlite://{}?mode=rwc", path.display());
    let table = "idempotent_record";
    let keys = "k1:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE";
    let ring = || StaticKeyRing::new(SealKey::new("k1", [1; 32]).unwrap(), []);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let plain = runtime.block_on(async {
        let plain = idem_store_sqlx::SqliteStore::connect(&url).await.unwrap();
        plain.migrate().await.unwrap();
        let sealed = SealedStore::new(Arc::new(plain.clone()), ring());
        let (hour, day) = (Duration::from_secs(3600), Duration::from_secs(86_400));
        // Its holder's lease lapsed: the record waits for an operator.
        let lease = claimed(&sealed, "cli.seal", "order-9", idem_runtime::now() - 2 * hour, hour, day).await;
        let steps = r#"{"charge":"!unknown: {\"step\":\"charge\",\"effect_key\":\"cli.seal:order-9:charge\",\"attempt\":1,\"at\":7}"}"#;
        assert_eq!(sealed.record_steps(&lease, steps).await.unwrap(), idem_runtime::FenceCheck::Held);
        plain
    });
    let raw = |plain: &idem_store_sqlx::SqliteStore| {
        runtime.block_on(async { plain.get("cli.seal", "order-9").await.unwrap().unwrap().steps.unwrap() })
    };
    assert!(
        !raw(&plain).contains("order-9:charge"),
        "the intent is sealed: {}",
        raw(&plain)
    );

    let blind = idem(&url, table, &["--json", "unknown"]);
    assert_eq!(json(&blind), serde_json::json!([]));
    assert!(String::from_utf8_lossy(&blind.stderr).contains("1 more wait to be settled"));
    let with_keys = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(["--database-url", &url, "--table", table])
            .env("IDEM_SEAL_KEYS", keys)
            .args(args)
            .output()
            .unwrap()
    };
    let listed = json(&with_keys(&["--json", "unknown"]));
    assert_eq!(listed[0]["effect_key"], "cli.seal:order-9:charge", "{listed}");
    let shown = json(&idem(&url, table, &["--json", "show", "cli.seal", "order-9"]));
    assert!(shown[0]["steps"].as_str().unwrap().contains(SEALED_PREFIX), "{shown}");
    let wrong = idem(&url, table, &["--seal-keys", "k1:AQID", "show", "cli.seal", "order-9"]);
    assert_eq!(wrong.status.code(), Some(2), "a bad ring is a usage error");
    assert!(
        String::from_utf8_lossy(&wrong.stderr).contains("32"),
        "{}",
        String::from_utf8_lossy(&wrong.stderr)
    );

    let settled = with_keys(&[
        "settle",
        "cli.seal",
        "order-9",
        "charge",
        "--value",
        r#"{"id":"ch_77"}"#,
        "--yes",
    ]);
    assert!(settled.status.success(), "{}", String::from_utf8_lossy(&settled.stderr));
    assert!(
        !raw(&plain).contains("ch_77"),
        "the settled value is sealed: {}",
        raw(&plain)
    );
    let opened = runtime.block_on(async {
        SealedStore::new(Arc::new(plain.clone()), ring())
            .get("cli.seal", "order-9")
            .await
            .unwrap()
            .unwrap()
    });
    assert_eq!(opened.steps.as_deref(), Some(r#"{"charge":"{\"id\":\"ch_77\"}"}"#));
    let _ = std::fs::remove_file(path);
}

/// `idem erase --subject`: the subject's records keep only a tombstone (counted by
/// `idem stats`), a retry of its calls is answered `Erased` and not run, another
/// subject's record is untouched; without the subject key nothing is erased.
#[test]
fn a_subject_is_erased_by_the_command() {
    use idem_runtime::subject::{self, SubjectKey};
    let path = idem_testkit::scratch::path(&format!("{}.db", unique("cli-erase")));
    let url = format!("sqlite://{}?mode=rwc", path.display());
    let table = "idempotent_record";
    let key_text = "BAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQ=";
    subject::install_key(SubjectKey::new([4; 32]));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let store = runtime.block_on(async {
        let store = idem_store_sqlx::SqliteStore::connect(&url).await.unwrap();
        store.migrate().await.unwrap();
        store
    });
    let op = Idempotent::new("cli.erase").store(Arc::new(store.clone()));
    let pay = |subject: &str, key: &str, answer: &str| {
        let (op, answer) = (op.clone().subject(subject), answer.to_owned());
        runtime.block_on(async move {
            op.execute(key, async move { Ok::<_, idem_runtime::Error>(answer) })
                .await
        })
    };
    assert_eq!(pay("ada", "order-1", "receipt for ada").unwrap(), "receipt for ada");
    assert_eq!(pay("bob", "order-2", "receipt for bob").unwrap(), "receipt for bob");

    let keyless = idem(&url, table, &["erase", "--subject", "ada", "--yes"]);
    assert!(!keyless.status.success());
    assert!(String::from_utf8_lossy(&keyless.stderr).contains("IDEM_SUBJECT_KEY"));
    let erased = json(&idem(
        &url,
        table,
        &[
            "--json",
            "erase",
            "--subject",
            "ada",
            "--subject-key",
            key_text,
            "--yes",
        ],
    ));
    assert_eq!(erased, serde_json::json!({"erased": 1}));

    let stats = json(&idem(&url, table, &["--json", "stats", "--biz", "cli.erase"]));
    let row = &stats["by_biz_and_status"][0];
    assert_eq!(
        (row["records"].as_u64(), row["tombstones"].as_u64()),
        (Some(2), Some(1)),
        "{stats}"
    );
    let record = runtime.block_on(store.get("cli.erase", "order-1")).unwrap().unwrap();
    assert_eq!(
        (record.response_body, record.tombstone),
        (None, Some(idem_runtime::Tombstone::Erased))
    );
    assert!(matches!(
        pay("ada", "order-1", "a second charge"),
        Err(idem_runtime::Error::Erased { .. })
    ));
    assert_eq!(pay("bob", "order-2", "").unwrap(), "receipt for bob");
    let _ = std::fs::remove_file(path);
}

/// `idem rekey` over 100,000 records sealed with an old key, in batches with progress:
/// afterwards a ring without the old key opens every one, and a second run re-seals
/// nothing. The records are sealed in memory and written in bulk (as a long-lived table
/// holds them), then re-sealed by the command.
fn rekey_over_100000(url: &str, table: &str, stamp: &str) {
    use idem_runtime::pages::RecordPages;
    use idem_runtime::seal::{SealedStore, StaticKeyRing, SEALED_PREFIX};
    use idem_store_sqlx::sqlx;
    const RECORDS: u32 = 100_000;
    let (old_key, new_key) = (
        "old:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE",
        "new:AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI",
    );
    let ring = |keys: &str| StaticKeyRing::parse(keys, "test").unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let memory = idem_runtime::MemoryStore::new();
        let sealed = SealedStore::new(Arc::new(memory.clone()), ring(old_key)).table(table);
        let now = idem_runtime::now();
        for n in 0..RECORDS {
            let lease = claimed(&sealed, "cli.rekey", &format!("k{n}"), now, Duration::from_secs(60), Duration::from_secs(86_400)).await;
            let answer = format!("\"receipt {n}\"");
            assert_eq!(sealed.complete(&lease, &answer, now, Duration::from_secs(86_400)).await.unwrap(), idem_runtime::FenceCheck::Held);
        }
        let records = memory.page("", RECORDS + 1).await.unwrap().records;
        assert_eq!(records.len(), RECORDS as usize);
        macro_rules! bulk {
            ($pool:ty, $db:ty) => {{
                let pool = <$pool>::connect(url).await.unwrap();
                for chunk in records.chunks(1000) {
                    let mut insert = sqlx::QueryBuilder::<$db>::new(format!(
                        "INSERT INTO {table} (biz_type, idempotent_key, status, fence, response_body, lease_until, created_at, completed_at, expires_at) "
                    ));
                    insert.push_values(chunk, |mut row, record| {
                        row.push_bind(record.biz.clone())
                            .push_bind(record.key.clone())
                            .push("'SUCCESS'")
                            .push_bind(record.fence as i64)
                            .push_bind(record.response_body.clone())
                            .push(stamp)
                            .push(stamp)
                            .push(stamp)
                            .push(stamp.replace("2020", "2099"));
                    });
                    insert.build().execute(&pool).await.unwrap();
                }
            }};
        }
        if url.starts_with("redis") {
            let store = idem_store_redis::RedisStore::connect(url).await.unwrap();
            let client = idem_store_redis::redis::Client::open(url).unwrap();
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            let _: () = idem_store_redis::redis::cmd("FLUSHDB").query_async(&mut conn).await.unwrap();
            let micros = |at: std::time::SystemTime| at.duration_since(UNIX_EPOCH).unwrap().as_micros().to_string();
            let far = micros(now + Duration::from_secs(30 * 86_400));
            for chunk in records.chunks(1000) {
                let mut pipe = idem_store_redis::redis::pipe();
                for record in chunk {
                    let created = micros(record.created_at);
                    pipe.hset_multiple(
                        store.record_key(&record.biz, &record.key),
                        &[
                            ("status", "SUCCESS"),
                            ("fence", &record.fence.to_string()),
                            ("created_at", &created),
                            ("lease_until", &created),
                            ("completed_at", &created),
                            ("expires_at", &far),
                            ("response_body", record.response_body.as_deref().unwrap()),
                        ],
                    )
                    .ignore();
                }
                let _: () = pipe.query_async(&mut conn).await.unwrap();
            }
        } else if url.starts_with("sqlite") {
            bulk!(sqlx::SqlitePool, sqlx::Sqlite);
        } else if url.starts_with("postgres") {
            bulk!(sqlx::PgPool, sqlx::Postgres);
        } else {
            bulk!(sqlx::MySqlPool, sqlx::MySql);
        }
    });
    let keys = format!("{new_key},{old_key}");
    let rekey = |keys: &str| {
        Command::new(env!("CARGO_BIN_EXE_idem"))
            .args([
                "--database-url",
                url,
                "--table",
                table,
                "--json",
                "rekey",
                "--batch",
                "5000",
            ])
            .env("IDEM_SEAL_KEYS", keys)
            .output()
            .unwrap()
    };
    let started = std::time::Instant::now();
    let done = rekey(&keys);
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(
        stderr.lines().filter(|l| l.starts_with("rekey: ")).count() >= 20,
        "progress after every batch: {stderr}"
    );
    let done = json(&done);
    assert_eq!(done["resealed"], RECORDS, "{done}");
    assert_eq!(done["changed_meanwhile"], 0, "{done}");
    eprintln!(
        "idem rekey re-sealed {RECORDS} records on {url} in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // The old key retired: every record opens with the new key alone.
    runtime.block_on(async {
        let store: Arc<dyn IdempotencyStore> = match url.split(':').next().unwrap() {
            "sqlite" => Arc::new(
                idem_store_sqlx::SqliteStore::connect(url)
                    .await
                    .unwrap()
                    .with_table_name(table)
                    .unwrap(),
            ),
            "postgres" => Arc::new(
                idem_store_sqlx::PostgresStore::connect(url)
                    .await
                    .unwrap()
                    .with_table_name(table)
                    .unwrap(),
            ),
            "redis" => Arc::new(idem_store_redis::RedisStore::connect(url).await.unwrap()),
            _ => Arc::new(
                idem_store_sqlx::MySqlStore::connect(url)
                    .await
                    .unwrap()
                    .with_table_name(table)
                    .unwrap(),
            ),
        };
        let retired = SealedStore::new(store.clone(), ring(new_key)).table(table);
        for n in (0..RECORDS).step_by(997) {
            let raw = store.get("cli.rekey", &format!("k{n}")).await.unwrap().unwrap();
            assert!(raw
                .response_body
                .as_deref()
                .unwrap()
                .starts_with(&format!("{SEALED_PREFIX}new:")));
            let opened = retired.get("cli.rekey", &format!("k{n}")).await.unwrap().unwrap();
            assert_eq!(opened.response_body, Some(format!("\"receipt {n}\"")));
        }
    });
    let again = json(&rekey(&keys));
    assert_eq!(again["resealed"], 0, "{again}");
    let keyless = idem(url, table, &["rekey"]);
    assert!(String::from_utf8_lossy(&keyless.stderr).contains("--seal-keys"));
}

#[test]
fn rekey_reseals_100000_records_on_sqlite() {
    let path = idem_testkit::scratch::path(&format!("{}.db", unique("cli-rekey")));
    let url = format!("sqlite://{}?mode=rwc", path.display());
    runtime_migrate(&url, "idempotent_record");
    rekey_over_100000(&url, "idempotent_record", "'2020-01-01 00:00:00.000000'");
    let _ = std::fs::remove_file(path);
}

#[test]
fn rekey_reseals_100000_records_on_postgres() {
    let Some(url) = idem_testkit::conformance::server_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL") else {
        return;
    };
    let table = unique("idem_rekey");
    runtime_migrate(&url, &table);
    rekey_over_100000(&url, &table, "'2020-01-01 00:00:00+00'");
}

#[test]
fn rekey_reseals_100000_records_on_mariadb() {
    let Some(url) = idem_testkit::conformance::server_url("IDEM_TEST_MYSQL_URL", "MariaDB") else {
        return;
    };
    let table = unique("idem_rekey");
    runtime_migrate(&url, &table);
    rekey_over_100000(&url, &table, "'2020-01-01 00:00:00'");
}

/// On a Redis database of its own (the walk covers every record in it).
#[test]
fn rekey_reseals_100000_records_on_redis() {
    let Some(url) = idem_testkit::conformance::server_url("IDEM_TEST_REDIS_URL", "Redis") else {
        return;
    };
    let url = format!("{}/7", url.rsplit_once('/').map_or(url.as_str(), |(base, _)| base));
    rekey_over_100000(&url, "idempotent_record", "");
}

/// Create `table` at `url` with the command.
fn runtime_migrate(url: &str, table: &str) {
    let migrated = idem(url, table, &["migrate"]);
    assert!(
        migrated.status.success(),
        "{}",
        String::from_utf8_lossy(&migrated.stderr)
    );
}
