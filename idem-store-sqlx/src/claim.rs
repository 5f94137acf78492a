//! The part of a claim that is the same in every dialect: after an upsert that did
//! not grant the key, read the record that stood in the way.

use std::future::Future;

use idem_runtime::{Claim, ClaimOutcome, Lease, Record, StoreError};

/// How often a claim retries when the record changes between its upsert and its read
/// (released, purged or expired in between), or when the server rolls its upsert back
/// and nothing stands once it reads, before giving up with an error.
pub(crate) const CLAIM_ATTEMPTS: usize = 5;

/// What a dialect's claim statement came to.
pub(crate) enum Upserted {
    /// The key is ours.
    Granted(Lease),
    /// Refused; the record that stood in the way when the statement could return it.
    Refused(Option<Record>),
}

/// Run `upsert` (one atomic statement); when it refused without saying what stood in
/// the way — or the server rolled it back, another writer of the key coming first
/// (`rollback.rs`) — `read` the record. A record that vanished or became claimable in
/// between sends the claim round again, a bounded number of times — never a guess.
pub(crate) async fn claim_or_read<U, UF, R, RF>(
    claim: &Claim<'_>,
    mut upsert: U,
    mut read: R,
) -> Result<ClaimOutcome, StoreError>
where
    U: FnMut() -> UF,
    UF: Future<Output = Result<Upserted, StoreError>>,
    R: FnMut() -> RF,
    RF: Future<Output = Result<Option<Record>, StoreError>>,
{
    for _ in 0..CLAIM_ATTEMPTS {
        let stood = match upsert().await {
            Ok(Upserted::Granted(lease)) => return Ok(ClaimOutcome::Acquired(lease)),
            Ok(Upserted::Refused(Some(record))) => Some(record),
            Ok(Upserted::Refused(None)) => read().await?,
            Err(error) if crate::rollback::lost_race(&error) => read().await?,
            Err(error) => return Err(error),
        };
        if let Some(existing) = standing(claim, stood) {
            return Ok(existing);
        }
    }
    Err(changed_under(claim))
}

/// The answer of a refused claim when the record that `stood` in its way still does;
/// `None` when it vanished or became claimable (go round again).
pub(crate) fn standing(claim: &Claim<'_>, stood: Option<Record>) -> Option<ClaimOutcome> {
    stood.filter(|record| !claim.admits(record)).map(ClaimOutcome::Existing)
}

/// The error of a claim that went round [`CLAIM_ATTEMPTS`] times.
pub(crate) fn changed_under(claim: &Claim<'_>) -> StoreError {
    StoreError::new(format!(
        "the record of biz `{}` key `{}` changed under {CLAIM_ATTEMPTS} claims in a row; try again",
        claim.biz, claim.key
    ))
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::time::{Duration, SystemTime};

    use idem_runtime::Status;

    use super::*;

    fn claim_at(now: SystemTime) -> Claim<'static> {
        Claim::new("b", "k", now, Duration::from_secs(30), Duration::from_secs(60))
    }

    /// SCENARIOS 15: the record changes between a refused upsert and the read that
    /// follows. A record that vanished, or became claimable, sends the claim round
    /// again; past the bound it is an error, never a guess.
    #[tokio::test]
    async fn a_record_changing_under_the_claim_is_retried_then_refused() {
        let now = idem_runtime::now();
        let claim = claim_at(now);
        let upserts = Cell::new(0);
        let vanished = claim_or_read(
            &claim,
            || async {
                upserts.set(upserts.get() + 1);
                Ok(Upserted::Refused(None))
            },
            || async { Ok(None) },
        )
        .await
        .unwrap_err();
        assert_eq!(upserts.get(), CLAIM_ATTEMPTS);
        assert!(vanished.to_string().contains("changed under 5 claims"), "{vanished}");

        // Claimable when read (it expired in between), then granted on the next round.
        let expired = claim_at(now - Duration::from_secs(3600)).granted(None);
        let lease = Lease::of(&claim.granted(None));
        let rounds = Cell::new(0);
        let outcome = claim_or_read(
            &claim,
            || {
                rounds.set(rounds.get() + 1);
                let grant = rounds.get() > 1;
                let lease = lease.clone();
                async move {
                    Ok(if grant {
                        Upserted::Granted(lease)
                    } else {
                        Upserted::Refused(None)
                    })
                }
            },
            || {
                let expired = expired.clone();
                async move { Ok(Some(expired)) }
            },
        )
        .await
        .unwrap();
        assert_eq!(outcome, ClaimOutcome::Acquired(lease));
        assert_eq!(rounds.get(), 2);

        // A live record stands: the claim answers with it, after one round.
        let live = claim_at(now).granted(None);
        let outcome = claim_or_read(
            &claim,
            || async { Ok(Upserted::Refused(None)) },
            || {
                let live = live.clone();
                async move { Ok(Some(live)) }
            },
        )
        .await
        .unwrap();
        assert!(matches!(outcome, ClaimOutcome::Existing(record) if record.status == Status::Processing));
    }
}
