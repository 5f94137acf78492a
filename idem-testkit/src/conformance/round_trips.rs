//! What a call costs in round trips to its store: a replay as many as one read of a
//! row by its key, a first execution as many as two statements (the claim, the
//! record).

use std::future::Future;

use idem::{Error, Idempotent};

use super::calls::Store;
use super::unique;

/// How many duplicates a store may see before it expects them, and answers them in
/// one round trip.
const WARM_UP: usize = 8;

/// Once a store has met duplicates, a replay costs the round trips of `read` (one
/// statement reading a row by its key on the store's own pool or connection, with
/// whatever the pool adds to a statement, such as sqlx's ping when a connection goes
/// back), and a first execution twice that. `store` talks to its server only over
/// connections whose round trips `round_trips` counts (a pool of one connection
/// through a [`Link`](crate::harness::link::Link)).
pub async fn a_replay_takes_one_round_trip<R, F>(store: Store, round_trips: impl Fn() -> u64, read: R)
where
    R: Fn() -> F,
    F: Future<Output = ()>,
{
    let counted = |before: u64| round_trips() - before;
    read().await;
    let before = round_trips();
    read().await;
    let one = counted(before);
    assert!(one >= 1, "a read went past the counted connections");

    let op = Idempotent::new(unique("round-trips")).store(store);
    let call = |key: &'static str| op.execute(key, async { Ok::<_, Error>(7_u32) });
    // The first call also checks the table, and the duplicates teach the store.
    for _ in 0..=WARM_UP {
        assert_eq!(call("paid").await.expect("the call is answered"), 7);
    }
    let before = round_trips();
    assert_eq!(call("paid").await.expect("the replay is answered"), 7);
    let replay = counted(before);
    assert_eq!(replay, one, "a replay took {replay} round trips, one statement {one}");

    let before = round_trips();
    assert_eq!(call("new").await.expect("the first execution is answered"), 7);
    let first = counted(before);
    assert_eq!(
        first,
        2 * one,
        "a first execution took {first} round trips, one statement {one}"
    );
}
