//! The conformance suite on Redis 7 (`IDEM_TEST_REDIS_URL`; `.ci/start-databases`
//! starts one), the store-independent database scenarios, and the traps of Redis: a
//! script sent twice, an evicting server refused, a restart without persistence
//! (failing closed while it is down, fences going on above the old ones after).

use idem_testkit::conformance;
use idem_testkit::{conformance_suite, shared_store_suite, store_clock_suite};

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use conformance::calls::Store;
use idem::store::{Claim, ClaimOutcome, FenceCheck};
use idem::{redis, Error, IdempotencyStore, Idempotent, LeaseClock, RedisStore};

/// The suites move time by the instants they pass: the store judges by them.
async fn open() -> Option<RedisStore> {
    Some(open_on_store_clock().await?.with_lease_clock(LeaseClock::Caller))
}

/// The store as production runs it: leases judged by the server's clock (`TIME`).
async fn open_on_store_clock() -> Option<RedisStore> {
    let url = conformance::server_url("IDEM_TEST_REDIS_URL", "Redis")?;
    Some(RedisStore::connect(&url).await.expect("connect to Redis"))
}

store_clock_suite!(async { Some(Arc::new(open_on_store_clock().await?) as Store) });

/// A plain connection to the test server, to write or read a record by hand.
async fn connection() -> redis::aio::MultiplexedConnection {
    let url = std::env::var("IDEM_TEST_REDIS_URL").unwrap();
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn open_dyn() -> Option<Store> {
    Some(Arc::new(open().await?))
}

conformance_suite!(open_dyn());

shared_store_suite!();

#[tokio::test]
async fn record_survives_a_reconnect() {
    if open_dyn().await.is_some() {
        conformance::database::record_survives_a_restart(|| async { open_dyn().await.unwrap() }).await;
    }
}

#[tokio::test]
async fn purge_keeps_an_expired_claim_without_a_lease() {
    let Some(store) = open().await else { return };
    let edit = |set: &'static str, key: String| {
        let store = store.clone();
        async move {
            assert_eq!(
                set, "lease_until = NULL, expires_at = created_at",
                "the one edit this test makes"
            );
            let mut conn = connection().await;
            let record = store.record_key("conformance.pay", &key);
            let created_at: String = redis::cmd("HGET")
                .arg(&record)
                .arg("created_at")
                .query_async(&mut conn)
                .await
                .unwrap();
            let _: () = redis::pipe()
                .atomic()
                .cmd("HDEL")
                .arg(&record)
                .arg("lease_until")
                .cmd("HSET")
                .arg(&record)
                .arg("expires_at")
                .arg(created_at)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    };
    let shared: Store = Arc::new(store.clone());
    conformance::database::purge_keeps_an_expired_claim_without_a_lease(&shared, edit).await;
}

#[tokio::test]
async fn corrupted_response_is_a_decode_error() {
    let Some(store) = open().await else { return };
    let corrupt = |key: String| {
        let store = store.clone();
        async move {
            let mut conn = connection().await;
            let record = store.record_key("conformance.pay", &key);
            let _: () = redis::cmd("HSET")
                .arg(record)
                .arg("response_body")
                .arg("not json")
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    };
    let shared: Store = Arc::new(store.clone());
    conformance::database::corrupted_response_is_a_decode_error(&shared, corrupt).await;
}

/// A claim, and a `complete`, sent twice as a resending client would: the second send
/// answers what the first did and changes nothing.
#[tokio::test]
async fn scripts_sent_twice_apply_once() {
    let Some(store) = open().await else { return };
    let mut conn = connection().await;
    let key = store.record_key("redis.twice", &conformance::unique("k"));
    let micros = |length: Duration| length.as_micros().to_string();
    // The claim script's arguments, as `RedisStore::claim_script` documents them.
    let claim = |claimant: &'static str| {
        let mut claim = RedisStore::claim_script().prepare_invoke();
        claim
            .key(&key)
            .arg(micros(Duration::from_secs(30)))
            .arg(micros(Duration::from_secs(60)))
            .arg("")
            .arg("")
            .arg(claimant)
            .arg("1000000");
        claim
    };
    let first: Vec<String> = claim("claimant-1").invoke_async(&mut conn).await.unwrap();
    let again: Vec<String> = claim("claimant-1").invoke_async(&mut conn).await.unwrap();
    assert_eq!(first[0], "ACQUIRED");
    assert_eq!(again, first, "the same claim sent twice is granted once");
    let mut complete = RedisStore::write_script().prepare_invoke();
    complete
        .key(&key)
        .arg("complete")
        .arg(&first[1])
        .arg(&first[2])
        .arg("42")
        .arg(micros(Duration::from_secs(60)))
        .arg("1000000")
        .arg("writer-1");
    let applied: i64 = complete.invoke_async(&mut conn).await.unwrap();
    let resent: i64 = complete.invoke_async(&mut conn).await.unwrap();
    assert_eq!((applied, resent), (1, 1));
    // Another write call of the same lease and outcome is not this one sent again.
    let mut other_writer = RedisStore::write_script().prepare_invoke();
    other_writer
        .key(&key)
        .arg("complete")
        .arg(&first[1])
        .arg(&first[2])
        .arg("42")
        .arg(micros(Duration::from_secs(60)))
        .arg("1000000")
        .arg("writer-2");
    let refused: i64 = other_writer.invoke_async(&mut conn).await.unwrap();
    assert_eq!(refused, 0);
    let fence: String = redis::cmd("HGET")
        .arg(&key)
        .arg("fence")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(fence, first[1], "no second fence");
    // Another claimant's claim is refused by the record the first left.
    let refused: Vec<String> = claim("claimant-2").invoke_async(&mut conn).await.unwrap();
    assert_eq!(refused[0], "EXISTING");
}

/// A Redis server of the test's own, on a free port, without persistence.
struct OwnRedis {
    port: u16,
    child: Child,
}

impl OwnRedis {
    fn start(port: Option<u16>, extra: &[&str]) -> Self {
        let port = port.unwrap_or_else(|| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        });
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server on the PATH (.ci/start-databases installs it)");
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        OwnRedis { port, child }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Only under CI, or where redis-server is installed.
fn have_redis_server() -> bool {
    let found = Command::new("redis-server").arg("--version").output().is_ok();
    assert!(
        found || std::env::var_os("CI").is_none(),
        "CI needs redis-server on the PATH"
    );
    found
}

#[tokio::test]
async fn an_evicting_server_is_refused() {
    if !have_redis_server() {
        return;
    }
    let server = OwnRedis::start(None, &["--maxmemory-policy", "allkeys-lru"]);
    let error = RedisStore::connect(&server.url()).await.unwrap_err();
    assert!(error.to_string().contains("allkeys-lru"), "{error}");
    assert!(error.to_string().contains("noeviction"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_fails_closed_then_recovers_with_higher_fences() {
    if !have_redis_server() {
        return;
    }
    let mut server = OwnRedis::start(None, &["--maxmemory-policy", "noeviction"]);
    let store: Store = Arc::new(RedisStore::connect(&server.url()).await.unwrap());
    let op = Idempotent::new("redis.restart").store(store.clone());
    let before: u64 = op.execute("k", async { Ok::<_, Error>(1) }).await.unwrap();
    let fence_before = store.get("redis.restart", "k").await.unwrap().unwrap().fence;

    server.kill();
    let runs = std::sync::atomic::AtomicU32::new(0);
    let down: Result<u64, Error> = op
        .execute("k2", async {
            runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(2)
        })
        .await;
    assert!(matches!(down, Err(Error::Store { .. })), "{down:?}");
    assert_eq!(
        runs.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "nothing runs while Redis is down"
    );

    let _server = OwnRedis::start(Some(server.port), &["--maxmemory-policy", "noeviction"]);
    // The same store reconnects; the record died with the server (no persistence).
    let mut after = None;
    for _ in 0..50 {
        if let Ok(value) = op.execute("k", async { Ok::<_, Error>(3) }).await {
            after = Some(value);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        (before, after),
        (1, Some(3)),
        "a restart without persistence loses the record"
    );
    let fence_after = store.get("redis.restart", "k").await.unwrap().unwrap().fence;
    assert!(
        fence_after > fence_before,
        "fences go on above the lost ones: {fence_before} → {fence_after}"
    );
}

#[tokio::test]
async fn a_claim_on_a_live_lease_is_refused_and_a_lapsed_one_taken_over() {
    let Some(store) = open().await else { return };
    let biz = conformance::unique("redis.lease");
    let now = idem::store::now();
    let claim = Claim::new(&biz, "k", now, Duration::from_secs(30), Duration::from_secs(60));
    let ClaimOutcome::Acquired(lease) = store.claim(&claim).await.unwrap() else {
        panic!("first claim")
    };
    assert_eq!(lease.fence, claim.first_fence());
    assert!(matches!(store.claim(&claim).await.unwrap(), ClaimOutcome::Existing(_)));
    let later = Claim::new(
        &biz,
        "k",
        now + Duration::from_secs(31),
        Duration::from_secs(30),
        Duration::from_secs(60),
    );
    let ClaimOutcome::Acquired(taken) = store.claim(&later).await.unwrap() else {
        panic!("takeover")
    };
    assert_eq!((taken.fence, taken.created_at), (lease.fence + 1, lease.created_at));
    assert_eq!(
        store.complete(&lease, "1", now, Duration::from_secs(60)).await.unwrap(),
        FenceCheck::Lost
    );
}

/// A server that needs a password: the URL-only constructor is refused with Redis's
/// own answer, and a store on the application's own connection manager (password in
/// its client, timeouts of its own) claims, replays and fences as on any server — and
/// is still refused when that server may evict records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_built_client_reaches_a_password_protected_server() {
    if !have_redis_server() {
        return;
    }
    let server = OwnRedis::start(None, &["--maxmemory-policy", "noeviction", "--requirepass", "s3cret"]);
    let refused = RedisStore::connect(&server.url()).await.unwrap_err();
    assert!(
        refused.to_string().contains("NOAUTH") || format!("{refused:?}").contains("NOAUTH"),
        "{refused:?}"
    );

    let with_password = format!("redis://:s3cret@127.0.0.1:{}/0", server.port);
    let config = RedisStore::manager_config().set_response_timeout(Duration::from_secs(2));
    let manager = redis::Client::open(with_password.as_str())
        .unwrap()
        .get_connection_manager_with_config(config)
        .await
        .unwrap();
    let store: Store = Arc::new(RedisStore::from_manager(manager.clone()).await.unwrap());
    let op = Idempotent::new("redis.password").store(store.clone());
    let runs = std::sync::atomic::AtomicU32::new(0);
    let pay = || async {
        runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok::<_, Error>(19_900u64)
    };
    assert_eq!(op.execute("order-7", pay()).await.unwrap(), 19_900);
    assert_eq!(op.execute("order-7", pay()).await.unwrap(), 19_900, "replayed");
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);

    // A lease taken over is fenced out, through the user's client too.
    let now = idem::store::now();
    let claim = Claim::new(
        "redis.password",
        "k",
        now,
        Duration::from_millis(1),
        Duration::from_secs(60),
    );
    let ClaimOutcome::Acquired(first) = store.claim(&claim).await.unwrap() else {
        panic!("a new key")
    };
    tokio::time::sleep(Duration::from_millis(5)).await;
    let later = Claim::new(
        "redis.password",
        "k",
        idem::store::now(),
        Duration::from_secs(30),
        Duration::from_secs(60),
    );
    let ClaimOutcome::Acquired(second) = store.claim(&later).await.unwrap() else {
        panic!("taken over")
    };
    assert!(second.fence > first.fence);
    let stale = store
        .complete(&first, "\"late\"", idem::store::now(), Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(stale, FenceCheck::Lost);

    // The application's manager is still its own.
    let mut shared = manager;
    let pong: String = redis::cmd("PING").query_async(&mut shared).await.unwrap();
    assert_eq!(pong, "PONG");

    let evicting = OwnRedis::start(None, &["--maxmemory-policy", "volatile-lru", "--requirepass", "s3cret"]);
    let manager = redis::Client::open(format!("redis://:s3cret@127.0.0.1:{}/0", evicting.port))
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let error = RedisStore::from_manager(manager).await.unwrap_err();
    assert!(error.to_string().contains("volatile-lru"), "{error}");
}

/// A waiter on another store (as another process's would be) is told when the holder's
/// record finishes: the holder's write publishes, the waiter's subscriber hears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_elsewhere_is_told_when_the_record_finishes() {
    let Some(holding) = open_on_store_clock().await else {
        return;
    };
    let waiting = open_on_store_clock().await.unwrap();
    conformance::notices::a_waiter_elsewhere_is_told(Arc::new(holding), Arc::new(waiting)).await;
}

/// The waiter's subscriber loses its connection and cannot connect again while the
/// holder finishes: it subscribes as a user of its own, which is switched off and its
/// connection killed, then switched on again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_lost_its_connection_costs_a_read_not_an_answer() {
    let Some(url) = conformance::server_url("IDEM_TEST_REDIS_URL", "Redis") else {
        return;
    };
    let holding = open_on_store_clock().await.unwrap();
    let admin = connection().await;
    let run = |args: &'static [&'static str]| {
        let mut admin = admin.clone();
        async move {
            let () = redis::cmd(args[0])
                .arg(&args[1..])
                .query_async(&mut admin)
                .await
                .unwrap();
        }
    };
    let on: &'static [&'static str] = &["ACL", "SETUSER", "idem_watcher", "on", ">watching", "~*", "&*", "+@all"];
    run(on).await;
    let manager = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let watcher_url = url.replacen("redis://", "redis://idem_watcher:watching@", 1);
    let waiting = RedisStore::from_manager(manager)
        .await
        .unwrap()
        .listen_on(&watcher_url)
        .unwrap();
    let cut = || async {
        run(&["ACL", "SETUSER", "idem_watcher", "off"]).await;
        let killed: i64 = redis::cmd("CLIENT")
            .arg(&["KILL", "USER", "idem_watcher"])
            .query_async(&mut admin.clone())
            .await
            .unwrap();
        assert_eq!(killed, 1, "one subscriber of the waiter's store");
    };
    let mend = || run(on);
    conformance::notices::a_lost_notice_costs_a_read(Arc::new(holding), Arc::new(waiting), cut, mend).await;
}

/// A replay is one script, as long in round trips as one `HGETALL` on a connection of
/// its own; a first execution two scripts. Counted by a link in front of the server.
#[tokio::test]
async fn a_replay_takes_one_round_trip() {
    let Some(url) = conformance::server_url("IDEM_TEST_REDIS_URL", "Redis") else {
        return;
    };
    let target = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection_info()
        .addr
        .clone();
    let redis::ConnectionAddr::Tcp(_, port) = target else {
        panic!("the test server is on TCP")
    };
    let link = idem_testkit::harness::link::Link::to(port).await;
    let through = format!("redis://127.0.0.1:{}/0", link.port());
    let store = RedisStore::connect(&through).await.expect("connect through the link");
    let reading = redis::Client::open(through).unwrap();
    let reader = reading.get_multiplexed_async_connection().await.unwrap();
    let read = || {
        let mut reader = reader.clone();
        async move {
            let _: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
                .arg("idem:{1:b:k}")
                .query_async(&mut reader)
                .await
                .unwrap();
        }
    };
    conformance::round_trips::a_replay_takes_one_round_trip(Arc::new(store), || link.round_trips(), read).await;
}

/// In a storm of duplicates a replay runs no script: its claim reads the record and the
/// server's clock in one pipeline, and answers from them. Shown by taking the scripts
/// away from the store's user once the storm is on: the replays are still answered.
#[tokio::test]
async fn a_storm_of_duplicates_is_answered_without_a_script() {
    let Some(url) = conformance::server_url("IDEM_TEST_REDIS_URL", "Redis") else {
        return;
    };
    let admin = connection().await;
    let acl = |args: &'static [&'static str]| {
        let mut admin = admin.clone();
        async move {
            let () = redis::cmd("ACL").arg(args).query_async(&mut admin).await.unwrap();
        }
    };
    acl(&["SETUSER", "idem_storm", "on", ">storming", "~*", "&*", "+@all"]).await;
    let store = RedisStore::connect(&url.replacen("redis://", "redis://idem_storm:storming@", 1))
        .await
        .unwrap();
    let op = Idempotent::new(conformance::unique("storm")).store(Arc::new(store));
    let call = || op.execute("paid", async { Ok::<_, Error>(7_u32) });
    for _ in 0..50 {
        assert_eq!(call().await.unwrap(), 7);
    }
    acl(&["SETUSER", "idem_storm", "-@scripting"]).await;
    let mut replays = Vec::new();
    for _ in 0..10 {
        replays.push(call().await);
    }
    acl(&["DELUSER", "idem_storm"]).await;
    for replay in replays {
        assert_eq!(replay.expect("a replay in a storm runs no script"), 7);
    }
}
