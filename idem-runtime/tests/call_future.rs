//! What a call's future holds: the body once more than the body's own future at most,
//! whatever the entry point. A body is often a few kilobytes (an HTTP handler with its
//! service's future, a transaction with its statements); a call that carried it through
//! each of its layers by value would hold it many times over and copy it layer by layer
//! on every call.

use std::future::Future;

use idem_runtime::{Error, Idempotent, MemoryStore};

/// A body of about 4 KiB: its state holds the array across an await.
fn heavy_body() -> impl Future<Output = Result<u8, Error>> {
    let state = [7u8; 4096];
    async move {
        tokio::task::yield_now().await;
        Ok(state[4095])
    }
}

async fn light_body() -> Result<u8, Error> {
    Ok(1)
}

/// How many bytes the call's future grows by with the heavy body, against the light one,
/// in bodies: at most 2 (the body as handed in, and the body pinned where it runs).
fn held_bodies<C: Future>(light: impl Future, heavy: C) -> f64 {
    let body = std::mem::size_of_val(&heavy_body()) as f64;
    let grown = std::mem::size_of_val(&heavy) as f64 - std::mem::size_of_val(&light) as f64;
    grown / body
}

#[test]
fn a_call_holds_its_body_at_most_twice() {
    let store = MemoryStore::new();
    let op = Idempotent::new("size").store(std::sync::Arc::new(store.clone()));
    let on_store = held_bodies(
        op.execute_on(&store, "k", light_body()),
        op.execute_on(&store, "k", heavy_body()),
    );
    let installed = held_bodies(op.execute("k", light_body()), op.execute("k", heavy_body()));
    let describe: fn(&Error) -> String = |error| error.to_string();
    let attribute = held_bodies(
        idem_runtime::__private::run(&op, None, "k".to_owned(), describe, light_body()),
        idem_runtime::__private::run(&op, None, "k".to_owned(), describe, heavy_body()),
    );
    for (entry, held) in [
        ("execute_on", on_store),
        ("execute", installed),
        ("the attribute", attribute),
    ] {
        assert!(
            held <= 2.1,
            "a call through {entry} holds its body {held:.1} times: a layer carries it by value"
        );
    }
}

/// The most bytes a call's future may take with a body of a few bytes, through
/// `execute`.
const SMALL_CALL_FUTURE: usize = 1_400;

/// A call's future is moved a few times on every call (into the caller's future, into
/// the span that wraps it), so each byte it carries is copied each time. What a call
/// holds only on its rare paths (the error of a missing store, a record met in the way,
/// the state of waiting behind a duplicate) is boxed or consumed before the call awaits,
/// and does not make every call's future larger.
#[test]
fn a_call_with_a_small_body_has_a_small_future() {
    let store = MemoryStore::new();
    let op = Idempotent::new("size").store(std::sync::Arc::new(store));
    let size = std::mem::size_of_val(&op.execute("k", light_body()));
    println!("a call's future with a small body: {size} bytes");
    assert!(
        size <= SMALL_CALL_FUTURE,
        "a call's future with a small body takes {size} bytes, more than {SMALL_CALL_FUTURE}: \
         something its rare paths hold is carried inline across an await"
    );
}
