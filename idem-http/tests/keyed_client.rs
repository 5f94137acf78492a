//! `KeyedClient` against a real server on 127.0.0.1: what it retries (with the same key
//! every time), what it returns at once, and which failures it reports as ambiguous.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use idem::http::{KeyedClient, SendError};
use idem::{Idempotent, MemoryStore};

/// What the server saw: the `Idempotency-Key` of each request, by route.
#[derive(Default)]
struct Seen(Mutex<Vec<(String, String)>>);

impl Seen {
    fn note(&self, route: &str, headers: &HeaderMap) -> usize {
        let key = headers
            .get("idempotency-key")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        let mut seen = self.0.lock().unwrap();
        seen.push((route.to_owned(), key));
        seen.iter().filter(|(r, _)| r == route).count()
    }

    fn keys(&self, route: &str) -> Vec<String> {
        let seen = self.0.lock().unwrap();
        seen.iter()
            .filter(|(r, _)| r == route)
            .map(|(_, k)| k.clone())
            .collect()
    }
}

async fn flaky(State(seen): State<Arc<Seen>>, headers: HeaderMap) -> Response {
    match seen.note("flaky", &headers) {
        1 | 2 => StatusCode::SERVICE_UNAVAILABLE.into_response(),
        _ => (StatusCode::CREATED, "charged").into_response(),
    }
}

async fn busy(State(seen): State<Arc<Seen>>, headers: HeaderMap) -> Response {
    match seen.note("busy", &headers) {
        1 => (StatusCode::CONFLICT, [("retry-after", "1")], "in progress").into_response(),
        _ => (StatusCode::CREATED, "charged").into_response(),
    }
}

async fn refuse(State(seen): State<Arc<Seen>>, headers: HeaderMap) -> Response {
    seen.note("refuse", &headers);
    (StatusCode::BAD_REQUEST, "declined").into_response()
}

async fn silent(State(seen): State<Arc<Seen>>, headers: HeaderMap) -> Response {
    seen.note("silent", &headers);
    tokio::time::sleep(Duration::from_secs(30)).await;
    StatusCode::CREATED.into_response()
}

async fn down(State(seen): State<Arc<Seen>>, headers: HeaderMap) -> Response {
    seen.note("down", &headers);
    StatusCode::BAD_GATEWAY.into_response()
}

async fn server() -> (String, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let app = Router::new()
        .route("/flaky", post(flaky))
        .route("/busy", post(busy))
        .route("/refuse", post(refuse))
        .route("/silent", post(silent))
        .route("/down", post(down))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, seen)
}

/// The answer to a POST of `url`, sent inside an idempotent call (the key comes from it).
async fn send(client: &KeyedClient, url: String) -> (u16, String) {
    let op = Idempotent::new("keyed").store(Arc::new(MemoryStore::new()));
    op.execute("k", async {
        let response = client
            .send(reqwest::Client::new().post(url).body("{}"), "charge")
            .await
            .unwrap_or_else(|error| panic!("{error}"));
        Ok::<_, idem::Error>((response.status().as_u16(), response.text().await.unwrap()))
    })
    .await
    .unwrap()
}

fn client() -> KeyedClient {
    let timeout = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    KeyedClient::new(timeout).pauses(Duration::from_millis(20), Duration::from_millis(100))
}

#[tokio::test]
async fn server_errors_and_in_progress_are_retried_with_the_same_key() {
    let (base, seen) = server().await;
    let client = client();
    assert_eq!(
        send(&client, format!("{base}/flaky")).await,
        (201, "charged".to_owned())
    );
    let keys = seen.keys("flaky");
    assert_eq!(keys.len(), 3, "two 503s, then the answer");
    assert!(
        keys.iter().all(|key| key == &keys[0] && key.ends_with(":charge\"")),
        "{keys:?}"
    );
    assert_eq!(send(&client, format!("{base}/busy")).await.0, 201);
    assert_eq!(seen.keys("busy").len(), 2, "retried after Retry-After");
}

#[tokio::test]
async fn a_4xx_is_the_answer_and_is_never_retried() {
    let (base, seen) = server().await;
    assert_eq!(
        send(&client(), format!("{base}/refuse")).await,
        (400, "declined".to_owned())
    );
    assert_eq!(seen.keys("refuse").len(), 1);
}

/// Each failure the client ends with, and whether it may have taken effect.
async fn failure(url: String) -> SendError {
    let op = Idempotent::new("keyed").store(Arc::new(MemoryStore::new()));
    let slot = Arc::new(Mutex::new(None));
    let kept = slot.clone();
    let _ = op
        .execute("k", async move {
            let error = client().send(reqwest::Client::new().post(url), "charge").await.err();
            *kept.lock().unwrap() = error;
            Ok::<_, idem::Error>(())
        })
        .await;
    let error = slot.lock().unwrap().take();
    error.expect("the send failed")
}

#[tokio::test]
async fn an_unanswered_request_or_a_5xx_is_ambiguous_and_no_connection_is_not() {
    let (base, seen) = server().await;
    let unanswered = failure(format!("{base}/silent")).await;
    assert!(
        matches!(unanswered, SendError::Unanswered { attempts: 4, .. }),
        "{unanswered:?}"
    );
    assert!(unanswered.is_ambiguous());
    assert_eq!(
        seen.keys("silent").len(),
        4,
        "every try reached the server, with one key"
    );
    let down = failure(format!("{base}/down")).await;
    assert!(
        matches!(
            down,
            SendError::Unsettled {
                status: StatusCode::BAD_GATEWAY,
                ..
            }
        ),
        "{down:?}"
    );
    assert!(down.is_ambiguous());
    // Nothing listens on the port: nothing was ever sent.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let refused = failure(format!("http://127.0.0.1:{port}/charges")).await;
    assert!(matches!(refused, SendError::NotSent { .. }), "{refused:?}");
    assert!(!refused.is_ambiguous());
    // Outside a call there is no key to send with: nothing is sent.
    let outside = client()
        .send(reqwest::Client::new().post(format!("{base}/flaky")), "charge")
        .await;
    assert!(matches!(outside, Err(SendError::NoCall(_))), "{outside:?}");
}
