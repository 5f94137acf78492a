//! The layer on a whole axum `Router` (`Router::layer`, which axum applies to each
//! route): keys are scoped by the matched route and the request's path is
//! fingerprinted, a request no route matches is not recorded; and the options the
//! socket tests do not reach.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use axum::body::{to_bytes, Body};
use axum::http::{Method, Request, StatusCode};
use axum::routing::{post, put};
use axum::Router;
use idem_http::{ClientErrors, IdempotencyLayer};
use idem_runtime::{IdempotencyStore, Idempotent, MemoryStore};
use tower::ServiceExt;

fn app(
    store: Arc<MemoryStore>,
    runs: Arc<AtomicU32>,
    configure: impl FnOnce(IdempotencyLayer) -> IdempotencyLayer,
) -> Router {
    let counted = move || {
        let runs = runs.clone();
        async move {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            (StatusCode::CONFLICT, format!("run {n}"))
        }
    };
    Router::new()
        .route("/orders/{id}", post(counted.clone()))
        .route("/orders/{id}/state", put(counted))
        // Shared by every caller: these tests are about routes (callers: tests/http.rs beside this file).
        .layer(configure(
            IdempotencyLayer::new(Idempotent::new("orders").store(store)).shared(),
        ))
}

async fn send(app: &Router, method: Method, path: &str, key: Option<&str>) -> (StatusCode, String, bool) {
    let mut request = Request::builder().method(method).uri(path);
    if let Some(key) = key {
        request = request.header("x-request-id", key);
    }
    let response = app.clone().oneshot(request.body(Body::empty()).unwrap()).await.unwrap();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let status = response.status();
    let body = to_bytes(response.into_body(), usize::MAX).await.unwrap();
    (status, String::from_utf8(body.to_vec()).unwrap(), replayed)
}

#[tokio::test]
async fn on_a_whole_router_keys_are_scoped_by_route() {
    let (store, runs) = (Arc::new(MemoryStore::new()), Arc::new(AtomicU32::new(0)));
    let app = app(store.clone(), runs.clone(), |layer| {
        layer
            .header(http::HeaderName::from_static("x-request-id"))
            .client_errors(ClientErrors::Always)
    });
    assert_eq!(
        send(&app, Method::POST, "/orders/1", Some("r-1")).await,
        (StatusCode::CONFLICT, "run 1".into(), false)
    );
    assert_eq!(
        send(&app, Method::POST, "/orders/1", Some("r-1")).await,
        (StatusCode::CONFLICT, "run 1".into(), true)
    );
    // Another order under the same route, the same key: the key reused for another request.
    let (status, body, _) = send(&app, Method::POST, "/orders/2", Some("r-1")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(store.get("orders", "POST /orders/{id} 0: r-1").await.unwrap().is_some());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_request_no_route_matches_is_not_recorded() {
    let (store, runs) = (Arc::new(MemoryStore::new()), Arc::new(AtomicU32::new(0)));
    let app = app(store.clone(), runs, |layer| {
        layer.header(http::HeaderName::from_static("x-request-id"))
    });
    for _ in 0..2 {
        let (status, _, replayed) = send(&app, Method::POST, "/nowhere", Some("\"r-9\"")).await;
        assert_eq!((status, replayed), (StatusCode::NOT_FOUND, false));
    }
    assert!(store.get("orders", "POST /nowhere 0: r-9").await.unwrap().is_none());
}

#[tokio::test]
async fn only_the_configured_methods_and_optional_keys() {
    let (store, runs) = (Arc::new(MemoryStore::new()), Arc::new(AtomicU32::new(0)));
    let app = app(store, runs.clone(), |layer| layer.methods([Method::PUT]).optional());
    // POST is no longer guarded: it runs every time, key or not.
    send(&app, Method::POST, "/orders/1", Some("\"k\"")).await;
    send(&app, Method::POST, "/orders/1", Some("\"k\"")).await;
    // PUT without a key is let through (optional); with one, it is guarded — and its
    // 409, answered without `started()`, is not recorded by default.
    send(&app, Method::PUT, "/orders/1/state", None).await;
    let (_, body, replayed) = send(&app, Method::PUT, "/orders/1/state", Some("\"k\"")).await;
    assert_eq!((body.as_str(), replayed), ("run 4", false));
    let (_, body, replayed) = send(&app, Method::PUT, "/orders/1/state", Some("\"k\"")).await;
    assert_eq!((body.as_str(), replayed), ("run 5", false));
    assert_eq!(runs.load(Ordering::SeqCst), 5);
}
