//! The annotated fn: its signature parsed, its body kept as tokens.
//!
//! As `tokio-macros` and `tracing-attributes` do, the body is not parsed: a syntax error
//! in it is then reported once, by rustc, at the user's tokens; and the body's inner
//! attributes (`#![allow(..)]`) are split off so they stay at the top of the fn body.

use proc_macro2::{Delimiter, TokenStream, TokenTree};
use quote::ToTokens;
use syn::parse::{Parse, ParseStream};
use syn::{Attribute, ReturnType, Signature, Token, Visibility};

/// `#[attrs] vis sig { #![inner] statements }`.
pub struct IdempotentFn {
    pub attrs: Vec<Attribute>,
    pub vis: Visibility,
    pub sig: Signature,
    /// The body's inner attributes, `#![...]` each.
    pub inner_attrs: TokenStream,
    /// The body's statements, as written.
    pub statements: TokenStream,
}

impl Parse for IdempotentFn {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis: Visibility = input.parse()?;
        let sig: Signature = input.parse()?;
        if input.peek(Token![;]) {
            return Err(syn::Error::new(
                sig.ident.span(),
                format!(
                    "`#[idempotent]` goes on a fn with a body: put it on `{}` in the `impl` block, not on the \
                     trait's declaration",
                    sig.ident
                ),
            ));
        }
        let body = match input.parse::<TokenTree>()? {
            TokenTree::Group(group) if group.delimiter() == Delimiter::Brace => group.stream(),
            other => return Err(syn::Error::new(other.span(), "expected the fn's body in `{ ... }`")),
        };
        let (inner_attrs, statements) = split_inner_attributes(body);
        Ok(Self {
            attrs,
            vis,
            sig,
            inner_attrs,
            statements,
        })
    }
}

/// `#![a] #![b] rest` → (`#![a] #![b]`, `rest`).
fn split_inner_attributes(body: TokenStream) -> (TokenStream, TokenStream) {
    let tokens: Vec<TokenTree> = body.into_iter().collect();
    let mut at = 0;
    while let [TokenTree::Punct(pound), TokenTree::Punct(bang), TokenTree::Group(group), ..] = &tokens[at..] {
        if pound.as_char() != '#' || bang.as_char() != '!' || group.delimiter() != Delimiter::Bracket {
            break;
        }
        at += 3;
    }
    let (inner, rest) = tokens.split_at(at);
    (inner.iter().cloned().collect(), rest.iter().cloned().collect())
}

/// Check that the fn can be made idempotent.
pub fn check(item: &IdempotentFn) -> syn::Result<()> {
    let sig = &item.sig;
    if let Some(constness) = sig.constness {
        return Err(syn::Error::new(
            constness.span,
            "`#[idempotent]` cannot be used on a `const fn`: it claims a key in a store at run time",
        ));
    }
    if sig.asyncness.is_none() {
        if rewritten_by_async_trait(&sig.output) {
            return Err(syn::Error::new(
                sig.fn_token.span,
                "`#[idempotent]` sees this method after `#[async_trait]` rewrote it into a fn returning a boxed \
                 future, which it cannot wrap: write the trait with native `async fn` (Rust 1.75+), or keep the \
                 `#[idempotent]` body in an inherent `async fn` and call it from the trait method",
            ));
        }
        return Err(syn::Error::new(
            sig.fn_token.span,
            "`#[idempotent]` works on `async fn` only: write `async fn` (the claim and the record are awaited)",
        ));
    }
    if let Some(borrowed) = borrowed_ok_type(&sig.output) {
        return Err(syn::Error::new_spanned(
            borrowed,
            "the `Ok` type borrows: a duplicate gets the value read back from the store, so it must own its \
             data; return an owned type (`String` for `&str`, `Vec<T>` for `&[T]`)",
        ));
    }
    if let Some((error, named)) = foreign_error_type(&sig.output) {
        return Err(syn::Error::new_spanned(
            error,
            format!(
                "`{named}` cannot carry idem's errors (`InProgress`, `Store`, …), and, a type of another crate, it \
                 cannot be given `impl From<idem::Error>`: return an error enum of your own with a \
                 `#[from] idem::Error` variant, `anyhow::Error`, or `Box<dyn std::error::Error + Send + Sync>`"
            ),
        ));
    }
    Ok(())
}

/// The type arguments of `Result<T, E>`, when the fn returns one.
fn result_arguments(output: &ReturnType) -> Option<&syn::punctuated::Punctuated<syn::GenericArgument, Token![,]>> {
    let ReturnType::Type(_, ty) = output else {
        return None;
    };
    let syn::Type::Path(path) = &**ty else {
        return None;
    };
    let last = path.path.segments.last().filter(|segment| segment.ident == "Result")?;
    match &last.arguments {
        syn::PathArguments::AngleBracketed(args) => Some(&args.args),
        _ => None,
    }
}

/// `Result<&'a T, E>`: the `&'a T`.
fn borrowed_ok_type(output: &ReturnType) -> Option<&syn::TypeReference> {
    match result_arguments(output)?.first() {
        Some(syn::GenericArgument::Type(syn::Type::Reference(reference))) => Some(reference),
        _ => None,
    }
}

/// `Result<T, E>` whose `E` is a standard type that no crate but its own may give
/// `From<idem::Error>` (`String`, `&str`, `()`, `std::io::Error`): `E`, and how to name it.
fn foreign_error_type(output: &ReturnType) -> Option<(&syn::Type, &'static str)> {
    let Some(syn::GenericArgument::Type(error)) = result_arguments(output)?.iter().nth(1) else {
        return None;
    };
    let named = match error {
        syn::Type::Tuple(unit) if unit.elems.is_empty() => "()",
        syn::Type::Reference(reference) if matches!(&*reference.elem, syn::Type::Path(p) if p.path.is_ident("str")) => {
            "&str"
        }
        syn::Type::Path(path) if path.qself.is_none() => {
            let segments: Vec<String> = path.path.segments.iter().map(|s| s.ident.to_string()).collect();
            let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
            match segments.as_slice() {
                ["String"] | ["std", "string", "String"] | ["alloc", "string", "String"] => "String",
                ["io", "Error"] | ["std", "io", "Error"] => "std::io::Error",
                _ => return None,
            }
        }
        _ => return None,
    };
    Some((error, named))
}

/// `&mut self` with `store = &self.store`: the store would stay borrowed from `self`
/// while the body, which holds `self`, runs. An `Arc` store is cloned for the call.
pub fn check_store(item: &IdempotentFn, store: Option<&syn::Expr>) -> syn::Result<()> {
    let mutable_self = matches!(
        item.sig.receiver(),
        Some(receiver) if receiver.reference.is_some() && receiver.mutability.is_some()
    );
    let Some(syn::Expr::Reference(reference)) = store else {
        return Ok(());
    };
    let from_self = reference
        .expr
        .to_token_stream()
        .into_iter()
        .next()
        .is_some_and(|first| first.to_string() == "self");
    if mutable_self && from_self {
        return Err(syn::Error::new_spanned(
            reference,
            "with `&mut self`, `store = &self...` keeps `self` borrowed while the body runs: keep the store in an \
             `Arc` field and write `store = self.store` (the `Arc` is cloned for the call)",
        ));
    }
    Ok(())
}

/// `tx = name` names a parameter of the fn, bound by a plain identifier.
pub fn check_tx(item: &IdempotentFn, tx: Option<&syn::Ident>) -> syn::Result<()> {
    let Some(tx) = tx else { return Ok(()) };
    let found = item.sig.inputs.iter().any(|input| {
        matches!(input, syn::FnArg::Typed(typed)
            if matches!(&*typed.pat, syn::Pat::Ident(pat) if pat.ident == *tx && pat.subpat.is_none()))
    });
    if found {
        return Ok(());
    }
    let names: Vec<String> = item
        .sig
        .inputs
        .iter()
        .filter_map(|input| match input {
            syn::FnArg::Typed(typed) => match &*typed.pat {
                syn::Pat::Ident(pat) => Some(format!("`{}`", pat.ident)),
                _ => None,
            },
            syn::FnArg::Receiver(_) => None,
        })
        .collect();
    Err(syn::Error::new_spanned(
        tx,
        format!(
            "`tx = {tx}` names no parameter of this fn (its parameters: {}); name the one of type \
             `&mut sqlx::Transaction<'_, DB>`",
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            }
        ),
    ))
}

/// `-> Pin<Box<dyn Future<Output = ..> + Send + 'async_trait>>`.
fn rewritten_by_async_trait(output: &ReturnType) -> bool {
    let ReturnType::Type(_, ty) = output else {
        return false;
    };
    let text = ty.to_token_stream().to_string();
    text.contains("Pin") && text.contains("Future") && text.contains("async_trait")
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    #[test]
    fn keeps_the_body_as_tokens_and_splits_inner_attributes() {
        let item: IdempotentFn = syn::parse2(quote!(
            pub async fn f(&self) -> Result<u32, E> {
                #![allow(unused_variables)]
                #![allow(dead_code)]
                let x = 1;
                Ok(2)
            }
        ))
        .unwrap();
        assert_eq!(
            item.inner_attrs.to_string(),
            "# ! [allow (unused_variables)] # ! [allow (dead_code)]"
        );
        assert_eq!(item.statements.to_string(), "let x = 1 ; Ok (2)");
        let broken: IdempotentFn = syn::parse2(quote!(async fn f() -> Result<u32, E> { let = ; })).unwrap();
        assert_eq!(
            broken.statements.to_string(),
            "let = ;",
            "a body's syntax is rustc's to judge"
        );
    }

    #[test]
    fn a_standard_error_type_is_refused_by_name_and_an_own_one_is_not() {
        for (returned, named) in [
            (quote!(Result<u32, String>), "`String`"),
            (quote!(Result<u32, std::string::String>), "`String`"),
            (quote!(Result<u32, &'static str>), "`&str`"),
            (quote!(Result<u32, ()>), "`()`"),
            (quote!(Result<u32, std::io::Error>), "`std::io::Error`"),
            (quote!(Result<u32, io::Error>), "`std::io::Error`"),
        ] {
            let item: IdempotentFn = syn::parse2(quote!(async fn f() -> #returned { Ok(1) })).unwrap();
            let error = check(&item).unwrap_err().to_string();
            assert!(
                error.starts_with(named) && error.contains("error enum of your own"),
                "{returned}: {error}"
            );
        }
        for returned in [
            quote!(Result<u32, AppError>),
            quote!(Result<u32, anyhow::Error>),
            quote!(io::Result<u32>),
        ] {
            let item: IdempotentFn = syn::parse2(quote!(async fn f() -> #returned { Ok(1) })).unwrap();
            assert!(check(&item).is_ok(), "{returned}");
        }
    }

    #[test]
    fn a_store_borrowed_from_mut_self_names_the_arc() {
        let item: IdempotentFn = syn::parse2(quote!(
            async fn f(&mut self) -> Result<u32, E> {
                Ok(1)
            }
        ))
        .unwrap();
        let borrowed: syn::Expr = syn::parse2(quote!(&self.store)).unwrap();
        let error = check_store(&item, Some(&borrowed)).unwrap_err().to_string();
        assert!(error.contains("keep the store in an `Arc`"), "{error}");
        let shared: syn::Expr = syn::parse2(quote!(self.store)).unwrap();
        assert!(check_store(&item, Some(&shared)).is_ok());
    }

    #[test]
    fn refuses_sync_and_const_fns() {
        let sync: IdempotentFn = syn::parse2(quote!(
            fn f() -> Result<(), E> {
                Ok(())
            }
        ))
        .unwrap();
        assert!(check(&sync).unwrap_err().to_string().contains("`async fn` only"));
        let konst: IdempotentFn = syn::parse2(quote!(
            const fn f() -> Result<(), E> {
                Ok(())
            }
        ))
        .unwrap();
        assert!(check(&konst).unwrap_err().to_string().contains("`const fn`"));
    }

    #[test]
    fn names_the_fix_for_a_trait_declaration_and_an_async_trait_method() {
        let declared = syn::parse2::<IdempotentFn>(quote!(
            async fn pay(&self) -> Result<u32, E>;
        ));
        let error = declared.err().unwrap().to_string();
        assert!(error.contains("put it on `pay` in the `impl` block"), "{error}");
        let rewritten: IdempotentFn = syn::parse2(quote!(
            fn pay<'async_trait>(
                &'async_trait self,
            ) -> ::core::pin::Pin<
                Box<dyn ::core::future::Future<Output = Result<u32, E>> + ::core::marker::Send + 'async_trait>,
            > {
                Box::pin(async move { Ok(1) })
            }
        ))
        .unwrap();
        let error = check(&rewritten).unwrap_err().to_string();
        assert!(error.contains("after `#[async_trait]` rewrote it"), "{error}");
    }
}
