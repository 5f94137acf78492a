//! What a call costs in round trips to its store — a replay as many as one read of a
//! row by its key, a first execution as many as two statements (the claim, the
//! record) — and what the claim that reads in the same statement makes of the record
//! it read.

use std::future::Future;
use std::time::Duration;

use idem::store::{Claim, ClaimOutcome, FenceCheck};
use idem::{Error, Idempotent, Status};

use super::calls::Store;
use super::unique;

/// How many duplicates a store may see before it expects them, and answers them in
/// one round trip.
const WARM_UP: usize = 8;

/// How many duplicates more make a storm, in which nearly every claim meets a record
/// and the store reads first.
const STORM: usize = 40;

/// Once a store has met duplicates, a replay costs the round trips of `read` (one
/// statement reading a row by its key on the store's own pool or connection, with
/// whatever the pool adds to a statement, such as sqlx's ping when a connection goes
/// back), and a first execution twice that; so does a claim of a running call from a
/// caller whose clock runs five minutes ahead (`store` judges leases by its server's
/// clock, so what it read is judged at the server's instant, and stands). In a storm of
/// duplicates, when the store reads first, a replay and the claim of the caller ahead
/// still cost one read, and a first execution at most three. `store` talks to its
/// server only over connections whose round trips `round_trips` counts (a pool of one
/// connection through a [`Link`](crate::harness::link::Link)).
pub async fn a_replay_takes_one_round_trip<R, F>(store: Store, round_trips: impl Fn() -> u64, read: R)
where
    R: Fn() -> F,
    F: Future<Output = ()>,
{
    let round_trips = &round_trips;
    let counted = |before: u64| round_trips() - before;
    read().await;
    let before = round_trips();
    read().await;
    let one = counted(before);
    assert!(one >= 1, "a read went past the counted connections");

    let biz = unique("round-trips");
    let op = Idempotent::new(biz.clone()).store(store.clone());
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

    let ahead_of_a_running_call = |key: &'static str| {
        let (store, biz) = (store.clone(), biz.clone());
        async move {
            let now = idem::store::now();
            let claim = |at| Claim::new(&biz, key, at, Duration::from_secs(30), Duration::from_secs(3600));
            let granted = store.claim(&claim(now)).await.expect("the claim is answered");
            assert!(matches!(granted, ClaimOutcome::Acquired(_)), "{granted:?}");
            let before = round_trips();
            let ahead = store.claim(&claim(now + Duration::from_secs(300))).await;
            let took = counted(before);
            assert!(
                matches!(&ahead, Ok(ClaimOutcome::Existing(record)) if record.status == Status::Processing),
                "the running call was not answered to a caller ahead: {ahead:?}"
            );
            took
        }
    };
    let ahead = ahead_of_a_running_call("running").await;
    assert_eq!(
        ahead, one,
        "a claim of a running call took {ahead} round trips, one statement {one}"
    );

    // A storm: the store reads first.
    for _ in 0..STORM {
        assert_eq!(call("paid").await.expect("the call is answered"), 7);
    }
    let before = round_trips();
    assert_eq!(call("paid").await.expect("the replay is answered"), 7);
    let replay = counted(before);
    assert_eq!(
        replay, one,
        "in a storm a replay took {replay} round trips, one statement {one}"
    );
    let before = round_trips();
    assert_eq!(
        call("new-in-a-storm").await.expect("the first execution is answered"),
        7
    );
    let first = counted(before);
    assert!(
        first <= 3 * one,
        "in a storm a first execution took {first} round trips, one statement {one}"
    );
    let ahead = ahead_of_a_running_call("running-in-a-storm").await;
    assert_eq!(
        ahead, one,
        "in a storm a claim of a running call took {ahead} round trips, one statement {one}"
    );
}

/// The round trips counted by `round_trips` so far, once they have stopped coming (a
/// pool pings a connection as it goes back, after the call returned).
async fn settled(round_trips: &impl Fn() -> u64) -> u64 {
    let mut last = round_trips();
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = round_trips();
        if now == last {
            return now;
        }
        last = now;
    }
}

/// A store on the pool its own `connect` made lends a connection that went back moments
/// ago without a ping: a replay costs one round trip fewer than `read` (one statement
/// on a pool with sqlx's defaults, which pings every connection it lends). A connection
/// idle for `idle_for` or longer is pinged first, so one that died meanwhile — `sever`
/// closes every connection under the pool — is replaced, and the next call is
/// answered. `store` talks to its server only over connections whose round trips
/// `round_trips` counts.
pub async fn a_connection_used_moments_ago_is_lent_without_a_ping<R, F>(
    store: Store,
    round_trips: impl Fn() -> u64,
    read: R,
    sever: impl Fn(),
    idle_for: Duration,
) where
    R: Fn() -> F,
    F: Future<Output = ()>,
{
    read().await;
    let before = settled(&round_trips).await;
    read().await;
    let pinged = settled(&round_trips).await - before;
    assert!(
        pinged >= 2,
        "a statement on sqlx's default pool took {pinged} round trips, not a ping and itself"
    );

    let op = Idempotent::new(unique("lent-without-a-ping")).store(store);
    let call = || op.execute("paid", async { Ok::<_, Error>(7_u32) });
    for _ in 0..=WARM_UP {
        assert_eq!(call().await.expect("the call is answered"), 7);
    }
    // The fewest of a few replays: a connection the pool opened lately prepares the
    // statement first, one round trip more.
    let mut replay = u64::MAX;
    for _ in 0..3 {
        let before = settled(&round_trips).await;
        assert_eq!(call().await.expect("the replay is answered"), 7);
        replay = replay.min(settled(&round_trips).await - before);
    }
    assert_eq!(
        replay,
        pinged - 1,
        "a replay on a connection used moments ago took {replay} round trips; a statement on sqlx's default pool, \
         which pings first, {pinged}"
    );

    sever();
    tokio::time::sleep(idle_for + Duration::from_millis(200)).await;
    let after = call().await;
    assert_eq!(
        after.expect(
            "a call after every pooled connection died while idle is answered (the idle one pinged and replaced)"
        ),
        7
    );
}

/// Once a store has met duplicates (a few, and again a storm of them, where every store
/// reads first), a claim that reads the record in its way (in its insert, or before
/// its claim statement) judges it as a read's would be: a running
/// claim stands — with `server_clock` (`store` judges leases by its server's clock),
/// also for a caller five minutes ahead of it; a lapsed lease and an expired record
/// are taken over, at a higher fence. `lapse(key)` ends the lease of `key`'s record
/// and `expire(key)` its life, by hand.
pub async fn the_insert_that_reads_judges_what_it_read<L, LF, E, EF>(
    store: Store,
    server_clock: bool,
    lapse: L,
    expire: E,
) where
    L: Fn(String) -> LF,
    LF: Future<Output = ()>,
    E: Fn(String) -> EF,
    EF: Future<Output = ()>,
{
    let biz = unique("insert-and-read");
    // Once after the warm-up, where the claim's insert reads (or the claim reads first
    // where no insert can read), and once in a storm, where every store reads first.
    for duplicates in [WARM_UP, STORM] {
        judges_what_it_read(&store, &biz, duplicates, server_clock, &lapse, &expire).await;
    }
}

/// [`the_insert_that_reads_judges_what_it_read`] after `duplicates` duplicates.
async fn judges_what_it_read<L, LF, E, EF>(
    store: &Store,
    biz: &str,
    duplicates: usize,
    server_clock: bool,
    lapse: &L,
    expire: &E,
) where
    L: Fn(String) -> LF,
    LF: Future<Output = ()>,
    E: Fn(String) -> EF,
    EF: Future<Output = ()>,
{
    let [running, lapsed, expired] = ["running", "lapsed", "expired"].map(unique);
    let now = idem::store::now();
    let claim = |key: &str, at| {
        let (store, biz, key) = (store.clone(), biz.to_owned(), key.to_owned());
        async move {
            let claim = Claim::new(&biz, &key, at, Duration::from_secs(30), Duration::from_secs(3600));
            store.claim(&claim).await.expect("the claim is answered")
        }
    };
    let acquired = |outcome| match outcome {
        ClaimOutcome::Acquired(lease) => lease,
        other => panic!("after {duplicates} duplicates, expected the key granted, got {other:?}"),
    };
    let running_lease = acquired(claim(&running, now).await);
    let lapsed_lease = acquired(claim(&lapsed, now).await);
    let expired_lease = acquired(claim(&expired, now).await);
    for _ in 0..duplicates {
        assert!(matches!(claim(&running, now).await, ClaimOutcome::Existing(_)));
    }

    let ahead = if server_clock {
        now + Duration::from_secs(300)
    } else {
        now
    };
    let ahead = claim(&running, ahead).await;
    assert!(
        matches!(&ahead, ClaimOutcome::Existing(record) if record.status == Status::Processing && record.fence == running_lease.fence),
        "a running claim was not answered to a caller ahead: {ahead:?}"
    );

    lapse(lapsed.clone()).await;
    let taken = acquired(claim(&lapsed, now).await);
    assert!(
        taken.fence > lapsed_lease.fence,
        "a lapsed lease is taken over at a higher fence"
    );

    let completed = store.complete(&expired_lease, "\"done\"", now, Duration::from_secs(3600));
    assert_eq!(completed.await.expect("the completion is recorded"), FenceCheck::Held);
    expire(expired.clone()).await;
    let renewed = acquired(claim(&expired, now).await);
    assert!(
        renewed.fence > expired_lease.fence,
        "an expired record is claimed anew at a higher fence"
    );
}

/// Generate two tests for the SQL store `$store` on the server at the URL in `$var`
/// (`$backend` names it when the variable is unset), its round trips counted by a
/// [`Link`](crate::harness::link::Link) that takes over the port of the `$options`
/// (connect options), `$read` — a `SELECT` binding a biz and a key — the statement a
/// replay is held to: `a_replay_takes_one_round_trip`, the store made with
/// `<$store>::new(pool)` on a pool of one connection (`$pool` options); and
/// `a_connection_used_moments_ago_is_lent_without_a_ping`, the store made by
/// `<$store>::connect`, against `$read` on a pool with sqlx's defaults. The crate using
/// it names `idem_store_sqlx`. Needs feature `harness`.
#[macro_export]
macro_rules! sql_round_trip_test {
    ($store:ty, $options:ty, $pool:ty, $var:literal, $backend:literal, $read:literal) => {
        #[tokio::test]
        async fn a_replay_takes_one_round_trip() {
            let Some(url) = $crate::conformance::server_url($var, $backend) else {
                return;
            };
            let options: $options = url.parse().expect("the test URL parses");
            let link = $crate::harness::link::Link::to(options.get_port()).await;
            let pool = <$pool>::new()
                .max_connections(1)
                .connect_with(options.port(link.port()))
                .await
                .expect("connect through the link");
            let store = <$store>::new(pool.clone());
            store.migrate().await.expect("migrate");
            let read = || async {
                idem::sqlx::query($read)
                    .bind("b")
                    .bind("k")
                    .fetch_optional(&pool)
                    .await
                    .expect("read a row by its key");
            };
            let store = std::sync::Arc::new(store);
            $crate::conformance::round_trips::a_replay_takes_one_round_trip(store, || link.round_trips(), read).await;
        }

        #[tokio::test]
        async fn a_connection_used_moments_ago_is_lent_without_a_ping() {
            let Some(url) = $crate::conformance::server_url($var, $backend) else {
                return;
            };
            let options: $options = url.parse().expect("the test URL parses");
            let port = options.get_port();
            let link = $crate::harness::link::Link::to(port).await;
            let through_link = url.replacen(&format!(":{port}/"), &format!(":{}/", link.port()), 1);
            assert_ne!(through_link, url, "the test's URL names its port: {url}");
            let store = <$store>::connect(&through_link)
                .await
                .expect("connect through the link");
            store.migrate().await.expect("migrate");
            let defaults = <$pool>::new()
                .max_connections(1)
                .connect_with(options.port(link.port()))
                .await
                .expect("connect through the link");
            let read = || async {
                idem::sqlx::query($read)
                    .bind("b")
                    .bind("k")
                    .fetch_optional(&defaults)
                    .await
                    .expect("read a row by its key");
            };
            let sever = || {
                link.cut();
                link.heal();
            };
            $crate::conformance::round_trips::a_connection_used_moments_ago_is_lent_without_a_ping(
                std::sync::Arc::new(store),
                || link.round_trips(),
                read,
                sever,
                idem_store_sqlx::PING_IF_IDLE_FOR,
            )
            .await;
        }
    };
}
