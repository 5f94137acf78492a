//! Whether the handler started executing: what tells a 4xx the handler answered (it
//! ran — a declined card — and is recorded) from one an extractor or a validation
//! answered before it (nothing ran; the claim is released so a corrected retry runs).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

tokio::task_local! {
    static STARTED: Arc<AtomicBool>;
}

/// Say, from inside a handler behind the layer, that it has started executing: from
/// here on, a 4xx response is the handler's answer, recorded and replayed like a 2xx.
/// Call it once the request is validated, before the first effect. Without it, a 4xx
/// is taken for a rejection before the handler (an extractor's, a validation's) and
/// not recorded. Outside the layer it does nothing.
///
/// ```
/// # use axum::{http::StatusCode, Json};
/// async fn pay(Json(cents): Json<u64>) -> Result<Json<u64>, StatusCode> {
///     idem_http::started();
///     if cents > 1_000_000 {
///         return Err(StatusCode::PAYMENT_REQUIRED); // recorded: the bank said no
///     }
///     Ok(Json(cents))
/// }
/// ```
pub fn started() {
    let _ = STARTED.try_with(|started| started.store(true, Ordering::SeqCst));
}

/// The mark of one request.
#[derive(Debug, Clone, Default)]
pub(crate) struct StartedMark(Arc<AtomicBool>);

impl StartedMark {
    /// Run `future` (the inner service's call) where [`started`] marks this request.
    pub(crate) async fn scope<F: std::future::Future>(&self, future: F) -> F::Output {
        STARTED.scope(self.0.clone(), future).await
    }

    pub(crate) fn is_set(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}
