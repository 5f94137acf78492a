//! The layer on a tonic service over HTTP/2 on 127.0.0.1, with tonic's client: the same
//! semantics as over HTTP, in gRPC's terms — the key and the caller in the metadata,
//! the first answer (message or status) replayed, the layer's refusals as statuses.

use idem_examples::grpc;
use idem_testkit::conformance::faulty;

use std::sync::Arc;
use std::time::Duration;

use grpc::{pay, Bank, PayRequest};
use tonic::Code;

/// The service behind the layer on a SQLite file, and a channel to it. Every record is
/// written `record_delay` late, as on a loaded database.
async fn start(bank_delay: Duration, record_delay: Duration) -> (tonic::transport::Channel, Arc<Bank>) {
    let (address, bank) = serve(bank_delay, record_delay).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    (channel, bank)
}

/// The service of [`start`], and where it listens.
async fn serve(bank_delay: Duration, record_delay: Duration) -> (std::net::SocketAddr, Arc<Bank>) {
    let path = idem_testkit::scratch::path("grpc.db");
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
    tokio::spawn(grpc::serve(listener, store, bank.clone()));
    (address, bank)
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
    // The operation keeps no requests: the refusal says the key was first used for
    // another request, without naming fields.
    assert!(
        reused.message().contains("first used for another request"),
        "{reused:?}"
    );
    assert!(!reused.message().contains("/cents"), "{reused:?}");
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
    let path = http::uri::PathAndQuery::from_static(grpc::PAY);
    let refused = client
        .unary::<_, grpc::Receipt, _>(call, path, tonic_prost::ProstCodec::default())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    assert_eq!(charges(&bank), 0);
}

/// One `Pay` call through `service` (a channel under the outgoing layers), with
/// `caller`'s bearer token when there is one and no key of its own: the layers set it.
async fn unary<T>(service: T, caller: Option<&str>, cents: i64) -> Result<grpc::Receipt, tonic::Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    T::ResponseBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send,
{
    let mut client = tonic::client::Grpc::new(service);
    client.ready().await.map_err(|e| tonic::Status::from_error(e.into()))?;
    let mut call = tonic::Request::new(request(cents));
    if let Some(caller) = caller {
        call.metadata_mut()
            .insert("authorization", format!("Bearer {caller}").parse().unwrap());
    }
    let path = http::uri::PathAndQuery::from_static(grpc::PAY);
    client
        .unary::<_, grpc::Receipt, _>(call, path, tonic_prost::ProstCodec::default())
        .await
        .map(tonic::Response::into_inner)
}

/// What a call through the layers came to, as a recorded body can keep it: the charge,
/// or the status's code and whether its outcome is unknown.
fn outcome(result: Result<grpc::Receipt, tonic::Status>) -> Result<u64, (i32, bool)> {
    result
        .map(|receipt| receipt.charge_id)
        .map_err(|status| (status.code() as i32, idem::http::grpc_outcome_is_unknown(&status)))
}

/// The `Idempotency-Key` of each request sent through a [`counted`] channel, in order.
type Sent = Arc<std::sync::Mutex<Vec<Option<String>>>>;

/// `channel`, counting the requests sent through it (each try of each call) and keeping
/// each one's `Idempotency-Key`.
fn counted(
    channel: tonic::transport::Channel,
) -> (
    impl tower_service::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = tonic::transport::Error,
            Future: Send,
        > + Clone
        + Send
        + 'static,
    Sent,
) {
    use tower::ServiceExt;
    let sent = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = sent.clone();
    let channel = channel.map_request(move |request: http::Request<tonic::body::Body>| {
        let key = request
            .headers()
            .get("idempotency-key")
            .map(|v| v.to_str().unwrap().to_owned());
        log.lock().unwrap().push(key);
        request
    });
    (channel, sent)
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
            let first = unary(keyed.clone(), Some("ada"), 100).await.unwrap();
            let again = unary(keyed, Some("ada"), 100).await.unwrap();
            Ok::<_, idem::Error>((first.charge_id, again.charge_id))
        })
        .await
        .unwrap();
    assert_eq!(receipts.0, receipts.1, "the repeat got the first receipt");
    assert_eq!(charges(&bank), 1, "charged once");
    assert!(idem::http::grpc_status_is_ambiguous(Code::DeadlineExceeded as i32));
    assert!(!idem::http::grpc_status_is_ambiguous(Code::InvalidArgument as i32));
}

/// Two sends of one effect at once: through `OutgoingKeyLayer` the second is answered
/// `ABORTED` (the first is still running); through `GrpcRetryLayer` it is sent again
/// with the same key until the first receipt is there to replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_through_the_retry_layer_gets_the_first_receipt() {
    use tower_layer::Layer;
    let (channel, bank) = start(Duration::from_millis(600), Duration::ZERO).await;
    let op = idem::Idempotent::new("grpc.retrying").store(Arc::new(idem::MemoryStore::new()));
    let plain = op
        .execute(&key(), async {
            let keyed = idem::http::OutgoingKeyLayer::new("charge").layer(channel.clone());
            let (first, second) = tokio::join!(unary(keyed.clone(), Some("ada"), 100), async {
                tokio::time::sleep(Duration::from_millis(150)).await;
                unary(keyed.clone(), Some("ada"), 100).await
            });
            Ok::<_, idem::Error>((outcome(first), outcome(second)))
        })
        .await
        .unwrap();
    assert!(plain.0.is_ok(), "{:?}", plain.0);
    assert_eq!(plain.1, Err((Code::Aborted as i32, true)), "{:?}", plain.1);
    assert_eq!(charges(&bank), 1);

    let (counted, sent) = counted(channel);
    let retried = op
        .execute(&key(), async {
            let keyed = idem::http::GrpcRetryLayer::new("charge")
                .attempts(10)
                .pauses(Duration::from_millis(100), Duration::from_millis(200))
                .layer(counted);
            let (first, second) = tokio::join!(unary(keyed.clone(), Some("ada"), 100), async {
                tokio::time::sleep(Duration::from_millis(150)).await;
                unary(keyed.clone(), Some("ada"), 100).await
            });
            Ok::<_, idem::Error>((first.unwrap().charge_id, second.unwrap().charge_id))
        })
        .await
        .unwrap();
    assert_eq!(retried.0, retried.1, "the duplicate got the first receipt");
    assert_eq!(charges(&bank), 2, "charged once for this call");
    let sent = sent.lock().unwrap().clone();
    assert!(sent.len() >= 3, "the duplicate was sent again: {sent:?}");
    assert!(sent.iter().all(|key| key.is_some() && *key == sent[0]), "{sent:?}");
}

/// A refusal is the server's answer: returned at once, not retried, and not an unknown
/// outcome. Outside an idempotent call a request has no key and goes as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_layer_never_retries_a_refusal() {
    use tower_layer::Layer;
    let (channel, bank) = start(Duration::ZERO, Duration::ZERO).await;
    let (counted, sent) = counted(channel);
    let keyed = idem::http::GrpcRetryLayer::new("charge")
        .attempts(4)
        .pauses(Duration::from_millis(10), Duration::from_millis(10))
        .layer(counted);
    let op = idem::Idempotent::new("grpc.refused").store(Arc::new(idem::MemoryStore::new()));
    let refused = op
        .execute(&key(), async {
            Ok::<_, idem::Error>(outcome(unary(keyed.clone(), None, 100).await))
        })
        .await
        .unwrap();
    assert_eq!(refused, Err((Code::Unauthenticated as i32, false)), "{refused:?}");
    assert_eq!(sent.lock().unwrap().len(), 1, "a refusal is not retried");

    let outside = unary(keyed, Some("ada"), 100).await.unwrap_err();
    assert_eq!(outside.code(), Code::InvalidArgument, "no key: {outside:?}");
    assert_eq!(sent.lock().unwrap().clone()[1..], [None], "sent without a key");
    assert_eq!(charges(&bank), 0);
}

/// A call whose connection was never made is retried and, when the tries run out, is
/// not an unknown outcome (nothing left); outside an idempotent call it has no key and
/// is tried once. A call that timed out after it left is an unknown outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_layer_tells_a_call_never_sent_from_one_unanswered() {
    use tower_layer::Layer;
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let nowhere = tonic::transport::Channel::from_shared(format!("http://{closed}"))
        .unwrap()
        .connect_lazy();
    let (counted_nowhere, tried) = counted(nowhere);
    let tries = idem::http::GrpcRetryLayer::new("charge")
        .attempts(3)
        .pauses(Duration::from_millis(10), Duration::from_millis(10));
    let op = idem::Idempotent::new("grpc.unanswered").store(Arc::new(idem::MemoryStore::new()));
    let unsent = op
        .execute(&key(), async {
            Ok::<_, idem::Error>(outcome(
                unary(tries.layer(counted_nowhere.clone()), Some("ada"), 100).await,
            ))
        })
        .await
        .unwrap();
    assert_eq!(unsent, Err((Code::Unavailable as i32, false)), "never sent: {unsent:?}");
    assert_eq!(tried.lock().unwrap().len(), 3, "tried 3 times");
    let outside = outcome(unary(tries.layer(counted_nowhere.clone()), Some("ada"), 100).await);
    assert_eq!(outside, Err((Code::Unavailable as i32, false)), "{outside:?}");
    assert_eq!(
        tried.lock().unwrap().len(),
        4,
        "outside a call, without a key: tried once"
    );

    let (address, bank) = serve(Duration::from_millis(1500), Duration::ZERO).await;
    let impatient = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let (impatient, tried) = counted(impatient);
    let unanswered = op
        .execute(&key(), async {
            Ok::<_, idem::Error>(outcome(unary(tries.layer(impatient), Some("ada"), 100).await))
        })
        .await
        .unwrap();
    assert!(matches!(unanswered, Err((_, true))), "unknown: {unanswered:?}");
    let tried = tried.lock().unwrap().clone();
    assert_eq!(tried.len(), 3, "tried 3 times: {tried:?}");
    assert!(
        tried.iter().all(|key| key.is_some() && *key == tried[0]),
        "one key: {tried:?}"
    );
    // The server drops a call its client gave up on (tonic cancels its future), so the
    // bank may not have been reached; it is never reached twice.
    tokio::time::sleep(Duration::from_millis(1800)).await;
    assert!(charges(&bank) <= 1, "charged {} times", charges(&bank));
}
