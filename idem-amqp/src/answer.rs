//! lapin's answers, bounded in time.
//!
//! lapin can leave a request unanswered for ever: one sent just as its channel dies may
//! be dropped with its answer still awaited (in lapin 4, a command queued for a channel
//! already killed is skipped with its promise). A consumer's settlement that never
//! returns keeps its delivery in hand, its session from ending and, with the prefetch
//! full, every other delivery away; a relay's publish or confirm that never returns
//! holds its batch, and the outbox behind it, for good. Given up after a limit, the
//! request is taken for failed and the connection for dead: the session ends, and
//! what it had not settled is the broker's to deliver (or the relay's to publish)
//! again, which the records answer.

use std::future::Future;
use std::time::Duration;

/// `answer`, or [`Unanswered::Silent`] once `limit` has passed without it.
pub(crate) async fn within<T>(
    limit: Duration,
    answer: impl Future<Output = lapin::Result<T>>,
) -> Result<T, Unanswered> {
    match tokio::time::timeout(limit, answer).await {
        Ok(answer) => answer.map_err(Unanswered::Failed),
        Err(_) => Err(Unanswered::Silent(limit)),
    }
}

/// Why a request got no answer.
#[derive(Debug)]
pub(crate) enum Unanswered {
    /// lapin said it failed.
    Failed(lapin::Error),
    /// lapin had not answered within this time.
    Silent(Duration),
}

impl std::fmt::Display for Unanswered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unanswered::Failed(error) => error.fmt(f),
            Unanswered::Silent(limit) => write!(f, "no answer within {limit:.1?}: the connection is taken for dead"),
        }
    }
}

/// A request given up is an error of the session, as one that failed.
impl From<Unanswered> for lapin::Error {
    fn from(unanswered: Unanswered) -> Self {
        match unanswered {
            Unanswered::Failed(error) => error,
            silent => std::io::Error::new(std::io::ErrorKind::TimedOut, silent.to_string()).into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request lapin never answers is given up after the limit.
    #[tokio::test]
    async fn a_request_never_answered_is_given_up() {
        let limit = Duration::from_millis(50);
        let given_up = tokio::time::timeout(Duration::from_secs(5), within::<bool>(limit, std::future::pending()))
            .await
            .expect("a request never answered was waited for past its limit");
        assert!(
            matches!(given_up, Err(Unanswered::Silent(l)) if l == limit),
            "{given_up:?}"
        );
        let error = lapin::Error::from(given_up.unwrap_err());
        assert!(error.to_string().contains("no answer within 50.0ms"), "{error}");
    }

    /// An answer is passed on as lapin gave it.
    #[tokio::test]
    async fn an_answer_is_passed_on() {
        let limit = Duration::from_secs(5);
        assert!(matches!(within(limit, async { Ok(true) }).await, Ok(true)));
        assert!(matches!(within(limit, async { Ok(false) }).await, Ok(false)));
    }
}
