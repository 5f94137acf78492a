//! Records and figures, as an aligned table or as JSON.

use std::time::{SystemTime, UNIX_EPOCH};

use comfy_table::Table;
use idem_runtime::Record;
use idem_store_sqlx::BizStatus;
use serde_json::{json, Value};

/// Seconds since the epoch, with microseconds.
fn epoch(at: SystemTime) -> f64 {
    at.duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// How long ago, as `3m12s`.
fn ago(at: SystemTime) -> String {
    let secs = SystemTime::now().duration_since(at).map_or(0, |d| d.as_secs());
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m{}s", secs / 60, secs % 60),
        3600..86_400 => format!("{}h{}m", secs / 3600, secs % 3600 / 60),
        _ => format!("{}d{}h", secs / 86_400, secs % 86_400 / 3600),
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
        "lease_until": record.lease_until.map(epoch),
        "created_at": epoch(record.created_at),
        "completed_at": record.completed_at.map(epoch),
        "expires_at": epoch(record.expires_at),
        "steps": record.steps,
    })
}

pub fn print_records(records: &[Record], json: bool) {
    if json {
        println!("{}", Value::Array(records.iter().map(to_json).collect()));
        return;
    }
    let mut table = Table::new();
    table.load_preset(comfy_table::presets::NOTHING);
    table.set_header(["biz", "key", "status", "fence", "created", "outcome"]);
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
            format!("{} ago", ago(record.created_at)),
            outcome.chars().take(60).collect(),
        ]);
    }
    println!("{table}");
    println!("{} records", records.len());
}

pub fn print_stats(rows: &[BizStatus], oldest_processing: Option<&Record>, json: bool) {
    if json {
        let rows: Vec<Value> = rows
            .iter()
            .map(|row| json!({"biz": row.biz, "status": row.status.as_str(), "records": row.records, "expired": row.expired}))
            .collect();
        let oldest = oldest_processing.map(|r| json!({"biz": r.biz, "key": r.key, "created_at": epoch(r.created_at)}));
        println!("{}", json!({ "by_biz_and_status": rows, "oldest_processing": oldest }));
        return;
    }
    let mut table = Table::new();
    table.load_preset(comfy_table::presets::NOTHING);
    table.set_header(["biz", "status", "records", "expired"]);
    for row in rows {
        table.add_row([
            row.biz.clone(),
            row.status.as_str().to_owned(),
            row.records.to_string(),
            row.expired.to_string(),
        ]);
    }
    println!("{table}");
    let (records, expired) = rows
        .iter()
        .fold((0, 0), |(r, e), row| (r + row.records, e + row.expired));
    println!("{records} records, {expired} expired and not yet purged");
    match oldest_processing {
        Some(record) => println!(
            "oldest PROCESSING: biz `{}` key `{}`, created {} ago",
            record.biz,
            record.key,
            ago(record.created_at)
        ),
        None => println!("no PROCESSING record"),
    }
    println!("duplicate and hit rates come from the calls, not the records: see idem_calls_total (feature metrics)");
}
