//! The store used by attributes and builders that name none.

use std::sync::{Arc, RwLock};

use crate::store::IdempotencyStore;

static DEFAULT: RwLock<Option<Arc<dyn IdempotencyStore>>> = RwLock::new(None);

/// Conversion into the shared store [`install`] and [`Idempotent::store`] keep:
/// `Arc<S>` for any store `S`, or `Arc<dyn IdempotencyStore>`.
///
/// [`Idempotent::store`]: crate::Idempotent::store
pub trait IntoSharedStore {
    /// The store as a trait object.
    fn into_shared(self) -> Arc<dyn IdempotencyStore>;
}

impl<S: IdempotencyStore> IntoSharedStore for Arc<S> {
    fn into_shared(self) -> Arc<dyn IdempotencyStore> {
        self
    }
}

impl IntoSharedStore for Arc<dyn IdempotencyStore> {
    fn into_shared(self) -> Arc<dyn IdempotencyStore> {
        self
    }
}

/// Make `store` the default for every call that names no store, and return the one it
/// replaces. Call it once at start-up, before serving requests.
pub fn install(store: impl IntoSharedStore) -> Option<Arc<dyn IdempotencyStore>> {
    let mut slot = DEFAULT.write().unwrap_or_else(|poisoned| poisoned.into_inner());
    slot.replace(store.into_shared())
}

/// The store installed by [`install`], if any.
pub fn installed() -> Option<Arc<dyn IdempotencyStore>> {
    DEFAULT.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
}
