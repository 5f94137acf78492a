//! `idem` depended on as `payments_idem`: the attribute expands to the right path with
//! no `crate = ...`, because it reads this crate's `Cargo.toml`.

use payments_idem::{idempotent, MemoryStore};

/// The application's error.
#[derive(Debug, thiserror::Error)]
pub enum PayError {
    /// idem's own.
    #[error(transparent)]
    Idem(#[from] payments_idem::Error),
}

/// A charge, idempotent on its id.
#[idempotent(key = id, biz = "renamed.pay", store = store)]
pub async fn pay(store: &MemoryStore, id: u32, cents: u64) -> Result<u64, PayError> {
    Ok(cents)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_renamed_dependency_needs_no_crate_option() {
        let store = MemoryStore::new();
        assert_eq!(pay(&store, 1, 100).await.unwrap(), 100);
        assert_eq!(pay(&store, 1, 999).await.unwrap(), 100, "replayed");
    }
}
