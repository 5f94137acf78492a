use idem::idempotent;

#[derive(Debug)]
struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

#[idempotent(key = "id", biz = "pay")]
async fn pay(id: u32) -> Result<u32, String> {
    Ok(id)
}
fn main() {}
