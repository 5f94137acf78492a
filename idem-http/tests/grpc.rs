//! The layer on a tonic service over HTTP/2 on 127.0.0.1, with tonic's client: the same
//! semantics as over HTTP, in gRPC's terms — the key and the caller in the metadata,
//! the first answer (message or status) replayed, the layer's refusals as statuses.

#[allow(dead_code)]
#[path = "../../examples/grpc_payment.rs"]
mod example;
use idem_testkit::conformance::faulty;

use std::sync::Arc;
use std::time::Duration;

use example::{pay, Bank, PayRequest};
use tonic::Code;

/// The service behind the layer on a SQLite file, and a channel to it. Every record is
/// written `record_delay` late, as on a loaded database.
async fn start(bank_delay: Duration, record_delay: Duration) -> (tonic::transport::Channel, Arc<Bank>) {
    let path = std::env::temp_dir().join(format!("idem-grpc-{}.db", std::process::id()));
    let store: faulty::Store = idem::sql::open(&format!("sqlite://{}?mode=rwc", path.display()))
        .await
        .unwrap();
    let store = faulty::FaultyStore::new(&store);
    store.inject(faulty::Op::Complete, faulty::Fault::Delay(record_delay), u32::MAX);
    let store = store.shared();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let bank = Arc::new(Bank {
        delay: bank_delay,
        ..Bank::default()
    });
    tokio::spawn(example::serve(listener, store, bank.clone()));
    let channel = tonic::transport::Channel::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    (channel, bank)
}

fn charges(bank: &Bank) -> u64 {
    bank.charges.load(std::sync::atomic::Ordering::SeqCst)
}

fn request(cents: i64) -> PayRequest {
    PayRequest {
        user: "ada".to_owned(),
        cents,
    }
}

fn key() -> String {
    uuid::Uuid::new_v4().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_call_gets_the_first_answer() {
    // The answer's end (its status) reaches the client only once it is recorded: a
    // retry the moment the first answer arrives is answered from the record.
    let (channel, bank) = start(Duration::ZERO, Duration::from_millis(300)).await;
    let key = key();
    let first = pay(channel.clone(), &key, "alice", request(1990)).await.unwrap();
    assert!(first.metadata().get("idempotent-replayed").is_none());
    let again = pay(channel.clone(), &key, "alice", request(1990)).await.unwrap();
    assert_eq!(again.get_ref(), first.get_ref(), "the first receipt");
    assert_eq!(again.metadata().get("idempotent-replayed").unwrap(), "true");
    // Another caller with the same key is another call.
    let bob = pay(channel.clone(), &key, "bob", request(1990)).await.unwrap();
    assert_ne!(bob.get_ref().charge_id, first.get_ref().charge_id);
    assert_eq!(charges(&bank), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_with_a_refreshed_token_is_the_same_caller() {
    let (channel, bank) = start(Duration::ZERO, Duration::ZERO).await;
    let key = key();
    let first = pay(channel.clone(), &key, "alice.1", request(1990)).await.unwrap();
    let retry = pay(channel.clone(), &key, "alice.2", request(1990)).await.unwrap();
    assert_eq!(retry.get_ref(), first.get_ref(), "the first receipt");
    assert_eq!(retry.metadata().get("idempotent-replayed").unwrap(), "true");
    assert_eq!(charges(&bank), 1, "one charge");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_the_call_answered_is_replayed() {
    let (channel, bank) = start(Duration::ZERO, Duration::ZERO).await;
    let key = key();
    let refused = pay(channel.clone(), &key, "alice", request(-5)).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    let again = pay(channel.clone(), &key, "alice", request(-5)).await.unwrap_err();
    assert_eq!((again.code(), again.message()), (refused.code(), refused.message()));
    assert_eq!(again.metadata().get("idempotent-replayed").unwrap(), "true");
    assert_eq!(charges(&bank), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layers_refusals_are_grpc_statuses() {
    let (channel, bank) = start(Duration::from_millis(500), Duration::ZERO).await;
    let key = key();
    let running = tokio::spawn({
        let (channel, key) = (channel.clone(), key.clone());
        async move { pay(channel, &key, "alice", request(100)).await }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let duplicate = pay(channel.clone(), &key, "alice", request(100)).await.unwrap_err();
    assert_eq!(
        duplicate.code(),
        Code::Aborted,
        "a duplicate of a running call: {duplicate:?}"
    );
    assert!(running.await.unwrap().is_ok());
    let reused = pay(channel.clone(), &key, "alice", request(200)).await.unwrap_err();
    assert_eq!(reused.code(), Code::FailedPrecondition, "{reused:?}");
    assert!(
        reused.message().contains("/cents") || reused.message().contains("differ"),
        "{reused:?}"
    );
    let malformed = pay(channel.clone(), "a key", "alice", request(100)).await.unwrap_err();
    assert_eq!(malformed.code(), Code::InvalidArgument, "{malformed:?}");
    assert_eq!(charges(&bank), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_without_a_caller_is_unauthenticated() {
    let (channel, bank) = start(Duration::ZERO, Duration::ZERO).await;
    let mut client = tonic::client::Grpc::new(channel);
    client.ready().await.unwrap();
    let mut call = tonic::Request::new(request(100));
    call.metadata_mut().insert("idempotency-key", key().parse().unwrap());
    let path = http::uri::PathAndQuery::from_static(example::PAY);
    let refused = client
        .unary::<_, example::Receipt, _>(call, path, tonic_prost::ProstCodec::default())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    assert_eq!(charges(&bank), 0);
}

/// A tonic client through `OutgoingKeyLayer`, inside an idempotent call: each request
/// carries the call's effect key, so the server behind the layer charges once and
/// answers the repeat with the first receipt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_through_the_outgoing_layer_sends_the_calls_key() {
    use tower_layer::Layer;
    let (channel, bank) = start(Duration::ZERO, Duration::ZERO).await;
    let op = idem::Idempotent::new("grpc.outgoing").store(Arc::new(idem::MemoryStore::new()));
    let receipts: (u64, u64) = op
        .execute(&key(), async {
            let keyed = idem::http::OutgoingKeyLayer::new("charge").layer(channel);
            let client = tonic::client::Grpc::new(keyed);
            let send = || {
                let mut call = tonic::Request::new(request(100));
                call.metadata_mut()
                    .insert("authorization", "Bearer ada".parse().unwrap());
                let mut client = client.clone();
                async move {
                    client.ready().await.unwrap();
                    let path = http::uri::PathAndQuery::from_static(example::PAY);
                    client
                        .unary::<_, example::Receipt, _>(call, path, tonic_prost::ProstCodec::default())
                        .await
                        .unwrap()
                        .into_inner()
                }
            };
            let first = send().await;
            let again = send().await;
            Ok::<_, idem::Error>((first.charge_id, again.charge_id))
        })
        .await
        .unwrap();
    assert_eq!(receipts.0, receipts.1, "the repeat got the first receipt");
    assert_eq!(charges(&bank), 1, "charged once");
    assert!(idem::http::grpc_status_is_ambiguous(Code::DeadlineExceeded as i32));
    assert!(!idem::http::grpc_status_is_ambiguous(Code::InvalidArgument as i32));
}
