//! Exactly-once effects across a message queue: the outbox, a relay that is killed
//! and republishes, and consumers keyed the ways the seed article lists.
//!
//! 1. `pay` runs in transactional mode: the charge, its outbox message and the SUCCESS
//!    record commit together, so a crash never leaves a charge without its message (or
//!    a message without its charge), and a retried request replays.
//! 2. A relay publishes pending outbox rows and then marks them sent. It "dies" after
//!    publishing and before marking, every third batch: those messages are published
//!    again — at-least-once delivery, as every real queue gives.
//! 3. The SMS consumer handles each message through `#[idempotent(key = msg.id)]`: one
//!    SMS per message however often it is delivered. A partition consumer keyed by
//!    `group:topic:partition:offset`, a daily job keyed by `job:date:bucket` and a
//!    state-machine update guarded by its `WHERE status = 'WAIT_PAY'` show the others.
//!
//! ```text
//! cargo run --example outbox
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use idem::sqlx::{self, Sqlite, SqlitePool, Transaction};
use idem::{idempotent, SqliteStore};
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// A message on the queue.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Message {
    id: i64,
    user: String,
    text: String,
}

/// The queue: what was delivered, in order (with redeliveries).
type Queue = Arc<Mutex<Vec<Message>>>;

/// The charge and its message, in the caller's transaction, at most once per request.
#[idempotent(key = request_id, biz = "pay", tx = tx)]
async fn pay(tx: &mut Transaction<'_, Sqlite>, request_id: &str, user: &str, cents: i64) -> Result<i64, AppError> {
    let (charge,): (i64,) = sqlx::query_as("INSERT INTO charges (user_name, cents) VALUES (?, ?) RETURNING id")
        .bind(user)
        .bind(cents)
        .fetch_one(&mut **tx)
        .await?;
    sqlx::query("INSERT INTO outbox (user_name, text, sent) VALUES (?, ?, 0)")
        .bind(user)
        .bind(format!("paid {cents} cents, charge {charge}"))
        .execute(&mut **tx)
        .await?;
    Ok(charge)
}

/// Publish pending messages, then mark them sent; `die_before_marking` is a relay
/// killed between the two.
async fn relay(pool: &SqlitePool, queue: &Queue, die_before_marking: bool) -> Result<usize, AppError> {
    let pending: Vec<(i64, String, String)> =
        sqlx::query_as("SELECT id, user_name, text FROM outbox WHERE sent = 0 ORDER BY id LIMIT 4")
            .fetch_all(pool)
            .await?;
    for (id, user, text) in &pending {
        queue.lock().unwrap().push(Message {
            id: *id,
            user: user.clone(),
            text: text.clone(),
        });
    }
    if die_before_marking {
        return Ok(pending.len());
    }
    for (id, ..) in &pending {
        sqlx::query("UPDATE outbox SET sent = 1 WHERE id = ?")
            .bind(id)
            .execute(pool)
            .await?;
    }
    Ok(pending.len())
}

/// The SMS consumer: one SMS per message id, however often it is delivered.
#[idempotent(key = msg.id, biz = "sms", payload = msg.text)]
async fn send_sms(msg: &Message, sent: &Mutex<HashMap<i64, u32>>) -> Result<(), AppError> {
    let effect = idem::context().expect("inside the call").effect_key("sms");
    *sent.lock().unwrap().entry(msg.id).or_default() += 1;
    let _ = effect; // handed to the SMS provider, which dedups on it too
    Ok(())
}

/// A partition consumer: the offset is the identity of a delivery on a partition.
#[idempotent(key = format!("{group}:{topic}:{partition}:{offset}"), biz = "points")]
async fn add_points(
    group: &str,
    topic: &str,
    partition: u32,
    offset: u64,
    awarded: &Mutex<u32>,
) -> Result<u32, AppError> {
    *awarded.lock().unwrap() += 10;
    Ok(10)
}

/// A scheduled job: one run per day and bucket, however often the scheduler fires.
#[idempotent(key = format!("settle:{date}:{bucket}"), biz = "job")]
async fn settle_day(date: &str, bucket: u32, runs: &Mutex<u32>) -> Result<u32, AppError> {
    *runs.lock().unwrap() += 1;
    Ok(bucket)
}

/// A state-machine step, guarded twice: the record, and the status in the `WHERE`.
#[idempotent(key = format!("order-{order}"), biz = "mark-paid", tx = tx)]
async fn mark_paid(tx: &mut Transaction<'_, Sqlite>, order: i64) -> Result<bool, AppError> {
    let done = sqlx::query("UPDATE orders SET status = 'PAID' WHERE id = ? AND status = 'WAIT_PAY'")
        .bind(order)
        .execute(&mut **tx)
        .await?;
    Ok(done.rows_affected() == 1)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let dir = std::env::temp_dir().join(format!("idem-outbox-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let store = SqliteStore::connect(&format!("sqlite://{}/outbox.db", dir.display())).await?;
    store.migrate().await?;
    idem::install(Arc::new(store.clone()));
    let pool = store.pool().clone();
    for ddl in [
        "CREATE TABLE charges (id INTEGER PRIMARY KEY, user_name TEXT NOT NULL, cents INTEGER NOT NULL)",
        "CREATE TABLE outbox (id INTEGER PRIMARY KEY, user_name TEXT NOT NULL, text TEXT NOT NULL, sent INTEGER NOT NULL)",
        "CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL)",
        "INSERT INTO orders (id, status) VALUES (1, 'WAIT_PAY')",
    ] {
        sqlx::query(ddl).execute(&pool).await?;
    }

    // 1. Twenty users pay; each request arrives three times (click, click, gateway retry).
    for user in 0..20 {
        for _attempt in 0..3 {
            let mut tx = pool.begin().await?;
            pay(&mut tx, &format!("req-{user}"), &format!("user-{user}"), 100 + user).await?;
            tx.commit().await?;
        }
    }
    // 2. The relay runs until the outbox is drained, dying before marking every third batch.
    let queue = Queue::default();
    let mut batch = 0;
    while relay(&pool, &queue, batch % 3 == 2).await? > 0 {
        batch += 1;
    }
    // 3. The consumer gets every delivery, redeliveries included.
    let sent = Mutex::new(HashMap::new());
    let deliveries = queue.lock().unwrap().clone();
    for msg in &deliveries {
        send_sms(msg, &sent).await?;
    }

    let (charges,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM charges").fetch_one(&pool).await?;
    let (messages,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM outbox").fetch_one(&pool).await?;
    let sms = sent.lock().unwrap().clone();
    println!("requests 60 → charges {charges}, outbox messages {messages}");
    println!(
        "relay batches {batch}, deliveries {} (redelivered {}) → SMS sent {} (to {} users, at most {} per message)",
        deliveries.len(),
        deliveries.len() - messages as usize,
        sms.values().sum::<u32>(),
        sms.len(),
        sms.values().max().copied().unwrap_or(0)
    );
    assert_eq!((charges, messages), (20, 20));
    assert!(deliveries.len() > messages as usize, "the dying relay redelivered");
    assert!(sms.values().all(|&n| n == 1) && sms.len() == 20);

    let awarded = Mutex::new(0);
    for _redelivery in 0..3 {
        add_points("loyalty", "payments", 3, 4711, &awarded).await?;
    }
    let runs = Mutex::new(0);
    for _fire in 0..4 {
        for bucket in 0..2 {
            settle_day("2026-11-30", bucket, &runs).await?;
        }
    }
    let mut marked = Vec::new();
    for _retry in 0..2 {
        let mut tx = pool.begin().await?;
        marked.push(mark_paid(&mut tx, 1).await?);
        tx.commit().await?;
    }
    println!(
        "offset 3:4711 delivered 3× → {} points; job fired 4× per bucket → {} runs for 2 buckets; order marked PAID {:?}",
        awarded.lock().unwrap(),
        runs.lock().unwrap(),
        marked
    );
    assert_eq!((*awarded.lock().unwrap(), *runs.lock().unwrap()), (10, 2));
    assert_eq!(marked, [true, true], "the retry replays the first answer");
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
