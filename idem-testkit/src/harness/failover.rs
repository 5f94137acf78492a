//! A storm of calls that goes on through a failover: tasks call the same keys, each call
//! retried until answered (as a client retries an error); what every body that finished
//! returned, and what every caller got, is kept to be checked afterwards.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem::{IdempotencyStore, Idempotent};

/// What a storm saw.
pub struct Storm {
    /// When the storm began: the instants in `attempts` are counted from it.
    began: Instant,
    /// Every call's attempts, by key: who called, when it started and ended, and what
    /// it came to, so that a key that ran twice can be told step by step.
    attempts: Mutex<HashMap<usize, Vec<Attempt>>>,
    /// What each body that finished returned, by key.
    finished: Mutex<HashMap<usize, Vec<String>>>,
    /// What each caller got.
    answers: Mutex<Vec<(usize, String)>>,
    /// Calls that failed (and were retried).
    pub errors: AtomicUsize,
    /// What they failed with (the whole chain), how often each.
    failures: Mutex<std::collections::BTreeMap<String, usize>>,
}

/// One attempt of one call.
#[derive(Clone, Debug)]
struct Attempt {
    task: String,
    started: Duration,
    ended: Duration,
    outcome: String,
}

impl Storm {
    /// `tasks` tasks call `keys` keys (`k0`, `k1`, …) through `op`: two tasks start on
    /// each key together, the others meet it later. An error is retried after 50 ms, for
    /// up to a minute per key.
    ///
    /// The tasks share `op`'s store handle, so they share this process's claim gate:
    /// the callers of a key send one claim at a time, and the others take its outcome,
    /// as one service process's would. To have the store meet their claims at once, as
    /// it meets those of separate processes, give each its own handle:
    /// [`start_workers`](Self::start_workers).
    pub fn start(op: Arc<Idempotent>, tasks: usize, keys: usize) -> (Arc<Storm>, Vec<tokio::task::JoinHandle<()>>) {
        Self::start_workers(vec![op; tasks], keys)
    }

    /// [`start`](Self::start) with a task for each of `ops`, each through its own
    /// operation: operations on separate store handles (`Arc::new(store.clone())`
    /// each) claim at the store as separate processes do.
    /// ([`start_apart`](Self::start_apart) makes such operations.)
    pub fn start_workers(ops: Vec<Arc<Idempotent>>, keys: usize) -> (Arc<Storm>, Vec<tokio::task::JoinHandle<()>>) {
        let tasks = ops.len();
        let storm = Arc::new(Storm {
            began: Instant::now(),
            attempts: Mutex::default(),
            finished: Mutex::default(),
            answers: Mutex::default(),
            errors: AtomicUsize::new(0),
            failures: Mutex::default(),
        });
        let handles = ops
            .into_iter()
            .enumerate()
            .map(|(task, op)| {
                let storm = storm.clone();
                tokio::spawn(async move {
                    for i in 0..keys {
                        let k = (i + task / 2 * keys / (tasks / 2).max(1)) % keys;
                        storm.call(&op, k, format!("{task}.{k}")).await;
                    }
                })
            })
            .collect();
        (storm, handles)
    }

    /// [`start_workers`](Self::start_workers) with `tasks` operations, each made by `op`
    /// on a handle of its own of `store` (a clone of it: the same pool or connection,
    /// another claim gate), so that the callers of a key meet at the store, as separate
    /// processes' claims do: what a failover storm must put to the store's own claim.
    ///
    /// # Panics
    ///
    /// When the clones of `store` are one store (an `Arc` of one, whose clones forward
    /// to it): the tasks would share one claim gate.
    pub fn start_apart<S>(
        store: &S,
        tasks: usize,
        keys: usize,
        op: impl Fn(Arc<dyn IdempotencyStore>) -> Idempotent,
    ) -> (Arc<Storm>, Vec<tokio::task::JoinHandle<()>>)
    where
        S: IdempotencyStore + Clone + 'static,
    {
        let handles: Vec<Arc<dyn IdempotencyStore>> = (0..tasks).map(|_| Arc::new(store.clone()) as _).collect();
        // A store whose clones are one store (an `Arc` of one) would give every task
        // one claim gate: the storm would put nothing to the store's own claim.
        let instances: std::collections::HashSet<_> = handles.iter().map(|handle| handle.instance()).collect();
        assert_eq!(
            instances.len(),
            tasks,
            "the clones of the store are one store (an `Arc` of one?): give `start_apart` the store itself"
        );
        let ops = handles.into_iter().map(|handle| Arc::new(op(handle))).collect();
        Self::start_workers(ops, keys)
    }

    async fn call(self: &Arc<Self>, op: &Idempotent, k: usize, token: String) {
        let since = Instant::now();
        loop {
            let (storm, body_token) = (self.clone(), token.clone());
            let started = self.began.elapsed();
            let outcome: Result<String, idem::Error> = op
                .execute(&format!("k{k}"), async move {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    storm
                        .finished
                        .lock()
                        .unwrap()
                        .entry(k)
                        .or_default()
                        .push(body_token.clone());
                    Ok(body_token)
                })
                .await;
            self.attempts.lock().unwrap().entry(k).or_default().push(Attempt {
                task: token.clone(),
                started,
                ended: self.began.elapsed(),
                outcome: match &outcome {
                    Ok(answer) => format!("answered {answer}"),
                    Err(error) => idem::error_chain(error),
                },
            });
            match outcome {
                Ok(answer) => {
                    self.answers.lock().unwrap().push((k, answer));
                    return;
                }
                Err(idem::Error::InProgress { .. }) => {}
                Err(error) => {
                    self.errors.fetch_add(1, Ordering::SeqCst);
                    *self
                        .failures
                        .lock()
                        .unwrap()
                        .entry(idem::error_chain(&error))
                        .or_default() += 1;
                    assert!(since.elapsed() < Duration::from_secs(60), "key {k}: {error}");
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// What the calls that failed failed with (each error's whole chain), and how often.
    pub fn failures(&self) -> Vec<(String, usize)> {
        self.failures
            .lock()
            .unwrap()
            .iter()
            .map(|(e, n)| (e.clone(), *n))
            .collect()
    }

    /// Key `k`'s attempts, one a line, in the order they ended.
    fn told(&self, k: usize) -> String {
        let attempts = self.attempts.lock().unwrap();
        // A caller's attempts in a row that came to the same are one line.
        let mut runs: Vec<(Attempt, usize)> = Vec::new();
        let mut latest: HashMap<&str, usize> = HashMap::new();
        for a in attempts.get(&k).map(Vec::as_slice).unwrap_or_default() {
            match latest.get(a.task.as_str()).map(|&i| &mut runs[i]) {
                Some((last, n)) if last.outcome == a.outcome => {
                    last.ended = a.ended;
                    *n += 1;
                }
                _ => {
                    latest.insert(&a.task, runs.len());
                    runs.push((a.clone(), 1));
                }
            }
        }
        let line = |(a, n): &(Attempt, usize)| {
            format!("  {} {:.3?}..{:.3?} ({n}×): {}", a.task, a.started, a.ended, a.outcome)
        };
        runs.iter().map(line).collect::<Vec<_>>().join("\n")
    }

    /// The call that took longest, from its first attempt's start to its answer: its
    /// key, how long, and the key's attempts (as a failed check tells them) — where a
    /// storm that took long spent its time.
    pub fn slowest(&self) -> Option<(usize, Duration, String)> {
        let (k, took) = {
            let attempts = self.attempts.lock().unwrap();
            let mut calls: HashMap<(usize, &str), (Duration, Duration)> = HashMap::new();
            for (k, attempts) in attempts.iter() {
                for a in attempts {
                    let call = calls.entry((*k, a.task.as_str())).or_insert((a.started, a.ended));
                    *call = (call.0.min(a.started), call.1.max(a.ended));
                }
            }
            calls
                .into_iter()
                .map(|((k, _), (start, end))| (k, end.saturating_sub(start)))
                .max_by_key(|(_, took)| *took)?
        };
        Some((k, took, self.told(k)))
    }

    /// Answers given so far.
    pub fn answered(&self) -> usize {
        self.answers.lock().unwrap().len()
    }

    /// Wait for every task, failing past `bound` (a commit waiting forever would hang it).
    pub async fn join(handles: Vec<tokio::task::JoinHandle<()>>, bound: Duration) {
        tokio::time::timeout(bound, async {
            for handle in handles {
                handle.await.unwrap();
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the storm did not end within {bound:?}"));
    }

    /// Every call was answered; every key's body finished once; every answer is what
    /// that body returned; `store` (read after the failover) holds it as `SUCCESS`.
    pub async fn check(&self, tasks: usize, keys: usize, biz: &str, store: &dyn IdempotencyStore) {
        let finished = self.finished.lock().unwrap().clone();
        let answers = self.answers.lock().unwrap().clone();
        assert_eq!(answers.len(), tasks * keys, "every call was answered in the end");
        for k in 0..keys {
            let runs = finished.get(&k).map(Vec::as_slice).unwrap_or_default();
            assert_eq!(
                runs.len(),
                1,
                "key {k}: the body finished {} times: {runs:?}; its attempts:\n{}",
                runs.len(),
                self.told(k)
            );
        }
        for (k, answer) in &answers {
            assert_eq!(
                answer, &finished[k][0],
                "key {k}: a caller got another answer than the body's"
            );
        }
        for k in 0..keys {
            let record = store.get(biz, &format!("k{k}")).await.unwrap().expect("record kept");
            assert_eq!(record.status, idem::Status::Succeeded, "key {k}");
            assert_eq!(
                record.response_body,
                Some(format!("\"{}\"", finished[&k][0])),
                "key {k}"
            );
        }
    }
}
