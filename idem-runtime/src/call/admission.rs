//! Admission: claim the key, or answer from the record that stands in the way, or wait
//! for it to finish.
//!
//! Waiting reads the record; it never writes. A claim is sent again only when the read
//! shows the key free (released, expired, or a lapsed lease), so waiters do not contend
//! with the holder's writes. `wait` bounds the whole wait, reads included.

// tokio's clock, which a paused test clock moves as it moves the store's sleeps and
// `MemoryStore`'s leases.
use tokio::time::Instant;

use serde::de::DeserializeOwned;

use super::flight::{stands, Seat};
use super::gate::{self, Met, Turn};
use super::{error_of, Call};
use crate::claim::{fingerprints_agree, Claim, ClaimOutcome, Lease};
use crate::clock;
use crate::error::Error;
use crate::observe;
use crate::operation::Idempotent;
use crate::policy::Mode;
use crate::record::{Record, Status};
use crate::replay::{decode, DIGEST_PREFIX};
use crate::retention::Tombstone;
use crate::step::unknown_error;
use crate::unknown::unsettled;

/// What admission came to, when it did not end the call with an error.
pub(super) enum Admitted<T> {
    /// The key is ours, with at least two thirds of the lease ahead.
    Claimed(Claimed),
    /// A finished call's value, replayed.
    Replayed(T),
}

/// A key held: its lease, the clock's reading its claim was sent with, and when it was
/// granted.
pub(super) struct Claimed {
    pub(super) lease: Lease,
    pub(super) read: clock::Reading,
    pub(super) granted: Instant,
}

/// What waiting on a record came to.
enum Waited<T> {
    /// The record finished: here is the answer.
    Answered(Admitted<T>),
    /// The key became free: claim again.
    Free,
}

impl Call<'_> {
    /// Admit the call that began at the clock's reading `admitting`.
    pub(super) async fn admit<T: DeserializeOwned>(
        &self,
        fingerprint: Option<&str>,
        admitting: clock::Reading,
    ) -> Result<Admitted<T>, Error> {
        let deadline = self.op.wait.map(|wait| admitting.read() + wait);
        let request = self.op.request_body();
        // The first claim is sent as admission begins, at its reading of the clock when
        // it did not wait at the gate; a later one, when it is sent.
        let mut first_claim = Some(admitting);
        'admit: loop {
            // The record in the way, as this caller's claim met it; `None` when it is
            // running with a fingerprint that agrees, and the next read tells more.
            let in_the_way = 'turn: {
                match gate::turn(self.store, &self.op.biz, &self.key, deadline.is_some()).await {
                    Turn::Join => None,
                    // A claim of the key under way here met this: so would ours have.
                    Turn::Took(met) => match &*met {
                        Met::Claimed { fingerprint: theirs } if !fingerprints_agree(theirs.as_deref(), fingerprint) => {
                            return Err(self.error(|biz, key| Error::PayloadMismatch { biz, key }));
                        }
                        Met::Claimed { .. } => None,
                        Met::Existing(record) => Some(Record::clone(record)),
                    },
                    Turn::Claim(ticket) => {
                        let named = (self.store, self.op.biz.as_ref(), self.key.as_str());
                        let (read, claimed_at) = match first_claim.take() {
                            Some(admitting) if !ticket.waited() => (admitting, admitting.read()),
                            // Its lease is counted from admission all the same.
                            Some(admitting) => (clock::Reading::take(), admitting.read()),
                            None => {
                                let read = clock::Reading::take();
                                (read, read.read())
                            }
                        };
                        let lease = {
                            let claim =
                                Claim::new(&self.op.biz, &self.key, read.at(), self.op.stored_lease(), self.op.ttl)
                                    .read_at(read.read())
                                    .with_fingerprint(fingerprint)
                                    .with_request_body(request.as_deref());
                            let claimed = self.store.claim(&claim).await;
                            match claimed.map_err(|e| self.store_error("claim", e))? {
                                ClaimOutcome::Acquired(lease) => lease,
                                ClaimOutcome::Existing(record) => {
                                    ticket.hand_on(named, || Met::Existing(Box::new(record.clone())));
                                    break 'turn Some(record);
                                }
                            }
                        };
                        // (The claim and what it met are out of scope here: the future does
                        // not carry them while the lease is checked.)
                        ticket.hand_on(named, || Met::Claimed {
                            fingerprint: fingerprint.map(str::to_owned),
                        });
                        let lease = lease.with_retention(self.op.retention());
                        let granted = Instant::now();
                        if self.lease_ahead(&lease, granted - claimed_at).await? {
                            observe::claimed(&self.op.biz, lease.fence, lease.took_over(), granted - admitting.read());
                            return Ok(Admitted::Claimed(Claimed { lease, read, granted }));
                        }
                        // Taken over before the body started: nothing ran; claim again.
                        continue 'admit;
                    }
                }
            };
            // A finished record answers at once. (`in_the_way` is consumed on every
            // path, so the future does not carry a record while it waits.)
            let answered = in_the_way.map(|record| self.answer_from(record, fingerprint));
            if let Some(Ok(answer)) = answered.transpose()? {
                return Ok(answer);
            }
            // Waiting (rare) runs in a future of its own, so that a call's future does
            // not carry the waiting's state.
            match Box::pin(self.wait_on(fingerprint, deadline)).await? {
                Waited::Answered(answer) => return Ok(answer),
                Waited::Free => continue,
            }
        }
    }

    /// A record running stands in the way (or a claim under way here just took the
    /// key): read it until it finishes or the key becomes free, within the deadline.
    /// The waiters of the key in this process share the reads ([`Seat`]).
    async fn wait_on<T: DeserializeOwned>(
        &self,
        fingerprint: Option<&str>,
        deadline: Option<Instant>,
    ) -> Result<Waited<T>, Error> {
        let mut seat: Option<Seat> = None;
        loop {
            let Some(deadline) = deadline.filter(|deadline| *deadline > Instant::now()) else {
                return Err(self.error(|biz, key| Error::InProgress { biz, key }));
            };
            let seat = seat.get_or_insert_with(|| {
                observe::waiting(&self.op.biz);
                Seat::take(self.store, &self.op.biz, &self.key, deadline)
            });
            let Some(read) = seat.next().await else {
                return Err(self.error(|biz, key| Error::InProgress { biz, key }));
            };
            let now = clock::now();
            let record = match &*read {
                Err(error) => return Err(self.store_error("get", error.relayed())),
                Ok(Some(record)) if stands(record, now) => record.clone(),
                Ok(_) => return Ok(Waited::Free),
            };
            if let Ok(answer) = self.answer_from(record, fingerprint)? {
                return Ok(Waited::Answered(answer));
            }
        }
    }

    /// What a live `record` in the way answers: the finished call's answer, or
    /// (`Err`) the record, still running. An error when it was claimed with another
    /// payload, or is left unsettled.
    fn answer_from<T: DeserializeOwned>(
        &self,
        record: Record,
        fingerprint: Option<&str>,
    ) -> Result<Result<Admitted<T>, Record>, Error> {
        if !fingerprints_agree(record.fingerprint.as_deref(), fingerprint) {
            return Err(self.error(|biz, key| Error::PayloadMismatch { biz, key }));
        }
        if record.status != Status::Processing {
            return self.answer_finished(record).map(Ok);
        }
        if let Some(intent) = unsettled(&record) {
            return Err(unknown_error(&Lease::of(&record), &intent));
        }
        Ok(Err(record))
    }

    /// A finished record answers the duplicate.
    fn answer_finished<T: DeserializeOwned>(&self, record: Record) -> Result<Admitted<T>, Error> {
        answer_finished(self.op, &self.key, record).map(Admitted::Replayed)
    }
}

/// What a finished record answers a duplicate of `op` for `key`: the replayed value,
/// or the error its mode and status call for.
/// A tombstone answers for itself, whatever the mode: the call ran, and neither its
/// answer nor a second run is to be had.
pub(crate) fn answer_finished<T: DeserializeOwned>(op: &Idempotent, key: &str, record: Record) -> Result<T, Error> {
    match record.tombstone_at(clock::now()) {
        Some(Tombstone::Erased) => return Err(error_of(op, key, |biz, key| Error::Erased { biz, key })),
        Some(Tombstone::Expired) => return Err(error_of(op, key, |biz, key| Error::Expired { biz, key })),
        None => {}
    }
    match (record.status, op.mode) {
        (Status::Succeeded, Mode::ReturnFirst)
            if record
                .response_body
                .as_deref()
                .is_some_and(|answer| answer.starts_with(DIGEST_PREFIX)) =>
        {
            Err(error_of(op, key, |biz, key| Error::AnswerNotKept { biz, key }))
        }
        (Status::Succeeded, Mode::ReturnFirst) => decode(record.response_body.as_deref()).map_err(|source| {
            error_of(op, key, |biz, key| Error::Decode {
                biz,
                key,
                source: Box::new(source),
            })
        }),
        (Status::Succeeded, Mode::Reject) => Err(error_of(op, key, |biz, key| Error::Duplicate { biz, key })),
        _ => Err(error_of(op, key, |biz, key| Error::PreviousFailed {
            biz,
            key,
            message: record.error_message.unwrap_or_default(),
        })),
    }
}
