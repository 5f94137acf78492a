//! What becomes of a delivery once its handler answered: ack, redeliver later, or the
//! final-failure policy.

use idem_runtime::Error;

/// A handler's error, as the consumer reads it: whether it is one of idem's.
///
/// The consumer decides from idem's error what the delivery's outcome was (recorded,
/// still running elsewhere, not recorded). Implement it for the error type of an
/// `#[idempotent]` handler by pointing at the variant that holds [`idem_runtime::Error`]:
///
/// ```
/// # use idem_messaging::HandlerError;
/// #[derive(Debug, thiserror::Error)]
/// enum CreditError {
///     #[error(transparent)]
///     Idem(#[from] idem_runtime::Error),
///     #[error("database: {0}")]
///     Db(String),
/// }
///
/// impl HandlerError for CreditError {
///     fn idem_error(&self) -> Option<&idem_runtime::Error> {
///         match self {
///             CreditError::Idem(error) => Some(error),
///             _ => None,
///         }
///     }
/// }
/// ```
///
/// An error type without it is a compile error that says so:
///
/// ```compile_fail
/// #[derive(Debug, thiserror::Error)]
/// #[error("refused")]
/// struct Refused;
///
/// let answer: Result<(), Refused> = Err(Refused);
/// idem_messaging::Disposition::of(&answer);
/// ```
#[diagnostic::on_unimplemented(
    message = "the consumer cannot tell whether `{Self}` is one of idem's errors",
    label = "the handler's error type must implement `HandlerError`",
    note = "implement `HandlerError` for `{Self}`: `fn idem_error(&self) -> Option<&idem::Error>` returns the variant \
            that holds idem's error (`#[from] idem::Error`), `None` for the handler's own failures; or return \
            `idem::Error` itself"
)]
pub trait HandlerError: std::fmt::Display {
    /// The idem error this is, or `None` for the handler's own failure.
    fn idem_error(&self) -> Option<&Error>;
}

impl HandlerError for Error {
    fn idem_error(&self) -> Option<&Error> {
        Some(self)
    }
}

/// What to do with a message that can never succeed: its failure is recorded
/// (`on_error = Record` answers every redelivery with `Error::PreviousFailed`), its body
/// does not decode, it carries no key, or its key was first used with another payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnFailure {
    /// Reject it without requeueing: the broker moves it to the queue's dead-letter
    /// exchange (`x-dead-letter-exchange`), or drops it when the queue has none.
    #[default]
    DeadLetter,
    /// Ack it: the message is gone, its failure only logged (and recorded, where it is).
    AckAndDrop,
}

/// A consumer's verdict on one delivery: what it tells the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Its outcome is recorded (a success, or a duplicate of one): ack.
    Ack,
    /// Not recorded, or not yet (still running elsewhere, the store failed, the body
    /// failed and its claim was released): never ack; redeliver after a pause.
    Redeliver,
    /// It can never succeed: the [`OnFailure`] policy.
    Final,
}

impl Disposition {
    /// The verdict on a handler's answer.
    pub fn of<T, E: HandlerError>(answer: &Result<T, E>) -> Self {
        match answer {
            Ok(_) => Disposition::Ack,
            Err(error) => match error.idem_error() {
                // The body's own failure: with `on_error = Release` (the default) the
                // claim is gone and a redelivery runs it again; with `Record` the
                // redelivery meets `PreviousFailed`, which is final.
                None => Disposition::Redeliver,
                Some(error) => Self::of_idem(error),
            },
        }
    }

    fn of_idem(error: &Error) -> Self {
        match error {
            // `mode = Reject`: a finished duplicate. Its outcome is recorded. A
            // tombstone (its answer expired, or its subject erased): it ran long ago.
            Error::Duplicate { .. }
            | Error::AnswerNotKept { .. }
            | Error::TokenSpent { .. }
            | Error::Expired { .. }
            | Error::Erased { .. } => Disposition::Ack,
            Error::PreviousFailed { .. }
            | Error::PayloadMismatch { .. }
            | Error::InvalidKey { .. }
            | Error::InvalidBiz { .. }
            | Error::InvalidOption { .. }
            | Error::InvalidStep { .. }
            | Error::Reentrant { .. }
            | Error::TokenUnknown { .. }
            | Error::Encode { .. } => Disposition::Final,
            // InProgress, OutcomeUnknown (kept until settled: the next delivery after
            // that replays or runs), LeaseLost, Store, Decode, NoStore and whatever a
            // later version adds: nothing says the outcome is recorded, so the message
            // is kept.
            _ => Disposition::Redeliver,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(error: Error) -> Disposition {
        Disposition::of::<(), Error>(&Err(error))
    }

    #[test]
    fn only_a_recorded_outcome_is_acked() {
        assert_eq!(Disposition::of::<u8, Error>(&Ok(1)), Disposition::Ack);
        let (biz, key) = ("credit".to_owned(), "7".to_owned());
        assert_eq!(
            of(Error::Duplicate {
                biz: biz.clone(),
                key: key.clone()
            }),
            Disposition::Ack
        );
        for tombstone in [
            Error::Expired {
                biz: biz.clone(),
                key: key.clone(),
            },
            Error::Erased {
                biz: biz.clone(),
                key: key.clone(),
            },
        ] {
            assert_eq!(of(tombstone), Disposition::Ack, "a tombstone's message ran before");
        }
        assert_eq!(
            of(Error::InProgress {
                biz: biz.clone(),
                key: key.clone()
            }),
            Disposition::Redeliver
        );
        assert_eq!(of(Error::NoStore { biz: biz.clone() }), Disposition::Redeliver);
        // Kept (never dropped, never dead-lettered) until it is settled.
        assert_eq!(
            of(Error::OutcomeUnknown {
                biz: biz.clone(),
                key: key.clone(),
                step: Some("charge".to_owned()),
                effect_key: "credit:7:1:charge".to_owned(),
                since: std::time::SystemTime::UNIX_EPOCH,
            }),
            Disposition::Redeliver
        );
        assert_eq!(
            of(Error::PayloadMismatch {
                biz: biz.clone(),
                key: key.clone()
            }),
            Disposition::Final
        );
    }
}
