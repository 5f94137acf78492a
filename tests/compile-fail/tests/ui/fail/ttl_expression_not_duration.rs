use idem::idempotent;

#[derive(Debug)]
struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

#[idempotent(key = "id", biz = "pay", ttl = hours * 3600)]
async fn pay(id: u32, hours: u64) -> Result<u32, AppError> {
    Ok(id)
}
fn main() {}
