use std::fmt::Display;

use idem::{idempotent, IdempotencyStore};
use serde::{de::DeserializeOwned, Serialize};

#[idempotent(key = format!("{}-{}", a, b), biz = "pass.generic", store = store, payload = (a, b))]
async fn generic<S, T>(store: &S, (a, b): (u32, u32), value: T, label: impl Display + Send) -> Result<T, idem::Error>
where
    S: IdempotencyStore + Clone,
    T: Serialize + DeserializeOwned + Send,
{
    let _ = label.to_string();
    Ok(value)
}

#[idempotent(key = "req.0", biz = "pass.tuple", store = store, crate = ::idem)]
async fn tuple_struct(store: &idem::MemoryStore, req: Req) -> Result<u64, idem::Error> {
    let Req(id, cents) = req;
    let _ = id;
    Ok(cents)
}

struct Req(String, u64);

pub fn main() {}
