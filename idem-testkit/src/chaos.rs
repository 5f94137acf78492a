//! The history of a chaos run, and the checker that judges it.
//!
//! Workers record every call they make ([`Call`]: key, payload, process, what it
//! answered); the business records every effect a body made ([`Effect`]: key, the
//! token of the call that made it, the fence it ran under, the process it ran in).
//! [`check`] reads both, with the store's final records and the processes a fault cut
//! off (killed, paused past their lease, partitioned from the store), and finds every
//! [`Anomaly`]:
//!
//! - a key whose body ran more than once, beyond the runs a fault cut off (a killed
//!   holder's effect, then its successor's, is what a lease allows; two effects of
//!   processes no fault touched is a double execution), or two effects under one fence
//!   (two bodies under one lease);
//! - an `Ok` answer other than the key's first `Ok` answer;
//! - an `Ok` answer with no effect behind it;
//! - an `Ok` answer to a call whose payload was not the key's first payload;
//! - a success lost: an `Ok` answer whose key's record is gone, not `SUCCESS`, or
//!   holds another answer.
//!
//! ```
//! use idem_testkit::chaos::{check, Answer, Call, Effect};
//!
//! let calls = vec![
//!     Call::new("k1", "p", "w1", Answer::Ok("t1".into())),
//!     Call::new("k1", "p", "w2", Answer::Ok("t1".into())),
//!     Call::new("k1", "other", "w2", Answer::PayloadMismatch),
//! ];
//! let effects = vec![Effect { key: "k1".into(), token: "t1".into(), fence: 7, process: "w1".into() }];
//! let records = [("k1".to_owned(), Some("t1".to_owned()))].into();
//! let verdict = check(&calls, &effects, &records, &Default::default());
//! assert!(verdict.anomalies.is_empty(), "{verdict}");
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};
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
    /// What it answered.
    pub answer: Answer,
    /// When it began, in milliseconds on the run's clock (the coordinator's monotonic
    /// clock; 0 when not recorded).
    #[serde(default)]
    pub start_ms: u64,
    /// When it ended, on the same clock.
    #[serde(default)]
    pub end_ms: u64,
}

impl Call {
    /// A call of `key` with `payload` by `process`, answered `answer`.
    pub fn new(key: &str, payload: &str, process: &str, answer: Answer) -> Self {
        Self {
            key: key.to_owned(),
            payload: payload.to_owned(),
            process: process.to_owned(),
            answer,
            start_ms: 0,
            end_ms: 0,
        }
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
    /// `key`'s body made these effects (`tokens`) in processes no fault cut off: it
    /// ran twice.
    EffectTwice { key: String, tokens: Vec<String> },
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
    /// Calls whose holder lost its lease.
    pub lease_lost: usize,
    /// Calls cut off by a fault.
    pub failed: usize,
    /// Effects of bodies a fault cut off, run again by a later holder (what a lease
    /// allows of a killed or paused holder).
    pub cut_off: usize,
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
            "| calls | keys | ok | in progress | payload mismatch | lease lost | failed | cut-off runs |"
        )?;
        writeln!(f, "|---|---|---|---|---|---|---|---|")?;
        writeln!(
            f,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            self.calls,
            self.keys,
            self.ok,
            self.in_progress,
            self.payload_mismatch,
            self.lease_lost,
            self.failed,
            self.cut_off
        )?;
        for anomaly in &self.anomalies {
            writeln!(f, "- {anomaly:?}")?;
        }
        Ok(())
    }
}

/// Judge a history: `calls` as the workers recorded them, `effects` as the business
/// holds them, `records`, each key's final record's answer (`None` when the record is
/// gone or not `SUCCESS`), and the processes a fault `cut_off`. A key's first payload
/// is the one its first `Ok` answer was given to.
pub fn check(
    calls: &[Call],
    effects: &[Effect],
    records: &HashMap<String, Option<String>>,
    cut_off: &HashSet<String>,
) -> Verdict {
    let mut verdict = Verdict {
        calls: calls.len(),
        ..Verdict::default()
    };
    let mut by_key: BTreeMap<&str, Vec<&Call>> = BTreeMap::new();
    for call in calls {
        by_key.entry(&call.key).or_default().push(call);
        match &call.answer {
            Answer::Ok(_) => verdict.ok += 1,
            Answer::InProgress => verdict.in_progress += 1,
            Answer::PayloadMismatch => verdict.payload_mismatch += 1,
            Answer::LeaseLost => verdict.lease_lost += 1,
            Answer::Failed(_) => verdict.failed += 1,
        }
    }
    verdict.keys = by_key.len();
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
            .filter(|effect| {
                answered.is_some_and(|token| *token == &effect.token) || !cut_off.contains(&effect.process)
            })
            .collect();
        // Runs a fault cut off, beyond the one that stands (when all of them were).
        verdict.cut_off += effects.len() - standing.len().max(1);
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

    /// Each anomaly the checker exists for, found in a history that has it.
    #[test]
    fn finds_every_kind_of_anomaly() {
        let calls = vec![
            Call::new("twice", "p", "w1", Answer::Ok("a".into())),
            Call::new("other", "p", "w1", Answer::Ok("x".into())),
            Call::new("other", "p", "w2", Answer::Ok("y".into())),
            Call::new("payload", "p", "w1", Answer::Ok("q".into())),
            Call::new("payload", "not-p", "w2", Answer::Ok("q".into())),
            Call::new("lost", "p", "w1", Answer::Ok("l".into())),
            Call::new("ghost", "p", "w1", Answer::Ok("g".into())),
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
        // w3 was cut off: its run of `fence` is excused, not its fence shared with w1's.
        let cut_off = ["w3".to_owned()].into();
        let verdict = check(&calls, &effects, &records, &cut_off);
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
        ] {
            assert!(kinds.iter().any(|k| k == kind), "{kind} not found: {verdict}");
        }
        assert!(!verdict.valid());
        assert_eq!(verdict.cut_off, 1);
    }

    /// A history with faults but no anomaly is valid: fenced-out effects, lost leases,
    /// cut-off calls and refused payloads are what faults legitimately cause.
    #[test]
    fn a_faulty_but_correct_history_is_valid() {
        let calls = vec![
            Call::new("k", "p", "w1#1", Answer::Failed("killed".into())),
            Call::new("k", "p", "w2#1", Answer::InProgress),
            Call::new("k", "p", "w3#1", Answer::Ok("t2".into())),
            Call::new("k", "p", "w1#2", Answer::Ok("t2".into())),
            Call::new("k", "p2", "w4#1", Answer::PayloadMismatch),
            Call::new("j", "p", "w2#1", Answer::LeaseLost),
        ];
        // w1's first incarnation was killed mid-body; w3 took the key over and answered.
        let effects = vec![effect("k", "t1", 10, "w1#1"), effect("k", "t2", 11, "w3#1")];
        let records = [("k".to_owned(), Some("t2".to_owned()))].into();
        let cut_off = ["w1#1".to_owned()].into();
        let verdict = check(&calls, &effects, &records, &cut_off);
        assert!(verdict.valid(), "{verdict}");
        assert_eq!((verdict.calls, verdict.keys, verdict.ok, verdict.cut_off), (6, 2, 2, 1));
        // Had no fault touched w1, its run and w3's are a double execution.
        let verdict = check(&calls, &effects, &records, &HashSet::new());
        assert!(
            matches!(verdict.anomalies.as_slice(), [Anomaly::EffectTwice { .. }]),
            "{verdict}"
        );
    }
}
