use idem::idempotent;

#[derive(Debug)]
struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

struct Req;

#[idempotent(key = "id", biz = "pay", payload = req)]
async fn pay(id: u32, req: Req) -> Result<u32, AppError> {
    Ok(id)
}
fn main() {}
