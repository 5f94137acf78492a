use idem::idempotent;

#[derive(Debug)]
struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// Not a list.
#[idempotent(key = "id", biz = "pay", redact = "/card")]
async fn pay(id: u32) -> Result<u32, AppError> {
    Ok(id)
}

// Not a JSON pointer.
#[idempotent(key = "id", biz = "refund", redact = ["/card", "card.number"])]
async fn refund(id: u32) -> Result<u32, AppError> {
    Ok(id)
}

fn main() {}
