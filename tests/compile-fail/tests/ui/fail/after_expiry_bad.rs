use idem::idempotent;

#[derive(Debug)]
struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// A window is a duration string.
#[idempotent(key = "id", biz = "pay", after_expiry = Gone(30))]
async fn pay(id: u32) -> Result<u32, AppError> {
    Ok(id)
}

// Neither `NewRequest` nor `Gone(..)`.
#[idempotent(key = "id", biz = "refund", after_expiry = Forever)]
async fn refund(id: u32) -> Result<u32, AppError> {
    Ok(id)
}

// A window of nothing.
#[idempotent(key = "id", biz = "void", after_expiry = Gone("0s"))]
async fn void(id: u32) -> Result<u32, AppError> {
    Ok(id)
}

fn main() {}
