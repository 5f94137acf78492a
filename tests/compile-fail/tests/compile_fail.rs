//! The attribute's compile errors (`tests/ui/fail`, with `.stderr` goldens; the shapes it
//! must accept are `tests/shapes.rs`). Regenerate goldens with
//! `TRYBUILD=overwrite cargo test -p idem-compile-fail`, then read the diff.

#[test]
fn attribute_misuse_is_a_spanned_error() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/fail/*.rs");
}
