//! Messages on NATS JetStream (`IDEM_TEST_NATS_URL`): the consumer helper's cost per
//! message against a bare pull consumer that acks, and the outbox relay's rate, beside
//! RabbitMQ's rows. A file-backed
//! stream, every publish acknowledged.

use std::time::{Duration, Instant};

use futures::StreamExt;
use idem::Error;

use crate::messages;
use idem_nats::async_nats::{self, jetstream};
use idem_nats::{Consumer, Message};
use serde_json::Value;

const BATCH: usize = 16;

/// A fresh stream `name` holding `n` messages with ids `0..n`, each publish acknowledged.
async fn filled(url: &str, name: &str, n: usize) -> jetstream::Context {
    let js = jetstream::new(async_nats::connect(url).await.unwrap());
    let _ = js.delete_stream(name).await;
    js.create_stream(jetstream::stream::Config {
        name: name.to_owned(),
        subjects: vec![format!("{name}.in")],
        ..Default::default()
    })
    .await
    .unwrap();
    let mut acks = Vec::with_capacity(n);
    for id in 0..n {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(idem_nats::MSG_ID, id.to_string().as_str());
        acks.push(
            js.publish_with_headers(format!("{name}.in"), headers, r#"{"points": 7}"#.into())
                .await
                .unwrap(),
        );
    }
    for ack in acks {
        ack.await.unwrap();
    }
    js
}

/// A bare pull consumer: `double_ack` every message (as the helper does); µs per message.
async fn bare(url: &str, name: &str, n: usize) -> f64 {
    let js = filled(url, name, n).await;
    let consumer = js
        .get_stream(name)
        .await
        .unwrap()
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("bare".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let started = Instant::now();
    let acked = std::sync::atomic::AtomicUsize::new(0);
    while acked.load(std::sync::atomic::Ordering::Relaxed) < n {
        let messages = consumer.fetch().max_messages(BATCH).messages().await.unwrap();
        messages
            .for_each_concurrent(BATCH, |message| async {
                message.unwrap().double_ack().await.unwrap();
                acked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            })
            .await;
    }
    started.elapsed().as_secs_f64() * 1e6 / n as f64
}

/// The consumer helper with `handler`; µs per message.
async fn helper<F, Fut>(url: &str, name: &str, n: usize, handler: F) -> f64
where
    F: Fn(Message<Value>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Value, Error>> + Send + 'static,
{
    filled(url, name, n).await;
    let consumer = Consumer::new(url, name, "helper").batch(BATCH);
    let started = Instant::now();
    let watched = consumer.clone();
    let done = async move {
        while watched.stats().acked < n as u64 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    consumer.run_until(done, handler).await;
    started.elapsed().as_secs_f64() * 1e6 / n as f64
}

pub async fn report(calls: usize) {
    let Ok(url) = std::env::var("IDEM_TEST_NATS_URL") else {
        println!("\n(messages: IDEM_TEST_NATS_URL unset, NATS JetStream not measured)");
        return;
    };
    let mut rows = vec![
        (
            "bare pull consumer, `double_ack` each",
            bare(&url, "idem_bench_bare", calls).await,
        ),
        (
            "`Consumer`, handler answers at once",
            helper(&url, "idem_bench_helper", calls, |_message| async { Ok(Value::Null) }).await,
        ),
    ];
    let database = std::env::var("IDEM_TEST_POSTGRES_URL").ok();
    if let Some(database) = &database {
        let op = messages::idempotent_handler_op(database, "nats").await;
        let idem_us = helper(&url, "idem_bench_idem", calls, move |message: Message<Value>| {
            let op = op.clone();
            async move { op.execute(&message.key, async { Ok::<_, Error>(message.body) }).await }
        })
        .await;
        rows.push((
            "`Consumer` + idempotent handler on PostgreSQL (claim + record)",
            idem_us,
        ));
    }
    messages::consumer_table(
        &format!("messages on NATS JetStream (file storage, batch {BATCH})"),
        &rows,
    );
    if let Some(database) = &database {
        filled(&url, "idem_bench_relay", 0).await;
        let title = "outbox relay, PostgreSQL → JetStream, publish acks";
        let broker = idem_nats::JetStreamBroker::new(&url);
        messages::relay_table(title, database, "idem_bench_relay.in", calls * 5, broker).await;
    }
}
