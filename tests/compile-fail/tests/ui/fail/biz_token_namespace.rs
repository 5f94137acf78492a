use idem::idempotent;

#[idempotent(key = id, biz = "token.order.submit")]
async fn submit(id: u32) -> Result<u32, idem::Error> {
    Ok(id)
}

fn main() {}
