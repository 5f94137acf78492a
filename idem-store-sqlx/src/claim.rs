//! The part of a claim that is the same in every dialect: after an upsert that did
//! not grant the key, read the record that stood in the way.

use std::future::Future;
use std::time::SystemTime;

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
    /// Whether the statements judge leases and expiry by the server's clock. The claim
    /// statement's own refusal is then final, and a record read after it is judged by
    /// the server's instant of that read: the caller's clock, which may run ahead of the
    /// server's, has no say in it.
    fn on_server_clock(&self) -> bool {
        false
    }
    /// Whether the site first tries [`insert`](Self::insert), the cheaper claim of a key
    /// nobody holds.
    fn inserts_first(&self) -> bool {
        false
    }
    /// Insert the record of a key nobody holds: the lease, or what stood in the way.
    fn insert(&mut self, claim: &Claim<'_>) -> impl Future<Output = Result<Inserted, StoreError>> + Send {
        let _ = claim;
        std::future::ready(Ok(Inserted::Unread))
    }
    /// Whether the site reads the record before its claim statement: while claims
    /// often meet records, where no insert reads it in the same statement (SQLite,
    /// MySQL, a Galera node).
    fn reads_first(&self) -> bool {
        false
    }
    /// Count the claim's first look: it `met` a record, or found none.
    fn observe(&self, met: bool) {
        let _ = met;
    }
    fn upsert(&mut self, claim: &Claim<'_>) -> impl Future<Output = Result<Upserted, StoreError>> + Send;
    /// The record, and the instant it was read at by the server's clock (`None` on the
    /// caller's: the claim's instant judges).
    fn read(
        &mut self,
        claim: &Claim<'_>,
    ) -> impl Future<Output = Result<(Option<Record>, Option<SystemTime>), StoreError>> + Send;
}

/// What a claim's insert of a key nobody holds came to. (SQLite claims with its
/// upsert alone.)
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
pub(crate) enum Inserted {
    /// The record was inserted: the key is ours.
    Granted(Lease),
    /// A record stood, and the statement read it too (a replay in one round trip), at
    /// this instant of the server's clock where the statements judge by it.
    Read(Record, Option<SystemTime>),
    /// A record stood that the statement did not read: the claim reads it.
    Unread,
}

/// The insert a claim starts with, where the dialect has one (SQLite's has none).
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
pub(crate) struct FirstClaim<'s> {
    pub sql: &'s str,
    /// Whether the statement also reads the record in its way.
    pub reads: bool,
}

/// A connection of dialect `D` (a pooled one, or the caller's transaction's) with the
/// table's claim and read statements: every SQL store's [`ClaimSite`].
pub(crate) struct OnConnection<'c, D: Dialect> {
    pub conn: &'c mut <D::Db as Database>::Connection,
    /// Whether no `BEGIN` on `conn` is unfinished, when it is a connection of the
    /// store's pool ([`crate::pooler::Lent`]); `None` for the caller's.
    pub settled: Option<&'c mut bool>,
    /// The claim statement.
    pub upsert: &'c str,
    /// The read of one record.
    pub get: &'c str,
    /// The dialect's insert-if-absent claim, where it has one and the site uses it.
    pub insert: Option<FirstClaim<'c>>,
    /// Where the insert's outcomes are counted (on the store's pool).
    pub duplicates: Option<&'c idem_runtime::duplicates::Duplicates>,
    /// The table's statements: whose clock they judge by, whether they are prepared.
    pub sql: &'c crate::statements::Statements,
    /// Whether `conn` is in a transaction already (the caller's), which a pooler keeps
    /// on one server connection: no statement needs one of its own.
    pub pinned: bool,
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
    // While claims often meet records, a site that cannot read in its insert reads
    // first: a record that stands is the answer in one statement.
    let reads_first = site.reads_first();
    if reads_first {
        let (stood, judged_at) = read_judged(site, claim).await?;
        site.observe(stood.is_some());
        if let Some(existing) = standing(claim, stood, judged_at) {
            return Ok(existing);
        }
    }
    // The insert, where the site has one, is a round of its own before the claim
    // statement's.
    let inserts_first = site.inserts_first();
    for round in 0..CLAIM_ATTEMPTS + usize::from(inserts_first) {
        // Each claim counts once, at its first look: a read first counted already.
        let first_look = round == 0 && !reads_first;
        let (stood, judged_at) = if inserts_first && round == 0 {
            // The insert judges nothing: a record it met (and read) is judged by the
            // instant of that read.
            let inserted = site.insert(claim).await;
            if let (true, Ok(inserted)) = (first_look, &inserted) {
                site.observe(!matches!(inserted, Inserted::Granted(_)));
            }
            match inserted {
                Ok(Inserted::Granted(lease)) => return Ok(ClaimOutcome::Acquired(lease)),
                Ok(Inserted::Read(record, read_at)) => (Some(record), Some(read_at.unwrap_or(claim.now))),
                Ok(Inserted::Unread) => read_judged(site, claim).await?,
                Err(error) => read_after_lost_race(site, claim, rolled_back, error).await?,
            }
        } else {
            // The claim statement's own refusal is judged already (on the caller's clock
            // it is judged again, as a read is); a record read afterwards is judged by
            // the instant of that read.
            let trusted = site.on_server_clock();
            let upserted = site.upsert(claim).await;
            if let (true, Ok(upserted)) = (first_look, &upserted) {
                site.observe(!matches!(upserted, Upserted::Granted(_)));
            }
            match upserted {
                Ok(Upserted::Granted(lease)) => return Ok(ClaimOutcome::Acquired(lease)),
                Ok(Upserted::Refused(Some(record))) => (Some(record), (!trusted).then_some(claim.now)),
                Ok(Upserted::Refused(None)) => read_judged(site, claim).await?,
                Err(error) => read_after_lost_race(site, claim, rolled_back, error).await?,
            }
        };
        if let Some(existing) = standing(claim, stood, judged_at) {
            return Ok(existing);
        }
    }
    Err(changed_under(claim))
}

/// After a claim statement failed with `error`: on the pool, a statement the server
/// rolled back lost the race to another writer of the key, whose record is read;
/// anything else is the claim's error.
async fn read_after_lost_race<S: ClaimSite>(
    site: &mut S,
    claim: &Claim<'_>,
    rolled_back: RolledBack,
    error: StoreError,
) -> Result<(Option<Record>, Option<SystemTime>), StoreError> {
    if rolled_back == RolledBack::LostRace && crate::rollback::lost_race(&error) {
        read_judged(site, claim).await
    } else {
        Err(error)
    }
}

/// Read what stood in the claim's way: the record, and the instant to judge it by —
/// the server's instant of the read where the site has one, else the claim's.
async fn read_judged<S: ClaimSite>(
    site: &mut S,
    claim: &Claim<'_>,
) -> Result<(Option<Record>, Option<SystemTime>), StoreError> {
    let (record, read_at) = site.read(claim).await?;
    Ok((record, Some(read_at.unwrap_or(claim.now))))
}

/// The answer of a refused claim when the record that `stood` in its way still does
/// at `judged_at`; `None` when it vanished or became claimable since (go round again).
/// With no instant, the server's refusal is the judgement and the record the answer.
/// Never the caller's clock against a server's: a caller whose clock runs ahead would
/// see every running claim as lapsed.
fn standing(claim: &Claim<'_>, stood: Option<Record>, judged_at: Option<SystemTime>) -> Option<ClaimOutcome> {
    let stands = |record: &Record| {
        judged_at.is_none_or(|at| {
            let mut judged = *claim;
            judged.now = at;
            !judged.admits(record)
        })
    };
    stood.filter(stands).map(ClaimOutcome::Existing)
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
        /// The site's statements judge by the server's clock, which reads at this
        /// instant (`None`: the caller's clock).
        server_reads_at: Option<SystemTime>,
        /// The site reads first, then inserts, granting this lease.
        reads_then_inserts: Option<Lease>,
        /// What the site was told each claim's first look met.
        observed: std::sync::Mutex<Vec<bool>>,
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
            server_reads_at: None,
            reads_then_inserts: None,
            observed: std::sync::Mutex::default(),
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

        fn on_server_clock(&self) -> bool {
            self.server_reads_at.is_some()
        }

        fn reads_first(&self) -> bool {
            self.reads_then_inserts.is_some()
        }

        fn inserts_first(&self) -> bool {
            self.reads_then_inserts.is_some()
        }

        async fn insert(&mut self, _claim: &Claim<'_>) -> Result<Inserted, StoreError> {
            Ok(Inserted::Granted(self.reads_then_inserts.clone().expect("a site that inserts")))
        }

        fn observe(&self, met: bool) {
            self.observed.lock().unwrap().push(met);
        }

        async fn read(&mut self, _claim: &Claim<'_>) -> Result<(Option<Record>, Option<SystemTime>), StoreError> {
            Ok(((self.stands)(), self.server_reads_at))
        }
    }

    /// The record changes between a refused upsert and the read that
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

    /// On a server's clock, a caller whose clock runs 5 minutes ahead sees a running
    /// claim as lapsed: the server's refusal, and its instant for what a claim reads,
    /// decide instead — the record is the answer, never a round again.
    #[tokio::test]
    async fn a_caller_ahead_of_the_servers_clock_gets_the_running_claim() {
        let server_now = idem_runtime::now();
        let running = claim_at(server_now).granted(None);
        let ahead = claim_at(server_now + Duration::from_secs(300));
        assert!(ahead.admits(&running), "by the caller's clock the lease lapsed");

        // The claim statement refused, returning the record.
        let refused_with = running.clone();
        let mut refusing = scripted(move |_| Upserted::Refused(Some(refused_with.clone())), || None);
        refusing.server_reads_at = Some(server_now);
        let outcome = claim_or_read(&ahead, &mut refusing, RolledBack::LostRace)
            .await
            .unwrap();
        assert_eq!(outcome, ClaimOutcome::Existing(running.clone()));
        assert_eq!(refusing.rounds, 1);

        // The claim statement refused; the record read afterwards is judged by the
        // server's instant of that read.
        let read = running.clone();
        let mut reading = scripted(|_| Upserted::Refused(None), move || Some(read.clone()));
        reading.server_reads_at = Some(server_now);
        let outcome = claim_or_read(&ahead, &mut reading, RolledBack::LostRace).await.unwrap();
        assert_eq!(outcome, ClaimOutcome::Existing(running));
        assert_eq!(reading.rounds, 1);
    }

    /// A site that reads first and then inserts (MySQL, a Galera node, while claims
    /// often meet records) counts a claim once: the insert that follows the read is
    /// not a second look.
    #[tokio::test]
    async fn a_claim_is_counted_once() {
        let claim = claim_at(idem_runtime::now());
        let lease = Lease::of(&claim.granted(None));
        let mut site = scripted(|_| Upserted::Refused(None), || None);
        site.reads_then_inserts = Some(lease.clone());
        let outcome = claim_or_read(&claim, &mut site, RolledBack::LostRace).await.unwrap();
        assert_eq!(outcome, ClaimOutcome::Acquired(lease));
        assert_eq!(*site.observed.lock().unwrap(), [false], "the read found no record; counted once");
    }
}
