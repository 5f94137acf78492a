use idem::{idempotent, MemoryStore};

#[derive(Debug)]
struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

struct Bank {
    store: MemoryStore,
    charged: u64,
}

impl Bank {
    #[idempotent(key = "id", biz = "pay", store = &self.store)]
    async fn pay(&mut self, id: u32) -> Result<u64, AppError> {
        self.charged += 1;
        Ok(self.charged)
    }
}
fn main() {}
