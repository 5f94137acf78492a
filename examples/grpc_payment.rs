//! A gRPC payment service (tonic) behind the same `Idempotency-Key` layer as HTTP: the
//! key is the `idempotency-key` metadata entry, the caller the subject of its bearer
//! token (the `authorization` entry, as the service's authentication verifies it: a
//! token refreshed between an attempt and its retry is the same caller), and a retry
//! gets the first answer — message and status — back.
//!
//! ```text
//! cargo run --example grpc_payment -- --listen 127.0.0.1:50051 --database-url sqlite://…/grpc_payment.db
//! ```
//!
//! Both flags are optional (those are the defaults; the SQLite file is in the system's
//! temporary folder). One method, `/payments.Payments/Pay(PayRequest) -> Receipt`. The
//! layer's own answers are gRPC statuses: no or a malformed key `INVALID_ARGUMENT`, no
//! caller `UNAUTHENTICATED`, a duplicate of a call still running `ABORTED` (retry
//! later), the key reused for another request `FAILED_PRECONDITION`, the store down
//! `UNAVAILABLE`. A call that ends `UNAVAILABLE`, `INTERNAL` (the server's failures) is
//! not recorded, so its retry runs; `INVALID_ARGUMENT` and the like after
//! `idem::http::started()` are the call's answer, recorded and replayed.
//!
//! The messages are written with prost's derive, and the service as tonic's generated
//! code writes it, so the example needs no `protoc`:
//!
//! ```text
//! service Payments { rpc Pay(PayRequest) returns (Receipt); }
//! message PayRequest { string user = 1; int64 cents = 2; }
//! message Receipt { uint64 charge_id = 1; int64 cents = 2; }
//! ```

use std::net::SocketAddr;
use std::sync::Arc;

use idem_examples::grpc::{serve, Bank};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut listen: SocketAddr = "127.0.0.1:50051".parse()?;
    let mut database_url = format!(
        "sqlite://{}?mode=rwc",
        std::env::temp_dir().join("idem-grpc_payment.db").display()
    );
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--listen" => listen = value.parse()?,
            "--database-url" => database_url = value,
            other => return Err(format!("unknown flag {other}: use --listen, --database-url").into()),
        }
    }
    let store = idem::sql::open(&database_url).await?;
    let listener = tokio::net::TcpListener::bind(listen).await?;
    println!(
        "grpc_payment: listening on http://{} (records in {database_url})",
        listener.local_addr()?
    );
    serve(listener, store, Arc::new(Bank::default())).await?;
    Ok(())
}
