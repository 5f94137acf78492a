use idem::idempotent;

#[idempotent(key = key, biz = "pay", on_takeover = reconcile)]
async fn pay(key: &str) -> Result<u32, idem::Error> {
    let _ = key;
    Ok(1)
}

fn main() {}
