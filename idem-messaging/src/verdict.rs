//! The verdict on one delivery: its handler run (a panic caught), its answer read by the
//! table, a poison message's failures counted.

use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;
use idem_runtime::observe::shown_key;
use tracing::{debug, warn};

use crate::attempts::Attempts;
use crate::disposition::{Disposition, HandlerError};

/// Run `handler` (the handler on the delivery of `key` from `source`, a queue or a
/// stream) and give the consumer's verdict: [`Disposition::of`] its answer, made final
/// when the body has failed as often as `attempts` allows (`delivered_before`: the
/// broker's count of the message's earlier deliveries). A panic fails this delivery
/// only: it counts as a failed run.
pub async fn verdict<T, E, Fut>(
    source: &str,
    key: &str,
    delivered_before: u32,
    attempts: &Attempts,
    handler: Fut,
) -> Disposition
where
    E: HandlerError,
    Fut: Future<Output = Result<T, E>>,
{
    match AssertUnwindSafe(handler).catch_unwind().await {
        Ok(answer) => {
            let disposition = Disposition::of(&answer);
            let body_failed = answer.as_ref().err().is_some_and(|error| error.idem_error().is_none());
            if let Err(error) = &answer {
                match disposition {
                    Disposition::Final => {
                        warn!(%source, key = %shown_key(key), %error, "message failed for good")
                    }
                    _ => {
                        debug!(%source, key = %shown_key(key), %error, "message not settled; delivered again after a pause")
                    }
                }
            }
            attempts.count(key, disposition, body_failed, delivered_before)
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            warn!(%source, key = %shown_key(key), panic = %what, "the handler panicked; the message is not settled");
            attempts.count(key, Disposition::Redeliver, true, delivered_before)
        }
    }
}
