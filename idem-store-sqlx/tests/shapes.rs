//! Every shape of function `#[idempotent]` supports, and every form of its options.

use std::fmt::Display;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use idem::{idempotent, IdempotencyStore, MemoryStore};
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
}

#[derive(Serialize, Deserialize)]
struct Req {
    request_id: String,
    cents: u64,
}

static FREE_STORE: std::sync::LazyLock<MemoryStore> = std::sync::LazyLock::new(MemoryStore::new);

/// A free fn, `&S` store, key as a string expression over a field.
#[idempotent(key = "req.request_id", biz = "shapes.free", store = &*FREE_STORE)]
async fn free(req: Req, runs: &AtomicU32) -> Result<u64, AppError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(req.cents) // the body still owns `req`: the key was evaluated by reference
}

struct Service {
    store: Arc<MemoryStore>,
    shared: Arc<dyn IdempotencyStore>,
    charged: u64,
}

impl Service {
    /// `&self`, `Arc<S>` store, bare `format!` key over two parameters.
    #[idempotent(key = format!("{}:{}", user, order), biz = "shapes.method", store = self.store)]
    async fn by_ref(&self, user: u32, order: u32) -> Result<String, AppError> {
        Ok(format!("{user}/{order}"))
    }

    /// `&mut self`: the `Arc` store is cloned, so the body may borrow `self` mutably.
    #[idempotent(key = id, biz = "shapes.mut", store = self.store, ttl = "1h30m", lease = "5s")]
    async fn by_mut(&mut self, id: u64, cents: u64) -> Result<u64, AppError> {
        self.charged += cents;
        Ok(self.charged)
    }

    /// `Arc<dyn IdempotencyStore>` store, `Reject` as a path, `on_error`, `wait`.
    #[idempotent(key = id, biz = "shapes.dyn", store = self.shared, mode = idem::Mode::Reject, on_error = Record, wait = "1s")]
    async fn on_dyn(&self, id: &str) -> Result<(), AppError> {
        Ok(())
    }
}

/// A generic fn with a where clause, an `impl Trait` parameter and a pattern.
#[idempotent(key = key, biz = "shapes.generic", store = store)]
async fn generic<K, S>(store: &S, key: K, (a, b): (u32, u32), extra: impl Display + Send) -> Result<String, AppError>
where
    K: Display + Send,
    S: IdempotencyStore + Clone,
{
    Ok(format!("{}+{}={} {extra}", a, b, a + b))
}

/// `?` inside the body, and an early `return`.
#[idempotent(key = n, biz = "shapes.try", store = store, payload = n)]
async fn early(store: &MemoryStore, n: i64) -> Result<i64, AppError> {
    if n < 0 {
        return Ok(0);
    }
    let parsed: i64 = n
        .to_string()
        .parse()
        .map_err(|_| idem::Error::NoStore { biz: "never".into() })?;
    Ok(parsed * 2)
}

mod renamed {
    pub use idem as my_idem;
}

/// `crate = ...` for a renamed dependency.
#[idempotent(key = "x % 2", biz = "shapes.crate", store = store, crate = renamed::my_idem)]
async fn via_renamed(store: &MemoryStore, x: u8) -> Result<u8, AppError> {
    Ok(x)
}

#[tokio::test]
async fn every_shape_runs_once_per_key() {
    let runs = AtomicU32::new(0);
    for _ in 0..2 {
        let req = Req {
            request_id: "r1".into(),
            cents: 100,
        };
        assert_eq!(free(req, &runs).await.unwrap(), 100);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let store = Arc::new(MemoryStore::new());
    let mut service = Service {
        store: store.clone(),
        shared: store.clone(),
        charged: 0,
    };
    assert_eq!(service.by_ref(7, 9).await.unwrap(), "7/9");
    assert_eq!(
        store.get("shapes.method", "7:9").await.unwrap().unwrap().status,
        idem::Status::Succeeded
    );
    assert_eq!(service.by_mut(1, 50).await.unwrap(), 50);
    assert_eq!(service.by_mut(1, 50).await.unwrap(), 50, "replayed, not charged again");
    assert_eq!(service.by_mut(2, 25).await.unwrap(), 75);
    assert_eq!(service.charged, 75);
    service.on_dyn("a").await.unwrap();
    assert!(matches!(
        service.on_dyn("a").await,
        Err(AppError::Idem(idem::Error::Duplicate { .. }))
    ));

    let plain = MemoryStore::new();
    assert_eq!(generic(&plain, "k", (2, 3), "!").await.unwrap(), "2+3=5 !");
    assert_eq!(generic(&plain, "k", (4, 4), "?").await.unwrap(), "2+3=5 !");
    assert_eq!(early(&plain, -1).await.unwrap(), 0);
    assert_eq!(early(&plain, 21).await.unwrap(), 42);
    assert_eq!(via_renamed(&plain, 3).await.unwrap(), 3);
    assert_eq!(via_renamed(&plain, 5).await.unwrap(), 3, "5 % 2 == 3 % 2: the same key");
}

#[tokio::test]
async fn the_builder_is_the_same_operation() {
    let store = Arc::new(MemoryStore::new());
    let op = idem::Idempotent::new("shapes.builder")
        .store(store.clone())
        .payload(&("a", 1));
    let first: u32 = op.execute("k", async { Ok::<_, idem::Error>(1) }).await.unwrap();
    let again: u32 = op.execute("k", async { Ok::<_, idem::Error>(2) }).await.unwrap();
    assert_eq!((first, again), (1, 1));
    let other = idem::Idempotent::new("shapes.builder").store(store).payload(&("a", 2));
    let error = other
        .execute("k", async { Ok::<u32, idem::Error>(3) })
        .await
        .unwrap_err();
    assert!(matches!(error, idem::Error::PayloadMismatch { .. }));
    let bad_biz = idem::Idempotent::new("").store(Arc::new(MemoryStore::new()));
    let error = bad_biz
        .execute("k", async { Ok::<u32, idem::Error>(3) })
        .await
        .unwrap_err();
    assert!(error.to_string().contains("biz is empty"), "{error}");
}

/// Every expression option read from a string literal: `payload = "req"` fingerprints
/// the value of `req` (not the text), `store = "store"` is the store.
#[idempotent(key = "req.request_id", biz = "shapes.strings", payload = "req", store = "store")]
async fn strings(store: &MemoryStore, req: Req, runs: &AtomicU32) -> Result<u64, AppError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(req.cents)
}

#[tokio::test]
async fn string_literals_are_expressions_for_every_option() {
    let (store, runs) = (MemoryStore::new(), AtomicU32::new(0));
    let req = |cents| Req {
        request_id: "r-1".into(),
        cents,
    };
    assert_eq!(strings(&store, req(100), &runs).await.unwrap(), 100);
    assert_eq!(
        strings(&store, req(100), &runs).await.unwrap(),
        100,
        "the same payload replays"
    );
    let error = strings(&store, req(200), &runs).await.unwrap_err();
    assert!(
        matches!(error, AppError::Idem(idem::Error::PayloadMismatch { .. })),
        "another payload is told apart, so the value was fingerprinted: {error:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let record = store.get("shapes.strings", "r-1").await.unwrap().unwrap();
    assert_eq!(
        record.request_body, None,
        "only the fingerprint is stored unless keep_request asks"
    );
}
