use idem::idempotent;

#[derive(Debug)]
struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// Not a bool.
#[idempotent(key = "id", biz = "otp", keep_answer = "no")]
async fn otp(id: u32) -> Result<u32, AppError> {
    Ok(id)
}

fn main() {}
