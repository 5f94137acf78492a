use idem::idempotent;
use idem::sqlx::{self, Postgres, Transaction};

#[derive(Debug)]
struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

#[idempotent(key = key, biz = "pay", tx = pool)]
async fn with_a_pool(pool: &sqlx::PgPool, key: &str) -> Result<u32, AppError> {
    let _ = pool;
    Ok(1)
}

#[idempotent(key = key, biz = "pay", tx = conn)]
async fn with_a_connection(conn: &mut sqlx::PgConnection, key: &str) -> Result<u32, AppError> {
    let _ = conn;
    Ok(1)
}

#[idempotent(key = key, biz = "pay", tx = tx)]
async fn with_a_transaction_by_value(tx: Transaction<'static, Postgres>, key: &str) -> Result<u32, AppError> {
    let _ = tx;
    Ok(1)
}

fn main() {}
