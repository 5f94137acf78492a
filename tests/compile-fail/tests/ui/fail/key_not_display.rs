use idem::idempotent;

#[derive(Debug)]
struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

struct Opaque;

#[idempotent(key = "id", biz = "pay")]
async fn pay(id: Opaque) -> Result<u32, AppError> {
    Ok(1)
}
fn main() {}
