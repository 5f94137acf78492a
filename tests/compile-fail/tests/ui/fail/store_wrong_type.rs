use idem::idempotent;

#[derive(Debug)]
struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

struct Service {
    store: idem::MemoryStore,
    name: String,
}

impl Service {
    #[idempotent(key = "id", biz = "pay", store = self.name)]
    async fn pay(&self, id: u32) -> Result<u32, AppError> {
        Ok(id)
    }
}
fn main() {}
