//! The attribute's compile errors (`tests/ui/fail`, with `.stderr` goldens) and the
//! shapes it must accept (`tests/ui/pass`). Regenerate goldens with
//! `TRYBUILD=overwrite cargo test -p idem-compile-fail`, then read the diff.

#[test]
fn attribute_misuse_is_a_spanned_error() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/fail/*.rs");
}

#[test]
fn supported_shapes_compile() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass/*.rs");
}
