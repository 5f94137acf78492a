//! JetStream forgets a `Nats-Msg-Id` after its duplicate window; idem's records do not.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull, stream};
use futures_util::StreamExt;
use idem_runtime::{Error, Idempotent, MemoryStore};

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
