//! The claim protocol with unknown outcomes, model-checked: every interleaving of three
//! callers of one key, up to a bound, explored exhaustively by `stateright`.
//!
//! The model is the protocol, not the code: a store that judges leases by its own clock
//! (which ticks, and may jump ahead once by up to the clock tolerance), claims and
//! takeovers under a fence, a heartbeat that renews (or, when the holder is paused or
//! cut off, does not), a step's intent written before its request leaves, requests that
//! travel to a downstream that never deduplicates (and may arrive late, or have their
//! answer lost), the step's value and the response recorded under the fence, a lookup
//! that reconciles, failing closed and an operator who settles. Any caller may crash at
//! any moment; a crashed caller's request in flight may still arrive.
//!
//! Invariants:
//! - **every effect at most once, unless its policy is rerun** — or a request reached
//!   the downstream after its sender's lease had lapsed (a holder paused or cut off
//!   between its last renewal and its request's arrival, or a request stalled on the
//!   way): the window RELIABILITY states;
//! - **every answer is the recorded one**: every `Ok` a caller gets is the same value,
//!   and the record's response once there is one.
//!
//! Two mutants of the model — the intent written after the effect, and a takeover that
//! skips the lookup — must each be caught with a counterexample.

use stateright::{Checker, Model, Property};

/// How long a lease is, as the holder counts it, and the tolerance the store adds.
const LEASE: u8 = 2;
const TOLERANCE: u8 = 1;
/// The store's clock does not run past this (the bound of the exploration).
const LAST_TICK: u8 = 7;
/// A lease that never lapses: an unsettled record's.
const UNSETTLED: u8 = u8::MAX;
const CALLERS: usize = 3;

/// What the step does when it finds its effect begun and not finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Policy {
    Rerun,
    Reconcile,
    FailClosed,
}

/// A deliberately broken protocol, to show the checker catches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Mutant {
    None,
    /// The request leaves before the intent is written.
    IntentAfterEffect,
    /// A reconciling takeover runs the effect without asking.
    TakeoverSkipsLookup,
}

/// The step's entry in the record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Entry {
    None,
    Intended,
    /// The step's value: the downstream's charge id.
    Value(u8),
    Unknown,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Record {
    fence: u8,
    lease_until: u8,
    entry: Entry,
    /// The recorded response (`SUCCESS`).
    response: Option<u8>,
}

/// Where a caller is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Pc {
    Idle,
    /// Holds the claim under `fence`; has not started the step.
    Holding {
        fence: u8,
    },
    /// Its intent is on record; the request has not left.
    Intended {
        fence: u8,
    },
    /// The request left (mutant: before its intent).
    Sent {
        fence: u8,
    },
    /// The downstream answered `charge`.
    Answered {
        fence: u8,
        charge: u8,
    },
    /// The request left and no answer came (a timeout): ambiguous.
    Unanswered {
        fence: u8,
    },
    /// The step's value is recorded; the response is next.
    Recorded {
        fence: u8,
        charge: u8,
    },
    Finished,
    Crashed,
}

impl Pc {
    fn fence(self) -> Option<u8> {
        match self {
            Pc::Holding { fence }
            | Pc::Intended { fence }
            | Pc::Sent { fence }
            | Pc::Answered { fence, .. }
            | Pc::Unanswered { fence }
            | Pc::Recorded { fence, .. } => Some(fence),
            _ => None,
        }
    }
}

/// What a caller was told.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Answer {
    Ok(u8),
    Unknown,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    now: u8,
    jumped: bool,
    record: Option<Record>,
    /// The downstream's charges, each by the fence that sent it.
    charges: Vec<u8>,
    /// Requests on the way: (caller, fence).
    in_flight: Vec<(usize, u8)>,
    callers: [Pc; CALLERS],
    answers: Vec<Answer>,
    /// A request reached (or is on its way to) the downstream past its sender's lease.
    stalled: bool,
    settled: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    Tick,
    /// The store's clock jumps ahead by the tolerance (a failover to a clock ahead).
    Jump,
    Claim(usize),
    Renew(usize),
    /// The next move of a holder's step.
    Step(usize),
    /// The request of `in_flight[i]` arrives; its answer reaches its sender or is lost.
    Arrive(usize, bool),
    Crash(usize),
    Settle,
}

struct Protocol {
    policy: Policy,
    mutant: Mutant,
}

impl Protocol {
    fn stored_lease(now: u8) -> u8 {
        now + LEASE + TOLERANCE
    }

    /// Whether `fence` still holds the record (same fence, not finished).
    fn holds(state: &State, fence: u8) -> bool {
        state.record.is_some_and(|r| r.fence == fence && r.response.is_none())
    }

    fn record_mut(state: &mut State) -> &mut Record {
        state.record.as_mut().expect("a holder's record")
    }

    /// A holder whose claim is held: what its step does now.
    fn step(&self, state: &mut State, caller: usize) {
        let pc = state.callers[caller];
        let Some(fence) = pc.fence() else { return };
        if !Self::holds(state, fence) {
            // Fenced out (taken over): the write changes nothing; the call ends.
            state.callers[caller] = Pc::Finished;
            return;
        }
        let declared = self.policy != Policy::Rerun;
        state.callers[caller] = match pc {
            Pc::Holding { .. } => match Self::record_mut(state).entry {
                Entry::Value(charge) => Pc::Recorded { fence, charge },
                Entry::Unknown => return self.fail_closed(state, caller),
                Entry::Intended if declared => match self.policy {
                    Policy::FailClosed => return self.fail_closed(state, caller),
                    _ if self.mutant == Mutant::TakeoverSkipsLookup => self.start(state, fence),
                    _ => match state.charges.first() {
                        Some(&charge) => {
                            Self::record_mut(state).entry = Entry::Value(charge);
                            Pc::Recorded { fence, charge }
                        }
                        None => self.start(state, fence),
                    },
                },
                _ => self.start(state, fence),
            },
            Pc::Intended { .. } => {
                state.in_flight.push((caller, fence));
                Pc::Sent { fence }
            }
            Pc::Answered { charge, .. } => {
                Self::record_mut(state).entry = Entry::Value(charge);
                Pc::Recorded { fence, charge }
            }
            Pc::Unanswered { .. } if !declared => {
                // Rerun: the error is returned and the claim released.
                let record = Self::record_mut(state);
                record.entry = Entry::None;
                record.lease_until = 0;
                Pc::Finished
            }
            Pc::Unanswered { .. } => match (self.policy, state.charges.first()) {
                (Policy::Reconcile, Some(&charge)) => {
                    Self::record_mut(state).entry = Entry::Value(charge);
                    Pc::Recorded { fence, charge }
                }
                (Policy::Reconcile, None) => {
                    // Not done: the intent taken back with the error, the claim released.
                    let record = Self::record_mut(state);
                    record.entry = Entry::None;
                    record.lease_until = 0;
                    Pc::Finished
                }
                _ => return self.fail_closed(state, caller),
            },
            Pc::Recorded { charge, .. } => {
                let record = Self::record_mut(state);
                record.response = Some(charge);
                state.answers.push(Answer::Ok(charge));
                Pc::Finished
            }
            other => other,
        };
    }

    /// The effect starts: its intent first (unless it declares no policy), then the
    /// request; the mutant sends first.
    fn start(&self, state: &mut State, fence: u8) -> Pc {
        if self.policy == Policy::Rerun {
            return Pc::Intended { fence };
        }
        if self.mutant == Mutant::IntentAfterEffect {
            // The request leaves with no intent on record: the value, once the answer
            // is back, is the first the record hears of it.
            return Pc::Intended { fence };
        }
        Self::record_mut(state).entry = Entry::Intended;
        Pc::Intended { fence }
    }

    fn fail_closed(&self, state: &mut State, caller: usize) {
        let record = Self::record_mut(state);
        record.entry = Entry::Unknown;
        record.lease_until = UNSETTLED;
        state.answers.push(Answer::Unknown);
        state.callers[caller] = Pc::Finished;
    }

    /// After time passed: a request on its way, or a live holder yet to send, whose
    /// sender's lease lapsed.
    fn note_stalls(state: &mut State) {
        let lapsed = |fence: u8| match state.record {
            Some(r) => r.fence != fence || (r.lease_until != UNSETTLED && r.lease_until <= state.now),
            None => true,
        };
        let on_the_way = state.in_flight.iter().any(|&(_, fence)| lapsed(fence));
        let holding = state.callers.iter().any(|pc| {
            matches!(pc, Pc::Holding { fence } | Pc::Intended { fence } if lapsed(*fence) && state.record.is_some_and(|r| r.fence == *fence && r.entry == Entry::Intended))
        });
        state.stalled |= on_the_way || holding;
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            jumped: false,
            record: None,
            charges: Vec::new(),
            in_flight: Vec::new(),
            callers: [Pc::Idle; CALLERS],
            answers: Vec::new(),
            stalled: false,
            settled: false,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.now < LAST_TICK {
            actions.push(Action::Tick);
            if !state.jumped {
                actions.push(Action::Jump);
            }
        }
        for caller in 0..CALLERS {
            match state.callers[caller] {
                Pc::Idle => actions.push(Action::Claim(caller)),
                Pc::Finished | Pc::Crashed => continue,
                Pc::Sent { .. } => {}
                _ => actions.push(Action::Step(caller)),
            }
            if state.callers[caller].fence().is_some() {
                actions.push(Action::Renew(caller));
            }
            actions.push(Action::Crash(caller));
        }
        for i in 0..state.in_flight.len() {
            actions.push(Action::Arrive(i, true));
            actions.push(Action::Arrive(i, false));
        }
        if !state.settled && state.record.is_some_and(|r| r.entry == Entry::Unknown) {
            actions.push(Action::Settle);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Tick => state.now += 1,
            Action::Jump => {
                state.now = (state.now + TOLERANCE).min(LAST_TICK);
                state.jumped = true;
            }
            Action::Claim(caller) => {
                let now = state.now;
                match &mut state.record {
                    None => {
                        state.record = Some(Record {
                            fence: 1,
                            lease_until: Self::stored_lease(now),
                            entry: Entry::None,
                            response: None,
                        });
                        state.callers[caller] = Pc::Holding { fence: 1 };
                    }
                    Some(record) if record.response.is_some() => {
                        state.answers.push(Answer::Ok(record.response.unwrap()));
                        state.callers[caller] = Pc::Finished;
                    }
                    Some(record) if record.lease_until == UNSETTLED => {
                        state.answers.push(Answer::Unknown);
                        state.callers[caller] = Pc::Finished;
                    }
                    Some(record) if record.lease_until <= now => {
                        record.fence += 1;
                        record.lease_until = Self::stored_lease(now);
                        state.callers[caller] = Pc::Holding { fence: record.fence };
                    }
                    // In progress: the caller comes back later.
                    Some(_) => return None,
                }
            }
            Action::Renew(caller) => {
                let fence = state.callers[caller].fence()?;
                let now = state.now;
                match &mut state.record {
                    Some(record)
                        if record.fence == fence && record.response.is_none() && record.lease_until != UNSETTLED =>
                    {
                        record.lease_until = Self::stored_lease(now);
                    }
                    _ => return None,
                }
            }
            Action::Step(caller) => self.step(&mut state, caller),
            Action::Arrive(i, answered) => {
                let (caller, fence) = state.in_flight.remove(i);
                let charge = u8::try_from(state.charges.len()).unwrap() + 1;
                state.charges.push(fence);
                if state.callers[caller] == (Pc::Sent { fence }) {
                    state.callers[caller] = if answered {
                        Pc::Answered { fence, charge }
                    } else {
                        Pc::Unanswered { fence }
                    };
                }
            }
            Action::Crash(caller) => state.callers[caller] = Pc::Crashed,
            Action::Settle => {
                // The operator asks the downstream (by the effect key) and settles.
                let charge = (!state.charges.is_empty()).then_some(1);
                let record = Self::record_mut(&mut state);
                record.entry = charge.map_or(Entry::None, Entry::Value);
                record.lease_until = 0;
                state.settled = true;
            }
        }
        Self::note_stalls(&mut state);
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "every effect at most once unless its policy is rerun",
                |model: &Protocol, state: &State| {
                    model.policy == Policy::Rerun || state.stalled || state.charges.len() <= 1
                },
            ),
            Property::always("every answer is the recorded one", |_, state: &State| {
                let oks: Vec<u8> = state
                    .answers
                    .iter()
                    .copied()
                    .filter_map(|a| match a {
                        Answer::Ok(v) => Some(v),
                        Answer::Unknown => None,
                    })
                    .collect();
                let recorded = state.record.and_then(|r| r.response);
                oks.windows(2).all(|pair| pair[0] == pair[1]) && oks.iter().all(|v| recorded == Some(*v))
            }),
            // Not vacuous: a charge answered, and an effect reconciled after a crash.
            Property::sometimes("a charge is answered", |_, state: &State| {
                state.answers.iter().any(|a| matches!(a, Answer::Ok(_)))
            }),
            Property::sometimes(
                "a crashed holder's charge is answered by its successor",
                |_, state: &State| {
                    state.callers.contains(&Pc::Crashed)
                        && state.charges.len() == 1
                        && state.answers.iter().any(|a| matches!(a, Answer::Ok(_)))
                        && state.record.is_some_and(|r| r.fence > 1)
                },
            ),
            // What rerun is: a crash after the charge, and the successor charges again.
            Property::sometimes(
                "a rerun repeats an effect with no stall",
                |model: &Protocol, state: &State| {
                    model.policy == Policy::Rerun && !state.stalled && state.charges.len() >= 2
                },
            ),
        ]
    }
}

fn check(policy: Policy, mutant: Mutant) -> impl Checker<Protocol> {
    Protocol { policy, mutant }.checker().spawn_bfs().join()
}

const AT_MOST_ONCE: &str = "every effect at most once unless its policy is rerun";
const RECORDED: &str = "every answer is the recorded one";

#[test]
fn reconcile_and_fail_closed_never_repeat_an_effect_and_answer_the_record() {
    for policy in [Policy::Reconcile, Policy::FailClosed] {
        let checker = check(policy, Mutant::None);
        checker.assert_no_discovery(AT_MOST_ONCE);
        checker.assert_no_discovery(RECORDED);
        checker.assert_any_discovery("a charge is answered");
        checker.assert_any_discovery("a crashed holder's charge is answered by its successor");
        println!(
            "{policy:?}: {} states explored ({} unique), depth {}",
            checker.state_count(),
            checker.unique_state_count(),
            checker.max_depth()
        );
    }
}

/// Without a policy the model finds the double a crash after the charge makes: the
/// checker sees what the policies close.
#[test]
fn rerun_repeats_an_effect_after_a_crash() {
    let checker = check(Policy::Rerun, Mutant::None);
    checker.assert_any_discovery("a rerun repeats an effect with no stall");
    checker.assert_no_discovery(RECORDED);
}

#[test]
fn each_mutant_is_caught() {
    for (policy, mutant) in [
        (Policy::Reconcile, Mutant::IntentAfterEffect),
        (Policy::FailClosed, Mutant::IntentAfterEffect),
        (Policy::Reconcile, Mutant::TakeoverSkipsLookup),
    ] {
        let path = check(policy, mutant).assert_any_discovery(AT_MOST_ONCE);
        println!(
            "{mutant:?} under {policy:?}: caught in {} steps",
            path.into_actions().len()
        );
    }
}
