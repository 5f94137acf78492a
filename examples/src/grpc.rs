//! The gRPC payment service of the `grpc_payment` example, behind the same
//! `Idempotency-Key` layer as HTTP: its messages, the service, its authentication and
//! layer, and a client's call with its key and caller.
//!
//! The messages are written with prost's derive, and the service as tonic's generated
//! code writes it, so it needs no `protoc`:
//!
//! ```text
//! service Payments { rpc Pay(PayRequest) returns (Receipt); }
//! message PayRequest { string user = 1; int64 cents = 2; }
//! message Receipt { uint64 charge_id = 1; int64 cents = 2; }
//! ```

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use idem::http::IdempotencyLayer;
use idem::Idempotent;

use crate::bearer;

/// `payments.PayRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PayRequest {
    /// Who pays.
    #[prost(string, tag = "1")]
    pub user: String,
    /// How much, in cents.
    #[prost(int64, tag = "2")]
    pub cents: i64,
}

/// `payments.Receipt`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Receipt {
    /// The bank's charge.
    #[prost(uint64, tag = "1")]
    pub charge_id: u64,
    /// How much was charged, in cents.
    #[prost(int64, tag = "2")]
    pub cents: i64,
}

/// The fake bank: slow, and counting what it charged.
#[derive(Debug, Default)]
pub struct Bank {
    /// How long a charge takes.
    pub delay: Duration,
    /// The charges made.
    pub charges: AtomicU64,
}

/// The path of the one method.
pub const PAY: &str = "/payments.Payments/Pay";

/// The `payments.Payments` service, as tonic's generated server code writes one.
#[derive(Debug, Clone)]
pub struct Payments {
    /// The bank it charges.
    pub bank: Arc<Bank>,
}

impl tonic::server::NamedService for Payments {
    const NAME: &'static str = "payments.Payments";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// `Pay`: a positive amount is charged; another is refused with `INVALID_ARGUMENT`
/// after the request was taken on (`started`): the call's own answer, replayed.
struct Pay(Arc<Bank>);

impl tonic::server::UnaryService<PayRequest> for Pay {
    type Response = Receipt;
    type Future = BoxFuture<Result<tonic::Response<Receipt>, tonic::Status>>;

    fn call(&mut self, request: tonic::Request<PayRequest>) -> Self::Future {
        let bank = self.0.clone();
        Box::pin(async move {
            idem::http::started();
            let request = request.into_inner();
            if request.cents <= 0 {
                return Err(tonic::Status::invalid_argument("cents must be positive"));
            }
            tokio::time::sleep(bank.delay).await;
            let charge_id = bank.charges.fetch_add(1, Ordering::SeqCst) + 1;
            Ok(tonic::Response::new(Receipt {
                charge_id,
                cents: request.cents,
            }))
        })
    }
}

impl<B> tower::Service<http::Request<B>> for Payments
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let bank = self.bank.clone();
        match request.uri().path() {
            PAY => Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
                Ok(grpc.unary(Pay(bank), request).await)
            }),
            _ => Box::pin(async { Ok(tonic::Status::unimplemented("no such method").into_http()) }),
        }
    }
}

/// Who is calling, as [`authenticate`] verified it: a bearer token's subject.
#[derive(Debug, Clone)]
pub struct Subject(pub String);

/// The service's authentication, in front of the layer: a bearer token `SUBJECT.SERIAL`
/// names its subject (a stand-in for verifying a real token's signature and reading its
/// `sub`). A call without one carries no [`Subject`], and the layer refuses it.
pub fn authenticate(mut request: http::Request<tonic::body::Body>) -> http::Request<tonic::body::Body> {
    if let Some(subject) = bearer::subject(request.headers()) {
        request.extensions_mut().insert(Subject(subject));
    }
    request
}

/// The layer over `store`: a gRPC call is a POST like any other to it, each caller's
/// keys its own by the token's subject.
pub fn layer(store: std::sync::Arc<dyn idem::IdempotencyStore>) -> IdempotencyLayer {
    IdempotencyLayer::new(Idempotent::new("grpc.payments").store(store)).principal(|caller: &Subject| caller.0.clone())
}

/// Serve `Payments` behind the layer on `listener` until the process ends.
pub async fn serve(
    listener: tokio::net::TcpListener,
    store: std::sync::Arc<dyn idem::IdempotencyStore>,
    bank: Arc<Bank>,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        .layer(tower::util::MapRequestLayer::new(authenticate))
        .layer(layer(store))
        .add_service(Payments { bank })
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
        .await
}

/// One `Pay` call over `channel` with `key` and `caller`'s bearer token (`SUBJECT.SERIAL`,
/// or a subject alone) in its metadata.
pub async fn pay(
    channel: tonic::transport::Channel,
    key: &str,
    caller: &str,
    request: PayRequest,
) -> Result<tonic::Response<Receipt>, tonic::Status> {
    let mut client = tonic::client::Grpc::new(channel);
    client
        .ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut request = tonic::Request::new(request);
    let metadata = request.metadata_mut();
    metadata.insert(
        "idempotency-key",
        key.parse().map_err(|_| tonic::Status::invalid_argument("key"))?,
    );
    metadata.insert(
        "authorization",
        format!("Bearer {caller}")
            .parse()
            .map_err(|_| tonic::Status::invalid_argument("caller"))?,
    );
    let path = http::uri::PathAndQuery::from_static(PAY);
    client.unary(request, path, tonic_prost::ProstCodec::default()).await
}
