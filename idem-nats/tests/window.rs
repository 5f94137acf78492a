//! JetStream forgets a `Nats-Msg-Id` after its duplicate window; idem's records do not.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull, stream};
use futures_util::StreamExt;
use idem_nats::{Consumer, JetStreamBroker, Message, OutboxMessage, Relay};
use idem_runtime::{Error, Idempotent, MemoryStore};
use support::outbox_with;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_republish_after_the_duplicate_window_is_absorbed_by_the_records() {
    let Some(url) = idem_testkit::conformance::server_url("IDEM_TEST_NATS_URL", "NATS") else {
        return;
    };
    let client = async_nats::connect(&url).await.unwrap();
    let js = jetstream::new(client);
    let name = format!("window_{}", std::process::id());
    let subject = format!("{name}.orders");
    let stream = js
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            duplicate_window: Duration::from_secs(1),
            ..Default::default()
        })
        .await
        .unwrap();
    let publish = |id: &'static str| {
        let (js, subject) = (js.clone(), subject.clone());
        async move {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Nats-Msg-Id", id);
            js.publish_with_headers(subject, headers, "7".into())
                .await
                .unwrap()
                .await
                .unwrap()
        }
    };
    assert!(!publish("order-7").await.duplicate);
    assert!(
        publish("order-7").await.duplicate,
        "within its window the broker drops the copy"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !publish("order-7").await.duplicate,
        "after its window the broker takes it again"
    );

    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("credit".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let credit = Idempotent::new("credit").store(Arc::new(MemoryStore::new()));
    let effects = Arc::new(AtomicUsize::new(0));
    let mut messages = consumer.fetch().max_messages(2).messages().await.unwrap();
    let mut delivered = 0;
    while let Some(message) = messages.next().await {
        let message = message.unwrap();
        let key = message
            .headers
            .as_ref()
            .and_then(|h| h.get("Nats-Msg-Id"))
            .unwrap()
            .to_string();
        let effects = effects.clone();
        credit
            .execute(&key, async move {
                effects.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(7)
            })
            .await
            .unwrap();
        message.double_ack().await.unwrap();
        delivered += 1;
    }
    assert_eq!(delivered, 2, "the broker delivered both copies");
    assert_eq!(effects.load(Ordering::SeqCst), 1, "the records ran the effect once");
    js.delete_stream(&name).await.unwrap();
}

/// The whole way: the relay publishes an outbox row, is "killed" between the stream's
/// ack and its mark, and publishes the row again after the stream's one-second window;
/// the stream keeps both copies, and the consumer runs the effect once. The consumer,
/// told the records' ttl, notes the window that is shorter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_publishing_again_after_the_window_costs_no_second_effect() {
    let Some(url) = idem_testkit::conformance::server_url("IDEM_TEST_NATS_URL", "NATS") else {
        return;
    };
    let js = jetstream::new(async_nats::connect(&url).await.unwrap());
    let name = format!("window_relay_{}", std::process::id());
    let subject = format!("{name}.orders");
    let _ = js.delete_stream(&name).await;
    js.create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![subject.clone()],
        duplicate_window: Duration::from_secs(1),
        ..Default::default()
    })
    .await
    .unwrap();

    let (pool, outbox) = outbox_with("window", [OutboxMessage::json("", &subject, &7).unwrap()]).await;
    let relay = Relay::new(pool.clone(), outbox.clone(), JetStreamBroker::new(&url));
    let mut session = relay.connect().await.unwrap();
    assert_eq!(relay.round(&mut session).await.unwrap(), 1);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    sqlx::query(&format!("UPDATE {} SET sent_at = NULL", outbox.table()))
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(relay.round(&mut session).await.unwrap(), 1);
    let stored = js
        .get_stream(&name)
        .await
        .unwrap()
        .get_info()
        .await
        .unwrap()
        .state
        .messages;
    assert_eq!(stored, 2, "after its window the stream took the row again");

    let consumer = Consumer::new(&url, &name, "credit").records_ttl(Duration::from_secs(24 * 3600));
    let note = consumer
        .duplicate_window()
        .await
        .unwrap()
        .expect("a window shorter than the records is noted");
    assert_eq!(note.window, Duration::from_secs(1));
    let credit = Idempotent::new("credit").store(Arc::new(MemoryStore::new()));
    let effects = Arc::new(AtomicUsize::new(0));
    let watched = consumer.clone();
    let stop = async move {
        while watched.stats().acked < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(
        Duration::from_secs(20),
        consumer.run_until(stop, |message: Message<i64>| {
            let (credit, effects) = (credit.clone(), effects.clone());
            async move {
                credit
                    .execute(&message.key, async move {
                        effects.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, Error>(message.body)
                    })
                    .await
            }
        }),
    )
    .await
    .expect("the consumer acked both copies");
    assert_eq!(effects.load(Ordering::SeqCst), 1, "the records ran the effect once");
    js.delete_stream(&name).await.unwrap();
}
