use std::sync::Arc;

use idem::{idempotent, IdempotencyStore, MemoryStore};

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
}

struct Service {
    owned: MemoryStore,
    arc: Arc<MemoryStore>,
    dyn_arc: Arc<dyn IdempotencyStore>,
    count: u32,
}

impl Service {
    #[idempotent(key = "id", biz = "pass.ref", store = &self.owned)]
    async fn by_ref(&self, id: u32) -> Result<u32, AppError> {
        Ok(id)
    }

    #[idempotent(key = id, biz = "pass.arc", store = self.arc, ttl = "1h30m", lease = "10s")]
    async fn by_mut(&mut self, id: u32) -> Result<u32, AppError> {
        self.count += 1;
        Ok(self.count)
    }

    #[idempotent(key = id, biz = "pass.dyn", store = self.dyn_arc.clone(), mode = Reject, on_error = Record, wait = "2s")]
    async fn on_dyn(&self, id: u32) -> Result<(), AppError> {
        Ok(())
    }
}

#[idempotent(key = "id", biz = "pass.installed")]
async fn installed(id: u32) -> Result<Vec<String>, idem::Error> {
    Ok(vec![id.to_string()])
}

#[idempotent(key = "id", biz = "pass.kept", payload = "id", keep_request = true)]
async fn kept(id: u32) -> Result<u32, idem::Error> {
    Ok(id)
}

#[idempotent(key = "id", biz = "pass.unkept", payload = "id", keep_request = false)]
async fn unkept(id: u32) -> Result<u32, idem::Error> {
    Ok(id)
}

#[idempotent(key = "id", biz = "pass.subject", subject = user, after_expiry = Gone("30d"))]
async fn of_a_subject(id: u32, user: &str) -> Result<u32, idem::Error> {
    let _ = user;
    Ok(id)
}

#[idempotent(key = "id", biz = "pass.new_request", after_expiry = idem::AfterExpiry::NewRequest)]
async fn new_request(id: u32) -> Result<u32, idem::Error> {
    Ok(id)
}

#[idempotent(key = "id", biz = "pass.digest", keep_answer = false, redact = ["/secret", "/card/number"])]
async fn one_time(id: u32) -> Result<u32, idem::Error> {
    Ok(id)
}

pub fn main() {}
