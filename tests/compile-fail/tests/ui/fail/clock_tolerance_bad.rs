use idem::idempotent;

#[derive(Debug)]
struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

#[idempotent(key = "id", biz = "pay", clock_tolerance = 30)]
async fn pay(id: u32) -> Result<u32, AppError> {
    Ok(id)
}
fn main() {}
