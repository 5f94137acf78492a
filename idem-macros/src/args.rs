//! The options of `#[idempotent(...)]`, parsed and checked.

use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, Ident, Lit, LitStr, Path, Token};

use crate::duration::parse_millis;

const OPTIONS: [&str; 10] = [
    "key", "biz", "ttl", "mode", "lease", "on_error", "wait", "payload", "store", "crate",
];
const MAX_BIZ_CHARS: usize = 64;

/// A duration option: its value in milliseconds, and the literal it was written as.
pub struct Millis(pub u64, pub proc_macro2::Span);

/// The checked options of one attribute.
pub struct Args {
    pub key: Expr,
    pub biz: LitStr,
    pub ttl: Option<Millis>,
    pub lease: Option<Millis>,
    pub wait: Option<Millis>,
    /// `ReturnFirst` or `Reject`, as written.
    pub mode: Option<Ident>,
    /// `Release` or `Record`, as written.
    pub on_error: Option<Ident>,
    pub payload: Option<Expr>,
    pub store: Option<Expr>,
    pub krate: Option<Path>,
}

/// `name = value`, before the value is checked against the name.
struct RawOption {
    name: Ident,
    value: Expr,
}

impl Parse for RawOption {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        // `Ident::parse_any` so that the keyword `crate` is accepted as a name.
        let name = Ident::parse_any(input)?;
        input.parse::<Token![=]>().map_err(|e| {
            syn::Error::new(
                e.span(),
                format!("expected `=` after `{name}`: options are written `{name} = value`"),
            )
        })?;
        let value = input.parse()?;
        Ok(Self { name, value })
    }
}

impl Args {
    /// Parse and check the attribute's tokens.
    pub fn parse(tokens: TokenStream) -> syn::Result<Self> {
        let raw = Punctuated::<RawOption, Token![,]>::parse_terminated.parse2(tokens)?;
        let mut seen: Vec<Ident> = Vec::new();
        let mut builder = Builder::default();
        for option in raw {
            let name = option.name.to_string();
            if !OPTIONS.contains(&name.as_str()) {
                return Err(unknown_option(&option.name));
            }
            if let Some(first) = seen.iter().find(|seen| **seen == option.name) {
                let mut error =
                    syn::Error::new(option.name.span(), format!("option `{name}` is given twice; keep one"));
                error.combine(syn::Error::new(first.span(), format!("`{name}` is first given here")));
                return Err(error);
            }
            builder.set(&name, option.value)?;
            seen.push(option.name);
        }
        builder.finish()
    }
}

#[derive(Default)]
struct Builder {
    key: Option<Expr>,
    biz: Option<LitStr>,
    ttl: Option<Millis>,
    lease: Option<Millis>,
    wait: Option<Millis>,
    mode: Option<Ident>,
    on_error: Option<Ident>,
    payload: Option<Expr>,
    store: Option<Expr>,
    krate: Option<Path>,
}

impl Builder {
    fn set(&mut self, name: &str, value: Expr) -> syn::Result<()> {
        match name {
            "key" => self.key = Some(expression("key", value, KEY_HINT)?),
            "biz" => self.biz = Some(biz(value)?),
            "ttl" => self.ttl = Some(duration("ttl", &value)?),
            "lease" => self.lease = Some(duration("lease", &value)?),
            "wait" => self.wait = Some(duration("wait", &value)?),
            "mode" => self.mode = Some(variant("mode", "Mode", &value, &["ReturnFirst", "Reject"])?),
            "on_error" => self.on_error = Some(variant("on_error", "OnError", &value, &["Release", "Record"])?),
            "payload" => self.payload = Some(expression("payload", value, "the request, such as \"req\"")?),
            "store" => {
                self.store = Some(expression(
                    "store",
                    value,
                    "a store, such as \"self.store\" or \"&store\"",
                )?)
            }
            _ => self.krate = Some(crate_path(value)?),
        }
        Ok(())
    }

    fn finish(self) -> syn::Result<Args> {
        let missing = |name: &str, example: &str| {
            syn::Error::new(
                Span::call_site(),
                format!("missing option `{name}`: add `{name} = {example}` to `#[idempotent(...)]`"),
            )
        };
        Ok(Args {
            key: self.key.ok_or_else(|| missing("key", "\"req.request_id\""))?,
            biz: self.biz.ok_or_else(|| missing("biz", "\"pay\""))?,
            ttl: self.ttl,
            lease: self.lease,
            wait: self.wait,
            mode: self.mode,
            on_error: self.on_error,
            payload: self.payload,
            store: self.store,
            krate: self.krate,
        })
    }
}

fn unknown_option(name: &Ident) -> syn::Error {
    let given = name.to_string();
    let nearest = OPTIONS
        .iter()
        .map(|option| (strsim::damerau_levenshtein(&given, option), option))
        .min()
        .filter(|(distance, _)| *distance <= 3);
    let suggestion = match nearest {
        Some((_, option)) => format!("did you mean `{option}`? "),
        None => String::new(),
    };
    syn::Error::new(
        name.span(),
        format!(
            "unknown option `{given}`: {suggestion}the options are {}",
            OPTIONS.join(", ")
        ),
    )
}

fn string_literal(value: &Expr) -> Option<&LitStr> {
    match value {
        Expr::Lit(ExprLit { lit: Lit::Str(lit), .. }) => Some(lit),
        _ => None,
    }
}

/// Every option that takes an expression reads a string literal as the expression it
/// contains (`key = "req.id"`, `payload = "req"`, `store = "self.store"`, as Java's SpEL
/// does), spanned on the literal; a bare expression is taken as written.
fn expression(name: &str, value: Expr, hint: &str) -> syn::Result<Expr> {
    let Some(lit) = string_literal(&value) else {
        return Ok(value);
    };
    if lit.value().trim().is_empty() {
        return Err(syn::Error::new(
            lit.span(),
            format!("`{name}` is empty: give the expression of {hint}"),
        ));
    }
    lit.parse::<Expr>().map_err(|e| {
        syn::Error::new(
            lit.span(),
            format!(
                "`{name} = {:?}` is not a Rust expression ({e}); write {hint}",
                lit.value()
            ),
        )
    })
}

/// What a key expression looks like.
const KEY_HINT: &str = "a field path such as \"req.request_id\" or a `format!(..)` call";

fn biz(value: Expr) -> syn::Result<LitStr> {
    let Some(lit) = string_literal(&value) else {
        return Err(syn::Error::new(
            value.span(),
            "`biz` must be a string literal, e.g. `biz = \"pay\"`",
        ));
    };
    let text = lit.value();
    let chars = text.chars().count();
    let problem = if chars == 0 {
        Some("`biz` is empty: name the business namespace, e.g. `biz = \"pay\"`".to_owned())
    } else if chars > MAX_BIZ_CHARS {
        Some(format!(
            "`biz` is {chars} characters long; the limit is {MAX_BIZ_CHARS}"
        ))
    } else if text.chars().any(char::is_control) {
        Some("`biz` contains a control character".to_owned())
    } else {
        None
    };
    match problem {
        Some(problem) => Err(syn::Error::new(lit.span(), problem)),
        None => Ok(lit.clone()),
    }
}

fn duration(name: &str, value: &Expr) -> syn::Result<Millis> {
    let Some(lit) = string_literal(value) else {
        return Err(syn::Error::new(
            value.span(),
            format!("`{name}` must be a duration string, e.g. `{name} = \"30s\"`"),
        ));
    };
    match parse_millis(&lit.value()) {
        Ok(0) => Err(syn::Error::new(
            lit.span(),
            format!("`{name}` must be positive: use at least \"1ms\""),
        )),
        Ok(millis) => Ok(Millis(millis, lit.span())),
        Err(problem) => Err(syn::Error::new(lit.span(), format!("bad `{name}`: {problem}"))),
    }
}

/// `mode = ReturnFirst` (or `Mode::ReturnFirst`, `idem::Mode::ReturnFirst`): one of
/// `allowed`, of the enum `enum_name` when a path names it.
fn variant(name: &str, enum_name: &str, value: &Expr, allowed: &[&str]) -> syn::Result<Ident> {
    let expected = allowed
        .iter()
        .map(|v| format!("`{v}`"))
        .collect::<Vec<_>>()
        .join(" or ");
    let ident = match value {
        Expr::Path(path) => path.path.segments.last().map(|segment| segment.ident.clone()),
        _ => None,
    };
    let Some(ident) = ident else {
        return Err(syn::Error::new(value.span(), format!("`{name}` must be {expected}")));
    };
    if let Expr::Path(path) = value {
        let segments = &path.path.segments;
        if let Some(owner) = segments.len().checked_sub(2).map(|at| &segments[at].ident) {
            if owner != enum_name {
                return Err(syn::Error::new(
                    owner.span(),
                    format!(
                        "`{name}` takes a variant of `idem::{enum_name}`, not of `{owner}`: write `{name} = {ident}`"
                    ),
                ));
            }
        }
    }
    if allowed.iter().any(|v| ident == v) {
        return Ok(ident);
    }
    let given = ident.to_string();
    let nearest = allowed
        .iter()
        .min_by_key(|v| strsim::damerau_levenshtein(&given.to_lowercase(), &v.to_lowercase()))
        .map(|v| format!("; did you mean `{v}`?"))
        .unwrap_or_default();
    Err(syn::Error::new(
        value.span(),
        format!("unknown {name} `{given}`: expected {expected}{nearest}"),
    ))
}

fn crate_path(value: Expr) -> syn::Result<Path> {
    match value {
        Expr::Path(path) if path.qself.is_none() => Ok(path.path),
        Expr::Lit(ExprLit { lit: Lit::Str(lit), .. }) => lit.parse(),
        other => Err(syn::Error::new(
            other.span(),
            "`crate` must be a path to the idem crate, e.g. `crate = ::my_idem`",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn error_of(tokens: TokenStream) -> String {
        match Args::parse(tokens) {
            Ok(_) => panic!("expected an error"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn a_variant_of_another_enum_is_refused() {
        let error = error_of(quote!(key = "a", biz = "b", mode = idem::OnError::Reject));
        assert!(error.contains("variant of `idem::Mode`, not of `OnError`"), "{error}");
        assert!(Args::parse(quote!(key = "a", biz = "b", mode = idem::Mode::Reject)).is_ok());
        assert!(Args::parse(quote!(key = "a", biz = "b", on_error = OnError::Record)).is_ok());
    }

    #[test]
    fn reads_every_option() {
        let args = Args::parse(quote!(
            key = "req.id",
            biz = "pay",
            ttl = "1h30m",
            mode = Reject,
            lease = "10s",
            on_error = Record,
            wait = "2s",
            payload = req,
            store = &self.store,
            crate = ::idem
        ))
        .unwrap();
        assert_eq!(args.biz.value(), "pay");
        assert_eq!(args.ttl.map(|m| m.0), Some(5_400_000));
        assert_eq!(args.mode.unwrap(), "Reject");
        assert_eq!(args.on_error.unwrap(), "Record");
        assert!(args.krate.is_some());
    }

    #[test]
    fn explains_mistakes() {
        assert!(error_of(quote!(key = "a", biz = "b", tll = "1h")).contains("did you mean `ttl`?"));
        assert!(error_of(quote!(key = "a", key = "b", biz = "c")).contains("given twice"));
        assert!(error_of(quote!(biz = "b")).contains("missing option `key`"));
        assert!(error_of(quote!(key = "a", biz = "b", ttl = "0s")).contains("must be positive"));
        assert!(error_of(quote!(key = "a", biz = "b", mode = Rejct)).contains("did you mean `Reject`?"));
        assert!(error_of(quote!(key = "a +", biz = "b")).contains("is not a Rust expression"));
    }
}
