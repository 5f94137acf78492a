//! The expansion: keep the signature, hand the body to the runtime.

use proc_macro2::{Group, Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::ReturnType;

use crate::args::{Args, Millis, OnTakeover};
use crate::item::IdempotentFn;

/// The fn with its body replaced by claim → execute → record.
pub fn expand(args: Args, item: IdempotentFn) -> TokenStream {
    let IdempotentFn {
        attrs,
        vis,
        sig,
        inner_attrs,
        statements: block,
    } = item;
    let krate = args.krate.map_or_else(default_crate, |path| path.into_token_stream());
    let private = quote!(#krate::__private);

    let ret = match &sig.output {
        ReturnType::Type(_, ty) => ty.to_token_stream(),
        ReturnType::Default => quote_spanned!(sig.paren_token.span.close()=> ()),
    };
    let ret_span = match &sig.output {
        ReturnType::Type(_, ty) => ty.span(),
        ReturnType::Default => sig.paren_token.span.close(),
    };

    let key = &args.key;
    let key_stmt = quote_spanned!(key.span()=> let __idem_key = #private::key(&(#key)););
    let biz = &args.biz;
    // Each duration is set on the builder, and checked against the runtime's bound in a
    // `const _` item, which the compiler always evaluates: out of range is a compile
    // error at the literal.
    let durations = [("ttl", &args.ttl), ("lease", &args.lease), ("wait", &args.wait)];
    let (duration_checks, duration_setters): (Vec<TokenStream>, Vec<TokenStream>) = durations
        .iter()
        .filter_map(|(option, value)| value.as_ref().map(|millis| (option, millis)))
        .map(|(option, Millis(ms, span))| {
            let problem = format!(
                "`{option}` is out of range: a duration is positive and at most 100 years \
                 (`idem::MAX_DURATION`), the longest every store can hold"
            );
            let check = respan(quote!(const _: () = #private::check_duration_ms(#ms, #problem);), *span);
            let setter = syn::Ident::new(option, Span::call_site());
            (check, quote!(.#setter(#private::Duration::from_millis(#ms))))
        })
        .unzip();
    // The tolerance may be zero; its upper bound is checked at the literal as the others'.
    let tolerance = args.clock_tolerance.as_ref().map(|Millis(ms, span)| {
        let problem = "`clock_tolerance` is out of range: at most 100 years (`idem::MAX_DURATION`), the longest \
                       every store can hold";
        let at_least_one = (*ms).max(1);
        let check = respan(
            quote!(const _: () = #private::check_duration_ms(#at_least_one, #problem);),
            *span,
        );
        (check, quote!(.clock_tolerance(#private::Duration::from_millis(#ms))))
    });
    let (duration_checks, duration_setters): (Vec<TokenStream>, Vec<TokenStream>) = duration_checks
        .into_iter()
        .zip(duration_setters)
        .chain(tolerance)
        .unzip();
    let duration_checks = quote!(#(#duration_checks)*);
    let duration_setters = quote!(#(#duration_setters)*);
    let mode = args.mode.map(|variant| quote!(.mode(#private::Mode::#variant)));
    let outcome_policy = args.outcome_policy_required.then(|| quote!(.require_outcome_policy()));
    let keep_request = args.keep_request.then(|| quote!(.keep_request(true)));
    let keep_answer = args.digest_only.then(|| quote!(.keep_answer(false)));
    let redact = (!args.redact.is_empty()).then(|| {
        let pointers = &args.redact;
        quote!(.redact([#(#pointers),*]))
    });
    let after_expiry = args
        .gone_for
        .map(|Millis(ms, _)| quote!(.after_expiry(#private::AfterExpiry::Gone(#private::Duration::from_millis(#ms)))));
    let subject = args.subject.map(|subject| {
        // Borrowed so that a field is not moved out of its request; a subject that is
        // a reference already makes that borrow one clippy would flag in user code.
        quote_spanned!(subject.span()=>
            #[allow(clippy::needless_borrows_for_generic_args)]
            let __idem_op = __idem_op.subject(&(#subject));
        )
    });
    let on_error = args
        .on_error
        .map(|variant| quote!(.on_error(#private::OnError::#variant)));
    // A `ttl` expression: evaluated once per call, as a `Duration` (a type error on the
    // expression otherwise), its range checked when the call runs.
    let ttl_expr = args
        .ttl_expr
        .map(|ttl| quote_spanned!(ttl.span()=> let __idem_op = #private::ttl(__idem_op, #ttl);));
    let payload = args
        .payload
        .map(|payload| quote_spanned!(payload.span()=> let __idem_op = #private::payload(__idem_op, &(#payload));));
    let store_span = args.store.as_ref().map(|store| store.span());
    let (store_stmt, store_arg) = match args.store {
        Some(store) => (
            quote_spanned!(store.span()=>
                let __idem_store_value = &(#store);
                let __idem_store = #private::store(__idem_store_value);
            ),
            quote_spanned!(ret_span=> ::core::option::Option::Some(&*__idem_store)),
        ),
        None => (quote!(), quote_spanned!(ret_span=> ::core::option::Option::None)),
    };
    // The whole call is spanned on the return type: an unmet bound on `T` or `E` is
    // reported there, once.
    let run = respan(
        quote!(#private::run::<#ret, _>(&__idem_op, #store_arg, __idem_key, __idem_describe, __idem_body).await),
        ret_span,
    );
    // An `Err` is described by its `Display` text where its type has one, else by its
    // type (autoref specialization: resolved here, where the error type is concrete).
    let describe = respan(
        quote! {
            #[allow(clippy::type_complexity)]
            let __idem_describe: fn(&<#ret as #private::IdempotentReturn>::Err) -> ::std::string::String = |__idem_error| {
                #[allow(unused_imports)]
                use #private::{DescribeByDisplay as _, DescribeByType as _};
                (&&#private::Describe(__idem_error)).describe()
            };
        },
        ret_span,
    );

    let body = quote! {
        async move {
            // Fixes the block's return type before its first `?`, as async-trait does.
            #[allow(unreachable_code)]
            if let ::core::option::Option::Some(__idem_ret) = ::core::option::Option::None::<#ret> {
                return __idem_ret;
            }
            #block
        }
    };
    // `on_takeover`: the whole body as the runtime's body step, under its policy.
    let takeover = match &args.on_takeover {
        None | Some(OnTakeover::Rerun) => quote!(),
        Some(OnTakeover::FailClosed) => quote! {
            let __idem_body = async move { #private::Step::body().fail_closed().run(__idem_body).await };
        },
        Some(OnTakeover::Reconcile(lookup)) => quote_spanned! {lookup.span()=>
            let __idem_body = async move { #private::Step::body().reconcile(#lookup).run(__idem_body).await };
        },
    };
    let call = match &args.tx {
        None => quote! {
            let __idem_body = #body;
            #takeover
            #run
        },
        Some(tx) => transactional(&private, tx, &ret, store_span, &body, ret_span),
    };
    let statements = quote! {
            #duration_checks
            #key_stmt
            let __idem_op = #private::Idempotent::new(#biz) #duration_setters #mode #on_error #outcome_policy #keep_request #keep_answer #redact #after_expiry;
            #ttl_expr
            #payload
            #subject
            #store_stmt
            #describe
            #call
    };
    // The fn's braces are spanned on the return type too: rustc reports the bounds of
    // the awaited future at the body, and they belong to the return type.
    let body = quote_spanned!(ret_span=> { #inner_attrs #statements });
    quote!(#(#attrs)* #vis #sig #body)
}

/// Transactional mode: admission on the transaction in parameter `tx`, the body with
/// `tx` reborrowed for it, the outcome recorded on the transaction again.
fn transactional(
    private: &TokenStream,
    tx: &syn::Ident,
    ret: &TokenStream,
    store_span: Option<Span>,
    body: &TokenStream,
    ret_span: Span,
) -> TokenStream {
    let store = if store_span.is_some() {
        quote!(::core::option::Option::Some(#private::store_of(&__idem_store)))
    } else {
        quote!(::core::option::Option::None)
    };
    // `tx` must be a transaction, and `store = ...` a store of its database: each a
    // compile error on the tokens at fault.
    // Every token on `tx`: the unmet bound and the type it leaves unknown are then one
    // error there, not a second one on the attribute.
    let tx_check = respan(quote!(let __idem_tx = #private::transaction(#tx);), tx.span());
    let store_check =
        store_span.map(|span| quote_spanned!(span=> #private::StoreCheck::of(&*__idem_tx).store(__idem_store_value);));
    let returns = quote!(<#ret as #private::IdempotentReturn>);
    let admit = respan(
        quote! {
            let __idem_call = match #private::admit::<_, #returns::Ok>(&__idem_op, #store, &mut *__idem_tx, __idem_key).await {
                ::core::result::Result::Ok(#private::Admitted::Claimed(__idem_call)) => __idem_call,
                ::core::result::Result::Ok(#private::Admitted::Replayed(__idem_value)) => {
                    return #returns::from_result(::core::result::Result::Ok(__idem_value));
                }
                ::core::result::Result::Err(__idem_error) => {
                    return #returns::from_result(::core::result::Result::Err(__idem_error.into()));
                }
            };
        },
        ret_span,
    );
    let record = respan(
        quote! {
            #returns::from_result(
                __idem_call.record(&mut *__idem_tx, #returns::into_result(__idem_outcome), __idem_describe).await
            )
        },
        ret_span,
    );
    // The body keeps its own spans; `tx` in it is the reborrow made for it.
    // The reborrow for the body is spanned on `tx` too: a parameter that is no
    // transaction is reported there, once.
    let reborrow = quote_spanned!(tx.span()=> let #tx = &mut *__idem_tx;);
    quote! {
        #tx_check
        #store_check
        #admit
        let __idem_outcome = __idem_call.run({
            #[allow(unused_variables)]
            #reborrow
            #body
        }).await;
        #record
    }
}

/// Where `idem` is for the crate being compiled: its name in that crate's `Cargo.toml`,
/// so a renamed dependency (`payments_idem = { package = "idem" }`) needs no `crate = ...`.
fn default_crate() -> TokenStream {
    match proc_macro_crate::crate_name("idem") {
        Ok(proc_macro_crate::FoundCrate::Name(name)) => {
            let name = syn::Ident::new(&name, Span::call_site());
            quote!(::#name)
        }
        // `idem` itself (its tests and doctests see it as `idem`), or not found: the
        // compiler's own error then names the missing crate.
        _ => quote!(::idem),
    }
}

/// `tokens` with every span set to `span`, so that rustc, which reports an unmet bound
/// of a call at one of its tokens, always points there.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tree| {
            if let TokenTree::Group(group) = &tree {
                let mut inner = Group::new(group.delimiter(), respan(group.stream(), span));
                inner.set_span(span);
                tree = TokenTree::Group(inner);
            }
            tree.set_span(span);
            tree
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    #[test]
    fn keeps_the_signature_and_claims_before_the_body() {
        let args = Args::parse(quote!(key = "req.id", biz = "pay", ttl = "1h")).unwrap();
        let item: IdempotentFn = syn::parse2(quote!(
            pub async fn pay(&self, req: Req) -> Result<u32, E> {
                Ok(req.amount)
            }
        ))
        .unwrap();
        let out = expand(args, item).to_string();
        assert!(out.starts_with("pub async fn pay (& self , req : Req) -> Result < u32 , E >"));
        let key_at = out.find("__private :: key (& (req . id))").unwrap();
        let body_at = out.find("Ok (req . amount)").unwrap();
        assert!(key_at < body_at);
        assert!(out.contains("check_duration_ms (3600000u64 , \"`ttl` is out of range"));
        assert!(out.contains("Duration :: from_millis (3600000u64)"));
    }
}
