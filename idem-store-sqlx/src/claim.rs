//! The part of a claim that is the same in every dialect: after an upsert that did
//! not grant the key, read the record that stood in the way.

use std::future::Future;

use idem_runtime::{Claim, ClaimOutcome, Lease, Record, StoreError};

/// How often a claim retries when the record changes between its upsert and its read
/// (released, purged or expired in between) before giving up with an error.
pub(crate) const CLAIM_ATTEMPTS: usize = 5;

/// Run `upsert` (one atomic statement: `Some(lease)` when it granted the key); when it
/// did not, `read` the record. A record that vanished or became claimable in between
/// sends the claim round again, a bounded number of times — never a guess.
pub(crate) async fn claim_or_read<U, UF, R, RF>(
    claim: &Claim<'_>,
    mut upsert: U,
    mut read: R,
) -> Result<ClaimOutcome, StoreError>
where
    U: FnMut() -> UF,
    UF: Future<Output = Result<Option<Lease>, StoreError>>,
    R: FnMut() -> RF,
    RF: Future<Output = Result<Option<Record>, StoreError>>,
{
    for _ in 0..CLAIM_ATTEMPTS {
        if let Some(lease) = upsert().await? {
            return Ok(ClaimOutcome::Acquired(lease));
        }
        match read().await? {
            Some(record) if !claim.admits(&record) => return Ok(ClaimOutcome::Existing(record)),
            _ => continue,
        }
    }
    Err(StoreError::new(format!(
        "the record of biz `{}` key `{}` changed under {CLAIM_ATTEMPTS} claims in a row; try again",
        claim.biz, claim.key
    )))
}
