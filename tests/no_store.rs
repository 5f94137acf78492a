//! Before `idem::install`, a call without `store =` fails with `NoStore` and runs
//! nothing; after it, the installed store is used. Its own test binary, because the
//! installed store is process-wide.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use idem::{idempotent, IdempotencyStore, MemoryStore};

#[idempotent(key = id, biz = "install.pay")]
async fn pay(id: u32, runs: &AtomicU32) -> Result<u32, idem::Error> {
    Ok(runs.fetch_add(1, Ordering::SeqCst) + 1)
}

#[tokio::test]
async fn no_store_before_install_then_the_installed_store() {
    let runs = AtomicU32::new(0);
    let error = pay(1, &runs).await.unwrap_err();
    assert!(
        matches!(&error, idem::Error::NoStore { biz } if biz == "install.pay"),
        "{error:?}"
    );
    assert!(error.to_string().contains("idem::install"));
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the body did not run");

    let store = Arc::new(MemoryStore::new());
    assert!(idem::install(store.clone()).is_none());
    assert_eq!(pay(1, &runs).await.unwrap(), 1);
    assert_eq!(pay(1, &runs).await.unwrap(), 1);
    assert_eq!(
        store.get("install.pay", "1").await.unwrap().unwrap().status,
        idem::Status::Succeeded
    );
}
