//! A record as the hash keeps it: decoded into [`Record`], or an error naming the field.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_runtime::{Record, Status, StoreError, Tombstone};

/// Microseconds since the epoch, as the scripts keep instants.
pub(crate) fn micros(at: SystemTime) -> u64 {
    u64::try_from(at.duration_since(UNIX_EPOCH).unwrap_or_default().as_micros()).unwrap_or(u64::MAX)
}

fn instant(micros: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(micros)
}

/// The record of `(biz, key)` from its hash's field–value pairs.
pub(crate) fn decode(biz: &str, key: &str, pairs: &[Vec<u8>]) -> Result<Record, StoreError> {
    let bad = |field: &str, why: String| {
        StoreError::new(format!(
            "the Redis record of biz `{biz}` key `{key}` has an unreadable `{field}`: {why}"
        ))
    };
    let mut fields = std::collections::HashMap::new();
    for pair in pairs.chunks(2) {
        let [name, value] = pair else {
            return Err(bad("(hash)", "an odd number of field and value strings".to_owned()));
        };
        let name = String::from_utf8_lossy(name).into_owned();
        let value = String::from_utf8(value.clone()).map_err(|e| bad(&name, format!("not UTF-8 ({e})")))?;
        fields.insert(name, value);
    }
    let number = |field: &str| -> Result<Option<u64>, StoreError> {
        fields
            .get(field)
            .map(|text| {
                text.parse::<u64>()
                    .map_err(|e| bad(field, format!("{text:?} is not a number ({e})")))
            })
            .transpose()
    };
    let required = |field: &str| number(field)?.ok_or_else(|| bad(field, "missing".to_owned()));
    let status = fields
        .get("status")
        .ok_or_else(|| bad("status", "missing".to_owned()))?;
    Ok(Record {
        biz: biz.to_owned(),
        key: key.to_owned(),
        status: status.parse::<Status>().map_err(|e| bad("status", e.to_string()))?,
        fence: required("fence")?,
        fingerprint: fields.get("fingerprint").cloned(),
        request_body: fields.get("request_body").cloned(),
        response_body: fields.get("response_body").cloned(),
        error_message: fields.get("error_message").cloned(),
        lease_until: number("lease_until")?.map(instant),
        created_at: instant(required("created_at")?),
        completed_at: number("completed_at")?.map(instant),
        expires_at: instant(required("expires_at")?),
        steps: fields.get("steps").cloned(),
        subject: fields.get("subject").cloned(),
        replay_until: number("replay_until")?.map(instant),
        tombstone: fields
            .get("tombstone")
            .map(|text| text.parse::<Tombstone>().map_err(|e| bad("tombstone", e.to_string())))
            .transpose()?,
    })
}
