//! The options of `#[idempotent(...)]`, parsed and checked.
//!
//! darling reads the attribute as a list of `name = value` items and gives each value
//! type its own `FromMeta` (durations, modes, the namespace); an accumulator collects
//! every mistake of one attribute, so all of them are reported at once, each on its
//! own tokens. The names are matched here, so a repeated option points at both places
//! and an unknown one lists the options beside darling's "did you mean".

use darling::ast::NestedMeta;
use darling::{Error, FromMeta};
use proc_macro2::{Span, TokenStream};
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, Ident, Lit, LitStr, Meta, Path};

use crate::duration::parse_millis;

const OPTIONS: [&str; 19] = [
    "key",
    "biz",
    "ttl",
    "mode",
    "lease",
    "clock_tolerance",
    "on_error",
    "on_takeover",
    "outcome_policy",
    "wait",
    "payload",
    "keep_request",
    "keep_answer",
    "redact",
    "subject",
    "after_expiry",
    "store",
    "tx",
    "crate",
];
const MAX_BIZ_CHARS: usize = 64;
/// Where form tokens keep their records (`idem::TOKEN_NAMESPACE`).
const TOKEN_NAMESPACE: &str = "token.";

/// What a key expression looks like.
const KEY_HINT: &str = "a field path such as \"req.request_id\" or a `format!(..)` call";

/// A duration option: its value in milliseconds, and the literal it was written as.
pub struct Millis(pub u64, pub Span);

/// Stands for the option's name in the errors of [`Millis`], which is not told it.
const OPTION: &str = "{option}";

impl FromMeta for Millis {
    fn from_value(value: &Lit) -> darling::Result<Self> {
        let Lit::Str(lit) = value else {
            return Err(Error::custom(format!(
                "`{OPTION}` must be a duration string, e.g. `{OPTION} = \"30s\"`"
            ))
            .with_span(value));
        };
        match parse_millis(&lit.value()) {
            Ok(0) => Err(Error::custom(format!("`{OPTION}` must be positive: use at least \"1ms\"")).with_span(lit)),
            Ok(millis) => Ok(Millis(millis, lit.span())),
            Err(problem) => Err(Error::custom(format!("bad `{OPTION}`: {problem}")).with_span(lit)),
        }
    }

    fn from_expr(value: &Expr) -> darling::Result<Self> {
        match value {
            Expr::Lit(lit) => Self::from_value(&lit.lit),
            other => Err(Error::custom(format!(
                "`{OPTION}` must be a duration string, e.g. `{OPTION} = \"30s\"`"
            ))
            .with_span(other)),
        }
    }
}

/// `clock_tolerance = "0s"`: a duration that may be zero.
fn tolerance(value: &Expr) -> darling::Result<Millis> {
    let hint = "`clock_tolerance` must be a duration string, e.g. `clock_tolerance = \"30s\"` (or \"0s\" for none)";
    match value {
        Expr::Lit(ExprLit { lit: Lit::Str(lit), .. }) => parse_millis(&lit.value())
            .map(|millis| Millis(millis, lit.span()))
            .map_err(|problem| Error::custom(format!("bad `clock_tolerance`: {problem}")).with_span(lit)),
        other => Err(Error::custom(hint).with_span(other)),
    }
}

/// `on_takeover = ...`: what a call that takes the record over (its holder died
/// mid-body) does before it runs the body again.
pub enum OnTakeover {
    /// `rerun`: run it again (the default).
    Rerun,
    /// `fail_closed`: fail with `OutcomeUnknown` until an operator settles the record.
    FailClosed,
    /// `reconcile(lookup)`: ask `lookup` whether the body's effect happened.
    Reconcile(Expr),
}

fn on_takeover(value: &Expr) -> darling::Result<(OnTakeover, Span)> {
    let hint = "`on_takeover` is `fail_closed`, `reconcile(lookup)` (an async closure or fn taking the \
                `idem::Intent` and answering `Result<idem::Lookup<T>, _>`) or `rerun`";
    match value {
        Expr::Path(path) if path.path.is_ident("fail_closed") => Ok((OnTakeover::FailClosed, path.span())),
        Expr::Path(path) if path.path.is_ident("rerun") => Ok((OnTakeover::Rerun, path.span())),
        Expr::Call(call) if matches!(&*call.func, Expr::Path(path) if path.path.is_ident("reconcile")) => {
            match call.args.len() {
                1 => Ok((OnTakeover::Reconcile(call.args[0].clone()), call.func.span())),
                _ => Err(Error::custom(format!("`reconcile` takes one lookup: {hint}")).with_span(call)),
            }
        }
        other => Err(Error::custom(hint).with_span(other)),
    }
}

/// `outcome_policy = required`: every step must declare what to do when its outcome is
/// unknown.
fn outcome_policy(value: &Expr) -> darling::Result<Span> {
    match value {
        Expr::Path(path) if path.path.is_ident("required") => Ok(path.span()),
        other => Err(Error::custom(
            "`outcome_policy` takes `required`: every step of the operation must say what to do when its \
             outcome is unknown (`Step::reconcile` or `Step::fail_closed`); leave the option out otherwise",
        )
        .with_span(other)),
    }
}

/// `after_expiry = NewRequest` (the default), or `Gone("30d")`: the tombstone's window
/// past the `ttl`.
fn after_expiry(value: &Expr) -> darling::Result<Option<Millis>> {
    let hint = "`after_expiry` is `NewRequest` (a retry after the `ttl` runs as a new request, the default) or \
                `Gone(\"30d\")` (for that long past the `ttl` a retry gets `Error::Expired` and never runs)";
    let named_as = |path: &Expr, name: &str| matches!(path, Expr::Path(path) if path.path.segments.last().is_some_and(|last| last.ident == name));
    match value {
        path if named_as(path, "NewRequest") => Ok(None),
        Expr::Call(call) if named_as(&call.func, "Gone") => match call.args.first() {
            Some(window @ Expr::Lit(ExprLit { lit: Lit::Str(_), .. })) if call.args.len() == 1 => {
                Millis::from_expr(window)
                    .map(Some)
                    .map_err(|error| named("after_expiry", error))
            }
            Some(window) if call.args.len() == 1 => {
                Err(Error::custom(format!("the window of `Gone` is a duration string: {hint}")).with_span(window))
            }
            _ => Err(Error::custom(format!("`Gone` takes one window, a duration string: {hint}")).with_span(call)),
        },
        other => Err(Error::custom(hint).with_span(other)),
    }
}

/// `biz = "pay"`: 1 to 64 characters, no control character.
struct Biz(LitStr);

impl FromMeta for Biz {
    fn from_expr(value: &Expr) -> darling::Result<Self> {
        match value {
            Expr::Lit(lit) => Self::from_value(&lit.lit),
            other => {
                let text = quote::ToTokens::to_token_stream(other).to_string().replace(' ', "");
                Err(Error::custom(format!(
                    "`biz` must be a string literal: write `biz = \"{text}\"` (the namespace is fixed at compile time)"
                ))
                .with_span(other))
            }
        }
    }

    fn from_value(value: &Lit) -> darling::Result<Self> {
        let Lit::Str(lit) = value else {
            return Err(Error::custom("`biz` must be a string literal, e.g. `biz = \"pay\"`").with_span(value));
        };
        let text = lit.value();
        let chars = text.chars().count();
        let problem = if chars == 0 {
            "`biz` is empty: name the business namespace, e.g. `biz = \"pay\"`".to_owned()
        } else if chars > MAX_BIZ_CHARS {
            format!("`biz` is {chars} characters long; the limit is {MAX_BIZ_CHARS}")
        } else if text.chars().any(char::is_control) {
            "`biz` contains a control character".to_owned()
        } else if let Some(rest) = text.strip_prefix(TOKEN_NAMESPACE) {
            format!(
                "`biz` must not begin with `{TOKEN_NAMESPACE}`: that namespace belongs to form tokens \
                 (`idem::token`), whose records it would share; name it otherwise, e.g. `biz = \"{rest}\"`"
            )
        } else {
            return Ok(Biz(lit.clone()));
        };
        Err(Error::custom(problem).with_span(lit))
    }
}

/// A variant of one of the runtime's enums, written bare (`Reject`) or by path
/// (`Mode::Reject`, `idem::Mode::Reject`).
trait Variants {
    /// The option's name.
    const OPTION: &'static str;
    /// The enum's name.
    const ENUM: &'static str;
    const VARIANTS: &'static [&'static str];
}

struct ModeOption;
impl Variants for ModeOption {
    const OPTION: &'static str = "mode";
    const ENUM: &'static str = "Mode";
    const VARIANTS: &'static [&'static str] = &["ReturnFirst", "Reject"];
}

struct OnErrorOption;
impl Variants for OnErrorOption {
    const OPTION: &'static str = "on_error";
    const ENUM: &'static str = "OnError";
    const VARIANTS: &'static [&'static str] = &["Release", "Record"];
}

struct Variant<V>(Ident, std::marker::PhantomData<V>);

impl<V: Variants> FromMeta for Variant<V> {
    fn from_expr(value: &Expr) -> darling::Result<Self> {
        let (name, enum_name) = (V::OPTION, V::ENUM);
        let expected = V::VARIANTS
            .iter()
            .map(|v| format!("`{v}`"))
            .collect::<Vec<_>>()
            .join(" or ");
        let Expr::Path(path) = value else {
            return Err(Error::custom(format!("`{name}` must be {expected}")).with_span(value));
        };
        let segments = &path.path.segments;
        let Some(ident) = segments.last().map(|segment| segment.ident.clone()) else {
            return Err(Error::custom(format!("`{name}` must be {expected}")).with_span(value));
        };
        if let Some(owner) = segments.len().checked_sub(2).map(|at| &segments[at].ident) {
            if owner != enum_name {
                return Err(Error::custom(format!(
                    "`{name}` takes a variant of `idem::{enum_name}`, not of `{owner}`: write `{name} = {ident}`"
                ))
                .with_span(owner));
            }
        }
        if V::VARIANTS.iter().any(|v| ident == v) {
            return Ok(Variant(ident, std::marker::PhantomData));
        }
        let given = ident.to_string();
        let nearest = V::VARIANTS
            .iter()
            .min_by_key(|v| strsim::damerau_levenshtein(&given.to_lowercase(), &v.to_lowercase()))
            .map(|v| format!("; did you mean `{v}`?"))
            .unwrap_or_default();
        Err(Error::custom(format!("unknown {name} `{given}`: expected {expected}{nearest}")).with_span(value))
    }
}

/// The checked options of one attribute.
pub struct Args {
    pub key: Expr,
    pub biz: LitStr,
    pub ttl: Option<Millis>,
    /// `ttl = some_expression`: a `Duration` evaluated once per call.
    pub ttl_expr: Option<Expr>,
    pub lease: Option<Millis>,
    /// May be zero.
    pub clock_tolerance: Option<Millis>,
    pub wait: Option<Millis>,
    /// `ReturnFirst` or `Reject`, as written.
    pub mode: Option<Ident>,
    /// `Release` or `Record`, as written.
    pub on_error: Option<Ident>,
    pub on_takeover: Option<OnTakeover>,
    /// `outcome_policy = required`.
    pub outcome_policy_required: bool,
    pub payload: Option<Expr>,
    /// `keep_request = true`.
    pub keep_request: bool,
    /// `keep_answer = false`: only a digest of the answer.
    pub digest_only: bool,
    /// `redact = ["/card/number"]`: the JSON pointers recorded as redacted.
    pub redact: Vec<LitStr>,
    /// The data subject's expression.
    pub subject: Option<Expr>,
    /// `after_expiry = Gone("30d")`: the tombstone's window.
    pub gone_for: Option<Millis>,
    pub store: Option<Expr>,
    /// The parameter holding the caller's transaction (transactional mode).
    pub tx: Option<Ident>,
    pub krate: Option<Path>,
}

impl Args {
    /// Parse and check the attribute's tokens; every mistake is reported.
    pub fn parse(tokens: TokenStream) -> darling::Result<Self> {
        let items = NestedMeta::parse_meta_list(tokens)?;
        let mut errors = Error::accumulator();
        let mut seen: Vec<Ident> = Vec::new();
        let mut options = Options::default();
        for item in items {
            let meta = match item {
                NestedMeta::Meta(Meta::NameValue(meta)) => meta,
                other => {
                    errors.push(expected_name_value(&other));
                    continue;
                }
            };
            let Some(name) = meta.path.get_ident().cloned() else {
                errors.push(Error::custom("an option is one name, e.g. `ttl = \"1h\"`").with_span(&meta.path));
                continue;
            };
            let option = name.to_string();
            if !OPTIONS.contains(&option.as_str()) {
                errors.push(unknown_option(&name));
                continue;
            }
            if let Some(first) = seen.iter().find(|seen| **seen == name) {
                errors.push(Error::custom(format!("option `{option}` is given twice; keep one")).with_span(&name));
                errors.push(Error::custom(format!("`{option}` is first given here")).with_span(first));
                continue;
            }
            seen.push(name.clone());
            let value = &meta.value;
            let named = |error: Error| named(&option, error);
            match option.as_str() {
                "key" => options.key = errors.handle(expression("key", value, KEY_HINT)),
                "biz" => options.biz = errors.handle(Biz::from_expr(value).map(|biz| biz.0)),
                "ttl" => match value {
                    // Anything but a literal is a `Duration` evaluated once per call.
                    Expr::Lit(_) => options.ttl = errors.handle(Millis::from_expr(value).map_err(named)),
                    expression => options.ttl_expr = Some(expression.clone()),
                },
                "lease" => options.lease = errors.handle(Millis::from_expr(value).map_err(named)),
                "clock_tolerance" => options.clock_tolerance = errors.handle(tolerance(value)),
                "wait" => options.wait = errors.handle(Millis::from_expr(value).map_err(named)),
                "mode" => options.mode = errors.handle(Variant::<ModeOption>::from_expr(value).map(|v| v.0)),
                "on_error" => options.on_error = errors.handle(Variant::<OnErrorOption>::from_expr(value).map(|v| v.0)),
                "on_takeover" => options.on_takeover = errors.handle(on_takeover(value)),
                "outcome_policy" => options.outcome_policy = errors.handle(outcome_policy(value)),
                "payload" => {
                    options.payload = errors.handle(expression("payload", value, "the request, such as \"req\""))
                }
                "keep_request" => {
                    options.keep_request = errors.handle(flag(
                        value,
                        "keep_request",
                        "`true` (keep the payload's JSON in the record beside its fingerprint) or `false`",
                    ))
                }
                "keep_answer" => {
                    options.keep_answer = errors.handle(flag(
                        value,
                        "keep_answer",
                        "`true` (the answer is kept and replayed, the default) or `false` (only its digest: a \
                         duplicate gets `Error::AnswerNotKept`)",
                    ))
                }
                "redact" => options.redact = errors.handle(redact(value)).unwrap_or_default(),
                "subject" => {
                    options.subject = errors.handle(expression(
                        "subject",
                        value,
                        "the person the call is about, such as \"req.user_id\"",
                    ))
                }
                "after_expiry" => options.gone_for = errors.handle(after_expiry(value)).flatten(),
                "store" => {
                    options.store = errors.handle(expression(
                        "store",
                        value,
                        "a store, such as \"self.store\" or \"&store\"",
                    ))
                }
                "tx" => options.tx = errors.handle(parameter_name(value)),
                _ => options.krate = errors.handle(crate_path(value)),
            }
        }
        let missing = |name: &str, example: &str| {
            Error::custom(format!(
                "missing option `{name}`: add `{name} = {example}` to `#[idempotent(...)]`"
            ))
            .with_span(&Span::call_site())
        };
        if let Some((true, span)) = options.keep_request {
            if options.payload.is_none() && !seen.iter().any(|name| name == "payload") {
                errors.push(
                    Error::custom(
                        "`keep_request = true` keeps the payload's JSON, and there is no payload: add \
                         `payload = \"req\"` (the request to fingerprint), or remove `keep_request`",
                    )
                    .with_span(&span),
                );
            }
        }
        if let Some(tx) = &options.tx {
            for error in transactional_conflicts(tx, &seen, &options) {
                errors.push(error);
            }
        }
        let key = options.key.take();
        let biz = options.biz.take();
        if key.is_none() && !seen.iter().any(|name| name == "key") {
            errors.push(missing("key", "\"req.request_id\""));
        }
        if biz.is_none() && !seen.iter().any(|name| name == "biz") {
            errors.push(missing("biz", "\"pay\""));
        }
        errors.finish()?;
        Ok(Args {
            // Present: a missing or failed one was an error above.
            key: key.expect("checked"),
            biz: biz.expect("checked"),
            ttl: options.ttl,
            ttl_expr: options.ttl_expr,
            lease: options.lease,
            clock_tolerance: options.clock_tolerance,
            wait: options.wait,
            mode: options.mode,
            on_error: options.on_error,
            on_takeover: options.on_takeover.map(|(policy, _)| policy),
            outcome_policy_required: options.outcome_policy.is_some(),
            payload: options.payload,
            keep_request: options.keep_request.is_some_and(|(keep, _)| keep),
            digest_only: options.keep_answer.is_some_and(|(keep, _)| !keep),
            redact: options.redact,
            subject: options.subject,
            gone_for: options.gone_for,
            store: options.store,
            tx: options.tx,
            krate: options.krate,
        })
    }
}

/// The options as they are read, before the required ones are checked.
#[derive(Default)]
struct Options {
    key: Option<Expr>,
    biz: Option<LitStr>,
    ttl: Option<Millis>,
    ttl_expr: Option<Expr>,
    lease: Option<Millis>,
    clock_tolerance: Option<Millis>,
    wait: Option<Millis>,
    mode: Option<Ident>,
    on_error: Option<Ident>,
    on_takeover: Option<(OnTakeover, Span)>,
    outcome_policy: Option<Span>,
    payload: Option<Expr>,
    /// The value, and where it was written.
    keep_request: Option<(bool, Span)>,
    keep_answer: Option<(bool, Span)>,
    redact: Vec<LitStr>,
    subject: Option<Expr>,
    gone_for: Option<Millis>,
    store: Option<Expr>,
    tx: Option<Ident>,
    krate: Option<Path>,
}

/// A flag option (`keep_request`, `keep_answer`): `true` or `false`, and where it was
/// written; `meaning` says what each value does, for the error.
fn flag(value: &Expr, option: &str, meaning: &str) -> darling::Result<(bool, Span)> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Bool(flag), ..
        }) => Ok((flag.value, flag.span())),
        other => Err(Error::custom(format!("`{option}` is {meaning}")).with_span(other)),
    }
}

/// `redact = ["/card/number", "/address"]`: JSON pointers, each a string literal
/// starting with `/`.
fn redact(value: &Expr) -> darling::Result<Vec<LitStr>> {
    let hint = "`redact` is a list of JSON pointers to the fields recorded as \"[redacted]\", such as \
                `redact = [\"/card/number\"]`";
    let Expr::Array(list) = value else {
        return Err(Error::custom(hint).with_span(value));
    };
    let mut errors = Error::accumulator();
    let mut pointers = Vec::new();
    for element in &list.elems {
        match element {
            Expr::Lit(ExprLit {
                lit: Lit::Str(pointer), ..
            }) if pointer.value().starts_with('/') => pointers.push(pointer.clone()),
            Expr::Lit(ExprLit {
                lit: Lit::Str(pointer), ..
            }) => errors.push(
                Error::custom(format!(
                    "`{}` is not a JSON pointer: write the field's path from the root, such as `\"/{}\"`",
                    pointer.value(),
                    pointer.value().replace('.', "/")
                ))
                .with_span(pointer),
            ),
            other => errors.push(Error::custom(hint).with_span(other)),
        }
    }
    errors.finish_with(pointers)
}

/// The options that mean nothing, or something unsafe, beside `tx = ...`: each an
/// error on its own tokens.
fn transactional_conflicts(tx: &Ident, seen: &[Ident], options: &Options) -> Vec<Error> {
    let mut errors = Vec::new();
    let leased = [
        ("lease", options.lease.is_some()),
        ("clock_tolerance", options.clock_tolerance.is_some()),
    ];
    for (option, given) in leased {
        let Some(name) = seen.iter().find(|name| *name == option).filter(|_| given) else {
            continue;
        };
        errors.push(
            Error::custom(format!(
                "`{option}` has no meaning with `tx = {tx}`: in transactional mode the claim commits with the \
                 transaction, so no running claim is ever visible to another call, and nothing is leased or taken \
                 over. Remove `{option}` (`wait` bounds how long a duplicate waits for the row lock)"
            ))
            .with_span(name),
        );
    }
    if let Some(span) = &options.outcome_policy {
        errors.push(
            Error::custom(format!(
                "`outcome_policy` has no meaning with `tx = {tx}`: a transactional body runs no steps (their \
                 record would roll back with the transaction), so no effect's outcome is ever unknown to idem"
            ))
            .with_span(span),
        );
    }
    if let Some((_, span)) = &options.on_takeover {
        errors.push(
            Error::custom(format!(
                "`on_takeover` has no meaning with `tx = {tx}`: in transactional mode the body's writes commit \
                 with the record or not at all, so no call ever finds an effect that may have happened; nothing \
                 is taken over. Remove `on_takeover` (a call to another service inside the body still needs \
                 `Context::effect_key` for that service to deduplicate)"
            ))
            .with_span(span),
        );
    }
    if let Some(variant) = options.on_error.as_ref().filter(|variant| *variant == "Record") {
        errors.push(
            Error::custom(format!(
                "`on_error = Record` cannot be used with `tx = {tx}`: the FAIL record would commit only if the \
                 caller commits the transaction, together with whatever the body wrote before its `Err`. Use \
                 `on_error = Release` (the default: the claim rolls back with the transaction, and a retry runs \
                 again), and keep a failure you must remember in a table of your own"
            ))
            .with_span(variant),
        );
    }
    errors
}

/// `tx = tx` or `tx = "tx"`: the name of the parameter that holds the transaction.
fn parameter_name(value: &Expr) -> darling::Result<Ident> {
    let hint = "`tx` names the parameter that holds the transaction, such as `tx = tx` for \
                `tx: &mut sqlx::Transaction<'_, sqlx::Postgres>`";
    let ident = match value {
        Expr::Path(path) if path.qself.is_none() => path.path.get_ident().cloned(),
        Expr::Lit(ExprLit {
            lit: Lit::Str(text), ..
        }) => text.parse::<Ident>().ok(),
        _ => None,
    };
    ident.ok_or_else(|| Error::custom(hint).with_span(value))
}

/// A value parser's error with the option's name put in, keeping its span.
fn named(option: &str, error: Error) -> Error {
    let span = error.span();
    Error::custom(error.to_string().replace(OPTION, option)).with_span(&span)
}

fn expected_name_value(item: &NestedMeta) -> Error {
    let text = quote::ToTokens::to_token_stream(item).to_string();
    Error::custom(format!(
        "expected `name = value`, found `{text}`: options are written `ttl = \"1h\"`, `mode = Reject`"
    ))
    .with_span(item)
}

fn unknown_option(name: &Ident) -> Error {
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
    Error::custom(format!(
        "unknown option `{given}`: {suggestion}the options are {}",
        OPTIONS.join(", ")
    ))
    .with_span(name)
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
fn expression(name: &str, value: &Expr, hint: &str) -> darling::Result<Expr> {
    let Some(lit) = string_literal(value) else {
        return Ok(value.clone());
    };
    if lit.value().trim().is_empty() {
        return Err(Error::custom(format!("`{name}` is empty: give the expression of {hint}")).with_span(lit));
    }
    lit.parse::<Expr>().map_err(|e| {
        Error::custom(format!(
            "`{name} = {:?}` is not a Rust expression ({e}); write {hint}",
            lit.value()
        ))
        .with_span(lit)
    })
}

fn crate_path(value: &Expr) -> darling::Result<Path> {
    match value {
        Expr::Path(path) if path.qself.is_none() => Ok(path.path.clone()),
        Expr::Lit(ExprLit { lit: Lit::Str(lit), .. }) => lit.parse().map_err(Error::from),
        other => {
            Err(Error::custom("`crate` must be a path to the idem crate, e.g. `crate = ::my_idem`").with_span(other))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn error_of(tokens: TokenStream) -> String {
        match Args::parse(tokens) {
            Ok(_) => panic!("expected an error"),
            Err(error) => error.into_iter().map(|e| e.to_string()).collect::<Vec<_>>().join(" | "),
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

    #[test]
    fn every_mistake_of_one_attribute_is_reported() {
        let error = error_of(quote!(biz = "", ttl = "1x", mode = Rejct, tll = "1h"));
        for part in [
            "`biz` is empty",
            "bad `ttl`: unknown unit `x`",
            "did you mean `Reject`?",
            "did you mean `ttl`?",
            "missing option `key`",
        ] {
            assert!(error.contains(part), "{part} in {error}");
        }
    }
}
