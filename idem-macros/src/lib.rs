//! The `#[idempotent]` attribute of [`idem`](https://docs.rs/idem). Depend on `idem`,
//! which re-exports it together with the runtime it expands to.
//!
//! This crate is a thin door: `args` parses and checks the options, `expand`
//! writes the code, both over `proc_macro2` so they are unit-tested without a compiler
//! run. Why `strsim`: it picks the nearest option name for "did you mean" hints.

use proc_macro::TokenStream;

mod args;
mod duration;
mod expand;

/// Make an `async fn` idempotent: claim the key, run the body once, record the result.
///
/// ```ignore
/// #[idempotent(key = "req.request_id", biz = "pay", ttl = "24h", mode = ReturnFirst)]
/// async fn pay(&self, req: PayRequest) -> Result<Receipt, PayError> { ... }
/// ```
///
/// See the `idem` crate docs for the options and their semantics.
#[proc_macro_attribute]
pub fn idempotent(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item2 = proc_macro2::TokenStream::from(item.clone());
    let parsed = syn::parse2::<syn::ItemFn>(item2.clone()).and_then(|func| {
        expand::check_fn(&func)?;
        let args = args::Args::parse(attr.into())?;
        Ok(expand::expand(args, func))
    });
    match parsed {
        Ok(tokens) => tokens.into(),
        // Keep the original fn so that the rest of the crate, and IDEs, still see it.
        Err(error) => {
            let mut tokens = error.to_compile_error();
            tokens.extend(item2);
            tokens.into()
        }
    }
}
