//! The consumer on a three-node RabbitMQ cluster (`IDEM_TEST_AMQP_CLUSTER_URLS`, started by
//! `.ci/start-rabbitmq-cluster`), a quorum queue, the node it is connected to killed
//! mid-load: it goes on from another node, and every message has one effect.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem::amqp::lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions};
use idem::amqp::lapin::types::{AMQPValue, FieldTable};
use idem::amqp::lapin::{BasicProperties, Connection, ConnectionProperties};
use idem::amqp::{Consumer, Message};
use idem::{Error, Idempotent, MemoryStore};
use serde_json::Value;

const MESSAGES: usize = 1000;

fn cluster_script(args: &[&str]) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../.ci/start-rabbitmq-cluster");
    let status = std::process::Command::new("bash")
        .arg(script)
        .args(args)
        .status()
        .unwrap();
    assert!(status.success(), "start-rabbitmq-cluster {args:?} failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_a_consumer_is_on_killed_mid_load_costs_no_second_effect() {
    let Some(urls) = idem_testkit::conformance::server_url("IDEM_TEST_AMQP_CLUSTER_URLS", "a RabbitMQ cluster") else {
        return;
    };
    let nodes: Vec<&str> = urls.split(',').collect();
    let queue = "idem.test.cluster";
    // The queue and its messages, through the second node.
    let connection = Connection::connect(nodes[1], ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .queue_delete(queue.into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    let mut arguments = FieldTable::default();
    arguments.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel.queue_declare(queue.into(), durable, arguments).await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    for i in 0..MESSAGES {
        let properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_message_id(format!("order-{i}").into());
        channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                br#"{"points": 1}"#,
                properties,
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }

    let credit = Idempotent::new("amqp.cluster").store(Arc::new(MemoryStore::new()));
    let effects: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    // The consumer connects to the first node that answers: the first. A settlement
    // lapin leaves unanswered as the node dies is given up after `stall_check`.
    let consumer = Consumer::new(urls.clone(), queue)
        .prefetch(20)
        .redeliver_after(Duration::from_millis(50))
        .stall_check(Duration::from_secs(2));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn({
        let (consumer, credit, effects) = (consumer.clone(), credit.clone(), effects.clone());
        async move {
            consumer
                .run_until(
                    async {
                        let _ = stopped.await;
                    },
                    move |message: Message<Value>| {
                        let (credit, effects) = (credit.clone(), effects.clone());
                        async move {
                            let key = message.key.clone();
                            credit
                                .execute(&message.key, async move {
                                    tokio::time::sleep(Duration::from_millis(2)).await;
                                    *effects.lock().unwrap().entry(key).or_default() += 1;
                                    Ok::<_, Error>(())
                                })
                                .await
                        }
                    },
                )
                .await;
        }
    });
    let started = Instant::now();
    let mut killed = false;
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    loop {
        let stats = consumer.stats();
        // Every message ran, and none waits: a redelivery still to come would be in
        // the count (acks count replays too, so they cannot tell).
        if effects.lock().unwrap().len() >= MESSAGES
            && channel
                .queue_declare(queue.into(), passive, FieldTable::default())
                .await
                .unwrap()
                .message_count()
                == 0
        {
            break;
        }
        if !killed && stats.acked > MESSAGES as u64 / 3 {
            cluster_script(&["kill", "1"]);
            killed = true;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "the load did not finish: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = consumer.stats();
    drop(stop);
    cluster_script(&["start", "1"]);
    let effects = effects.lock().unwrap().clone();
    let twice: Vec<_> = effects.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "keys with other than one effect: {twice:?}");
    assert_eq!(effects.len(), MESSAGES, "{stats:?}");
    assert!(
        stats.sessions_lost >= 1,
        "the consumer's node was killed under it: {stats:?}"
    );
    println!(
        "{MESSAGES} messages, the consumer's node killed mid-load: {stats:?}, every message one effect, in {:.1?}",
        started.elapsed()
    );
}
