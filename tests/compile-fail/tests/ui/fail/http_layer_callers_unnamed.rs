// An `IdempotencyLayer` told nothing of its callers is not a layer: a route would
// otherwise tell callers apart by nothing, or by bytes that change on a retry.
use std::sync::Arc;

use axum::{routing::post, Router};
use idem::http::IdempotencyLayer;
use idem::{Idempotent, MemoryStore};

fn main() {
    let layer = IdempotencyLayer::new(Idempotent::new("http.pay").store(Arc::new(MemoryStore::new())));
    let _app: Router = Router::new().route("/payments", post(|| async { "paid" }).route_layer(layer));
}
