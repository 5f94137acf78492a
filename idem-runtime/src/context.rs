//! The task-local context of a running idempotent call.

use std::future::Future;
use std::sync::Arc;

tokio::task_local! {
    static CURRENT: Context;
}

/// Which claim the current body runs under.
///
/// Side effects (an SMS, points, a message to a queue) reuse it so that they are
/// idempotent on the same key: pass [`Context::effect_key`] to the downstream service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Context {
    biz: Arc<str>,
    key: Arc<str>,
    fence: u64,
}

impl Context {
    pub(crate) fn new(biz: &str, key: &str, fence: u64) -> Self {
        Self {
            biz: biz.into(),
            key: key.into(),
            fence,
        }
    }

    /// Business namespace of the call.
    pub fn biz(&self) -> &str {
        &self.biz
    }

    /// Idempotency key of the call.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Fence number of the claim this body runs under.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// A key for one side effect of this call, `"{biz}:{key}:{effect}"`: the same on
    /// every retry of the call, different for each effect.
    pub fn effect_key(&self, effect: &str) -> String {
        format!("{}:{}:{effect}", self.biz, self.key)
    }

    pub(crate) async fn scope<F: Future>(self, body: F) -> F::Output {
        CURRENT.scope(self, body).await
    }
}

/// The context of the idempotent call whose body is running on this task, or `None`
/// outside one. Tasks spawned from the body do not inherit it: pass it along.
pub fn context() -> Option<Context> {
    CURRENT.try_with(Context::clone).ok()
}
