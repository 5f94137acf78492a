#![deny(warnings)]

use idem::idempotent;

#[derive(Debug)]
struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

/// A one-line body: no `unused_braces` in user code.
#[idempotent(key = id, biz = "pass.inner")]
async fn one_line(id: u32) -> Result<u32, AppError> { Ok(id) }

/// An inner attribute stays at the top of the body.
#[idempotent(key = id, biz = "pass.inner")]
async fn with_inner_attribute(id: u32) -> Result<u32, AppError> {
    #![allow(unused_variables)]
    let unused = 1;
    Ok(id)
}

pub fn main() {
    let _ = one_line(1);
    let _ = with_inner_attribute(2);
}
