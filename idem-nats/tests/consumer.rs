//! The JetStream consumer against a real server (`IDEM_TEST_NATS_URL`, started by
//! `.ci/start-nats`): what each kind of answer does to a message.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod support;

use idem_nats::async_nats::{self, jetstream};
use idem_nats::{Consumer, ConsumerStats, KeySource, Message};
use idem_runtime::{Error, Idempotent, MemoryStore};
use serde_json::Value;
use support::{fresh_stream_of, nats_url};

async fn publish(js: &jetstream::Context, name: &str, order: &str, body: &str) {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Order-Id", order);
    js.publish_with_headers(format!("{name}.in"), headers, body.to_owned().into())
        .await
        .unwrap()
        .await
        .unwrap();
}

async fn until(consumer: &Consumer, done: impl Fn(&ConsumerStats) -> bool) -> ConsumerStats {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stats = consumer.stats();
        if done(&stats) {
            return stats;
        }
        assert!(Instant::now() < deadline, "consumer stuck: {stats:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[derive(Debug, thiserror::Error)]
enum CreditError {
    #[error(transparent)]
    Idem(#[from] Error),
    #[error("the business refused")]
    Refused,
}

impl idem_nats::HandlerError for CreditError {
    fn idem_error(&self) -> Option<&Error> {
        match self {
            CreditError::Idem(error) => Some(error),
            CreditError::Refused => None,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_run_once_and_a_poison_message_is_terminated_at_its_bound() {
    let Some(url) = nats_url() else { return };
    let name = "idem_consumer";
    let js = fresh_stream_of(&url, name, format!("{name}.in")).await;
    for _ in 0..3 {
        publish(&js, name, "order-1", r#"{"points": 7}"#).await;
    }
    publish(&js, name, "order-2", r#"{"points": 9}"#).await;
    publish(&js, name, "poison", r#"{"points": 1}"#).await;
    publish(&js, name, "order-3", "not json").await;

    let credit = Idempotent::new("nats.credit").store(Arc::new(MemoryStore::new()));
    let runs: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let consumer = Consumer::new(&url, name, "credit")
        .key(KeySource::Header("Order-Id".into()))
        .redeliver_after(Duration::from_millis(50))
        .max_attempts(3);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn({
        let (consumer, credit, runs) = (consumer.clone(), credit.clone(), runs.clone());
        async move {
            consumer
                .run_until(
                    async {
                        let _ = stopped.await;
                    },
                    move |message: Message<Value>| {
                        let (credit, runs) = (credit.clone(), runs.clone());
                        async move {
                            let key = message.key.clone();
                            credit
                                .execute(&message.key, async move {
                                    *runs.lock().unwrap().entry(key.clone()).or_default() += 1;
                                    if key == "poison" {
                                        return Err(CreditError::Refused);
                                    }
                                    Ok(message.body["points"].clone())
                                })
                                .await
                        }
                    },
                )
                .await;
        }
    });
    let stats = until(&consumer, |s| s.acked == 4 && s.failed == 2).await;
    drop(stop);
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.get("order-1"), Some(&1), "three copies, one run: {runs:?}");
    assert_eq!(runs.get("order-2"), Some(&1));
    assert_eq!(runs.get("poison"), Some(&3), "three runs, then the policy: {stats:?}");
    assert_eq!(runs.get("order-3"), None, "a body that does not decode is not run");
    assert_eq!(stats.requeued, 2, "the poison came back twice: {stats:?}");
}

/// A consumer that runs a failing message twice and stops (within the 300 ms before the
/// next delivery), then a fresh one (its own count at zero) on the same durable
/// consumer: the stream's delivery count bounds the message across the two, 3 runs in
/// all, not 2 + 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_is_bounded_across_consumers_by_the_streams_count() {
    let Some(url) = nats_url() else { return };
    let name = "idem_consumer_bound";
    let js = fresh_stream_of(&url, name, format!("{name}.in")).await;
    publish(&js, name, "poison", r#"{"points": 1}"#).await;
    let runs = Arc::new(Mutex::new(0u32));
    let consumer = || {
        Consumer::new(&url, name, "credit")
            .key(KeySource::Header("Order-Id".into()))
            // Longer than a fetch's pull request lives (1 s): a pull the first
            // consumer left open when it stopped has expired before the message comes
            // back, so it cannot take a delivery (and an attempt) nobody handles.
            .redeliver_after(Duration::from_millis(1_500))
            .max_attempts(3)
    };
    let handler = |runs: Arc<Mutex<u32>>| {
        let credit = Idempotent::new("nats.bound").store(Arc::new(MemoryStore::new()));
        move |message: Message<Value>| {
            let (credit, runs) = (credit.clone(), runs.clone());
            async move {
                credit
                    .execute(&message.key, async move {
                        *runs.lock().unwrap() += 1;
                        Err::<Value, _>(CreditError::Refused)
                    })
                    .await
            }
        }
    };
    let first = consumer();
    let watched = first.clone();
    let twice = async move {
        while watched.stats().requeued < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    first.run_until(twice, handler(runs.clone())).await;
    assert_eq!(*runs.lock().unwrap(), 2);

    let second = consumer();
    let watched = second.clone();
    let failed = async move {
        while watched.stats().failed < 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), second.run_until(failed, handler(runs.clone())))
        .await
        .expect("the second consumer met the bound");
    assert_eq!(
        *runs.lock().unwrap(),
        3,
        "the bound counts the first consumer's runs too"
    );
    assert_eq!(second.stats().requeued, 0, "{:?}", second.stats());
}
