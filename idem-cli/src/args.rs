//! The command line.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Look at idempotency records, and repair them, on any idem store.
#[derive(Debug, Parser)]
#[command(name = "idem", version)]
pub struct Cli {
    /// The store: `sqlite://…`, `postgres://…`, `mysql://…` (or `mariadb://…`),
    /// `redis://…`.
    #[arg(long, env = "DATABASE_URL", global = true, default_value = "")]
    pub database_url: String,
    /// The table, when not `idempotent_record` (SQL stores).
    #[arg(long, global = true, default_value = "idempotent_record")]
    pub table: String,
    /// The key ring the application seals its records with (`ID:BASE64KEY` entries,
    /// the current key first), to show and repair sealed records; their values are
    /// bound to `--table` (on Redis, the name given to `SealedStore::table`).
    #[arg(
        long,
        env = "IDEM_SEAL_KEYS",
        global = true,
        default_value = "",
        hide_env_values = true,
        hide_default_value = true
    )]
    pub seal_keys: String,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Records by biz and status, how many expired, the oldest PROCESSING (form tokens
    /// apart).
    Stats {
        #[command(flatten)]
        filter: BizFilter,
    },
    /// Stuck claims: PROCESSING records created at least `--older-than` ago whose lease
    /// has lapsed (the oldest first). A claim whose lease still runs is a body at work
    /// and is not listed; nor are form tokens.
    Stuck {
        /// `0s`, `90s`, `5m`, `2h`, `1d`.
        #[arg(long, value_parser = duration, default_value = "0s")]
        older_than: Duration,
        #[command(flatten)]
        filter: BizFilter,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Live FAIL records (the oldest first).
    Failed {
        #[command(flatten)]
        filter: BizFilter,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Every field of one record. With `--http`, KEY is the key a client sent to the
    /// HTTP layer, and the record is found by its request line and caller.
    Show {
        #[command(flatten)]
        record: RecordId,
        #[command(flatten)]
        http: HttpScope,
    },
    /// Delete expired records in batches, never a running claim.
    Purge {
        /// Required: what is purged.
        #[arg(long, required = true)]
        expired: bool,
        /// Records per batch.
        #[arg(long, default_value_t = 1000)]
        batch: u64,
    },
    /// Free a stuck claim, so that the next call runs the body. Only a claim whose
    /// lease has lapsed (its holder stopped renewing it) is freed.
    Release {
        #[command(flatten)]
        record: RecordId,
        #[command(flatten)]
        confirm: Confirm,
        /// Free it even while its lease runs. If its holder is still running, the next
        /// call runs the body beside it (a second charge, a second SMS) and the holder's
        /// outcome is refused: only for a holder known to be gone.
        #[arg(long)]
        force: bool,
    },
    /// Delete a FAIL record so that the next call runs the body again.
    RetryFailed {
        #[command(flatten)]
        record: RecordId,
        #[command(flatten)]
        confirm: Confirm,
    },
    /// Effects whose outcome is unknown (the oldest first): records a step that failed
    /// closed holds until they are settled, with the step, its effect key and since when.
    Unknown {
        #[command(flatten)]
        filter: BizFilter,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Settle an effect whose outcome is unknown, once the other side told you whether
    /// it happened: `--value JSON` (it did, with this value: the next call returns it
    /// without running the effect) or `--not-done` (the next call runs it).
    Settle {
        #[command(flatten)]
        record: RecordId,
        /// The step (as `idem unknown` names it); none for a whole body
        /// (`on_takeover`).
        step: Option<String>,
        /// It happened, with this value: the step's value as JSON (`'{"id":"ch_1"}'`).
        #[arg(long, required_unless_present = "not_done", conflicts_with = "not_done")]
        value: Option<String>,
        /// It did not happen.
        #[arg(long)]
        not_done: bool,
        #[command(flatten)]
        confirm: Confirm,
    },
    /// Erase a data subject: every finished record the application marked with it
    /// (`subject = ...`), of every biz, keeps only a tombstone — no request, answer,
    /// failure or step — and a retry of its calls is answered "erased", never run.
    Erase {
        /// The subject as the application names it (a user id); only its keyed hash
        /// is looked for.
        #[arg(long)]
        subject: String,
        /// The application's subject key (32 bytes in base64), which the hash is keyed
        /// with.
        #[arg(
            long,
            env = "IDEM_SUBJECT_KEY",
            hide_env_values = true,
            default_value = "",
            hide_default_value = true
        )]
        subject_key: String,
        #[command(flatten)]
        confirm: Confirm,
    },
    /// Re-seal every record holding a value sealed with an older key, with the current
    /// key of the ring (`--seal-keys`, the new key first, the old ones after it), in
    /// batches with progress; afterwards the old keys can be dropped from every ring.
    /// A record a call rewrites meanwhile is left alone and counted.
    Rekey {
        /// Records per batch.
        #[arg(long, default_value_t = 1000)]
        batch: u32,
    },
    /// Create the table and its index if missing (the DDL of `migrate()`), or print
    /// that DDL.
    Migrate {
        /// Print the DDL (for a migration file) instead of running it.
        #[arg(long)]
        print: bool,
    },
    /// Check the table's shape against what the store needs.
    Check,
    /// The transactional outbox of `idem-amqp` in the same database (SQL stores).
    Outbox {
        /// The outbox table.
        #[arg(long, default_value = "idem_outbox")]
        outbox_table: String,
        #[command(subcommand)]
        command: OutboxCommand,
    },
}

/// What to do with the outbox.
#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// Rows by state: pending (retrying among them), sent, dead.
    Counts,
    /// Rows the relay parked after too many failed attempts, with why (the oldest
    /// first).
    Dead {
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u64,
    },
    /// Give parked rows back to the relay, with a fresh count of attempts: one row
    /// (`--id`) or all (`--all`). Fix what made them fail first.
    RetryDead {
        /// The row.
        #[arg(long, required_unless_present = "all", conflicts_with = "all")]
        id: Option<i64>,
        /// Every parked row.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        confirm: Confirm,
    },
    /// Delete rows the broker confirmed longer ago than `--older-than`, in batches
    /// (unsent rows are never touched).
    PurgeSent {
        /// `0s`, `90s`, `5m`, `2h`, `7d`.
        #[arg(long, value_parser = duration, default_value = "7d")]
        older_than: Duration,
        /// Rows per batch.
        #[arg(long, default_value_t = 1000)]
        batch: u64,
    },
}

impl OutboxCommand {
    /// The command's name, as typed.
    pub fn name(&self) -> &'static str {
        match self {
            OutboxCommand::Counts => "outbox counts",
            OutboxCommand::Dead { .. } => "outbox dead",
            OutboxCommand::RetryDead { .. } => "outbox retry-dead",
            OutboxCommand::PurgeSent { .. } => "outbox purge-sent",
        }
    }
}

impl Command {
    /// The command's name, as typed.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Stats { .. } => "stats",
            Command::Stuck { .. } => "stuck",
            Command::Failed { .. } => "failed",
            Command::Show { .. } => "show",
            Command::Purge { .. } => "purge",
            Command::Release { .. } => "release",
            Command::RetryFailed { .. } => "retry-failed",
            Command::Unknown { .. } => "unknown",
            Command::Settle { .. } => "settle",
            Command::Erase { .. } => "erase",
            Command::Rekey { .. } => "rekey",
            Command::Migrate { .. } => "migrate",
            Command::Check => "check",
            Command::Outbox { command, .. } => command.name(),
        }
    }

    /// Whether the command reads or changes what only a SQL table has (lists by
    /// status, the table's shape).
    pub fn needs_sql(&self) -> bool {
        !matches!(
            self,
            Command::Show { .. }
                | Command::Purge { .. }
                | Command::Release { .. }
                | Command::Unknown { .. }
                | Command::Settle { .. }
                | Command::Erase { .. }
                | Command::Rekey { .. }
        )
    }
}

/// One record: its biz and key.
#[derive(Debug, Args)]
pub struct RecordId {
    /// The biz.
    pub biz: String,
    /// The key.
    pub key: String,
}

/// `idem show --http "POST /payments" --caller alice pay order-7`: a record of the
/// HTTP layer, by the client's key.
#[derive(Debug, Args)]
pub struct HttpScope {
    /// The request's method and route as the router names it: `"POST /payments"`,
    /// `"PUT /orders/{id}"`.
    #[arg(long, value_name = "METHOD ROUTE")]
    pub http: Option<String>,
    /// Who sent it, as the layer names callers (the principal's id).
    #[arg(long, requires = "http", conflicts_with = "shared")]
    pub caller: Option<String>,
    /// The tenant header's value, when the layer narrows callers by one.
    #[arg(long, requires = "http")]
    pub tenant: Option<String>,
    /// The route is `.shared()`: no caller.
    #[arg(long, requires = "http")]
    pub shared: bool,
}

impl HttpScope {
    /// The record key of `key` in this scope; `None` without `--http`; `Err` for a
    /// scope that is not whole.
    pub fn record_key(&self, key: &str) -> Option<Result<String, String>> {
        let line = self.http.as_deref()?;
        let Some((method, route)) = line.trim().split_once(' ') else {
            return Some(Err(format!(
                "--http {line:?}: give the method and the route, such as \"POST /payments\""
            )));
        };
        let caller = match (&self.caller, self.shared) {
            (Some(caller), false) => caller.as_str(),
            (None, true) => "",
            _ => return Some(Err("--http needs --caller NAME (who sent it), or --shared".to_owned())),
        };
        let scope = idem_runtime::scoped_key::caller_scope(caller, self.tenant.as_deref());
        Some(Ok(idem_runtime::scoped_key::http_record_key(
            &method.to_ascii_uppercase(),
            route.trim(),
            &scope,
            key,
        )))
    }
}

/// `--biz`: only one biz.
#[derive(Debug, Args)]
pub struct BizFilter {
    /// Only this biz.
    #[arg(long)]
    pub biz: Option<String>,
}

/// `--yes`: a repair done without asking.
#[derive(Debug, Args)]
pub struct Confirm {
    /// Do not ask.
    #[arg(long)]
    pub yes: bool,
}

/// `90s`, `5m`, `2h`, `1d`.
fn duration(text: &str) -> Result<Duration, String> {
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: expected a number, then s, m, h or d"))?;
    let unit = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{text:?}: unknown unit {unit:?}; use s, m, h or d")),
    };
    Ok(Duration::from_secs(n * unit))
}
