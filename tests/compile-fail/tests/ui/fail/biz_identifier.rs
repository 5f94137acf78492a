use idem::idempotent;

#[idempotent(key = id, biz = pay)]
async fn pay(id: u32) -> Result<u32, idem::Error> {
    Ok(id)
}

fn main() {}
