//! A three-node JetStream cluster with the stream's leader killed mid-load: the outbox
//! relay publishes every row, none counted as failed while the replicas elect another
//! leader, the stream holds each once, and the consumer makes one effect of each.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_nats::async_nats::{
    self,
    jetstream::{self, stream},
};
use idem_nats::{Consumer, JetStreamBroker, Message, OutboxMessage, Relay};
use idem_runtime::{Error, Idempotent, MemoryStore};
use support::outbox_with;

const MESSAGES: usize = 2000;

/// The tests kill and start the cluster's nodes: one at a time.
static CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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
    let _cluster = CLUSTER.lock().await;
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
    // The rows, in an outbox on SQLite, and a relay to the cluster.
    let rows = (0..MESSAGES).map(|i| OutboxMessage::json("", &subject, &i).unwrap());
    let (pool, outbox) = outbox_with("cluster", rows).await;
    // The node that leads the stream's replicas, to be killed mid-load: the relay is
    // given the two others, so that it stays connected while the followers elect
    // another leader and meets the stream between two leaders.
    let leader = {
        let name = name.clone();
        tokio::task::spawn_blocking(move || nats_script(&["leader", &name]))
            .await
            .unwrap()
    };
    let followers: Vec<&str> = urls
        .split(',')
        .enumerate()
        .filter(|(i, _)| (i + 1).to_string() != leader)
        .map(|(_, url)| url)
        .collect();
    assert_eq!(followers.len(), 2, "the leader {leader:?} is one of the three nodes");
    let relay = Relay::new(pool.clone(), outbox.clone(), JetStreamBroker::new(followers.join(",")))
        .batch(5)
        .idle(Duration::from_millis(20));
    let (stop_relay, relay_stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn({
        let relay = relay.clone();
        async move {
            relay
                .run_until(async {
                    let _ = relay_stopped.await;
                })
                .await
        }
    });

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
                    move |message: Message<usize>| {
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
        if !killed && relay.stats().marked_sent > MESSAGES as u64 / 5 {
            // The stream's leader: its followers elect another.
            let leader = leader.clone();
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
    drop(stop_relay);
    let deliveries = consumer.stats().deliveries;
    let relayed = relay.stats();
    let counts = outbox.counts(&pool).await.unwrap();
    assert_eq!(
        (counts.sent, counts.pending, counts.dead),
        (MESSAGES as i64, 0, 0),
        "{relayed:?}"
    );
    assert_eq!(
        (relayed.retried_later, relayed.parked, relayed.returned),
        (0, 0, 0),
        "a stream between two leaders is the servers' failure, never a row's: {relayed:?}"
    );
    // The stream's state, once the cluster answers again (the killed node rejoins).
    let deadline = Instant::now() + Duration::from_secs(30);
    let stored = loop {
        match js.get_stream(&name).await {
            Ok(mut stream) => match stream.info().await {
                Ok(info) => break info.state.messages,
                Err(error) => assert!(Instant::now() < deadline, "no stream info: {error}"),
            },
            Err(error) => assert!(Instant::now() < deadline, "no stream: {error}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(stored, MESSAGES as u64, "the stream holds each row once");
    {
        let effects = effects.lock().unwrap();
        let twice: Vec<_> = effects.iter().filter(|(_, n)| **n != 1).collect();
        assert!(twice.is_empty(), "keys with other than one effect: {twice:?}");
        assert_eq!(effects.len(), MESSAGES);
    }
    println!(
        "{MESSAGES} rows relayed, the stream's leader killed mid-load: {} published ({} sessions lost), {deliveries} deliveries, every message one effect, in {:.1?}",
        relayed.published,
        relayed.sessions_lost,
        started.elapsed()
    );
    let _ = js.delete_stream(&name).await;
}

/// A stream with one replica whose server is down: the cluster still lists it, and
/// publishes to it are answered "no responders", as while a stream's replicas elect a
/// leader (which the kill above meets only some runs). For two seconds every round of
/// a relay connected to the other nodes ends its session with nothing marked and no
/// row's attempt counted; once the server is back, every row goes out once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_server_is_down_fails_no_row() {
    let Some(urls) = idem_testkit::conformance::server_url("IDEM_TEST_NATS_CLUSTER_URLS", "a NATS JetStream cluster")
    else {
        return;
    };
    let _cluster = CLUSTER.lock().await;
    let servers: Vec<async_nats::ServerAddr> = urls.split(',').map(|u| u.parse().unwrap()).collect();
    let js = jetstream::new(async_nats::connect(servers).await.unwrap());
    let name = format!("single_{}", std::process::id());
    let subject = format!("{name}.orders");
    js.get_or_create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![subject.clone()],
        num_replicas: 1,
        ..Default::default()
    })
    .await
    .unwrap();
    let home = {
        let name = name.clone();
        tokio::task::spawn_blocking(move || nats_script(&["leader", &name]))
            .await
            .unwrap()
    };
    let others: Vec<&str> = urls
        .split(',')
        .enumerate()
        .filter(|(i, _)| (i + 1).to_string() != home)
        .map(|(_, url)| url)
        .collect();

    let rows = (0..10).map(|i| OutboxMessage::json("", &subject, &i).unwrap());
    let (pool, outbox) = outbox_with("down", rows).await;
    let relay = Relay::new(pool.clone(), outbox.clone(), JetStreamBroker::new(others.join(",")));

    let down = home.clone();
    tokio::task::spawn_blocking(move || nats_script(&["kill", &down]))
        .await
        .unwrap();
    let started = Instant::now();
    let mut rounds = 0;
    while started.elapsed() < Duration::from_secs(2) {
        let mut session = relay.connect().await.unwrap();
        let error = relay.round(&mut session).await.unwrap_err();
        assert!(
            matches!(error, idem_nats::RelayError::Broker(_)),
            "the servers' failure: {error}"
        );
        rounds += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let attempts: i64 = sqlx::query_scalar(&format!("SELECT COALESCE(SUM(attempts), 0) FROM {}", outbox.table()))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        attempts,
        0,
        "no row's attempt counted in {rounds} rounds: {:?}",
        relay.stats()
    );
    assert_eq!(outbox.counts(&pool).await.unwrap().sent, 0);

    let up = home.clone();
    tokio::task::spawn_blocking(move || nats_script(&["start", &up]))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while outbox.counts(&pool).await.unwrap().sent < 10 {
        assert!(
            Instant::now() < deadline,
            "the rows never went out: {:?}",
            relay.stats()
        );
        if let Ok(mut session) = relay.connect().await {
            let _ = relay.round(&mut session).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let stored = js
        .get_stream(&name)
        .await
        .unwrap()
        .get_info()
        .await
        .unwrap()
        .state
        .messages;
    assert_eq!(stored, 10, "each row once");
    println!("a stream's server down 2 s: {rounds} rounds ended with the servers' failure, no row failed; then 10 rows sent once");
    let _ = js.delete_stream(&name).await;
}
