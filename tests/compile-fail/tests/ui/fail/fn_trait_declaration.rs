use idem::idempotent;

#[derive(Debug)]
struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

trait Payments {
    #[idempotent(key = "id", biz = "pay")]
    async fn pay(&self, id: u32) -> Result<u32, AppError>;
}
fn main() {}
