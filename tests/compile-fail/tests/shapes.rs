//! The shapes the attribute must accept: each file under `tests/shapes/` is a module of
//! this test, so it compiles with the rest of the workspace's tests (trybuild would build
//! every dependency once more for them), and its `main` runs.

// Shapes declared to be compiled, not all of them called.
#[allow(dead_code)]
#[path = "shapes/generics_and_patterns.rs"]
mod generics_and_patterns;
// Its `main` drops the futures it makes without awaiting them, on purpose; its bodies
// are laid out as users write them, not as rustfmt would.
#[allow(clippy::let_underscore_future)]
#[rustfmt::skip]
#[path = "shapes/inner_attributes.rs"]
mod inner_attributes;
#[allow(dead_code)]
#[path = "shapes/methods_and_stores.rs"]
mod methods_and_stores;

#[test]
fn supported_shapes_compile() {
    generics_and_patterns::main();
    inner_attributes::main();
    methods_and_stores::main();
}
