//! `ttl = "1h30m"`: the duration grammar of the attribute.

/// Milliseconds in one unit, longest unit names first so `ms` wins over `m`.
const UNITS: [(&str, u64); 5] = [
    ("ms", 1),
    ("s", 1_000),
    ("m", 60_000),
    ("h", 3_600_000),
    ("d", 86_400_000),
];

/// Parse `text` as one or more `<number><unit>` parts (`ms s m h d`) into milliseconds.
pub fn parse_millis(text: &str) -> Result<u64, String> {
    let hint = "write a duration such as \"500ms\", \"30s\", \"24h\" or \"1h30m\" (units: ms, s, m, h, d)";
    if text.trim().is_empty() {
        return Err(format!("empty duration: {hint}"));
    }
    let mut rest = text;
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return Err(format!("expected a number at `{rest}` in \"{text}\": {hint}"));
        }
        let (number, after) = rest.split_at(digits);
        let Some((unit, millis)) = UNITS.iter().find(|(unit, _)| after.starts_with(unit)) else {
            let found: String = after.chars().take_while(|c| !c.is_ascii_digit()).collect();
            return Err(if found.is_empty() {
                format!("missing unit after `{number}` in \"{text}\": {hint}")
            } else {
                format!("unknown unit `{found}` in \"{text}\": {hint}")
            });
        };
        let part = number
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(*millis))
            .and_then(|part| total.checked_add(part));
        total = part.ok_or_else(|| format!("duration \"{text}\" is too long"))?;
        rest = &after[unit.len()..];
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::parse_millis;

    #[test]
    fn parses_single_and_combined_units() {
        assert_eq!(parse_millis("500ms"), Ok(500));
        assert_eq!(parse_millis("30s"), Ok(30_000));
        assert_eq!(parse_millis("24h"), Ok(86_400_000));
        assert_eq!(parse_millis("1h30m"), Ok(5_400_000));
        assert_eq!(parse_millis("2d1s5ms"), Ok(172_801_005));
        assert_eq!(parse_millis("0s"), Ok(0));
    }

    #[test]
    fn explains_what_is_wrong() {
        assert!(parse_millis("24x").unwrap_err().contains("unknown unit `x`"));
        assert!(parse_millis("24").unwrap_err().contains("missing unit after `24`"));
        assert!(parse_millis("h").unwrap_err().contains("expected a number"));
        assert!(parse_millis("").unwrap_err().contains("empty duration"));
        assert!(parse_millis("99999999999999999d").unwrap_err().contains("too long"));
    }
}
