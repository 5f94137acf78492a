//! The floor a user would write by hand for the classic design of an idempotency
//! table: an auto-increment id, a unique key on `(biz_type, idempotent_key)`, an index
//! on the expiry, `INSERT` a `PROCESSING` row to claim and `UPDATE` it to record — on
//! the same pool as idem, in its own table.

use std::time::{Duration, SystemTime};

use idem::sqlx;

use super::{utc, Floor, BIZ, RESPONSE};

/// The table, made anew for the run.
pub async fn create(floor: &Floor) {
    let ddl: &[&str] = match floor {
        Floor::Sqlite(_) => &[
            "CREATE TABLE idem_seed_floor (id INTEGER PRIMARY KEY AUTOINCREMENT, biz_type VARCHAR(50) NOT NULL, \
                 idempotent_key VARCHAR(128) NOT NULL, status VARCHAR(20) NOT NULL, request_body TEXT, \
                 response_body TEXT, created_at TEXT, completed_at TEXT, expired_at TEXT, \
                 UNIQUE (biz_type, idempotent_key))",
            "CREATE INDEX idem_seed_floor_expired_at ON idem_seed_floor (expired_at)",
        ],
        Floor::Postgres(_) => &[
            "CREATE TABLE idem_seed_floor (id BIGSERIAL PRIMARY KEY, biz_type VARCHAR(50) NOT NULL, \
                 idempotent_key VARCHAR(128) NOT NULL, status VARCHAR(20) NOT NULL, request_body TEXT, \
                 response_body TEXT, created_at TIMESTAMPTZ, completed_at TIMESTAMPTZ, expired_at TIMESTAMPTZ, \
                 UNIQUE (biz_type, idempotent_key))",
            "CREATE INDEX idem_seed_floor_expired_at ON idem_seed_floor (expired_at)",
        ],
        Floor::MySql(_) => &[
            "CREATE TABLE idem_seed_floor (id BIGINT PRIMARY KEY AUTO_INCREMENT, biz_type VARCHAR(50) NOT NULL, \
               idempotent_key VARCHAR(128) NOT NULL, status VARCHAR(20) NOT NULL, request_body TEXT, \
               response_body TEXT, created_at DATETIME(6), completed_at DATETIME(6), expired_at DATETIME(6), \
               UNIQUE KEY uk_biz_key (biz_type, idempotent_key), KEY idx_expired_at (expired_at)) ENGINE = InnoDB",
        ],
    };
    for statement in std::iter::once(&"DROP TABLE IF EXISTS idem_seed_floor").chain(ddl) {
        run(floor, statement).await;
    }
}

async fn run(floor: &Floor, statement: &str) {
    match floor {
        Floor::Sqlite(store) => drop(sqlx::query(statement).execute(store.pool()).await.unwrap()),
        Floor::Postgres(store) => drop(sqlx::query(statement).execute(store.pool()).await.unwrap()),
        Floor::MySql(store) => drop(sqlx::query(statement).execute(store.pool()).await.unwrap()),
    }
}

const INSERT: &str = "INSERT INTO idem_seed_floor (biz_type, idempotent_key, status, request_body, created_at, \
                      expired_at) VALUES (?, ?, 'PROCESSING', NULL, ?, ?)";
const UPDATE: &str = "UPDATE idem_seed_floor SET status = 'SUCCESS', response_body = ?, completed_at = ? \
                      WHERE biz_type = ? AND idempotent_key = ?";
/// The same `UPDATE`, moving the expiry too (as idem's completion does: its `ttl`
/// counts from completion), so the expiry index is written twice.
const UPDATE_MOVING_EXPIRY: &str =
    "UPDATE idem_seed_floor SET status = 'SUCCESS', response_body = ?, completed_at = ?, \
                                    expired_at = ? WHERE biz_type = ? AND idempotent_key = ?";
const UPDATE_MOVING_EXPIRY_PG: &str = "UPDATE idem_seed_floor SET status = 'SUCCESS', response_body = $1, \
                                       completed_at = $2, expired_at = $3 WHERE biz_type = $4 AND idempotent_key = $5";
const INSERT_PG: &str = "INSERT INTO idem_seed_floor (biz_type, idempotent_key, status, request_body, created_at, \
                         expired_at) VALUES ($1, $2, 'PROCESSING', NULL, $3, $4)";
const UPDATE_PG: &str = "UPDATE idem_seed_floor SET status = 'SUCCESS', response_body = $1, completed_at = $2 \
                         WHERE biz_type = $3 AND idempotent_key = $4";

/// Claim `key` with an `INSERT`, record the answer with an `UPDATE` (that also moves
/// the expiry, with `moving_expiry`): each its own statement on the pool, as idem's
/// leased mode runs its two.
pub async fn claim_and_record(floor: &Floor, key: &str, moving_expiry: bool) {
    let now = idem::store::now();
    let expires = now + Duration::from_secs(86_400);
    macro_rules! two_statements {
        ($store:expr, $insert:expr, $update:expr, $at:expr) => {{
            sqlx::query($insert)
                .bind(BIZ)
                .bind(key)
                .bind($at(now))
                .bind($at(expires))
                .execute($store.pool())
                .await
                .unwrap();
            let mut update = sqlx::query(if moving_expiry { $update.1 } else { $update.0 })
                .bind(RESPONSE)
                .bind($at(now));
            if moving_expiry {
                update = update.bind($at(expires));
            }
            let done = update.bind(BIZ).bind(key).execute($store.pool()).await.unwrap();
            assert_eq!(done.rows_affected(), 1);
        }};
    }
    match floor {
        Floor::Sqlite(store) => two_statements!(store, INSERT, (UPDATE, UPDATE_MOVING_EXPIRY), super::sqlite_text),
        Floor::Postgres(store) => two_statements!(store, INSERT_PG, (UPDATE_PG, UPDATE_MOVING_EXPIRY_PG), utc),
        Floor::MySql(store) => two_statements!(store, INSERT, (UPDATE, UPDATE_MOVING_EXPIRY), |at: SystemTime| utc(at)
            .naive_utc()),
    }
}
