//! One-shot tokens (`idem::token`) on every store: one winner among concurrent
//! consumers, spent and unknown tokens refused with their own errors, expiry honoured.

use std::time::Duration;

use idem::{token, Error};

use super::calls::Store;

const BIZ: &str = "conformance.form";

/// 16 consumers race for each of 20 tokens: exactly one wins each; the others, and
/// every later consumer, are told the token is spent.
pub async fn concurrent_consumers_have_one_winner(store: &Store) {
    for _ in 0..20 {
        let issued = token::issue_on(&**store, BIZ, Duration::from_secs(60)).await.unwrap();
        let racers = (0..16).map(|_| {
            let (store, issued) = (store.clone(), issued.clone());
            tokio::spawn(async move { token::consume_on(&*store, BIZ, issued.as_str()).await })
        });
        let results: Vec<Result<(), Error>> = futures::future::join_all(racers)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let winners = results.iter().filter(|result| result.is_ok()).count();
        assert_eq!(winners, 1, "{results:?}");
        assert!(results
            .iter()
            .all(|result| matches!(result, Ok(()) | Err(Error::TokenSpent { .. }))));
        let late = token::consume_on(&**store, BIZ, issued.as_str()).await;
        assert!(matches!(late, Err(Error::TokenSpent { .. })), "{late:?}");
    }
}

/// Tokens never issued, issued for another biz, or malformed are unknown; tokens are
/// drawn fresh each time.
pub async fn unknown_tokens_are_refused(store: &Store) {
    let issued = token::issue_on(&**store, BIZ, Duration::from_secs(60)).await.unwrap();
    let other = token::issue_on(&**store, BIZ, Duration::from_secs(60)).await.unwrap();
    assert_ne!(issued, other);
    assert_eq!(issued.as_str().len(), 32);
    for (biz, presented) in [
        (BIZ, "0123456789abcdef0123456789abcdef"),
        ("conformance.other-form", issued.as_str()),
        (BIZ, ""),
        (BIZ, "line\nbreak"),
    ] {
        let result = token::consume_on(&**store, biz, presented).await;
        assert!(
            matches!(result, Err(Error::TokenUnknown { .. })),
            "{presented:?}: {result:?}"
        );
    }
    token::consume_on(&**store, BIZ, issued.as_str()).await.unwrap();
}

/// A token whose time ran out is unknown, and stays so.
pub async fn expired_tokens_are_refused(store: &Store) {
    let issued = token::issue_on(&**store, BIZ, Duration::from_millis(300))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(450)).await;
    let result = token::consume_on(&**store, BIZ, issued.as_str()).await;
    assert!(matches!(result, Err(Error::TokenUnknown { .. })), "{result:?}");
}
