//! The outbox relay to JetStream against a real server (`IDEM_TEST_NATS_URL`, started by
//! `.ci/start-nats`), on a SQLite outbox: each row published once with its id as
//! `Nats-Msg-Id` and marked sent only once the stream acked it; a row published again
//! (a relay killed between the stream's ack and the mark) is dropped by the stream
//! within its window; rows the stream cannot take wait, and the rows behind them go on.

use std::time::Duration;

use idem_nats::async_nats::{self, jetstream};
use idem_nats::{JetStreamBroker, Outbox, OutboxMessage, Relay, MSG_ID};
use sqlx::SqlitePool;

fn nats_url() -> Option<String> {
    idem_testkit::conformance::server_url("IDEM_TEST_NATS_URL", "NATS")
}

/// A fresh stream `name` taking the subjects `name.>`.
async fn fresh_stream(url: &str, name: &str) -> jetstream::Context {
    let js = jetstream::new(async_nats::connect(url).await.unwrap());
    let _ = js.delete_stream(name).await;
    js.create_stream(jetstream::stream::Config {
        name: name.to_owned(),
        subjects: vec![format!("{name}.>")],
        ..Default::default()
    })
    .await
    .unwrap();
    js
}

/// A SQLite outbox in a file of its own (the relay and the test each open connections).
async fn outbox(name: &str) -> (SqlitePool, Outbox<sqlx::Sqlite>) {
    let path = std::env::temp_dir().join(format!("idem-nats-relay-{name}-{}.db", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let pool = SqlitePool::connect(&format!("sqlite://{}?mode=rwc", path.display()))
        .await
        .unwrap();
    let outbox = Outbox::new();
    outbox.migrate(&pool).await.unwrap();
    (pool, outbox)
}

async fn push(pool: &SqlitePool, outbox: &Outbox<sqlx::Sqlite>, message: OutboxMessage) -> i64 {
    let mut tx = pool.begin().await.unwrap();
    let id = outbox.push(&mut tx, &message).await.unwrap();
    tx.commit().await.unwrap();
    id
}

/// The `Nats-Msg-Id` and payload of every message in `stream`, in order.
async fn stored(js: &jetstream::Context, stream: &str) -> Vec<(String, String)> {
    let stream = js.get_stream(stream).await.unwrap();
    let last = stream.get_info().await.unwrap().state.last_sequence;
    let mut messages = Vec::new();
    for sequence in 1..=last {
        let Ok(message) = stream.get_raw_message(sequence).await else {
            continue;
        };
        let id = message.headers.get(MSG_ID).map(|v| v.to_string()).unwrap_or_default();
        messages.push((id, String::from_utf8(message.payload.to_vec()).unwrap()));
    }
    messages
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_go_out_once_each_with_their_id_as_the_message_id() {
    let Some(url) = nats_url() else { return };
    let name = format!("relay_{}", std::process::id());
    let js = fresh_stream(&url, &name).await;
    let (pool, outbox) = outbox("once").await;
    let mut ids = Vec::new();
    for n in 0..5 {
        let message = OutboxMessage::bytes("", format!("{name}.orders"), format!("order {n}"))
            .with_header("Order", n.to_string());
        ids.push(push(&pool, &outbox, message).await);
    }
    let relay = Relay::new(pool.clone(), outbox.clone(), JetStreamBroker::new(&url));
    let mut session = relay.connect().await.unwrap();
    assert_eq!(relay.round(&mut session).await.unwrap(), 5);
    let sent: Vec<(String, String)> = ids
        .iter()
        .zip(0..)
        .map(|(id, n)| (id.to_string(), format!("order {n}")))
        .collect();
    assert_eq!(stored(&js, &name).await, sent, "each row once, its id as Nats-Msg-Id");
    let counts = outbox.counts(&pool).await.unwrap();
    assert_eq!((counts.pending, counts.sent), (0, 5));

    // The relay killed after the stream's acks and before its mark: the rows are
    // published again, and the stream drops them as duplicates (within its window).
    sqlx::query(&format!("UPDATE {} SET sent_at = NULL", outbox.table()))
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(
        relay.round(&mut session).await.unwrap(),
        5,
        "acked duplicates are marked sent"
    );
    assert_eq!(stored(&js, &name).await, sent, "no second copy in the stream");
    let stats = relay.stats();
    assert_eq!((stats.published, stats.marked_sent, stats.returned), (10, 10, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_the_stream_cannot_take_wait_and_the_rows_behind_go_on() {
    let Some(url) = nats_url() else { return };
    let name = format!("relay_fail_{}", std::process::id());
    let js = fresh_stream(&url, &name).await;
    let (pool, outbox) = outbox("fail").await;
    let good = push(&pool, &outbox, OutboxMessage::bytes("", format!("{name}.a"), "a")).await;
    let nowhere = push(&pool, &outbox, OutboxMessage::bytes("", format!("{name}_none.b"), "b")).await;
    let exchange = push(&pool, &outbox, OutboxMessage::bytes("orders", format!("{name}.c"), "c")).await;
    let behind = push(&pool, &outbox, OutboxMessage::bytes("", format!("{name}.d"), "d")).await;
    let relay = Relay::new(pool.clone(), outbox.clone(), JetStreamBroker::new(&url))
        .retry_after(Duration::from_secs(60))
        .max_attempts(2);
    let mut session = relay.connect().await.unwrap();
    assert_eq!(relay.round(&mut session).await.unwrap(), 2, "the two good rows");
    let ids: Vec<String> = stored(&js, &name).await.into_iter().map(|(id, _)| id).collect();
    assert_eq!(ids, [good.to_string(), behind.to_string()]);
    let stats = relay.stats();
    assert_eq!(
        (stats.returned, stats.retried_later, stats.parked),
        (1, 2, 0),
        "{stats:?}"
    );
    let reasons: Vec<(i64, i32, Option<String>)> = sqlx::query_as(&format!(
        "SELECT id, attempts, last_error FROM {} WHERE sent_at IS NULL ORDER BY id",
        outbox.table()
    ))
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(reasons.len(), 2);
    assert_eq!((reasons[0].0, reasons[0].1), (nowhere, 1));
    assert!(reasons[0].2.as_deref().unwrap().contains("no stream"), "{reasons:?}");
    assert_eq!((reasons[1].0, reasons[1].1), (exchange, 1));
    assert!(reasons[1].2.as_deref().unwrap().contains("no exchanges"), "{reasons:?}");
    // They wait their pause: the next round publishes nothing.
    assert_eq!(relay.round(&mut session).await.unwrap(), 0);
    assert_eq!(
        relay.stats().published,
        3,
        "the failing rows were not tried again at once"
    );
}
