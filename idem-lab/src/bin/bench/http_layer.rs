//! The `Idempotency-Key` layer against the same handler without it, in process (the
//! router called as a tower service, no socket): what the layer itself costs.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use idem::http::IdempotencyLayer;
use idem::Idempotent;
use tower::ServiceExt;

use super::{micros, run_id, sample, Backend, Percentiles};

async fn pay(Json(cents): Json<u64>) -> (StatusCode, Json<serde_json::Value>) {
    (
        StatusCode::CREATED,
        Json(serde_json::json!({"charge_id": 1, "cents": cents})),
    )
}

/// The signed-in caller, as an authentication middleware would put it in the request.
#[derive(Clone)]
struct Caller(&'static str);

fn request(key: Option<String>) -> Request<Body> {
    // The caller the layer keeps each caller's keys apart by.
    let mut request = Request::post("/payments")
        .header("content-type", "application/json")
        .header("authorization", "Bearer bench")
        .extension(Caller("bench"));
    if let Some(key) = key {
        request = request.header("idempotency-key", format!("\"{key}\""));
    }
    request.body(Body::from("19900")).unwrap()
}

async fn send(app: &Router, key: Option<String>) {
    let response = app.clone().oneshot(request(key)).await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    std::hint::black_box(axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap());
}

/// The rows of one backend.
async fn rows(backend: &Backend, calls: usize) {
    let bare = Router::new().route("/payments", post(pay));
    let layer = IdempotencyLayer::new(Idempotent::new("bench.http").store(backend.store.clone()))
        .principal(|caller: &Caller| caller.0.to_owned());
    let guarded = Router::new().route("/payments", post(pay)).route_layer(layer);
    let run = run_id();
    let alone = sample(calls, |_| send(&bare, None)).await;
    let first = sample(calls, |i| send(&guarded, Some(format!("{run}-{i}")))).await;
    send(&guarded, Some(format!("{run}-hot"))).await;
    let replay = sample(calls, |_| send(&guarded, Some(format!("{run}-hot")))).await;
    let row = |what: &str, p: &Percentiles| {
        println!(
            "| {} | {what} | {} | {} | {:+.1} |",
            backend.name,
            micros(p.p50),
            micros(p.p99),
            (p.p50.as_secs_f64() - alone.p50.as_secs_f64()) * 1e6
        );
    };
    row("handler alone (axum router, in process)", &alone);
    row("through the layer: first request", &first);
    row("through the layer: replayed request", &replay);
}

/// The table of the HTTP layer, for every backend.
pub async fn report(backends: &[Backend], calls: usize) {
    println!("\n| backend | `POST /payments` | p50 µs | p99 µs | added (p50) µs |");
    println!("|---|---|---|---|---|");
    for backend in backends {
        rows(backend, calls).await;
    }
}
