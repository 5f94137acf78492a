//! The `#[idempotent]` attribute's compile errors (`tests/ui/fail`, with `.stderr`
//! goldens) and the shapes it must accept (`tests/shapes.rs`), in a crate of their own:
//! trybuild builds this crate's dev-dependencies again in its own target directory, so
//! they are kept to what the cases use. `cargo test -p idem-compile-fail`.
