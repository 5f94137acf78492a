//! `RedisStore`: connecting, the key layout, and the store trait over the scripts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime};

use idem_runtime::redacted_url as redacted;
use idem_runtime::{Claim, ClaimOutcome, FenceCheck, IdempotencyStore, Lease, LeaseClock, Record, StoreError};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::Script;

use crate::connection::Connection;
use crate::notice::Listener;
use crate::record::{decode, micros};
use idem_runtime::duplicates::{Duplicates, FirstLook};

/// Where every record key starts by default.
pub const DEFAULT_PREFIX: &str = "idem:";

/// How long Redis keeps a record after it expired (or its lease ended), by default:
/// until then it answers as an expired record does in a SQL table (its fence goes on
/// from where it was), and [`purge_expired`](IdempotencyStore::purge_expired) may
/// delete it sooner.
pub const DEFAULT_KEEP_EXPIRED: Duration = Duration::from_secs(24 * 3600);

/// How often a script whose reply was lost is sent again before the error is returned.
const SENDS: usize = 3;

fn script(source: &str) -> Script {
    Script::new(&format!("{}\n{source}", include_str!("lua/common.lua")))
}

/// The claim: insert, take over, or answer the record in the way.
static CLAIM: LazyLock<Script> = LazyLock::new(|| script(include_str!("lua/claim.lua")));
/// The holder's writes, each checking its fence and life.
static WRITE: LazyLock<Script> = LazyLock::new(|| script(include_str!("lua/write.lua")));
/// The deletion of one expired record.
static PURGE: LazyLock<Script> = LazyLock::new(|| script(include_str!("lua/purge.lua")));
/// A record's values rewritten if it is as it was read.
static REPLACE: LazyLock<Script> = LazyLock::new(|| script(include_str!("lua/replace.lua")));
/// The erasure of one record of a data subject.
static ERASE: LazyLock<Script> = LazyLock::new(|| script(include_str!("lua/erase.lua")));

/// Idempotency records in Redis: one hash per record, every change one Lua script.
///
/// See the [crate docs](crate) for the key layout and what Redis's durability means
/// for a claim.
#[derive(Debug, Clone)]
pub struct RedisStore {
    conn: Connection,
    prefix: Arc<str>,
    /// The channel the holders' ends of this store's records are published on: the
    /// prefix's.
    channel: Arc<str>,
    keep_expired: Duration,
    lease_clock: LeaseClock,
    /// Where the completion notices of its waiters come from.
    listener: Listener,
    /// How often its claims meet a record: in a storm of duplicates, a claim reads first.
    duplicates: Arc<Duplicates>,
}

/// A holder write, as `write.lua` names it.
enum Write<'a> {
    /// The lease's new length.
    Renew(Duration),
    /// The response, and how long the record answers from now.
    Complete(&'a str, Duration),
    /// The message, and how long the record answers from now.
    Fail(&'a str, Duration),
    Release,
    Steps(&'a str),
}

impl RedisStore {
    /// Connect to one Redis server (`redis://127.0.0.1:6379/0`) through a
    /// `ConnectionManager` configured by [`manager_config`](Self::manager_config), and
    /// check that it will not evict records.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, Self::manager_config()).await
    }

    /// [`connect`](Self::connect) with a `ConnectionManager` configured by `config`.
    pub async fn connect_with(url: &str, config: ConnectionManagerConfig) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(|e| failed(&format!("opening {}", redacted(url)), e))?;
        let conn = client
            .get_connection_manager_with_config(config)
            .await
            .map_err(|e| failed(&format!("connecting to {}", redacted(url)), e))?;
        let store = Self::checked(Connection::Single(conn)).await?;
        Ok(store.listening_on(vec![client]))
    }

    /// The store's default connection settings: a call to a server that is down fails
    /// within about a second (2 reconnection attempts, 50 then 100 ms apart, 1 s to
    /// connect) instead of redis's default 6 attempts over 12 s, and a reply that takes
    /// over 5 s counts as lost (the script is then sent again, safely). A store fails
    /// closed: no claim, no body.
    pub fn manager_config() -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_number_of_retries(2)
            .set_factor(50)
            .set_max_delay(1000)
            .set_connection_timeout(Duration::from_secs(1))
            .set_response_timeout(Duration::from_secs(5))
    }

    /// Connect to a Redis Cluster through any of its nodes, and check that no primary
    /// will evict records.
    pub async fn connect_cluster(urls: &[&str]) -> Result<Self, StoreError> {
        let shown = urls.iter().map(|url| redacted(url)).collect::<Vec<_>>().join(", ");
        let client = redis::cluster::ClusterClient::new(urls.to_vec())
            .map_err(|e| failed(&format!("opening the cluster {shown}"), e))?;
        let conn = client
            .get_async_connection()
            .await
            .map_err(|e| failed(&format!("connecting to the cluster {shown}"), e))?;
        let store = Self::checked(Connection::Cluster(conn)).await?;
        // A publish reaches every node of a cluster: any of them tells.
        let servers = urls
            .iter()
            .map(|url| redis::Client::open(*url))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| failed(&format!("opening the cluster {shown}"), e))?;
        Ok(store.listening_on(servers))
    }

    /// Subscribe to the completions of the records on `url` (one server, or a node of
    /// the cluster), for a store made [`from_manager`](Self::from_manager) or
    /// [`from_cluster`](Self::from_cluster): its waiters are then told when a record
    /// they wait for finishes in another process, instead of reading it on a schedule.
    /// ([`connect`](Self::connect) and [`connect_cluster`](Self::connect_cluster)
    /// subscribe on their own URLs.) The subscription is one connection of its own,
    /// opened at the first wait.
    pub fn listen_on(self, url: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(|e| failed(&format!("opening {}", redacted(url)), e))?;
        Ok(self.listening_on(vec![client]))
    }

    fn listening_on(mut self, servers: Vec<redis::Client>) -> Self {
        self.listener = Listener::on(servers);
        self
    }

    /// The channel of the records under `prefix`.
    fn channel_of(prefix: &str) -> Arc<str> {
        format!("{prefix}notices").into()
    }

    /// A store on the application's own connection manager — built with the password,
    /// TLS, timeouts and retries the deployment needs, and perhaps shared with the
    /// application — after checking that the server will not evict records.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_store_redis::{redis, RedisStore};
    ///
    /// let client = redis::Client::open("redis://:s3cret@10.0.0.7:6379/0")?;
    /// let config = RedisStore::manager_config().set_response_timeout(std::time::Duration::from_secs(2));
    /// let manager = client.get_connection_manager_with_config(config).await?;
    /// let store = RedisStore::from_manager(manager.clone()).await?; // the application keeps `manager`
    /// # Ok(()) }
    /// ```
    pub async fn from_manager(manager: ConnectionManager) -> Result<Self, StoreError> {
        Self::checked(Connection::Single(manager)).await
    }

    /// A store on the application's own Redis Cluster connection (from a
    /// `redis::cluster::ClusterClientBuilder` with the password, TLS and timeouts the
    /// deployment needs), after checking that no primary will evict records.
    pub async fn from_cluster(conn: ClusterConnection) -> Result<Self, StoreError> {
        Self::checked(Connection::Cluster(conn)).await
    }

    async fn checked(conn: Connection) -> Result<Self, StoreError> {
        let store = RedisStore {
            conn,
            prefix: DEFAULT_PREFIX.into(),
            channel: Self::channel_of(DEFAULT_PREFIX),
            keep_expired: DEFAULT_KEEP_EXPIRED,
            lease_clock: LeaseClock::Store,
            listener: Listener::default(),
            duplicates: Arc::default(),
        };
        store.check_eviction_policy().await?;
        Ok(store)
    }

    /// Refuse a server whose `maxmemory-policy` may evict keys: an evicted record is a
    /// claim silently gone, and the next duplicate would run again. Only `noeviction`
    /// (Redis answers writes with an error when full) is accepted. The `volatile-*`
    /// policies are refused too: they evict keys that have a time to live, and every
    /// record has one (Redis deletes it [`keep_expired`](Self::keep_expired) after it
    /// expires).
    pub async fn check_eviction_policy(&self) -> Result<(), StoreError> {
        let cmd = redis::cmd("CONFIG").arg("GET").arg("maxmemory-policy").clone();
        let read = |e| failed("reading maxmemory-policy", e);
        for primary in self.conn.primaries().await.map_err(read)? {
            let answer: Vec<String> = self.conn.query_on(&primary, &cmd).await.map_err(read)?;
            if let Some(policy) = answer.get(1).filter(|policy| policy.as_str() != "noeviction") {
                return Err(StoreError::new(format!(
                    "Redis runs with maxmemory-policy {policy}: it may evict idempotency records, and a duplicate \
                     whose record was evicted runs again. Set `maxmemory-policy noeviction` on every primary \
                     (or keep idem's records on a server that has it)"
                )));
            }
        }
        Ok(())
    }

    /// Keys start with `prefix` instead of `idem:`. A prefix holding `{` or `}` is
    /// refused: it would move the cluster hash tag.
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, StoreError> {
        if prefix.contains(['{', '}']) {
            return Err(StoreError::new(format!(
                "the Redis key prefix {prefix:?} holds a brace; the record's hash tag must be the first"
            )));
        }
        self.prefix = prefix.into();
        self.channel = Self::channel_of(prefix);
        // Another prefix, another channel: a subscriber of its own.
        self.listener = self.listener.renewed();
        Ok(self)
    }

    /// Keep a record in Redis this long after it expired (default
    /// [`DEFAULT_KEEP_EXPIRED`]); `purge_expired` deletes it sooner.
    pub fn keep_expired(mut self, keep: Duration) -> Self {
        self.keep_expired = keep;
        self
    }

    /// Judge leases, expiry and grants by `clock`. The default,
    /// [`LeaseClock::Store`], reads the server's clock (`TIME`) in every script, so
    /// application hosts whose clocks disagree agree on every lease;
    /// [`LeaseClock::Caller`] takes the caller's instants (which follow tokio's paused
    /// clock) — for tests that move time against a real server, never for more than
    /// one host.
    pub fn with_lease_clock(mut self, clock: LeaseClock) -> Self {
        self.lease_clock = clock;
        self
    }

    /// The caller's `now` as the scripts take it: empty when the server's clock judges.
    fn caller_now(&self, now: SystemTime) -> String {
        match self.lease_clock {
            LeaseClock::Store => String::new(),
            LeaseClock::Caller => micros(now).to_string(),
        }
    }

    /// One page of the records' keys on `primary`, from `cursor`: the next cursor (0
    /// at the end) and the keys.
    async fn scan(
        &self,
        primary: &crate::connection::Primary,
        cursor: u64,
        operation: &str,
    ) -> Result<(u64, Vec<String>), StoreError> {
        let cmd = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{}*", glob_escaped(&self.prefix)))
            .arg("COUNT")
            .arg(500)
            .clone();
        self.conn
            .query_on(primary, &cmd)
            .await
            .map_err(|e| failed(operation, e))
    }

    /// Records whose outcome is unknown (of `biz`, or of any), at most `limit`: held by
    /// a step that failed closed until an operator settles them (`idem unknown`).
    /// Walks the records with `SCAN`, as the purge does.
    pub async fn unsettled(&self, biz: Option<&str>, limit: u32) -> Result<Vec<Record>, StoreError> {
        let mut found = Vec::new();
        for primary in self.conn.primaries().await.map_err(|e| failed("unsettled (scan)", e))? {
            let mut cursor = 0u64;
            loop {
                let (next, keys) = self.scan(&primary, cursor, "unsettled (scan)").await?;
                for (record_biz, key) in keys.iter().filter_map(|k| self.record_id(k)) {
                    if biz.is_some_and(|biz| biz != record_biz) {
                        continue;
                    }
                    if let Some(record) = self.get(record_biz, key).await? {
                        if idem_runtime::unknown::awaits_settling(&record) {
                            found.push(record);
                        }
                    }
                }
                if next == 0 || found.len() >= limit as usize {
                    break;
                }
                cursor = next;
            }
        }
        found.sort_by_key(|record| record.created_at);
        found.truncate(limit as usize);
        Ok(found)
    }

    /// The `(biz, key)` of a record's key (the inverse of [`record_key`](Self::record_key)).
    fn record_id<'k>(&self, record_key: &'k str) -> Option<(&'k str, &'k str)> {
        let inner = record_key
            .strip_prefix(&*self.prefix)?
            .strip_prefix('{')?
            .strip_suffix('}')?;
        let (length, rest) = inner.split_once(':')?;
        let length: usize = length.parse().ok()?;
        let (biz, key) = (rest.get(..length)?, rest.get(length..)?.strip_prefix(':')?);
        Some((biz, key))
    }

    /// The key of the record `(biz, key)`: `{prefix}{<length of biz>:<biz>:<key>}` —
    /// `idem:{3:pay:order-7}`. The length keeps every biz and key apart (`a:b` + `c` is
    /// not `a` + `b:c`); the braces are the cluster hash tag, so whatever key a record
    /// ever adds beside its hash lands on its slot.
    pub fn record_key(&self, biz: &str, key: &str) -> String {
        format!("{}{{{}:{biz}:{key}}}", self.prefix, biz.len())
    }

    /// The claim script, as the bench's hand-written floor calls it: `KEYS[1]` the
    /// record key, `ARGV` the lease's and the record's lengths (µs, from the server's
    /// clock, which judges every lease and expiry), fingerprint and request body (`""`
    /// for none), a claimant id, and how long to keep the record after it expires (µs).
    pub fn claim_script() -> &'static Script {
        &CLAIM
    }

    /// The holder-write script: `ARGV` what (`complete`, `fail`, `renew`, `release`,
    /// `steps`), fence, `created_at`, the value (a renewal's lease length in µs), the
    /// record's length from now (µs, `complete` and `fail`), keep (µs), an id of
    /// the write call (a resend with the same id is answered as applied; another
    /// writer's `complete` of the same lease is not), then optionally the caller's now
    /// (`""`: the server's clock), the replay's length when the record keeps a
    /// tombstone after it (µs, `""` for none) and the subject's keyed hash (`""`).
    pub fn write_script() -> &'static Script {
        &WRITE
    }

    fn keep_us(&self) -> u64 {
        u64::try_from(self.keep_expired.as_micros()).unwrap_or(u64::MAX)
    }

    /// Run a script, sending it again when its reply was lost (the scripts are written
    /// to be applied once however often the same call is sent).
    async fn run<T: redis::FromRedisValue>(
        &self,
        operation: &str,
        lease_or_key: (&str, &str),
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        let mut sent = 0;
        loop {
            sent += 1;
            match self.conn.invoke(invocation).await {
                Ok(value) => return Ok(value),
                Err(error) if sent < SENDS && lost_reply(&error) => {
                    tracing::warn!(target: "idem", %error, operation, biz = lease_or_key.0, key = lease_or_key.1, "Redis reply lost; sending the script again");
                    tokio::time::sleep(Duration::from_millis(20 * sent as u64)).await;
                }
                Err(error) => return Err(failed(operation, error)),
            }
        }
    }

    async fn write(&self, lease: &Lease, write: Write<'_>, now: SystemTime) -> Result<FenceCheck, StoreError> {
        let length = |length: Duration| u64::try_from(length.as_micros()).unwrap_or(u64::MAX);
        let retention = &lease.retention;
        // A finished record's length in the store, and the length of its replay when it
        // keeps a tombstone after it.
        let finished = |ttl: Duration| {
            let replay = retention.replay_until(now, ttl).map(|_| length(ttl).to_string());
            (length(retention.record_length(ttl)), replay.unwrap_or_default())
        };
        let (what, value, (ttl, replay)) = match write {
            Write::Renew(lease) => ("renew", length(lease).to_string(), (0, String::new())),
            Write::Complete(response, ttl) => ("complete", response.to_owned(), finished(ttl)),
            Write::Fail(message, ttl) => ("fail", message.to_owned(), finished(ttl)),
            Write::Release => ("release", String::new(), (0, String::new())),
            Write::Steps(steps) => ("steps", steps.to_owned(), (0, String::new())),
        };
        let mut invocation = WRITE.prepare_invoke();
        invocation
            .key(self.record_key(&lease.biz, &lease.key))
            .arg(what)
            .arg(lease.fence.to_string())
            .arg(micros(lease.created_at).to_string())
            .arg(value)
            .arg(ttl.to_string())
            .arg(self.keep_us().to_string())
            .arg(call_id())
            .arg(self.caller_now(now))
            .arg(replay)
            .arg(retention.subject.as_deref().unwrap_or(""))
            .arg(&*self.channel);
        let applied: i64 = self.run(what, (&lease.biz, &lease.key), &invocation).await?;
        Ok(if applied == 1 {
            FenceCheck::Held
        } else {
            FenceCheck::Lost
        })
    }
}

#[async_trait::async_trait]
impl IdempotencyStore for RedisStore {
    async fn claim(&self, claim: &Claim<'_>) -> Result<ClaimOutcome, StoreError> {
        let read = if self.duplicates.first_look(true) == FirstLook::Read {
            self.read_first(claim).await
        } else {
            None
        };
        // Each claim counts once: at its read, or else at its script.
        let counted = read.is_some();
        if let Some((stood, standing)) = read {
            self.duplicates.observe(stood);
            if let Some(standing) = standing {
                return Ok(standing);
            }
        }
        let claimed = self.run_claim(claim).await;
        if let (false, Ok(outcome)) = (counted, &claimed) {
            self.duplicates.observe(matches!(outcome, ClaimOutcome::Existing(_)));
        }
        claimed
    }

    async fn renew(&self, lease: &Lease, now: SystemTime, lease_for: Duration) -> Result<FenceCheck, StoreError> {
        self.write(lease, Write::Renew(lease_for), now).await
    }

    async fn complete(
        &self,
        lease: &Lease,
        response: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<FenceCheck, StoreError> {
        self.write(lease, Write::Complete(response, ttl), now).await
    }

    async fn fail(
        &self,
        lease: &Lease,
        message: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<FenceCheck, StoreError> {
        self.write(lease, Write::Fail(message, ttl), now).await
    }

    async fn release(&self, lease: &Lease) -> Result<FenceCheck, StoreError> {
        self.write(lease, Write::Release, idem_runtime::now()).await
    }

    async fn record_steps(&self, lease: &Lease, steps: &str) -> Result<FenceCheck, StoreError> {
        self.write(lease, Write::Steps(steps), idem_runtime::now()).await
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    async fn watch(&self, biz: &str, key: &str) -> Result<Option<idem_runtime::notice::Notice>, StoreError> {
        let record_key = self.record_key(biz, key);
        self.listener
            .watch(&self.conn, &self.channel, &record_key, (biz, key), &self.prefix)
            .await
    }

    async fn get(&self, biz: &str, key: &str) -> Result<Option<Record>, StoreError> {
        let cmd = redis::cmd("HGETALL").arg(self.record_key(biz, key)).clone();
        let pairs: Vec<Vec<u8>> = self.conn.query(&cmd).await.map_err(|e| failed("get", e))?;
        if pairs.is_empty() {
            return Ok(None);
        }
        decode(biz, key, &pairs).map(Some)
    }

    /// Walks the records with `SCAN` (every primary of a cluster) and deletes those
    /// that expired, a script per key. Redis also deletes each record by itself
    /// [`keep_expired`](RedisStore::keep_expired) after it expires.
    async fn purge_expired(&self, now: SystemTime, limit: u64) -> Result<u64, StoreError> {
        self.on_every_record("purge", &PURGE, &self.caller_now(now), limit)
            .await
    }

    /// Walks the records with `SCAN` (every primary of a cluster), a script per key.
    async fn erase_subject(&self, subject: &str) -> Result<u64, StoreError> {
        self.on_every_record("erase_subject", &ERASE, subject, u64::MAX).await
    }
}

impl RedisStore {
    /// The claim script: the key granted, or the record that stands in its way.
    async fn run_claim(&self, claim: &Claim<'_>) -> Result<ClaimOutcome, StoreError> {
        let mut invocation = CLAIM.prepare_invoke();
        invocation
            .key(self.record_key(claim.biz, claim.key))
            .arg(claim.lease.as_micros().to_string())
            .arg(claim.ttl.max(claim.lease).as_micros().to_string())
            .arg(claim.fingerprint.unwrap_or(""))
            .arg(claim.request_body.unwrap_or(""))
            .arg(call_id())
            .arg(self.keep_us().to_string())
            .arg(self.caller_now(claim.now));
        let reply: Vec<Vec<u8>> = self.run("claim", (claim.biz, claim.key), &invocation).await?;
        match reply.split_first() {
            Some((tag, rest)) if tag.as_slice() == b"ACQUIRED" && rest.len() == 2 => {
                let number = |bytes: &[u8]| -> Result<u64, StoreError> {
                    std::str::from_utf8(bytes)
                        .ok()
                        .and_then(|text| text.parse().ok())
                        .ok_or_else(|| StoreError::new("the claim script answered a fence that is not a number"))
                };
                Ok(ClaimOutcome::Acquired(Lease::new(
                    claim.biz,
                    claim.key,
                    number(&rest[0])?,
                    SystemTime::UNIX_EPOCH + Duration::from_micros(number(&rest[1])?),
                )))
            }
            Some((tag, rest)) if tag.as_slice() == b"EXISTING" => {
                Ok(ClaimOutcome::Existing(decode(claim.biz, claim.key, rest)?))
            }
            _ => Err(StoreError::new(
                "the claim script answered neither ACQUIRED nor EXISTING",
            )),
        }
    }

    /// In a storm of duplicates, before the claim script: the record and the server's
    /// clock in one round trip, and the record's answer when it stands at that instant
    /// (by the caller's instant with [`LeaseClock::Caller`]), and whether a record
    /// stood. `None` where nothing was read — on a cluster, or when the read failed —
    /// and the script decides, and is counted.
    async fn read_first(&self, claim: &Claim<'_>) -> Option<(bool, Option<ClaimOutcome>)> {
        let cmd = redis::cmd("HGETALL").arg(self.record_key(claim.biz, claim.key)).clone();
        let Ok(Some(((seconds, micros), pairs))) = self.conn.with_server_time::<Vec<Vec<u8>>>(&cmd).await else {
            return None;
        };
        if pairs.is_empty() {
            return Some((false, None));
        }
        let Ok(record) = decode(claim.biz, claim.key, &pairs) else {
            return Some((true, None));
        };
        let now = match self.lease_clock {
            LeaseClock::Store => SystemTime::UNIX_EPOCH + Duration::from_secs(seconds) + Duration::from_micros(micros),
            LeaseClock::Caller => claim.now,
        };
        let mut judged = *claim;
        judged.now = now;
        Some((
            true,
            (!judged.admits(&record)).then_some(ClaimOutcome::Existing(record)),
        ))
    }
}

impl RedisStore {
    /// Run `script` (named `operation`) with `arg` on every record, walked with `SCAN`
    /// on every primary of a cluster; the sum of its answers, stopping once it reaches
    /// `limit`.
    async fn on_every_record(
        &self,
        operation: &'static str,
        script: &Script,
        arg: &str,
        limit: u64,
    ) -> Result<u64, StoreError> {
        let scan = format!("{operation} (scan)");
        let mut total = 0;
        for primary in self.conn.primaries().await.map_err(|e| failed(&scan, e))? {
            let mut cursor = 0u64;
            loop {
                let (next, keys) = self.scan(&primary, cursor, &scan).await?;
                for key in keys {
                    let mut invocation = script.prepare_invoke();
                    invocation.key(&key).arg(arg);
                    total += self.run::<u64>(operation, ("", &key), &invocation).await?;
                    if total >= limit {
                        return Ok(total);
                    }
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(total)
    }
}

/// Records a `SCAN` page at a time, primary after primary (in address order); the cursor
/// is the primary's place in that order, `:`, and its `SCAN` cursor.
#[async_trait::async_trait]
impl idem_runtime::pages::RecordPages for RedisStore {
    async fn page(&self, cursor: &str, _limit: u32) -> Result<idem_runtime::pages::Page, StoreError> {
        let mut primaries = self.conn.primaries().await.map_err(|e| failed("page (scan)", e))?;
        primaries.sort();
        let (at, scan) = cursor.split_once(':').unwrap_or(("0", "0"));
        let bad = || StoreError::new(format!("the page cursor {cursor:?} is not one this store gave"));
        let (at, scan): (usize, u64) = (at.parse().map_err(|_| bad())?, scan.parse().map_err(|_| bad())?);
        let Some(primary) = primaries.get(at) else {
            return Ok(idem_runtime::pages::Page::default());
        };
        let (next, keys) = self.scan(primary, scan, "page (scan)").await?;
        // The page's records read at once: the connection multiplexes them.
        let mut reads = tokio::task::JoinSet::new();
        for (biz, key) in keys.iter().filter_map(|k| self.record_id(k)) {
            let (store, biz, key) = (self.clone(), biz.to_owned(), key.to_owned());
            reads.spawn(async move { store.get(&biz, &key).await });
        }
        let mut records = Vec::with_capacity(keys.len());
        while let Some(read) = reads.join_next().await {
            records.extend(read.map_err(|e| StoreError::with_source("page (read)", e))??);
        }
        let next = match next {
            0 if at + 1 < primaries.len() => Some(format!("{}:0", at + 1)),
            0 => None,
            scan => Some(format!("{at}:{scan}")),
        };
        Ok(idem_runtime::pages::Page { records, next })
    }

    /// A script per record (a page's records may live on several nodes), sent at once.
    async fn replace_values(&self, rewrites: &[idem_runtime::pages::Rewrite]) -> Result<u64, StoreError> {
        let mut writes = tokio::task::JoinSet::new();
        for rewrite in rewrites {
            let (store, rewrite) = (self.clone(), rewrite.clone());
            writes.spawn(async move { store.replace_one(&rewrite).await });
        }
        let mut replaced = 0;
        while let Some(written) = writes.join_next().await {
            replaced += written.map_err(|e| StoreError::with_source("replace_values", e))??;
        }
        Ok(replaced)
    }
}

impl RedisStore {
    /// One rewrite of [`replace_values`](idem_runtime::pages::RecordPages::replace_values):
    /// 1 when it was written.
    async fn replace_one(&self, rewrite: &idem_runtime::pages::Rewrite) -> Result<u64, StoreError> {
        let value = |value: &Option<String>| value.clone().unwrap_or_default();
        let (read, with) = (&rewrite.read, &rewrite.with);
        let mut invocation = REPLACE.prepare_invoke();
        invocation
            .key(self.record_key(&read.biz, &read.key))
            .arg(read.fence.to_string())
            .arg(micros(read.created_at).to_string())
            .arg(read.status.as_str());
        for record in [read, with] {
            invocation
                .arg(value(&record.request_body))
                .arg(value(&record.response_body))
                .arg(value(&record.error_message))
                .arg(value(&record.steps));
        }
        self.run::<u64>("replace_values", (&read.biz, &read.key), &invocation)
            .await
    }
}

/// An id unique to one call of the store (a claim, a holder write): the script sent
/// again for the same call recognizes itself by it, and only it.
fn call_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static PROCESS: LazyLock<String> =
        LazyLock::new(|| format!("{}-{}", std::process::id(), micros(SystemTime::now())));
    format!("{}-{}", *PROCESS, NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A reply the connection lost (the script may or may not have run).
fn lost_reply(error: &redis::RedisError) -> bool {
    error.is_io_error() || error.is_connection_dropped() || error.is_timeout()
}

pub(crate) fn failed(operation: &str, error: redis::RedisError) -> StoreError {
    StoreError::with_source(format!("Redis failed at {operation}"), error)
}

/// `text` as a literal in a `SCAN MATCH` glob.
fn glob_escaped(text: &str) -> String {
    text.chars()
        .flat_map(|c| match c {
            '*' | '?' | '[' | ']' | '\\' => vec!['\\', c],
            c => vec![c],
        })
        .collect()
}
