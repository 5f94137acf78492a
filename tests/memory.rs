//! The conformance suite on [`idem::MemoryStore`].

mod conformance;

use std::sync::Arc;

conformance_suite!(async {
    Some(Arc::new(idem::MemoryStore::new()) as Arc<dyn idem::IdempotencyStore>)
});
