use idem::idempotent;

#[derive(Debug)]
struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// Nothing to keep: no payload.
#[idempotent(key = "id", biz = "pay", keep_request = true)]
async fn pay(id: u32) -> Result<u32, AppError> {
    Ok(id)
}

// Not a bool.
#[idempotent(key = "id", biz = "refund", payload = "id", keep_request = "yes")]
async fn refund(id: u32) -> Result<u32, AppError> {
    Ok(id)
}

fn main() {}
