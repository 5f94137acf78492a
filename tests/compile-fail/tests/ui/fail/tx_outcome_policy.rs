use idem::idempotent;
use idem::sqlx::{Postgres, Transaction};

#[derive(Debug)]
struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

#[idempotent(key = key, biz = "pay", tx = tx, outcome_policy = required)]
async fn pay(tx: &mut Transaction<'_, Postgres>, key: &str) -> Result<u32, AppError> {
    let _ = (tx, key);
    Ok(1)
}

fn main() {}
