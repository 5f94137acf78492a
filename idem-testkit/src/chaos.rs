//! The history of a chaos run, and the checker that judges it.
//!
//! Workers record every call they make ([`Call`]: key, payload, process, the token its
//! body would run with, when it began and ended, what it answered); the business records
//! every effect a body made ([`Effect`]: key, the token of the call that made it, the
//! fence it ran under, the process it ran in); the coordinator records every [`Fault`]
//! it injected (which process, what, from when to when). [`check`] reads them all, with
//! the store's final records, and finds every [`Anomaly`]:
//!
//! - a key whose body ran more than once, beyond the runs a fault can explain: a run is
//!   excused only when a kill, a pause, a partition or a server restart hit its process
//!   *during that run* (between its call's start and end), or when its call never ended
//!   because its process was killed. A clock step explains nothing (leases are judged
//!   by the store's clock), and neither does a fault at another time. Two effects under
//!   one fence are two bodies under one lease, whatever the faults;
//! - a `LeaseLost` answered to a call that no fault hit while it ran;
//! - an `Ok` answer other than the key's first `Ok` answer;
//! - an `Ok` answer with no effect behind it;
//! - an `Ok` answer to a call whose payload was not the key's first payload;
//! - a success lost: an `Ok` answer whose key's record is gone, not `SUCCESS`, or
//!   holds another answer.
//!
//! ```
//! use idem_testkit::chaos::{check, Answer, Call, Effect, Fault, FaultKind};
//!
//! let calls = vec![
//!     Call::new("k1", "p", "w1", Answer::Ok("t1".into())).ran("t1", 0, 120),
//!     Call::new("k1", "p", "w2", Answer::Ok("t1".into())).ran("t2", 130, 140),
//!     Call::new("k1", "other", "w2", Answer::PayloadMismatch).ran("t3", 150, 151),
//! ];
//! let effects = vec![Effect { key: "k1".into(), token: "t1".into(), fence: 7, process: "w1".into() }];
//! let records = [("k1".to_owned(), Some("t1".to_owned()))].into();
//! let verdict = check(&calls, &effects, &records, &[]);
//! assert!(verdict.anomalies.is_empty(), "{verdict}");
//!
//! // w2 ran k1 again with no fault near its run: a double execution, whatever else happened.
//! let twice = [effects.clone(), vec![Effect { key: "k1".into(), token: "t2".into(), fence: 8, process: "w2".into() }]].concat();
//! let far = [Fault { process: "w2".into(), kind: FaultKind::Pause, start_ms: 5_000, end_ms: 11_000 }];
//! assert!(!check(&calls, &twice, &records, &far).valid());
//! ```

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde::{Deserialize, Serialize};

/// What a call answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Answer {
    /// The call's value: the token of the effect it stands for.
    Ok(String),
    /// A duplicate still running, the caller told to come back.
    InProgress,
    /// The key is held for another payload.
    PayloadMismatch,
    /// The holder's lease was lost (taken over after a pause or a partition): its
    /// outcome was refused.
    LeaseLost,
    /// The call was cut off: the store unreachable, the process killed before it
    /// answered (the coordinator writes this for calls a killed worker had begun).
    Failed(String),
}

/// One call, as the worker that made it saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Call {
    /// The idempotency key.
    pub key: String,
    /// The payload the call sent (the key's first payload, or another one).
    pub payload: String,
    /// The process that made the call (a worker and its incarnation).
    pub process: String,
    /// The token the call's body runs with, were it to run (the effect it makes carries
    /// it): what ties an effect to the call, and so to the time, it ran in. Empty when
    /// not recorded.
    #[serde(default)]
    pub token: String,
    /// What it answered.
    pub answer: Answer,
    /// When it began, in milliseconds on the run's clock (the coordinator's monotonic
    /// clock; 0 when not recorded).
    #[serde(default)]
    pub start_ms: u64,
    /// When it ended, on the same clock.
    #[serde(default)]
    pub end_ms: u64,
    /// The key's effect is a step that reconciles ([`Step::reconcile`](idem::Step::reconcile))
    /// against a downstream that does not deduplicate: its intent is recorded before the
    /// effect, so a successor asks instead of repeating, and a kill or a server restart
    /// excuses no second run — only a pause or a partition of the process while its
    /// call ran (the request stalled between the intent and the downstream).
    #[serde(default)]
    pub reconciled: bool,
}

impl Call {
    /// A call of `key` with `payload` by `process`, answered `answer`.
    pub fn new(key: &str, payload: &str, process: &str, answer: Answer) -> Self {
        Self {
            key: key.to_owned(),
            payload: payload.to_owned(),
            process: process.to_owned(),
            token: String::new(),
            answer,
            start_ms: 0,
            end_ms: 0,
            reconciled: false,
        }
    }

    /// The same call, of a key whose effect reconciles (see [`Call::reconciled`]).
    pub fn reconciled(mut self) -> Self {
        self.reconciled = true;
        self
    }

    /// The same call, whose body runs with `token`, begun at `start_ms` and ended at
    /// `end_ms` on the run's clock.
    pub fn ran(mut self, token: &str, start_ms: u64, end_ms: u64) -> Self {
        self.token = token.to_owned();
        (self.start_ms, self.end_ms) = (start_ms, end_ms);
        self
    }
}

/// What a fault did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FaultKind {
    /// The process was killed (`SIGKILL`) at `start_ms`: its calls then running never end.
    Kill,
    /// The process was stopped (`SIGSTOP`) from `start_ms` to `end_ms`.
    Pause,
    /// The process's link to the store was cut from `start_ms` to `end_ms`.
    Partition,
    /// The store's server was stopped and started again (every process is hit).
    Restart,
    /// The process's wall clock was stepped: explains nothing, since leases are judged
    /// by the store's clock.
    ClockStep,
}

/// One fault the coordinator injected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    /// The process it hit, or [`EVERY_PROCESS`].
    pub process: String,
    /// What it did.
    pub kind: FaultKind,
    /// When it began, in milliseconds on the run's clock.
    pub start_ms: u64,
    /// When it ended (`start_ms` for a kill or a clock step).
    pub end_ms: u64,
}

/// The [`Fault::process`] of a fault that hit every process (a server restart).
pub const EVERY_PROCESS: &str = "*";

impl Fault {
    /// Whether this fault can explain what `process` did between `from_ms` and `to_ms`:
    /// it hit that process in that time, and is of a kind that can take a lease away.
    fn hit(&self, process: &str, from_ms: u64, to_ms: u64) -> bool {
        self.kind != FaultKind::ClockStep
            && (self.process == process || self.process == EVERY_PROCESS)
            && self.start_ms <= to_ms
            && self.end_ms >= from_ms
    }
}

/// One business effect a body made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Effect {
    /// The key whose body made it.
    pub key: String,
    /// The token of the call whose body made it (its answer, when it finished).
    pub token: String,
    /// The fence it was made under.
    pub fence: u64,
    /// The process whose body made it.
    pub process: String,
}

/// Something the history shows that idem promises never happens. Each names the
/// key it happened to (`key`) and what shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)] // the fields are named in each variant's text
pub enum Anomaly {
    /// `key`'s body made these effects (`tokens`) in runs no fault explains: it ran
    /// twice.
    EffectTwice { key: String, tokens: Vec<String> },
    /// A call of `key` by `process` was told its lease was lost, and no fault hit that
    /// process while the call ran: the lease was taken from a live holder.
    LeaseLostUntouched { key: String, process: String },
    /// Two effects of `key` under one `fence`: two bodies under one lease.
    OneFenceTwice { key: String, fence: u64 },
    /// A caller of `key` got `got`, not the first answer `first`.
    AnswerNotFirst { key: String, first: String, got: String },
    /// A caller of `key` got `answer`, and no effect is behind it.
    AnswerWithoutEffect { key: String, answer: String },
    /// A call of `key` with another `payload` than its first got `answer`.
    OtherPayloadAnswered {
        key: String,
        payload: String,
        answer: String,
    },
    /// `key` answered `answer`, and its record no longer says so (`stored`).
    SuccessLost {
        key: String,
        answer: String,
        stored: Option<String>,
    },
}

/// What [`check`] found, and the counts it found it in.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    /// Calls in the history.
    pub calls: usize,
    /// Keys called.
    pub keys: usize,
    /// Calls answered `Ok`.
    pub ok: usize,
    /// Calls answered `InProgress`.
    pub in_progress: usize,
    /// Calls refused for another payload.
    pub payload_mismatch: usize,
    /// Calls whose holder lost its lease (each one a fault explains; the others are
    /// anomalies).
    pub lease_lost: usize,
    /// Calls cut off by a fault.
    pub failed: usize,
    /// Effects of bodies a fault cut off while they ran, run again by a later holder
    /// (what a lease allows of a killed, paused or partitioned holder).
    pub cut_off: usize,
    /// Keys whose effect reconciles.
    pub reconciled_keys: usize,
    /// Of [`cut_off`](Self::cut_off), runs of reconciled keys: a pause or a partition
    /// held the request between its intent and the downstream past the lease, so the
    /// successor's lookup did not see it.
    pub cut_off_reconciled: usize,
    /// Everything idem promises never happens, that did.
    pub anomalies: Vec<Anomaly>,
}

impl Verdict {
    /// Whether the history holds no anomaly.
    pub fn valid(&self) -> bool {
        self.anomalies.is_empty()
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.valid() { "VALID" } else { "INVALID" };
        writeln!(f, "{verdict}: {} anomalies", self.anomalies.len())?;
        writeln!(
            f,
            "| calls | keys | ok | in progress | payload mismatch | lease lost | failed | cut-off runs | reconciled keys | their cut-off runs |"
        )?;
        writeln!(f, "|---|---|---|---|---|---|---|---|---|---|")?;
        writeln!(
            f,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            self.calls,
            self.keys,
            self.ok,
            self.in_progress,
            self.payload_mismatch,
            self.lease_lost,
            self.failed,
            self.cut_off,
            self.reconciled_keys,
            self.cut_off_reconciled
        )?;
        for anomaly in &self.anomalies {
            writeln!(f, "- {anomaly:?}")?;
        }
        Ok(())
    }
}

/// Judge a history: `calls` as the workers recorded them, `effects` as the business
/// holds them, `records`, each key's final record's answer (`None` when the record is
/// gone or not `SUCCESS`), and the `faults` injected. A key's first payload is the one
/// its first `Ok` answer was given to.
pub fn check(
    calls: &[Call],
    effects: &[Effect],
    records: &HashMap<String, Option<String>>,
    faults: &[Fault],
) -> Verdict {
    let mut verdict = Verdict {
        calls: calls.len(),
        ..Verdict::default()
    };
    let hit = |process: &str, from_ms: u64, to_ms: u64| faults.iter().any(|f| f.hit(process, from_ms, to_ms));
    let mut by_key: BTreeMap<&str, Vec<&Call>> = BTreeMap::new();
    let mut by_token: HashMap<&str, &Call> = HashMap::new();
    for call in calls {
        by_key.entry(&call.key).or_default().push(call);
        if !call.token.is_empty() {
            by_token.insert(&call.token, call);
        }
        match &call.answer {
            Answer::Ok(_) => verdict.ok += 1,
            Answer::InProgress => verdict.in_progress += 1,
            Answer::PayloadMismatch => verdict.payload_mismatch += 1,
            Answer::LeaseLost => {
                verdict.lease_lost += 1;
                if !hit(&call.process, call.start_ms, call.end_ms) {
                    verdict.anomalies.push(Anomaly::LeaseLostUntouched {
                        key: call.key.clone(),
                        process: call.process.clone(),
                    });
                }
            }
            Answer::Failed(_) => verdict.failed += 1,
        }
    }
    verdict.keys = by_key.len();
    let reconciled: std::collections::HashSet<&str> = calls
        .iter()
        .filter(|call| call.reconciled)
        .map(|call| call.key.as_str())
        .collect();
    verdict.reconciled_keys = reconciled.len();
    // A run is excused when a fault hit its process while its call ran, or when its
    // call never ended and its process was killed. A reconciled key's run only by a
    // pause or a partition while its call ran.
    let stalled = |process: &str, from_ms: u64, to_ms: u64| {
        faults
            .iter()
            .any(|f| matches!(f.kind, FaultKind::Pause | FaultKind::Partition) && f.hit(process, from_ms, to_ms))
    };
    let excused = |effect: &Effect| match by_token.get(effect.token.as_str()) {
        Some(call) if call.process == effect.process && reconciled.contains(effect.key.as_str()) => {
            stalled(&effect.process, call.start_ms, call.end_ms)
        }
        Some(call) if call.process == effect.process => hit(&effect.process, call.start_ms, call.end_ms),
        _ if reconciled.contains(effect.key.as_str()) => false,
        _ => faults
            .iter()
            .any(|f| f.kind == FaultKind::Kill && f.process == effect.process),
    };
    let mut effects_of: BTreeMap<&str, Vec<&Effect>> = BTreeMap::new();
    for effect in effects {
        effects_of.entry(&effect.key).or_default().push(effect);
    }
    let answers: HashMap<&str, &String> = by_key
        .iter()
        .filter_map(|(key, calls)| {
            calls.iter().find_map(|call| match &call.answer {
                Answer::Ok(token) => Some((*key, token)),
                _ => None,
            })
        })
        .collect();
    for (key, effects) in &effects_of {
        // The answered run stands; every other run must be one a fault cut off. With
        // no answer, one run may stand.
        let answered = answers.get(key);
        let standing: Vec<&Effect> = effects
            .iter()
            .copied()
            .filter(|effect| answered.is_some_and(|token| *token == &effect.token) || !excused(effect))
            .collect();
        // Runs a fault cut off, beyond the one that stands (when all of them were).
        let cut_off = effects.len() - standing.len().max(1);
        verdict.cut_off += cut_off;
        if reconciled.contains(key) {
            verdict.cut_off_reconciled += cut_off;
        }
        if standing.len() > 1 {
            verdict.anomalies.push(Anomaly::EffectTwice {
                key: (*key).to_owned(),
                tokens: standing.iter().map(|e| e.token.clone()).collect(),
            });
        }
        let mut fences: Vec<u64> = effects.iter().map(|e| e.fence).collect();
        fences.sort_unstable();
        if let Some(pair) = fences.windows(2).find(|pair| pair[0] == pair[1]) {
            verdict.anomalies.push(Anomaly::OneFenceTwice {
                key: (*key).to_owned(),
                fence: pair[0],
            });
        }
    }
    for (key, calls) in by_key {
        let Some(first) = answers.get(key).copied() else {
            continue;
        };
        let first_payload = calls
            .iter()
            .find(|call| matches!(&call.answer, Answer::Ok(_)))
            .map(|call| &call.payload);
        for call in &calls {
            let Answer::Ok(got) = &call.answer else { continue };
            if got != first {
                verdict.anomalies.push(Anomaly::AnswerNotFirst {
                    key: key.to_owned(),
                    first: first.clone(),
                    got: got.clone(),
                });
            }
            if Some(&call.payload) != first_payload {
                verdict.anomalies.push(Anomaly::OtherPayloadAnswered {
                    key: key.to_owned(),
                    payload: call.payload.clone(),
                    answer: got.clone(),
                });
            }
        }
        let behind = effects_of
            .get(key)
            .is_some_and(|effects| effects.iter().any(|e| &e.token == first));
        if !behind {
            verdict.anomalies.push(Anomaly::AnswerWithoutEffect {
                key: key.to_owned(),
                answer: first.clone(),
            });
        }
        let stored = records.get(key).cloned().flatten();
        if stored.as_ref() != Some(first) {
            verdict.anomalies.push(Anomaly::SuccessLost {
                key: key.to_owned(),
                answer: first.clone(),
                stored,
            });
        }
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    fn effect(key: &str, token: &str, fence: u64, process: &str) -> Effect {
        Effect {
            key: key.into(),
            token: token.into(),
            fence,
            process: process.into(),
        }
    }

    fn fault(process: &str, kind: FaultKind, start_ms: u64, end_ms: u64) -> Fault {
        Fault {
            process: process.into(),
            kind,
            start_ms,
            end_ms,
        }
    }

    /// Each anomaly the checker exists for, found in a history that has it.
    #[test]
    fn finds_every_kind_of_anomaly() {
        let calls = vec![
            Call::new("twice", "p", "w1", Answer::Ok("a".into())).ran("a", 0, 100),
            Call::new("twice", "p", "w2", Answer::Failed("store".into())).ran("b", 10, 90),
            Call::new("other", "p", "w1", Answer::Ok("x".into())).ran("x", 0, 10),
            Call::new("other", "p", "w2", Answer::Ok("y".into())).ran("y", 20, 30),
            Call::new("payload", "p", "w1", Answer::Ok("q".into())).ran("q", 0, 10),
            Call::new("payload", "not-p", "w2", Answer::Ok("q".into())).ran("q2", 20, 30),
            Call::new("lost", "p", "w1", Answer::Ok("l".into())).ran("l", 0, 10),
            Call::new("ghost", "p", "w1", Answer::Ok("g".into())).ran("g", 0, 10),
            Call::new("taken", "p", "w1", Answer::LeaseLost).ran("t", 0, 200),
        ];
        let effects = vec![
            effect("twice", "a", 1, "w1"),
            effect("twice", "b", 2, "w2"),
            effect("other", "x", 1, "w1"),
            effect("payload", "q", 1, "w1"),
            effect("lost", "l", 1, "w1"),
            effect("fence", "f1", 5, "w1"),
            effect("fence", "f2", 5, "w3"),
        ];
        let records: HashMap<String, Option<String>> = [
            ("twice", Some("a")),
            ("other", Some("x")),
            ("payload", Some("q")),
            ("lost", None),
            ("ghost", Some("g")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.map(str::to_owned)))
        .collect();
        // w3 was killed: its run of `fence` is excused, not its fence shared with w1's.
        let faults = [fault("w3", FaultKind::Kill, 50, 50)];
        let verdict = check(&calls, &effects, &records, &faults);
        let kinds: Vec<String> = verdict
            .anomalies
            .iter()
            .map(|a| format!("{a:?}").split([' ', '{']).next().unwrap().to_owned())
            .collect();
        for kind in [
            "EffectTwice",
            "OneFenceTwice",
            "AnswerNotFirst",
            "OtherPayloadAnswered",
            "SuccessLost",
            "AnswerWithoutEffect",
            "LeaseLostUntouched",
        ] {
            assert!(kinds.iter().any(|k| k == kind), "{kind} not found: {verdict}");
        }
        assert!(!verdict.valid());
        assert_eq!(verdict.cut_off, 1);
    }

    /// A history with faults but no anomaly is valid: runs cut off by a fault while they
    /// ran, lost leases of processes a fault hit, cut-off calls and refused payloads are
    /// what faults legitimately cause.
    #[test]
    fn a_faulty_but_correct_history_is_valid() {
        let calls = vec![
            // w1's first incarnation was killed mid-body (its call never ended); w3 took
            // the key over and answered.
            Call::new("k", "p", "w2#1", Answer::InProgress).ran("k2", 100, 101),
            Call::new("k", "p", "w3#1", Answer::Ok("t2".into())).ran("t2", 5_000, 5_100),
            Call::new("k", "p", "w1#2", Answer::Ok("t2".into())).ran("k3", 6_000, 6_001),
            Call::new("k", "p2", "w4#1", Answer::PayloadMismatch).ran("k4", 6_000, 6_001),
            // w2 was paused while it held j: its lease was taken, its run excused.
            Call::new("j", "p", "w2#1", Answer::LeaseLost).ran("j1", 1_000, 9_000),
            Call::new("j", "p", "w3#1", Answer::Ok("j2".into())).ran("j2", 6_000, 6_200),
        ];
        let effects = vec![
            effect("k", "t1", 10, "w1#1"),
            effect("k", "t2", 11, "w3#1"),
            effect("j", "j1", 20, "w2#1"),
            effect("j", "j2", 21, "w3#1"),
        ];
        let records = [
            ("k".to_owned(), Some("t2".to_owned())),
            ("j".to_owned(), Some("j2".to_owned())),
        ]
        .into();
        let faults = [
            fault("w1#1", FaultKind::Kill, 200, 200),
            fault("w2#1", FaultKind::Pause, 1_500, 7_500),
            fault("w3#1", FaultKind::ClockStep, 5_050, 5_050),
        ];
        let verdict = check(&calls, &effects, &records, &faults);
        assert!(verdict.valid(), "{verdict}");
        assert_eq!((verdict.calls, verdict.keys, verdict.ok, verdict.cut_off), (6, 2, 3, 2));
        // Had no fault touched w1 and w2, their runs are double executions, and w2's
        // lost lease was taken from a live holder.
        let verdict = check(&calls, &effects, &records, &[]);
        assert_eq!(verdict.anomalies.len(), 3, "{verdict}");
    }

    /// A fault excuses only the runs it hit while they ran: not a run of its process
    /// before or after it, not a run of another process, and a clock step none at all.
    #[test]
    fn a_run_is_excused_only_by_a_fault_during_it() {
        let calls = vec![
            Call::new("k", "p", "w1", Answer::LeaseLost).ran("a", 1_000, 1_200),
            Call::new("k", "p", "w2", Answer::Ok("b".into())).ran("b", 1_050, 1_150),
        ];
        let effects = vec![effect("k", "a", 1, "w1"), effect("k", "b", 2, "w2")];
        let records = [("k".to_owned(), Some("b".to_owned()))].into();
        let doubled = |faults: &[Fault]| {
            let verdict = check(&calls, &effects, &records, faults);
            let twice = verdict
                .anomalies
                .iter()
                .any(|a| matches!(a, Anomaly::EffectTwice { .. }));
            let lost = verdict
                .anomalies
                .iter()
                .any(|a| matches!(a, Anomaly::LeaseLostUntouched { .. }));
            assert_eq!(twice, lost, "{verdict}");
            twice
        };
        assert!(
            !doubled(&[fault("w1", FaultKind::Pause, 900, 1_100)]),
            "a pause during the run"
        );
        assert!(!doubled(&[fault("w1", FaultKind::Partition, 1_100, 7_000)]));
        assert!(!doubled(&[fault(EVERY_PROCESS, FaultKind::Restart, 1_150, 1_900)]));
        assert!(doubled(&[]), "no fault");
        assert!(
            doubled(&[fault("w1", FaultKind::Pause, 5_000, 11_000)]),
            "a pause after the run"
        );
        assert!(
            doubled(&[fault("w1", FaultKind::Pause, 0, 900)]),
            "a pause before the run"
        );
        assert!(
            doubled(&[fault("w2", FaultKind::Pause, 900, 1_300)]),
            "a pause of another process"
        );
        assert!(
            doubled(&[fault("w1", FaultKind::ClockStep, 1_100, 1_100)]),
            "a clock step"
        );
        assert!(
            doubled(&[fault("w1", FaultKind::Kill, 900, 900)]),
            "a kill of a call that ended"
        );
        // A run whose call never ended: excused by its process's kill, and by nothing else.
        let unended = vec![calls[1].clone()];
        let verdict = check(
            &unended,
            &effects,
            &records,
            &[fault("w1", FaultKind::Kill, 1_300, 1_300)],
        );
        assert!(verdict.valid(), "{verdict}");
        let verdict = check(
            &unended,
            &effects,
            &records,
            &[fault("w1", FaultKind::Pause, 0, 99_000)],
        );
        assert!(!verdict.valid(), "{verdict}");
    }

    /// A reconciled key's second run is excused by a pause or a partition of its
    /// process while its call ran, and by nothing else: not a kill during the call, not
    /// a kill of a call that never ended, not a server restart.
    #[test]
    fn a_reconciled_run_is_excused_by_no_kill() {
        let calls = vec![
            Call::new("k", "p", "w1", Answer::Failed("killed".into()))
                .ran("a", 1_000, 1_200)
                .reconciled(),
            Call::new("k", "p", "w2", Answer::Ok("b".into()))
                .ran("b", 9_050, 9_150)
                .reconciled(),
        ];
        let effects = vec![effect("k", "a", 1, "w1"), effect("k", "b", 2, "w2")];
        let records = [("k".to_owned(), Some("b".to_owned()))].into();
        let doubled = |calls: &[Call], faults: &[Fault]| {
            let verdict = check(calls, &effects, &records, faults);
            assert_eq!(verdict.reconciled_keys, 1);
            !verdict.valid()
        };
        assert!(
            !doubled(&calls, &[fault("w1", FaultKind::Pause, 1_100, 11_000)]),
            "a pause inside it"
        );
        assert!(!doubled(&calls, &[fault("w1", FaultKind::Partition, 1_100, 11_000)]));
        let verdict = check(
            &calls,
            &effects,
            &records,
            &[fault("w1", FaultKind::Pause, 1_100, 11_000)],
        );
        assert_eq!((verdict.cut_off, verdict.cut_off_reconciled), (1, 1));
        assert!(
            doubled(&calls, &[fault("w1", FaultKind::Kill, 1_100, 1_100)]),
            "a kill during the call"
        );
        assert!(
            doubled(&calls, &[fault(EVERY_PROCESS, FaultKind::Restart, 1_100, 1_900)]),
            "a restart"
        );
        assert!(
            doubled(&calls[1..], &[fault("w1", FaultKind::Kill, 1_300, 1_300)]),
            "a call that never ended"
        );
        // The same history of a key that does not reconcile: the kill excuses it.
        let plain: Vec<Call> = calls
            .iter()
            .cloned()
            .map(|mut call| {
                call.reconciled = false;
                call
            })
            .collect();
        assert!(!doubled_plain(&plain, &effects, &records));
    }

    fn doubled_plain(calls: &[Call], effects: &[Effect], records: &HashMap<String, Option<String>>) -> bool {
        !check(calls, effects, records, &[fault("w1", FaultKind::Kill, 1_100, 1_100)]).valid()
    }
}
