//! A three-node JetStream cluster with a node killed mid-load: every message one effect.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_nats::async_nats::{
    self,
    jetstream::{self, stream},
};
use idem_nats::{Consumer, Message};
use idem_runtime::{Error, Idempotent, MemoryStore};

const MESSAGES: usize = 2000;

/// `.ci/start-nats ARGS…`, and what it printed.
fn nats_script(args: &[&str]) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../.ci/start-nats");
    let output = std::process::Command::new("bash")
        .arg(script)
        .args(args)
        .output()
        .unwrap();
    assert!(output.status.success(), "start-nats {args:?} failed");
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_mid_load_costs_no_message_and_no_second_effect() {
    let Some(urls) = idem_testkit::conformance::server_url("IDEM_TEST_NATS_CLUSTER_URLS", "a NATS JetStream cluster")
    else {
        return;
    };
    let servers: Vec<async_nats::ServerAddr> = urls.split(',').map(|u| u.parse().unwrap()).collect();
    let connect = || {
        async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect(servers.clone())
    };
    let js = jetstream::new(connect().await.unwrap());
    let name = format!("cluster_{}", std::process::id());
    let subject = format!("{name}.orders");
    js.get_or_create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![subject.clone()],
        num_replicas: 3,
        ..Default::default()
    })
    .await
    .unwrap();
    let publisher = {
        let js = jetstream::new(connect().await.unwrap());
        let subject = subject.clone();
        tokio::spawn(async move {
            let mut retried = 0;
            for i in 0..MESSAGES {
                loop {
                    let mut headers = async_nats::HeaderMap::new();
                    headers.insert("Nats-Msg-Id", format!("order-{i}").as_str());
                    let sent = async {
                        js.publish_with_headers(subject.clone(), headers, i.to_string().into())
                            .await?
                            .await
                    };
                    match tokio::time::timeout(Duration::from_secs(3), sent).await {
                        Ok(Ok(_)) => break,
                        _ => {
                            retried += 1;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
            }
            retried
        })
    };

    let credit = Idempotent::new("credit").store(Arc::new(MemoryStore::new()));
    let effects: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let consumer = Consumer::new(&urls, &name, "credit").redeliver_after(Duration::from_millis(100));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn({
        let (consumer, credit, effects) = (consumer.clone(), credit.clone(), effects.clone());
        async move {
            consumer
                .run_until(
                    async {
                        let _ = stopped.await;
                    },
                    move |message: Message<u64>| {
                        let (credit, effects) = (credit.clone(), effects.clone());
                        async move {
                            let key = message.key.clone();
                            credit
                                .execute(&message.key, async move {
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
    while effects.lock().unwrap().len() < MESSAGES {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the load did not finish: {:?}",
            consumer.stats()
        );
        if !killed && effects.lock().unwrap().len() > MESSAGES / 3 {
            // The node that leads the stream's replicas: its followers elect another.
            let leader = {
                let name = name.clone();
                tokio::task::spawn_blocking(move || nats_script(&["leader", &name]))
                    .await
                    .unwrap()
            };
            let killed_node = leader.clone();
            tokio::task::spawn_blocking(move || nats_script(&["kill", &killed_node]))
                .await
                .unwrap();
            killed = true;
            println!("killed node {leader}, the stream's leader");
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(3)).await;
                tokio::task::spawn_blocking(move || nats_script(&["start", &leader]))
                    .await
                    .unwrap();
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Redeliveries of settled messages, if any, come within the ack wait.
    tokio::time::sleep(Duration::from_secs(1)).await;
    drop(stop);
    let deliveries = consumer.stats().deliveries;
    let retried = publisher.await.unwrap();
    {
        let effects = effects.lock().unwrap();
        let twice: Vec<_> = effects.iter().filter(|(_, n)| **n != 1).collect();
        assert!(twice.is_empty(), "keys with other than one effect: {twice:?}");
        assert_eq!(effects.len(), MESSAGES);
    }
    println!(
        "{MESSAGES} messages, a node killed mid-load: {deliveries} deliveries, {retried} publishes retried, every message one effect, in {:.1?}",
        started.elapsed()
    );
    let _ = js.delete_stream(&name).await;
}
