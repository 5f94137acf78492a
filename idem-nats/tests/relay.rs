//! The outbox relay to JetStream against a real server (`IDEM_TEST_NATS_URL`, started by
//! `.ci/start-nats`), on a SQLite outbox: each row published once with its id as
//! `Nats-Msg-Id` and marked sent only once the stream acked it; a row published again
//! (a relay killed between the stream's ack and the mark) is dropped by the stream
//! within its window; rows the stream cannot take wait, and the rows behind them go on.

mod support;

use std::time::Duration;

use idem_nats::async_nats::jetstream;
use idem_nats::{JetStreamBroker, Outbox, OutboxMessage, Relay, MSG_ID};
use sqlx::SqlitePool;
use support::{fresh_stream_of, nats_url, outbox_with};

/// The ids of the outbox's rows, in order.
async fn ids(pool: &SqlitePool, outbox: &Outbox<sqlx::Sqlite>) -> Vec<i64> {
    sqlx::query_scalar(&format!("SELECT id FROM {} ORDER BY id", outbox.table()))
        .fetch_all(pool)
        .await
        .unwrap()
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
    let js = fresh_stream_of(&url, &name, format!("{name}.>")).await;
    let messages = (0..5).map(|n| {
        OutboxMessage::bytes("", format!("{name}.orders"), format!("order {n}")).with_header("Order", n.to_string())
    });
    let (pool, outbox) = outbox_with("relay-once", messages).await;
    let ids = ids(&pool, &outbox).await;
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
    let js = fresh_stream_of(&url, &name, format!("{name}.>")).await;
    let messages = [
        OutboxMessage::bytes("", format!("{name}.a"), "a"),
        OutboxMessage::bytes("", format!("{name}_none.b"), "b"),
        OutboxMessage::bytes("orders", format!("{name}.c"), "c"),
        OutboxMessage::bytes("", format!("{name}.d"), "d"),
    ];
    let (pool, outbox) = outbox_with("relay-fail", messages).await;
    let [good, nowhere, exchange, behind] = ids(&pool, &outbox).await[..] else {
        panic!("four rows")
    };
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
