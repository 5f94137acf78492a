//! The decorated functions the scenarios call. Each takes the store as a parameter
//! (`store = store`) and counts its executions, so a test can tell a replay from a run.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{idempotent, IdempotencyStore};
use serde::{Deserialize, Serialize};

/// A store as the scenarios take it: shared, behind the trait.
pub type Store = Arc<dyn IdempotencyStore>;

/// Claim `key` of `biz` through the store trait at `at` (a lease of `lease`, kept `ttl`),
/// which must be granted: its lease.
pub async fn granted(
    store: &Store,
    biz: &str,
    key: &str,
    at: std::time::SystemTime,
    lease: Duration,
    ttl: Duration,
) -> idem::store::Lease {
    use idem::store::{Claim, ClaimOutcome};
    match store.claim(&Claim::new(biz, key, at, lease, ttl)).await.unwrap() {
        ClaimOutcome::Acquired(lease) => lease,
        other => panic!("the claim is granted: {other:?}"),
    }
}

/// The application's error type: its own failures plus idem's.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// idem's error.
    #[error(transparent)]
    Idem(#[from] idem::Error),
    /// The bank declined the charge.
    #[error("the bank declined: {0}")]
    Declined(String),
}

impl AppError {
    /// The idem error inside, or a panic naming what came instead.
    pub fn idem(self) -> idem::Error {
        match self {
            AppError::Idem(error) => error,
            other => panic!("expected an idem error, got {other:?}"),
        }
    }
}

/// Counts how often a body ran.
#[derive(Debug, Default)]
pub struct Runs(AtomicU32);

impl Runs {
    /// Count a run of the body; the count so far.
    pub fn hit(&self) -> u32 {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }
    /// How often the body ran.
    pub fn count(&self) -> u32 {
        self.0.load(Ordering::SeqCst)
    }
    /// Once the body has run at least once (it started, where it counts first); a panic
    /// naming `what` after 5 s.
    pub async fn started(&self, what: &str) {
        let started = async {
            while self.count() == 0 {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(5), started)
            .await
            .unwrap_or_else(|_| panic!("{what} did not start within 5 s"));
    }
}

/// What a charge answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    /// Its `charge_no`.
    pub charge_no: u32,
    /// Its `cents`.
    pub cents: u64,
}

/// An order, a payload with a list of lines.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Order {
    /// Its `id`.
    pub id: String,
    /// Its `cents`.
    pub cents: u64,
    /// Its `lines`.
    pub lines: Vec<(String, u32)>,
}

/// A charge that takes `delay` at the bank.
#[idempotent(key = key, biz = "conformance.pay", store = store, wait = "10s")]
pub async fn pay_waiting(store: &Store, key: &str, runs: &Runs, delay: Duration) -> Result<Receipt, AppError> {
    tokio::time::sleep(delay).await;
    Ok(Receipt {
        charge_no: runs.hit(),
        cents: 199,
    })
}

/// The decorated call `pay_waiting_briefly` the scenarios make (its options are in its attribute).
#[idempotent(key = key, biz = "conformance.pay", store = store, wait = "200ms")]
pub async fn pay_waiting_briefly(store: &Store, key: &str, runs: &Runs) -> Result<Receipt, AppError> {
    Ok(Receipt {
        charge_no: runs.hit(),
        cents: 199,
    })
}

/// The decorated call `pay` the scenarios make (its options are in its attribute).
#[idempotent(key = key, biz = "conformance.pay", store = store)]
pub async fn pay(store: &Store, key: &str, runs: &Runs, delay: Duration) -> Result<Receipt, AppError> {
    tokio::time::sleep(delay).await;
    Ok(Receipt {
        charge_no: runs.hit(),
        cents: 199,
    })
}

/// The decorated call `pay_rejecting` the scenarios make (its options are in its attribute).
#[idempotent(key = key, biz = "conformance.pay", store = store, mode = Reject)]
pub async fn pay_rejecting(store: &Store, key: &str, runs: &Runs) -> Result<Receipt, AppError> {
    Ok(Receipt {
        charge_no: runs.hit(),
        cents: 199,
    })
}

/// The decorated call `place` the scenarios make (its options are in its attribute).
#[idempotent(key = "order.id", biz = "conformance.order", store = store, payload = order)]
pub async fn place(store: &Store, order: Order, runs: &Runs, delay: Duration) -> Result<u64, AppError> {
    tokio::time::sleep(delay).await;
    runs.hit();
    Ok(order.cents)
}

/// The decorated call `flaky_release` the scenarios make (its options are in its attribute).
#[idempotent(key = key, biz = "conformance.flaky", store = store)]
pub async fn flaky_release(store: &Store, key: &str, runs: &Runs, fail: bool) -> Result<u32, AppError> {
    let n = runs.hit();
    if fail {
        return Err(AppError::Declined(format!("attempt {n}")));
    }
    Ok(n)
}

/// The decorated call `flaky_record` the scenarios make (its options are in its attribute).
#[idempotent(key = key, biz = "conformance.flaky", store = store, on_error = Record)]
pub async fn flaky_record(store: &Store, key: &str, runs: &Runs, fail: bool) -> Result<u32, AppError> {
    let n = runs.hit();
    if fail {
        Err(AppError::Declined(format!("attempt {n}")))?;
    }
    Ok(n)
}

/// The decorated call `short_lived` the scenarios make (its options are in its attribute).
#[idempotent(key = key, biz = "conformance.short", store = store, ttl = "300ms")]
pub async fn short_lived(store: &Store, key: &str, runs: &Runs) -> Result<(u32, u64), AppError> {
    Ok((runs.hit(), idem::context().expect("inside a call").fence()))
}

/// A body that can outlive its 300 ms lease (heartbeat on), reporting its fence.
#[idempotent(key = key, biz = "conformance.lease", store = store, lease = "300ms", clock_tolerance = "0s")]
pub async fn leased(store: &Store, key: &str, runs: &Runs, delay: Duration) -> Result<(u32, u64), AppError> {
    tokio::time::sleep(delay).await;
    Ok((runs.hit(), idem::context().expect("inside a call").fence()))
}

/// A leased body that blocks its whole thread, heartbeat included, as a paused process
/// would; then returns `outcome`.
#[idempotent(key = key, biz = "conformance.lease", store = store, lease = "300ms", clock_tolerance = "0s", on_error = Record)]
pub async fn frozen(
    store: &Store,
    key: &str,
    freeze: Duration,
    outcome: Result<u32, String>,
) -> Result<(u32, u64), AppError> {
    std::thread::sleep(freeze);
    outcome.map(|n| (n, 0)).map_err(AppError::Declined)
}

/// The decorated call `frozen_release` the scenarios make (its options are in its attribute).
#[idempotent(key = key, biz = "conformance.lease", store = store, lease = "300ms", clock_tolerance = "0s")]
pub async fn frozen_release(store: &Store, key: &str, freeze: Duration) -> Result<(u32, u64), AppError> {
    std::thread::sleep(freeze);
    Err(AppError::Declined("gave up".into()))
}

/// The decorated call `panicking` the scenarios make (its options are in its attribute).
#[idempotent(key = key, biz = "conformance.lease", store = store, lease = "300ms", clock_tolerance = "0s")]
pub async fn panicking(store: &Store, key: &str) -> Result<(u32, u64), AppError> {
    panic!("the body panicked")
}

/// A body that never ends, with a 500 ms lease and the default clock tolerance (as long
/// again): dropped, it leaves its claim to the lease and the tolerance.
#[idempotent(key = key, biz = "conformance.lease", store = store, lease = "500ms")]
pub async fn hanging_with_tolerance(store: &Store, key: &str) -> Result<(u32, u64), AppError> {
    std::future::pending().await
}

/// The decorated call `in_biz_a` the scenarios make (its options are in its attribute).
#[idempotent(key = key, biz = "conformance.a", store = store)]
pub async fn in_biz_a(store: &Store, key: &str) -> Result<String, AppError> {
    Ok("a".into())
}

/// The decorated call `in_biz_b` the scenarios make (its options are in its attribute).
#[idempotent(key = key, biz = "conformance.b", store = store)]
pub async fn in_biz_b(store: &Store, key: &str) -> Result<String, AppError> {
    Ok("b".into())
}

/// Values that JSON round trips tend to get wrong.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Shape {
    /// A unit variant.
    Nothing,
    /// A struct variant.
    Circle {
        /// Its radius.
        r: f64,
    },
    /// A recursive variant.
    Nested(Option<Box<Shape>>),
}

/// A value of every kind JSON round trips tend to get wrong.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Awkward {
    /// Its `none`.
    pub none: Option<u8>,
    /// Its `zero`.
    pub zero: i64,
    /// Its `no`.
    pub no: bool,
    /// Its `empty`.
    pub empty: Vec<String>,
    /// Its `big`.
    pub big: u64,
    /// Its `small`.
    pub small: i64,
    /// Its `float`.
    pub float: f64,
    /// Its `shapes`.
    pub shapes: Vec<Shape>,
    /// Its `text`.
    pub text: String,
}

/// The decorated call `echo` the scenarios make (its options are in its attribute).
#[idempotent(key = key, biz = "conformance.types", store = store)]
pub async fn echo(store: &Store, key: &str, value: Awkward, runs: &Runs) -> Result<Awkward, AppError> {
    runs.hit();
    Ok(value)
}

/// The decorated call `echo_unit` the scenarios make (its options are in its attribute).
#[idempotent(key = key, biz = "conformance.types", store = store)]
pub async fn echo_unit(store: &Store, key: &str, runs: &Runs) -> Result<Option<()>, AppError> {
    runs.hit();
    Ok(None)
}

/// Asks for a different `Ok` type on an existing key, as a changed deploy would.
#[idempotent(key = key, biz = "conformance.pay", store = store)]
pub async fn pay_v2(store: &Store, key: &str, runs: &Runs) -> Result<Vec<String>, AppError> {
    runs.hit();
    Ok(vec![])
}

/// The decorated call `notify` the scenarios make (its options are in its attribute).
#[idempotent(key = key, biz = "conformance.context", store = store)]
pub async fn notify(store: &Store, key: &str) -> Result<(String, String, u64, String), AppError> {
    let context = idem::context().expect("the body runs inside a context");
    Ok((
        context.biz().to_owned(),
        context.key().to_owned(),
        context.fence(),
        context.effect_key("sms"),
    ))
}

/// Reports the fence and the SMS effect key it ran under to `seen`, then sleeps.
#[idempotent(key = key, biz = "conformance.effects", store = store, lease = "300ms", clock_tolerance = "0s", ttl = "1s")]
pub async fn send_sms(
    store: &Store,
    key: &str,
    seen: &std::sync::Mutex<Vec<(u64, String)>>,
    delay: Duration,
) -> Result<u64, AppError> {
    let context = idem::context().expect("inside a call");
    seen.lock().unwrap().push((context.fence(), context.effect_key("sms")));
    tokio::time::sleep(delay).await;
    Ok(context.fence())
}
