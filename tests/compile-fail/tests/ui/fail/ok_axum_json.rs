use idem::idempotent;

#[derive(Debug)]
struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Receipt {
    cents: u64,
}

#[idempotent(key = "id", biz = "pay")]
async fn pay(id: u32) -> Result<axum::Json<Receipt>, AppError> {
    Ok(axum::Json(Receipt { cents: 1 }))
}
fn main() {}
