//! Messages on RabbitMQ (`IDEM_TEST_AMQP_URL`): the consumer helper's cost per message
//! against a bare lapin consumer that acks, and the outbox relay's throughput on
//! PostgreSQL (`IDEM_TEST_POSTGRES_URL`). Persistent messages on durable queues, every
//! publish confirmed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use idem::amqp::lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use idem::amqp::lapin::types::FieldTable;
use idem::amqp::lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use idem::amqp::{AmqpBroker, Consumer, Message, Outbox, OutboxMessage};
use idem::{Error, Idempotent};
use serde_json::Value;

const PREFETCH: u16 = 16;

async fn channel(url: &str) -> (Connection, Channel) {
    let connection = Connection::connect(url, ConnectionProperties::default()).await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    (connection, channel)
}

/// A fresh durable queue holding `n` persistent messages with ids `0..n`, published
/// with confirms.
async fn filled(channel: &Channel, queue: &str, n: usize) {
    channel
        .queue_delete(queue.into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(queue.into(), durable, FieldTable::default())
        .await
        .unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    for id in 0..n {
        let properties = BasicProperties::default()
            .with_message_id(id.to_string().into())
            .with_delivery_mode(2);
        channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                br#"{"points": 7}"#,
                properties,
            )
            .await
            .unwrap();
    }
    channel.wait_for_confirms().await.unwrap();
}

/// A bare lapin consumer: ack every delivery; µs per message.
async fn bare(url: &str, queue: &str, n: usize) -> f64 {
    let (_connection, channel) = channel(url).await;
    filled(&channel, queue, n).await;
    channel.basic_qos(PREFETCH, BasicQosOptions::default()).await.unwrap();
    let started = Instant::now();
    let deliveries = channel
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    deliveries
        .take(n)
        .for_each_concurrent(usize::from(PREFETCH), |delivery| async move {
            delivery.unwrap().acker.ack(BasicAckOptions::default()).await.unwrap();
        })
        .await;
    started.elapsed().as_secs_f64() * 1e6 / n as f64
}

/// The consumer helper with `handler`; µs per message.
async fn helper<F, Fut>(url: &str, queue: &str, n: usize, handler: F) -> f64
where
    F: Fn(Message<Value>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Value, Error>> + Send + 'static,
{
    let (_connection, channel) = channel(url).await;
    filled(&channel, queue, n).await;
    let consumer = Consumer::new(url, queue).prefetch(PREFETCH);
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

/// `n` rows of an outbox on PostgreSQL, each a message to `destination` (a queue, a
/// subject), relayed to `broker` by `relays` relays; messages per second.
pub async fn relay<B: idem_messaging::Broker + Clone>(
    database: &str,
    destination: &str,
    n: usize,
    relays: usize,
    broker: B,
) -> f64 {
    let pool = idem::sqlx::PgPool::connect(database).await.unwrap();
    let outbox = Outbox::<idem::sqlx::Postgres>::named("idem_bench_outbox").unwrap();
    idem::sqlx::query("DROP TABLE IF EXISTS idem_bench_outbox")
        .execute(&pool)
        .await
        .unwrap();
    outbox.migrate(&pool).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let message = OutboxMessage::json("", destination, &serde_json::json!({"points": 7})).unwrap();
    for _ in 0..n {
        outbox.push(&mut tx, &message).await.unwrap();
    }
    tx.commit().await.unwrap();
    let started = Instant::now();
    let relays: Vec<_> = (0..relays)
        .map(|_| {
            idem_messaging::Relay::<_, B>::new(pool.clone(), outbox.clone(), broker.clone())
                .idle(Duration::from_millis(5))
        })
        .collect();
    let watching = outbox.clone();
    let counting = pool.clone();
    let done = async move {
        while watching.counts(&counting).await.unwrap().sent < n as i64 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let running = futures::future::join_all(relays.iter().map(|relay| relay.run()));
    tokio::select! {
        () = done => {}
        _ = running => {}
    }
    n as f64 / started.elapsed().as_secs_f64()
}

/// A consumer table: each row's label and µs a message, the bare client's first, with
/// each row's ratio to it.
pub fn consumer_table(title: &str, rows: &[(&str, f64)]) {
    println!("\n| {title} | µs per message | ÷ bare |");
    println!("|---|---|---|");
    let bare_us = rows[0].1;
    for (label, us) in rows {
        println!("| {label} | {us:.0} | {:.2} |", us / bare_us);
    }
}

/// The relay table: `n` rows to `destination` relayed by 1 and by 3 relays to `broker`.
pub async fn relay_table<B: idem_messaging::Broker + Clone>(
    title: &str,
    database: &str,
    destination: &str,
    n: usize,
    broker: B,
) {
    println!("\n| {title} | messages/s |");
    println!("|---|---|");
    for relays in [1, 3] {
        let rate = relay(database, destination, n, relays, broker.clone()).await;
        println!("| {relays} relay(s), batch 100 | {rate:.0} |");
    }
}

/// The operation of an idempotent handler on the PostgreSQL at `database`, its biz named
/// after `broker`.
pub async fn idempotent_handler_op(database: &str, broker: &str) -> Arc<Idempotent> {
    let store = idem::sql::open(database).await.unwrap();
    Arc::new(Idempotent::new(format!("bench.{broker}.{}", std::process::id())).store(store))
}

pub async fn report(calls: usize) {
    let Ok(url) = std::env::var("IDEM_TEST_AMQP_URL") else {
        println!("\n(messages: IDEM_TEST_AMQP_URL unset, RabbitMQ not measured)");
        return;
    };
    let mut rows = vec![
        (
            "bare lapin consumer, ack each",
            bare(&url, "idem.bench.bare", calls).await,
        ),
        (
            "`Consumer`, handler answers at once",
            helper(&url, "idem.bench.helper", calls, |_message| async { Ok(Value::Null) }).await,
        ),
    ];
    let database = std::env::var("IDEM_TEST_POSTGRES_URL").ok();
    if let Some(database) = &database {
        let op = idempotent_handler_op(database, "amqp").await;
        let idem_us = helper(&url, "idem.bench.idem", calls, move |message: Message<Value>| {
            let op = op.clone();
            async move { op.execute(&message.key, async { Ok::<_, Error>(message.body) }).await }
        })
        .await;
        rows.push((
            "`Consumer` + idempotent handler on PostgreSQL (claim + record)",
            idem_us,
        ));
    }
    consumer_table(
        &format!("messages on RabbitMQ (persistent, durable queue, prefetch {PREFETCH})"),
        &rows,
    );
    if let Some(database) = &database {
        let (_connection, channel) = channel(&url).await;
        filled(&channel, "idem.bench.relay", 0).await;
        let title = "outbox relay, PostgreSQL → RabbitMQ, confirms";
        relay_table(title, database, "idem.bench.relay", calls * 5, AmqpBroker::new(&url)).await;
    }
}
