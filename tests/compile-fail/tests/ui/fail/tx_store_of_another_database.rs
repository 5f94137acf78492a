use idem::idempotent;
use idem::sqlx::{Postgres, Transaction};

#[derive(Debug)]
struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

#[idempotent(key = key, biz = "pay", tx = tx, store = store)]
async fn pay(tx: &mut Transaction<'_, Postgres>, store: &idem::SqliteStore, key: &str) -> Result<u32, AppError> {
    let _ = tx;
    Ok(1)
}

#[idempotent(key = key, biz = "pay", tx = tx, store = store)]
async fn pay_on_redis(tx: &mut Transaction<'_, Postgres>, store: &idem::RedisStore, key: &str) -> Result<u32, AppError> {
    let _ = tx;
    Ok(1)
}

fn main() {}
