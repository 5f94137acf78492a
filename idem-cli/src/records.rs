//! Records and figures, as an aligned table or as JSON. Instants are RFC 3339 (UTC,
//! microseconds) in both.

use std::time::SystemTime;

use comfy_table::Table;
use idem_runtime::{Record, Status, TOKEN_NAMESPACE};
use idem_store_sqlx::BizStatus;
use serde_json::{json, Value};

/// `at` as RFC 3339 in UTC, with microseconds: `2026-11-30T17:51:50.123456Z`.
pub fn instant(at: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(at).to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// How long from now until `at` (or since, when past), as `3m12s`.
fn from_now(at: SystemTime) -> String {
    let now = SystemTime::now();
    match at.duration_since(now) {
        Ok(ahead) => format!("in {}", span(ahead.as_secs())),
        Err(_) => format!("{} ago", span(now.duration_since(at).map_or(0, |d| d.as_secs()))),
    }
}

fn span(secs: u64) -> String {
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m{}s", secs / 60, secs % 60),
        3600..86_400 => format!("{}h{}m", secs / 3600, secs % 3600 / 60),
        _ => format!("{}d{}h", secs / 86_400, secs % 86_400 / 3600),
    }
}

/// What a `PROCESSING` record's lease says now.
fn lease_text(record: &Record) -> String {
    match (record.status, record.lease_until) {
        (Status::Processing, Some(until)) if until > SystemTime::now() => format!("runs, ends {}", from_now(until)),
        (Status::Processing, Some(until)) => format!("lapsed {}", from_now(until)),
        (Status::Processing, None) => "none".to_owned(),
        _ => String::new(),
    }
}

fn to_json(record: &Record) -> Value {
    json!({
        "biz": record.biz,
        "key": record.key,
        "status": record.status.as_str(),
        "fence": record.fence,
        "fingerprint": record.fingerprint,
        "request_body": record.request_body,
        "response_body": record.response_body,
        "error_message": record.error_message,
        "lease_until": record.lease_until.map(instant),
        "created_at": instant(record.created_at),
        "completed_at": record.completed_at.map(instant),
        "expires_at": instant(record.expires_at),
        "steps": record.steps,
    })
}

/// Records as a table of one line each, or as a JSON array.
pub fn print_records(records: &[Record], json: bool) {
    if json {
        println!("{}", Value::Array(records.iter().map(to_json).collect()));
        return;
    }
    let mut table = Table::new();
    table.load_preset(comfy_table::presets::NOTHING);
    table.set_header(["biz", "key", "status", "fence", "created", "lease", "outcome"]);
    for record in records {
        let outcome = record
            .response_body
            .as_deref()
            .or(record.error_message.as_deref())
            .unwrap_or("");
        table.add_row([
            record.biz.clone(),
            record.key.clone(),
            record.status.as_str().to_owned(),
            record.fence.to_string(),
            from_now(record.created_at),
            lease_text(record),
            outcome.chars().take(60).collect(),
        ]);
    }
    println!("{table}");
    println!("{} records", records.len());
}

/// How a step is named to the operator: `step `charge``, or `the body` for a whole
/// body's entry (named by the empty string).
pub fn step_text(name: &str) -> String {
    if name.is_empty() {
        "the body".to_owned()
    } else {
        format!("step `{name}`")
    }
}

/// Records whose outcome is unknown: biz, key, the step, its effect key and since
/// when; or a JSON array of objects with those fields.
pub fn print_unsettled(records: &[Record], json: bool) {
    let rows: Vec<_> = records
        .iter()
        .filter_map(|record| Some((record, idem_runtime::unknown::unsettled(record)?)))
        .collect();
    if json {
        let rows = rows.iter().map(|(record, intent)| {
            json!({
                "biz": record.biz,
                "key": record.key,
                "step": intent.step,
                "effect_key": intent.effect_key,
                "attempt": intent.attempt,
                "since": instant(intent.since()),
            })
        });
        println!("{}", Value::Array(rows.collect()));
        return;
    }
    let mut table = Table::new();
    table.load_preset(comfy_table::presets::NOTHING);
    table.set_header(["biz", "key", "step", "effect key", "since"]);
    for (record, intent) in &rows {
        table.add_row([
            record.biz.clone(),
            record.key.clone(),
            if intent.step.is_empty() {
                "(body)".to_owned()
            } else {
                intent.step.clone()
            },
            intent.effect_key.clone(),
            format!("{} ({})", instant(intent.since()), from_now(intent.since())),
        ]);
    }
    println!("{table}");
    println!("{} unsettled", rows.len());
}

/// One record, every field in full: as `name  value` lines, or as a JSON array of one.
pub fn print_record(record: &Record, json: bool) {
    if json {
        println!("{}", Value::Array(vec![to_json(record)]));
        return;
    }
    let at =
        |at: Option<SystemTime>| at.map_or_else(|| "-".to_owned(), |at| format!("{} ({})", instant(at), from_now(at)));
    let text = |text: &Option<String>| text.clone().unwrap_or_else(|| "-".to_owned());
    let lease = match record.lease_until {
        Some(_) if record.status == Status::Processing => {
            format!("{} — {}", at(record.lease_until), lease_text(record))
        }
        _ => at(record.lease_until),
    };
    let fields = [
        ("biz", record.biz.clone()),
        ("key", record.key.clone()),
        ("status", record.status.as_str().to_owned()),
        ("fence", record.fence.to_string()),
        ("created_at", at(Some(record.created_at))),
        ("lease_until", lease),
        ("completed_at", at(record.completed_at)),
        ("expires_at", at(Some(record.expires_at))),
        ("fingerprint", text(&record.fingerprint)),
        ("request_body", text(&record.request_body)),
        ("response_body", text(&record.response_body)),
        ("error_message", text(&record.error_message)),
        ("steps", text(&record.steps)),
    ];
    for (name, value) in fields {
        println!("{name:<14}{value}");
    }
}

/// Whether a stats row counts form tokens rather than calls.
fn is_token(row: &BizStatus) -> bool {
    row.biz.starts_with(TOKEN_NAMESPACE)
}

pub fn print_stats(rows: &[BizStatus], oldest_processing: Option<&Record>, json: bool) {
    let (tokens, calls): (Vec<&BizStatus>, Vec<&BizStatus>) = rows.iter().partition(|row| is_token(row));
    if json {
        let row = |row: &&BizStatus| json!({"biz": row.biz, "status": row.status.as_str(), "records": row.records, "expired": row.expired, "tombstones": row.tombstones});
        let oldest = oldest_processing.map(|r| {
            json!({"biz": r.biz, "key": r.key, "created_at": instant(r.created_at), "lease_until": r.lease_until.map(instant)})
        });
        println!(
            "{}",
            json!({
                "by_biz_and_status": calls.iter().map(row).collect::<Vec<_>>(),
                "tokens": tokens.iter().map(row).collect::<Vec<_>>(),
                "oldest_processing": oldest,
            })
        );
        return;
    }
    let mut table = Table::new();
    table.load_preset(comfy_table::presets::NOTHING);
    table.set_header(["biz", "status", "records", "expired", "tombstones"]);
    for row in &calls {
        table.add_row([
            row.biz.clone(),
            row.status.as_str().to_owned(),
            row.records.to_string(),
            row.expired.to_string(),
            row.tombstones.to_string(),
        ]);
    }
    println!("{table}");
    let (records, expired, tombstones) = calls.iter().fold((0, 0, 0), |(r, e, t), row| {
        (r + row.records, e + row.expired, t + row.tombstones)
    });
    println!(
        "{records} records, {expired} expired and not yet purged, {tombstones} tombstones (kept without their \
         values: past their replay, or erased)"
    );
    if !tokens.is_empty() {
        let count = |status| {
            tokens
                .iter()
                .filter(|row| row.status == status)
                .map(|row| row.records)
                .sum::<u64>()
        };
        println!(
            "form tokens: {} open, {} spent (not counted above)",
            count(Status::Processing),
            count(Status::Succeeded)
        );
    }
    match oldest_processing {
        Some(record) => println!(
            "oldest PROCESSING: biz `{}` key `{}`, created {}, lease {}",
            record.biz,
            record.key,
            from_now(record.created_at),
            lease_text(record)
        ),
        None => println!("no PROCESSING record"),
    }
    println!("duplicate and hit rates come from the calls, not the records: see idem_calls_total (feature metrics)");
}
