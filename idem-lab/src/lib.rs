//! idem's lab tools, not published: each is a binary of this crate.
//!
//! - `chaos`: worker processes call shared keys through `#[idempotent]` while kills,
//!   pauses, partitions, server restarts and clock steps land on them; the kit's checker
//!   judges the history (`.ci/chaos` runs it on every server store).
//! - `probes`: bodies run and wrong answers under each injected fault.
//! - `bench`: the per-backend table of what idem costs against hand-written floors.
//! - `benches/overhead.rs`: criterion, the per-call overhead without a database.
//!
//! ```sh
//! cargo run --release -p idem-lab --bin bench
//! cargo run --release -p idem-lab --bin probes
//! cargo bench -p idem-lab
//! ```
