//! The part of a claim that is the same in every dialect: after an upsert that did
//! not grant the key, read the record that stood in the way.

use std::future::Future;

use idem_runtime::{Claim, ClaimOutcome, Lease, Record, StoreError};
use sqlx::Database;

use crate::dialect::{Dialect, Upserted};

/// How often a claim retries when the record changes between its upsert and its read
/// (released, purged or expired in between), or when the server rolls its upsert back
/// and nothing stands once it reads, before giving up with an error.
pub(crate) const CLAIM_ATTEMPTS: usize = 5;

/// What a claim statement the server rolled back (`rollback.rs`) means where it ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RolledBack {
    /// On the store's pool: the claim lost the race to another writer of the key, and
    /// reads what that writer left.
    LostRace,
    /// In the caller's transaction: the whole transaction is rolled back, the caller's
    /// to run again; an error.
    Aborted,
}

/// Where a claim's statements run: the claim statement, and the read of what stood in
/// its way.
pub(crate) trait ClaimSite {
    /// Whether the site first tries [`insert`](Self::insert), the cheaper claim of a key
    /// nobody holds.
    fn inserts_first(&self) -> bool {
        false
    }
    /// Insert the record of a key nobody holds: the lease, or `None` when one stood.
    fn insert(&mut self, claim: &Claim<'_>) -> impl Future<Output = Result<Option<Lease>, StoreError>> + Send {
        let _ = claim;
        std::future::ready(Ok(None))
    }
    fn upsert(&mut self, claim: &Claim<'_>) -> impl Future<Output = Result<Upserted, StoreError>> + Send;
    fn read(&mut self, claim: &Claim<'_>) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send;
}

/// A connection of dialect `D` (a pooled one, or the caller's transaction's) with the
/// table's claim and read statements: every SQL store's [`ClaimSite`].
pub(crate) struct OnConnection<'c, D: Dialect> {
    pub conn: &'c mut <D::Db as Database>::Connection,
    /// The claim statement.
    pub upsert: &'c str,
    /// The read of one record.
    pub get: &'c str,
    /// The dialect's insert-if-absent claim, where it has one and the site uses it.
    pub insert: Option<&'c str>,
}

/// Run the claim statement at `site`; when it refused without saying what stood in
/// the way — or, on the pool, the server rolled it back, another writer of the key
/// coming first — read the record. A record that vanished or became claimable in
/// between sends the claim round again, a bounded number of times — never a guess.
/// Where the site has one, a cheaper insert of a key nobody holds goes first; a record
/// in its way is read, answered if it stands, and only a claimable one goes on to the
/// claim statement (which takes it over). The one claim loop of every SQL store, on
/// its pool and in a caller's transaction.
pub(crate) async fn claim_or_read<S: ClaimSite>(
    claim: &Claim<'_>,
    site: &mut S,
    rolled_back: RolledBack,
) -> Result<ClaimOutcome, StoreError> {
    // The insert, where the site has one, is a round of its own before the claim
    // statement's.
    let inserts_first = site.inserts_first();
    for round in 0..CLAIM_ATTEMPTS + usize::from(inserts_first) {
        let attempt = if inserts_first && round == 0 {
            let inserted = site.insert(claim).await;
            inserted.map(|lease| lease.map_or(Upserted::Refused(None), Upserted::Granted))
        } else {
            site.upsert(claim).await
        };
        let stood = match attempt {
            Ok(Upserted::Granted(lease)) => return Ok(ClaimOutcome::Acquired(lease)),
            Ok(Upserted::Refused(Some(record))) => Some(record),
            Ok(Upserted::Refused(None)) => site.read(claim).await?,
            Err(error) if rolled_back == RolledBack::LostRace && crate::rollback::lost_race(&error) => {
                site.read(claim).await?
            }
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
fn standing(claim: &Claim<'_>, stood: Option<Record>) -> Option<ClaimOutcome> {
    stood.filter(|record| !claim.admits(record)).map(ClaimOutcome::Existing)
}

/// The error of a claim that went round [`CLAIM_ATTEMPTS`] times.
fn changed_under(claim: &Claim<'_>) -> StoreError {
    StoreError::new(format!(
        "the record of biz `{}` key `{}` changed under {CLAIM_ATTEMPTS} claims in a row; try again",
        claim.biz, claim.key
    ))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use idem_runtime::Status;

    use super::*;

    fn claim_at(now: SystemTime) -> Claim<'static> {
        Claim::new("b", "k", now, Duration::from_secs(30), Duration::from_secs(60))
    }

    /// A site whose claim statement answers `upserted(round)` (rounds count from 1) and
    /// whose read answers `stands`.
    struct Scripted<U, R> {
        rounds: u32,
        upserted: U,
        stands: R,
    }

    fn scripted<U, R>(upserted: U, stands: R) -> Scripted<U, R>
    where
        U: FnMut(u32) -> Upserted + Send,
        R: FnMut() -> Option<Record> + Send,
    {
        Scripted {
            rounds: 0,
            upserted,
            stands,
        }
    }

    impl<U, R> ClaimSite for Scripted<U, R>
    where
        U: FnMut(u32) -> Upserted + Send,
        R: FnMut() -> Option<Record> + Send,
    {
        async fn upsert(&mut self, _claim: &Claim<'_>) -> Result<Upserted, StoreError> {
            self.rounds += 1;
            Ok((self.upserted)(self.rounds))
        }

        async fn read(&mut self, _claim: &Claim<'_>) -> Result<Option<Record>, StoreError> {
            Ok((self.stands)())
        }
    }

    /// SCENARIOS 15: the record changes between a refused upsert and the read that
    /// follows. A record that vanished, or became claimable, sends the claim round
    /// again; past the bound it is an error, never a guess.
    #[tokio::test]
    async fn a_record_changing_under_the_claim_is_retried_then_refused() {
        let now = idem_runtime::now();
        let claim = claim_at(now);
        let mut vanishing = scripted(|_| Upserted::Refused(None), || None);
        let vanished = claim_or_read(&claim, &mut vanishing, RolledBack::LostRace)
            .await
            .unwrap_err();
        assert_eq!(vanishing.rounds as usize, CLAIM_ATTEMPTS);
        assert!(vanished.to_string().contains("changed under 5 claims"), "{vanished}");

        // Claimable when read (it expired in between), then granted on the next round.
        let expired = claim_at(now - Duration::from_secs(3600)).granted(None);
        let lease = Lease::of(&claim.granted(None));
        let granted = lease.clone();
        let mut expiring = scripted(
            move |round| {
                if round > 1 {
                    Upserted::Granted(granted.clone())
                } else {
                    Upserted::Refused(None)
                }
            },
            move || Some(expired.clone()),
        );
        let outcome = claim_or_read(&claim, &mut expiring, RolledBack::LostRace)
            .await
            .unwrap();
        assert_eq!(outcome, ClaimOutcome::Acquired(lease));
        assert_eq!(expiring.rounds, 2);

        // A live record stands: the claim answers with it, after one round.
        let live = claim_at(now).granted(None);
        let mut standing_record = scripted(|_| Upserted::Refused(None), move || Some(live.clone()));
        let outcome = claim_or_read(&claim, &mut standing_record, RolledBack::LostRace)
            .await
            .unwrap();
        assert!(matches!(outcome, ClaimOutcome::Existing(record) if record.status == Status::Processing));
    }
}
