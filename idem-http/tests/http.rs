//! The `Idempotency-Key` layer over a real socket on 127.0.0.1, with a real HTTP client,
//! on a SQLite file and PostgreSQL: every case of the draft and of Stripe's behaviour,
//! a storm of identical requests, and a server killed mid-request then restarted.

// The shared test tools, as every store's suite uses them.
use idem_testkit::{conformance, harness};

// The examples' stand-in for verifying a bearer token (its subject is the caller).
use idem_examples::bearer;

use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRequest, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::StreamExt;
use harness::{AppError, Effects};
use idem::http::{IdempotencyKeyExt, IdempotencyLayer};
use idem::{idempotent, IdempotencyStore, Idempotent};
use serde::Deserialize;
use serde_json::{json, Value};

type Store = Arc<dyn IdempotencyStore>;

/// The service behind the layer: a fake bank whose charges are rows in the database,
/// so a killed server's charges are counted too.
struct Shop {
    store: Store,
    effects: Effects,
    run: String,
    bank_delay: Duration,
    /// Handler runs, this process.
    runs: AtomicU32,
}

#[derive(Deserialize)]
struct Payment {
    user: String,
    cents: i64,
}

/// Validation before the handler: a JSON payment with positive cents, else 400.
struct Valid(Payment);

impl<S: Send + Sync> FromRequest<S> for Valid {
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Response> {
        let Json(payment) = Json::<Payment>::from_request(request, state)
            .await
            .map_err(IntoResponse::into_response)?;
        if payment.cents <= 0 {
            return Err((StatusCode::BAD_REQUEST, "cents must be positive").into_response());
        }
        Ok(Valid(payment))
    }
}

static NEXT_CHARGE: AtomicU64 = AtomicU64::new(1);

/// Below the handler, keyed by the request's own call: not a duplicate of it.
#[idempotent(key = idem::context().map(|c| c.key().to_owned()).unwrap_or_default(), biz = "http.receipt", store = store)]
async fn send_receipt(store: &Store, effects: &Effects, run: &str, charge: &str) -> Result<String, AppError> {
    effects.record(run, &format!("receipt {charge}"), charge).await?;
    Ok(format!("receipt for {charge}"))
}

async fn pay(State(shop): State<Arc<Shop>>, Valid(payment): Valid) -> Response {
    idem::http::started();
    shop.runs.fetch_add(1, Ordering::SeqCst);
    if std::env::var_os("HTTP_URL").is_some() {
        harness::report("CHARGING"); // to the test that kills this server process
    }
    if payment.cents > 1_000_000 {
        let declined = json!({"type": "urn:shop:card-declined", "title": "card declined", "status": 402});
        return (StatusCode::PAYMENT_REQUIRED, Json(declined)).into_response();
    }
    tokio::time::sleep(shop.bank_delay).await;
    let charge = format!(
        "ch-{}-{}",
        std::process::id(),
        NEXT_CHARGE.fetch_add(1, Ordering::SeqCst)
    );
    if let Err(error) = shop.effects.record(&shop.run, &payment.user, &charge).await {
        return (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response();
    }
    let receipt = send_receipt(&shop.store, &shop.effects, &shop.run, &charge)
        .await
        .unwrap();
    // The key the bank would see: derived from this call, the same on every retry of it.
    let to_bank = reqwest::Client::new()
        .post("http://bank.invalid/charges")
        .idempotency_key("bank")
        .unwrap()
        .build()
        .unwrap();
    let bank_key = to_bank.headers()["idempotency-key"].clone();
    let body = json!({
        "charge_id": charge,
        "cents": payment.cents,
        "receipt": receipt,
        "bank_key": bank_key.to_str().unwrap(),
    });
    let headers = [
        (header::LOCATION, format!("/payments/{charge}")),
        (
            header::HeaderName::from_static("x-served-by"),
            std::process::id().to_string(),
        ),
        (header::HeaderName::from_static("x-trace"), charge.clone()),
    ];
    (StatusCode::CREATED, headers, Json(body)).into_response()
}

async fn explode(State(shop): State<Arc<Shop>>) -> StatusCode {
    idem::http::started();
    shop.runs.fetch_add(1, Ordering::SeqCst);
    StatusCode::INTERNAL_SERVER_ERROR
}

/// A charge at a bank that takes the money and never answers (a timeout), under a step
/// that fails closed: the handler never learns whether it charged.
async fn charge_unanswered(State(shop): State<Arc<Shop>>) -> Response {
    idem::http::started();
    shop.runs.fetch_add(1, Ordering::SeqCst);
    let charged = idem::Step::new("charge")
        .fail_closed()
        .run(async {
            shop.effects.record(&shop.run, "unanswered", "charged").await?;
            Err::<String, AppError>(AppError::Effect(idem::sqlx::Error::PoolTimedOut))
        })
        .await;
    match charged {
        Ok(charge) => (StatusCode::CREATED, charge).into_response(),
        Err(error) => (StatusCode::BAD_GATEWAY, error.to_string()).into_response(),
    }
}

async fn charges(State(shop): State<Arc<Shop>>) -> Json<Value> {
    let count: usize = shop.effects.tokens(&shop.run).await.values().map(Vec::len).sum();
    Json(json!({ "count": count }))
}

/// Who a bearer token says is calling, as the application's authentication verified
/// it: the token's subject (`alice.3` is alice's third token).
#[derive(Clone)]
struct Principal(String);

/// Outside the idempotency layer, as authentication would be: no tenant, 401; a bearer
/// token's subject becomes the request's [`Principal`].
async fn authenticate(mut request: Request, next: axum::middleware::Next) -> Response {
    if !request.headers().contains_key("x-tenant") {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    if let Some(subject) = bearer::subject(request.headers()) {
        request.extensions_mut().insert(Principal(subject));
    }
    next.run(request).await
}

/// A statement streamed as server-sent events: `lines` events, 100 ms apart.
async fn statement(Json(request): Json<Value>) -> Response {
    idem::http::started();
    let lines = request["lines"].as_u64().unwrap_or(1);
    let events = futures::stream::iter(1..=lines).then(|n| async move {
        if n > 1 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok::<_, std::convert::Infallible>(axum::response::sse::Event::default().data(format!("line {n}")))
    });
    axum::response::sse::Sse::new(events).into_response()
}

/// Each layer on its method router, as docs/HTTP.md shows: another method gets axum's 405.
fn app(shop: Arc<Shop>, layer: IdempotencyLayer) -> Router {
    Router::new()
        .route("/payments", post(pay).route_layer(layer.clone()))
        .route("/explode", post(explode).route_layer(layer.clone()))
        .route("/unanswered", post(charge_unanswered).route_layer(layer.clone()))
        .route("/statements", post(statement).route_layer(layer))
        .route("/bank/charges", get(charges))
        .layer(axum::middleware::from_fn(authenticate))
        .with_state(shop)
}

/// The layer as the tests configure it, over `store`: the caller is the account named
/// by the `X-Tenant` header's bytes (any UTF-8, not only ASCII), as a gateway that
/// authenticated it forwards it.
fn layer(op: Idempotent, store: &Store) -> IdempotencyLayer {
    IdempotencyLayer::new(op.store(store.clone()))
        .caller(|request| String::from_utf8(request.headers.get("x-tenant")?.as_bytes().to_vec()).ok())
        .replay_header(header::LOCATION)
        .body_limit(4096)
}

/// A server on 127.0.0.1 and a client for it.
struct Server {
    base: String,
    client: reqwest::Client,
    shop: Arc<Shop>,
}

impl Server {
    async fn start(url: &str, run: &str, op: Idempotent, bank_delay: Duration) -> Self {
        Self::start_with(url, run, bank_delay, |store| layer(op, store)).await
    }

    async fn start_with(
        url: &str,
        run: &str,
        bank_delay: Duration,
        layer: impl FnOnce(&Store) -> IdempotencyLayer,
    ) -> Self {
        let store = idem::sql::open(url).await.unwrap();
        let shop = Arc::new(Shop {
            store: store.clone(),
            effects: Effects::open(url).await,
            run: run.to_owned(),
            bank_delay,
            runs: AtomicU32::new(0),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let router = app(shop.clone(), layer(&store));
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        Server {
            base,
            client: reqwest::Client::new(),
            shop,
        }
    }

    fn pay(&self, tenant: &str, key: Option<&str>, body: &Value) -> reqwest::RequestBuilder {
        let mut request = self
            .client
            .post(format!("{}/payments", self.base))
            .header("x-tenant", tenant)
            .json(body);
        if let Some(key) = key {
            request = request.header("idempotency-key", format!("\"{key}\""));
        }
        request
    }

    /// acme's payment of 100 cents with `key`, sent in a task of its own: the first
    /// request, still running while the test sends its duplicates.
    fn first_payment(self: &Arc<Self>, key: &str) -> tokio::task::JoinHandle<Answer> {
        let (server, key) = (self.clone(), key.to_owned());
        tokio::spawn(async move { Answer::of(server.pay("acme", Some(&key), &payment(100))).await })
    }

    async fn bank_charges(&self) -> u64 {
        let body: Value = self
            .client
            .get(format!("{}/bank/charges", self.base))
            .header("x-tenant", "t")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        body["count"].as_u64().unwrap()
    }

    fn runs(&self) -> u32 {
        self.shop.runs.load(Ordering::SeqCst)
    }
}

/// A response, read whole.
struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: String,
}

impl Answer {
    async fn of(request: reqwest::RequestBuilder) -> Self {
        let response = request.send().await.unwrap();
        Answer {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            body: response.text().await.unwrap(),
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// A problem document of `status` whose detail mentions `mentions`.
    fn assert_problem(&self, status: u16, mentions: &str) {
        assert_eq!(self.status, status, "{}", self.body);
        assert_eq!(self.header("content-type"), Some("application/problem+json"));
        let problem = self.json();
        assert_eq!(problem["status"], status);
        assert!(
            problem["type"].as_str().unwrap().starts_with("urn:idem:problem:"),
            "{problem}"
        );
        assert!(
            problem["detail"].as_str().unwrap().contains(mentions),
            "{problem} does not mention {mentions}"
        );
    }
}

fn payment(cents: i64) -> Value {
    json!({"user": "ada", "cents": cents})
}

macro_rules! http_suite {
    ($backend:literal) => {
        use super::*;

        async fn server(op: Idempotent, bank_delay: Duration) -> Option<(Server, String)> {
            let url = harness::backend_url($backend, "http")?;
            let run = conformance::unique("http");
            Some((Server::start(&url, &run, op, bank_delay).await, run))
        }

        fn op() -> Idempotent {
            Idempotent::new("http.pay")
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_missing_malformed_or_long_key_is_400() {
            let Some((server, _)) = server(op(), Duration::ZERO).await else { return };
            Answer::of(server.pay("acme", None, &payment(100)))
                .await
                .assert_problem(400, "idempotency-key");
            for bad in ["\"unterminated", "(\"a\")", "a b", &format!("\"{}\"", "k".repeat(256))] {
                let request = server
                    .client
                    .post(format!("{}/payments", server.base))
                    .header("x-tenant", "acme")
                    .header("idempotency-key", bad)
                    .json(&payment(100));
                Answer::of(request).await.assert_problem(400, "idempotency-key");
            }
            assert_eq!((server.runs(), server.bank_charges().await), (0, 0));
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn an_unknown_outcome_is_its_own_problem_to_every_retry() {
            let Some((server, _)) = server(op(), Duration::ZERO).await else { return };
            let key = conformance::unique("k");
            for attempt in 0..3 {
                let request = server
                    .client
                    .post(format!("{}/unanswered", server.base))
                    .header("x-tenant", "acme")
                    .header("idempotency-key", format!("\"{key}\""))
                    .json(&payment(100));
                let answer = Answer::of(request).await;
                answer.assert_problem(409, "not run again");
                assert_eq!(answer.json()["type"], "urn:idem:problem:outcome-unknown", "attempt {attempt}");
            }
            assert_eq!((server.runs(), server.bank_charges().await), (1, 1), "charged once, asked once");
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_retry_replays_the_first_response() {
            let Some((server, _)) = server(op(), Duration::ZERO).await else { return };
            let key = conformance::unique("k");
            let first = Answer::of(server.pay("acme", Some(&key), &payment(1990))).await;
            assert_eq!(first.status, 201, "{}", first.body);
            assert_eq!(first.header("idempotent-replayed"), None);
            let retry = Answer::of(server.pay("acme", Some(&key), &payment(1990))).await;
            assert_eq!(retry.status, 201);
            assert_eq!(retry.body, first.body, "the body bytes of the first response");
            assert_eq!(retry.header("content-type"), Some("application/json"));
            assert_eq!(retry.header("location"), first.header("location"));
            assert_eq!(retry.header("idempotent-replayed"), Some("true"));
            assert_eq!(retry.header("x-trace"), None, "a header not marked replayable");
            assert_eq!((server.runs(), server.bank_charges().await), (1, 2), "one charge, one receipt");
            // The key travelled: into the nested call (its receipt) and to the bank.
            let receipt = first.json();
            assert!(receipt["receipt"].as_str().unwrap().starts_with("receipt for ch-"));
            let bank_key = receipt["bank_key"].as_str().unwrap();
            assert!(
                bank_key.starts_with(&format!("\"http.pay:POST /payments 4:acme {key}:")) && bank_key.ends_with(":bank\""),
                "{bank_key}"
            );
        }

        /// An operation that keeps tombstones answers a retry after its `ttl` with 410,
        /// and runs nothing.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_retry_after_the_ttl_of_an_operation_keeping_tombstones_is_410() {
            let gone = Idempotent::new(conformance::unique("http.gone"))
                .ttl(Duration::from_millis(800))
                .after_expiry(idem::AfterExpiry::Gone(Duration::from_secs(60)));
            let Some((server, _)) = server(gone, Duration::ZERO).await else { return };
            let key = conformance::unique("k");
            assert_eq!(Answer::of(server.pay("acme", Some(&key), &payment(100))).await.status, 201);
            tokio::time::sleep(Duration::from_millis(1000)).await;
            let retry = Answer::of(server.pay("acme", Some(&key), &payment(100))).await;
            retry.assert_problem(410, "no longer kept");
            assert_eq!(retry.json()["type"], "urn:idem:problem:idempotency-key-expired");
            assert_eq!(server.runs(), 1, "not run again");
        }

        /// An operation that keeps only a digest of its answer: a retry is 409, the
        /// handler ran once.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_retry_of_a_request_whose_response_is_kept_as_a_digest_is_409() {
            let digest = Idempotent::new(conformance::unique("http.digest")).keep_answer(false);
            let Some((server, _)) = server(digest, Duration::ZERO).await else { return };
            let key = conformance::unique("k");
            assert_eq!(Answer::of(server.pay("acme", Some(&key), &payment(100))).await.status, 201);
            let retry = Answer::of(server.pay("acme", Some(&key), &payment(100))).await;
            retry.assert_problem(409, "kept only as a digest");
            assert_eq!(retry.json()["type"], "urn:idem:problem:response-not-replayable");
            assert_eq!(server.runs(), 1, "not run again");
        }

        /// A route that names each request's subject (here the tenant): after the
        /// subject's erasure a retry is 410, the handler ran once; another subject's
        /// retry still replays.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_retry_of_an_erased_subjects_request_is_410() {
            use idem::subject::{self, SubjectKey};
            let Some(url) = harness::backend_url($backend, "http") else { return };
            let key = SubjectKey::new([21; 32]);
            subject::install_key(key.clone());
            let op = Idempotent::new(conformance::unique("http.erased"));
            let mut plain = None;
            let server = Server::start_with(&url, &conformance::unique("http"), Duration::ZERO, |store| {
                plain = Some(store.clone());
                layer(op, store).subject(|request| {
                    String::from_utf8(request.headers.get("x-tenant")?.as_bytes().to_vec()).ok()
                })
            })
            .await;
            let (ada, bob) = (conformance::unique("ada"), conformance::unique("bob"));
            let key_of = conformance::unique("k");
            let first = Answer::of(server.pay(&ada, Some(&key_of), &payment(100))).await;
            assert_eq!(first.status, 201, "{}", first.body);
            let bobs = Answer::of(server.pay(&bob, Some(&key_of), &payment(100))).await;
            assert_eq!(bobs.status, 201);
            let erased = subject::erase(plain.unwrap().as_ref(), &key, &ada).await.unwrap();
            assert_eq!(erased, 1);
            let retry = Answer::of(server.pay(&ada, Some(&key_of), &payment(100))).await;
            retry.assert_problem(410, "erased");
            assert_eq!(retry.json()["type"], "urn:idem:problem:record-erased");
            let bobs_retry = Answer::of(server.pay(&bob, Some(&key_of), &payment(100))).await;
            assert_eq!((bobs_retry.status, &bobs_retry.body), (201, &bobs.body));
            assert_eq!(server.runs(), 2, "neither ran again");
        }

        /// Behind the layer on a sealed store: the response is replayed, and the table
        /// holds none of it in clear.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_sealed_store_behind_the_layer_replays_what_it_keeps_sealed() {
            use idem::seal::{SealKey, SealedStore, StaticKeyRing, SEALED_PREFIX};
            let Some(url) = harness::backend_url($backend, "http") else { return };
            let biz = conformance::unique("http.sealed");
            let ring = StaticKeyRing::new(SealKey::new("k1", [3; 32]).unwrap(), []);
            let op = Idempotent::new(biz.clone());
            let server = Server::start_with(&url, &conformance::unique("http"), Duration::ZERO, |store| {
                let sealed: Store = Arc::new(SealedStore::new(store.clone(), ring));
                layer(op, &sealed)
            })
            .await;
            let key = conformance::unique("k");
            let first = Answer::of(server.pay("acme", Some(&key), &payment(4242))).await;
            assert_eq!(first.status, 201, "{}", first.body);
            let retry = Answer::of(server.pay("acme", Some(&key), &payment(4242))).await;
            assert_eq!((retry.status, &retry.body), (201, &first.body));
            assert_eq!(retry.header("idempotent-replayed"), Some("true"));
            assert_eq!(server.runs(), 1);
            sqlx::any::install_default_drivers();
            let pool = sqlx::AnyPool::connect(&url).await.unwrap();
            let stored: Vec<(Option<String>,)> =
                sqlx::query_as(&format!("SELECT response_body FROM idempotent_record WHERE biz_type = '{biz}'"))
                    .fetch_all(&pool)
                    .await
                    .unwrap();
            let charge = first.json()["charge_id"].as_str().unwrap().to_owned();
            assert_eq!(stored.len(), 1, "one record");
            let response = stored[0].0.as_deref().unwrap();
            assert!(response.starts_with(SEALED_PREFIX) && !response.contains(&charge), "{response}");
        }

        /// The request is kept only when the operation asks: then the 422 names the
        /// fields that differ; by default it says only that the key was used for
        /// another request (the fingerprint alone tells).
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn another_body_with_the_same_key_is_422() {
            let Some((keeping, _)) = server(op().keep_request(true), Duration::ZERO).await else { return };
            let key = conformance::unique("k");
            assert_eq!(Answer::of(keeping.pay("acme", Some(&key), &payment(100))).await.status, 201);
            Answer::of(keeping.pay("acme", Some(&key), &payment(200)))
                .await
                .assert_problem(422, "/cents");
            assert_eq!(keeping.runs(), 1);

            let Some((fingerprinting, _)) = server(op(), Duration::ZERO).await else { return };
            let key = conformance::unique("k");
            assert_eq!(Answer::of(fingerprinting.pay("acme", Some(&key), &payment(100))).await.status, 201);
            let refused = Answer::of(fingerprinting.pay("acme", Some(&key), &payment(200))).await;
            refused.assert_problem(422, "first used for another request");
            assert!(!refused.body.contains("/cents"), "{}", refused.body);
            assert_eq!(fingerprinting.runs(), 1);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_duplicate_of_a_running_request_is_409_or_waits() {
            for wait in [false, true] {
                let op = if wait { op().wait(Duration::from_secs(10)) } else { op() };
                let Some((server, _)) = server(op, Duration::from_millis(600)).await else { return };
                let server = Arc::new(server);
                let key = conformance::unique("k");
                let first = server.first_payment(&key);
                tokio::time::sleep(Duration::from_millis(200)).await;
                let duplicate = Answer::of(server.pay("acme", Some(&key), &payment(100))).await;
                let first = first.await.unwrap();
                assert_eq!(first.status, 201);
                if wait {
                    assert_eq!((duplicate.status, &duplicate.body), (201, &first.body));
                    assert_eq!(duplicate.header("idempotent-replayed"), Some("true"));
                } else {
                    duplicate.assert_problem(409, "still being processed");
                    assert_eq!(duplicate.header("retry-after"), Some("1"));
                }
                assert_eq!(server.runs(), 1, "wait = {wait}");
            }
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_4xx_from_the_handler_is_recorded_and_replayed() {
            let Some((server, _)) = server(op(), Duration::ZERO).await else { return };
            let key = conformance::unique("k");
            let declined = Answer::of(server.pay("acme", Some(&key), &payment(5_000_000))).await;
            assert_eq!(declined.status, 402);
            let again = Answer::of(server.pay("acme", Some(&key), &payment(5_000_000))).await;
            assert_eq!((again.status, &again.body), (402, &declined.body));
            assert_eq!(again.header("idempotent-replayed"), Some("true"));
            assert_eq!((server.runs(), server.bank_charges().await), (1, 0));
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_4xx_before_the_handler_leaves_no_record() {
            let Some((server, _)) = server(op(), Duration::ZERO).await else { return };
            let key = conformance::unique("k");
            // Validation (an extractor) refuses: not recorded, so the corrected retry runs.
            let refused = Answer::of(server.pay("acme", Some(&key), &payment(-5))).await;
            assert_eq!((refused.status, refused.body.as_str()), (400, "cents must be positive"));
            let corrected = Answer::of(server.pay("acme", Some(&key), &payment(500))).await;
            assert_eq!(corrected.status, 201, "{}", corrected.body);
            // An outer layer (authentication) refuses: the request never reached idem.
            let other = conformance::unique("k");
            let anonymous = server
                .client
                .post(format!("{}/payments", server.base))
                .header("idempotency-key", format!("\"{other}\""))
                .json(&payment(500));
            assert_eq!(Answer::of(anonymous).await.status, 401);
            assert_eq!(Answer::of(server.pay("acme", Some(&other), &payment(500))).await.status, 201);
            assert_eq!(server.runs(), 2);
            let record = server
                .shop
                .store
                .get("http.pay", &format!("POST /payments 4:acme {other}"))
                .await
                .unwrap();
            assert!(record.is_some(), "the record is kept under the scoped key");
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_5xx_is_not_recorded_unless_asked() {
            for record in [false, true] {
                let Some(url) = harness::backend_url($backend, "http") else { return };
                let run = conformance::unique("http");
                // The default (not recorded), and the option turned on.
                let server = Server::start_with(&url, &run, Duration::ZERO, |store| match record {
                    false => layer(op(), store),
                    true => layer(op(), store).record_server_errors(true),
                })
                .await;
                let key = conformance::unique("k");
                let explode = || {
                    server
                        .client
                        .post(format!("{}/explode", server.base))
                        .header("x-tenant", "acme")
                        .header("idempotency-key", format!("\"{key}\""))
                };
                assert_eq!(Answer::of(explode()).await.status, 500);
                let again = Answer::of(explode()).await;
                assert_eq!(again.status, 500);
                let replayed = again.header("idempotent-replayed").is_some();
                assert_eq!((server.runs(), replayed), (if record { 1 } else { 2 }, record));
            }
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn idempotent_methods_pass_through() {
            let Some((server, _)) = server(op(), Duration::ZERO).await else { return };
            // GET without a key: untouched (no 400), twice.
            assert_eq!(server.bank_charges().await, 0);
            assert_eq!(server.bank_charges().await, 0);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn after_the_ttl_the_key_starts_a_new_life() {
            let Some((server, _)) = server(op().ttl(Duration::from_secs(1)), Duration::ZERO).await else { return };
            let key = conformance::unique("k");
            let first = Answer::of(server.pay("acme", Some(&key), &payment(100))).await;
            tokio::time::sleep(Duration::from_millis(1300)).await;
            let later = Answer::of(server.pay("acme", Some(&key), &payment(100))).await;
            assert_eq!((first.status, later.status), (201, 201));
            assert_eq!(later.header("idempotent-replayed"), None);
            assert_ne!(first.json()["charge_id"], later.json()["charge_id"]);
            assert_eq!(server.runs(), 2);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_body_above_the_limit_is_413() {
            let Some((server, _)) = server(op(), Duration::ZERO).await else { return };
            let key = conformance::unique("k");
            let big = json!({"user": "x".repeat(5000), "cents": 1});
            Answer::of(server.pay("acme", Some(&key), &big))
                .await
                .assert_problem(413, "4096 bytes");
            assert_eq!(server.runs(), 0);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn tenants_never_share_a_response() {
            let Some((server, _)) = server(op(), Duration::ZERO).await else { return };
            let key = conformance::unique("k");
            let acme = Answer::of(server.pay("acme", Some(&key), &payment(100))).await;
            let globex = Answer::of(server.pay("globex", Some(&key), &payment(100))).await;
            assert_eq!((acme.status, globex.status), (201, 201));
            assert_eq!(globex.header("idempotent-replayed"), None);
            assert_ne!(acme.json()["charge_id"], globex.json()["charge_id"]);
            let again = Answer::of(server.pay("globex", Some(&key), &payment(100))).await;
            assert_eq!(again.body, globex.body);
        }

        /// The layer scoped by the principal the authentication middleware names (a
        /// bearer token's subject).
        async fn server_by_principal(configure: fn(IdempotencyLayer) -> IdempotencyLayer) -> Option<Server> {
            let url = harness::backend_url($backend, "http")?;
            let run = conformance::unique("http");
            let server = Server::start_with(&url, &run, Duration::ZERO, |store| {
                // Requests kept, so a 422 names the fields that differ.
                let op = op().keep_request(true).store(store.clone());
                let layer = IdempotencyLayer::new(op).principal(|caller: &Principal| caller.0.clone());
                configure(layer.replay_header(header::LOCATION))
            })
            .await;
            Some(server)
        }

        /// A POST to `path` as `caller` (a bearer token, or none), with `key` and a raw body.
        fn post_as(server: &Server, path: &str, caller: Option<&str>, key: &str, body: &str) -> reqwest::RequestBuilder {
            let mut request = server
                .client
                .post(format!("{}{path}", server.base))
                .header("x-tenant", "gateway") // what the outer authentication layer wants
                .header("idempotency-key", key)
                .header("content-type", "application/json")
                .body(body.to_owned());
            if let Some(caller) = caller {
                request = request.header("authorization", format!("Bearer {caller}"));
            }
            request
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn two_principals_with_one_key_are_two_callers() {
            let Some(server) = server_by_principal(|layer| layer).await else { return };
            let key = conformance::unique("statement");
            let body = r#"{"user":"ada","cents":100}"#;
            let alice = Answer::of(post_as(&server, "/payments", Some("alice.1"), &key, body)).await;
            let bob = Answer::of(post_as(&server, "/payments", Some("bob.1"), &key, body)).await;
            assert_eq!((alice.status, bob.status), (201, 201), "{} {}", alice.body, bob.body);
            assert_eq!(bob.header("idempotent-replayed"), None, "bob never gets alice's response");
            assert_ne!(alice.json()["charge_id"], bob.json()["charge_id"]);
            let again = Answer::of(post_as(&server, "/payments", Some("alice.1"), &key, body)).await;
            assert_eq!((again.body.as_str(), again.header("idempotent-replayed")), (alice.body.as_str(), Some("true")));
            // Not signed in: refused, never "anonymous".
            Answer::of(post_as(&server, "/payments", None, &key, body))
                .await
                .assert_problem(401, "signed in");
            assert_eq!(server.runs(), 2);
            let rows = server.shop.store.get("http.pay", &format!("POST /payments 0: {key}")).await.unwrap();
            assert!(rows.is_none(), "records are not under a shared scope");
            // An operator told "alice, key K" finds her record (`idem show --http`).
            let scope = idem::scoped_key::caller_scope("alice", None);
            let found = idem::scoped_key::http_record_key("POST", "/payments", &scope, &key);
            let record = server.shop.store.get("http.pay", &found).await.unwrap().expect("alice's record");
            assert!(record.response_body.unwrap().contains(alice.json()["charge_id"].as_str().unwrap()));
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_retry_whose_credentials_changed_is_the_same_caller() {
            let Some(server) = server_by_principal(|layer| layer).await else { return };
            let key = conformance::unique("click");
            let body = r#"{"user":"ada","cents":100}"#;
            let click = post_as(&server, "/payments", Some("alice.1"), &key, body).header("cookie", "session=s1; _ga=GA1.1.1");
            let first = Answer::of(click).await;
            assert_eq!(first.status, 201, "{}", first.body);
            // The token refreshed and the analytics cookie changed before the retry.
            let retry = post_as(&server, "/payments", Some("alice.2"), &key, body).header("cookie", "_ga=GA1.1.2; session=s1");
            let retry = Answer::of(retry).await;
            assert_eq!((retry.body.as_str(), retry.header("idempotent-replayed")), (first.body.as_str(), Some("true")));
            assert_eq!(server.runs(), 1, "one charge");
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_tenant_header_never_names_a_caller() {
            let Some(server) = server_by_principal(|layer| layer.tenant_header(header::HeaderName::from_static("x-account"))).await else { return };
            let key = conformance::unique("tenant");
            let body = r#"{"user":"ada","cents":100}"#;
            for _ in 0..2 {
                // Two anonymous clients naming one account: refused, never sharing a record.
                Answer::of(post_as(&server, "/payments", None, &key, body).header("x-account", "acme"))
                    .await
                    .assert_problem(401, "signed in");
            }
            let acme = Answer::of(post_as(&server, "/payments", Some("alice.1"), &key, body).header("x-account", "acme")).await;
            let globex = Answer::of(post_as(&server, "/payments", Some("alice.1"), &key, body).header("x-account", "globex")).await;
            assert_eq!((acme.status, globex.status), (201, 201));
            assert_eq!(globex.header("idempotent-replayed"), None, "one caller's key under two accounts is two requests");
            assert_eq!(server.runs(), 2);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn non_ascii_tenants_never_merge() {
            let Some((server, _)) = server(op(), Duration::ZERO).await else { return };
            let key = conformance::unique("k");
            let as_tenant = |tenant: &[u8]| {
                server
                    .client
                    .post(format!("{}/payments", server.base))
                    .header("x-tenant", reqwest::header::HeaderValue::from_bytes(tenant).unwrap())
                    .header("idempotency-key", key.as_str())
                    .json(&payment(100))
            };
            let grosse = Answer::of(as_tenant("größe-ag".as_bytes())).await;
            let mueller = Answer::of(as_tenant("müller-gmbh".as_bytes())).await;
            assert_eq!((grosse.status, mueller.status), (201, 201), "{} {}", grosse.body, mueller.body);
            assert_eq!(mueller.header("idempotent-replayed"), None);
            assert_ne!(grosse.json()["charge_id"], mueller.json()["charge_id"]);
            // A tenant the function cannot name (not UTF-8): refused, not anonymous.
            Answer::of(as_tenant(&[0xff, 0xfe])).await.assert_problem(401, "signed in");
            assert_eq!(server.runs(), 2);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn bare_uuid_keys_are_keys() {
            let Some(server) = server_by_principal(|layer| layer).await else { return };
            let body = r#"{"user":"ada","cents":100}"#;
            let mut digits_first = 0;
            for _ in 0..24 {
                let key = uuid::Uuid::new_v4().to_string();
                digits_first += usize::from(key.starts_with(|c: char| c.is_ascii_digit()));
                let first = Answer::of(post_as(&server, "/payments", Some("t"), &key, body)).await;
                assert_eq!(first.status, 201, "{key}: {}", first.body);
                let again = Answer::of(post_as(&server, "/payments", Some("t"), &key, body)).await;
                assert_eq!(again.header("idempotent-replayed"), Some("true"), "{key}");
            }
            assert_eq!(server.runs(), 24);
            harness::say(&format!("bare UUID keys: 24 of 24 accepted ({digits_first} starting with a digit)"));
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_method_the_route_does_not_serve_is_405() {
            let Some((server, _)) = server(op(), Duration::ZERO).await else { return };
            let request = server
                .client
                .patch(format!("{}/payments", server.base))
                .header("x-tenant", "acme")
                .header("idempotency-key", "k-405")
                .json(&payment(100));
            let answer = Answer::of(request).await;
            assert_eq!(answer.status, 405, "{}", answer.body);
            assert_eq!(answer.header("allow"), Some("POST"));
            assert_eq!(server.runs(), 0);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn problem_details_speak_to_the_client_only() {
            let Some((server, _)) = server(op(), Duration::from_millis(400)).await else { return };
            let server = Arc::new(server);
            let key = conformance::unique("k");
            let first = server.first_payment(&key);
            tokio::time::sleep(Duration::from_millis(150)).await;
            let running = Answer::of(server.pay("acme", Some(&key), &payment(100))).await;
            assert_eq!(first.await.unwrap().status, 201);
            let reused = Answer::of(server.pay("acme", Some(&key), &payment(200))).await;
            for answer in [&running, &reused] {
                let detail = answer.json()["detail"].as_str().unwrap().to_owned();
                for internal in ["http.pay", "4:acme", "POST /payments", "biz", "sha256"] {
                    assert!(!detail.contains(internal), "{internal} leaked: {detail}");
                }
            }
            assert_eq!((running.status, reused.status), (409, 422));
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn the_same_json_serialized_again_is_the_same_request() {
            let Some(server) = server_by_principal(|layer| layer.ignore_field("/sent_at")).await else { return };
            let key = conformance::unique("k");
            let first = Answer::of(post_as(&server, "/payments", Some("t"), &key, r#"{"user":"ada","cents":100,"sent_at":1}"#)).await;
            assert_eq!(first.status, 201);
            let reserialized = "{ \"cents\": 100,\n  \"sent_at\": 2, \"user\": \"ada\" }";
            let again = Answer::of(post_as(&server, "/payments", Some("t"), &key, reserialized)).await;
            assert_eq!((again.status, again.header("idempotent-replayed")), (201, Some("true")), "{}", again.body);
            let other = Answer::of(post_as(&server, "/payments", Some("t"), &key, r#"{"user":"bob","cents":100}"#)).await;
            other.assert_problem(422, "/user");
            assert!(!other.body.contains("bob") && !other.body.contains("ada"), "paths, not values: {}", other.body);
            assert_eq!(server.runs(), 1);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_stream_passes_on_as_it_comes_and_replays_when_kept() {
            let Some(server) = server_by_principal(|layer| layer).await else { return };
            let key = conformance::unique("k");
            let started = std::time::Instant::now();
            let mut response = post_as(&server, "/statements", Some("t"), &key, r#"{"lines":8}"#).send().await.unwrap();
            assert_eq!(response.status(), 200);
            let first = response.chunk().await.unwrap().unwrap();
            let first_at = started.elapsed();
            assert!(String::from_utf8_lossy(&first).contains("line 1"));
            let mut text = String::from_utf8_lossy(&first).into_owned();
            while let Some(chunk) = response.chunk().await.unwrap() {
                text.push_str(&String::from_utf8_lossy(&chunk));
            }
            let whole_at = started.elapsed();
            assert!(text.contains("line 8"), "{text}");
            assert!(
                first_at * 3 < whole_at,
                "the first event came before the stream ended: {first_at:?} of {whole_at:?}"
            );
            // The stream's end reaches the client once its record is written: a retry
            // the moment it ends is a replay.
            let again = Answer::of(post_as(&server, "/statements", Some("t"), &key, r#"{"lines":8}"#)).await;
            assert_eq!((again.status, again.header("idempotent-replayed")), (200, Some("true")), "{}", again.body);
            assert_eq!(again.body, text, "kept whole, replayed whole");
            harness::say(&format!(
                "http stream on {}: first event after {first_at:?}, the 8th after {whole_at:?}",
                $backend
            ));
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_stream_above_the_limit_is_never_held_and_runs_once() {
            let Some(server) = server_by_principal(|layer| layer.response_limit(40)).await else { return };
            let key = conformance::unique("k");
            let first = Answer::of(post_as(&server, "/statements", Some("t"), &key, r#"{"lines":5}"#)).await;
            assert_eq!(first.status, 200);
            assert!(first.body.contains("line 5"), "the client got it all: {}", first.body);
            // Recorded (as not kept) before the client saw the stream's end.
            let again = Answer::of(post_as(&server, "/statements", Some("t"), &key, r#"{"lines":5}"#)).await;
            again.assert_problem(409, "not kept");
            assert_eq!(server.runs(), 0, "the statement handler is not counted");
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_storm_of_identical_requests_charges_once() {
            let Some((server, _)) = server(op(), Duration::from_millis(300)).await else { return };
            let server = Arc::new(server);
            let key = conformance::unique("k");
            let requests = (0..40).map(|_| {
                let (server, key) = (server.clone(), key.clone());
                tokio::spawn(async move { Answer::of(server.pay("acme", Some(&key), &payment(700))).await })
            });
            let answers: Vec<Answer> = futures::future::join_all(requests)
                .await
                .into_iter()
                .map(Result::unwrap)
                .collect();
            let created: Vec<&Answer> = answers.iter().filter(|a| a.status == 201).collect();
            assert!(!created.is_empty());
            assert!(created.iter().all(|a| a.body == created[0].body), "every 201 is the same charge");
            assert!(answers.iter().all(|a| a.status == 201 || a.status == 409));
            let last = Answer::of(server.pay("acme", Some(&key), &payment(700))).await;
            assert_eq!(last.body, created[0].body);
            assert_eq!((server.runs(), server.bank_charges().await), (1, 2), "one charge and its receipt");
            harness::say(&format!(
                "http storm on {}: 40 identical requests, {} got the charge, {} got 409, 1 charge",
                $backend,
                created.len(),
                answers.len() - created.len()
            ));
        }

        #[test]
        fn a_server_killed_mid_request_charges_once_after_restart() {
            killed_mid_request($backend);
        }
    };
}

mod sqlite {
    http_suite!("sqlite");
}

mod postgres {
    http_suite!("postgres");
}

/// The server process: serves until killed, with a 1 s lease.
#[test]
fn server_worker() {
    let Some(settings) = harness::worker_settings("http") else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let delay = Duration::from_millis(settings["HTTP_BANK_DELAY_MS"].parse().unwrap());
        let op = Idempotent::new("http.pay").lease(Duration::from_secs(1));
        let server = Server::start(&settings["HTTP_URL"], &settings["HTTP_RUN"], op, delay).await;
        harness::report(&format!("LISTENING {}", server.base));
        std::future::pending::<()>().await;
    });
}

/// Start a server process; its base URL and a reader of what it says.
fn start_server(
    url: &str,
    run: &str,
    bank_delay_ms: u64,
) -> (std::process::Child, String, BufReader<std::process::ChildStdout>) {
    let settings = [
        ("HTTP_URL", url.to_owned()),
        ("HTTP_RUN", run.to_owned()),
        ("HTTP_BANK_DELAY_MS", bank_delay_ms.to_string()),
    ];
    let (child, out, line) = harness::start_worker("http", "server_worker", &settings, "LISTENING ");
    let base = line.trim().strip_prefix("LISTENING ").unwrap().to_owned();
    (child, base, out)
}

fn killed_mid_request(backend: &str) {
    let Some(url) = harness::backend_url(backend, "http-kill") else {
        return;
    };
    let run = conformance::unique("http-kill");
    let key = conformance::unique("k");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let client = reqwest::Client::new();
    let pay = |base: &str| {
        client
            .post(format!("{base}/payments"))
            .header("x-tenant", "acme")
            .header("idempotency-key", format!("\"{key}\""))
            .json(&payment(4200))
    };

    // The first server is killed while its handler waits on the bank.
    let (mut first, base, mut out) = start_server(&url, &run, 60_000);
    let request = runtime.spawn(pay(&base).send());
    let mut line = String::new();
    while out.read_line(&mut line).unwrap() > 0 && !line.contains("CHARGING") {
        line.clear();
    }
    first.kill().unwrap(); // SIGKILL
    first.wait().unwrap();
    assert!(
        runtime.block_on(request).unwrap().is_err(),
        "the client saw the connection die"
    );

    let (mut second, base, _) = start_server(&url, &run, 0);
    runtime.block_on(async {
        // Within the dead holder's 1 s lease and its 1 s clock tolerance: still running,
        // as far as anyone knows.
        let early = Answer::of(pay(&base)).await;
        assert!(matches!(early.status, 409 | 201), "{}", early.body);
        tokio::time::sleep(Duration::from_millis(2200)).await;
        let retry = Answer::of(pay(&base)).await;
        assert_eq!(retry.status, 201, "{}", retry.body);
        let again = Answer::of(pay(&base)).await;
        assert_eq!((again.status, &again.body), (201, &retry.body));
        let effects = Effects::open(&url).await;
        let rows = effects.tokens(&run).await;
        assert_eq!(rows["ada"].len(), 1, "charged once across the kill: {rows:?}");
    });
    second.kill().unwrap();
    second.wait().unwrap();
    harness::say(&format!(
        "http kill on {backend}: server SIGKILLed mid-request, restarted; the retry after the 1 s lease and its tolerance charged once"
    ));
}
