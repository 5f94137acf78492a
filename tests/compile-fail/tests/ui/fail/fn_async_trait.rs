use idem::idempotent;

#[derive(Debug)]
struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

#[async_trait::async_trait]
trait Payments {
    async fn pay(&self, id: u32) -> Result<u32, AppError>;
}

struct Bank;

#[async_trait::async_trait]
impl Payments for Bank {
    #[idempotent(key = "id", biz = "pay")]
    async fn pay(&self, id: u32) -> Result<u32, AppError> {
        Ok(id)
    }
}
fn main() {}
