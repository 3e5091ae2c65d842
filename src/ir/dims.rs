//! Symbolic dimensions: a template writes `"CH"`, `"Kc-1"` or `"ple_ctx*2"`; lowering evaluates
//! them against the plan's named dimensions.
//!
//! Grammar: a sum of products, `term (('+'|'-') term)*`, `term = atom (('*'|'/') atom)*`,
//! `atom = name | integer`. Division must be exact and subtraction must not go below zero: a
//! template that asks otherwise is wrong, and the error says which symbol.

use std::collections::BTreeMap;

use super::op::Sym;

pub type Dims = BTreeMap<String, usize>;

/// Evaluates a template dimension.
pub fn eval(sym: &Sym, dims: &Dims) -> Result<usize, String> {
    match sym {
        Sym::Lit(n) => Ok(*n),
        Sym::Name(expr) => eval_expr(expr, dims),
    }
}

fn eval_expr(expr: &str, dims: &Dims) -> Result<usize, String> {
    let mut total: i128 = 0;
    for (sign, term) in split_keep(expr, &['+', '-']) {
        let value = eval_term(term.trim(), dims, expr)? as i128;
        total += if sign == '-' { -value } else { value };
        if total < 0 {
            return Err(format!("dimension `{expr}` is negative"));
        }
    }
    usize::try_from(total).map_err(|_| format!("dimension `{expr}` overflows"))
}

fn eval_term(term: &str, dims: &Dims, whole: &str) -> Result<usize, String> {
    let mut acc: Option<usize> = None;
    for (op, atom) in split_keep(term, &['*', '/']) {
        let v = eval_atom(atom.trim(), dims, whole)?;
        acc = Some(match (acc, op) {
            (None, _) => v,
            (Some(a), '/') => {
                if v == 0 || a % v != 0 {
                    return Err(format!("dimension `{whole}`: {a} is not divisible by {v}"));
                }
                a / v
            }
            (Some(a), _) => a
                .checked_mul(v)
                .ok_or_else(|| format!("dimension `{whole}` overflows"))?,
        });
    }
    acc.ok_or_else(|| format!("empty dimension expression `{whole}`"))
}

fn eval_atom(atom: &str, dims: &Dims, whole: &str) -> Result<usize, String> {
    if atom.is_empty() {
        return Err(format!("malformed dimension expression `{whole}`"));
    }
    if let Ok(n) = atom.parse::<usize>() {
        return Ok(n);
    }
    dims.get(atom).copied().ok_or_else(|| {
        let known: Vec<&str> = dims.keys().map(|k| k.as_str()).collect();
        format!(
            "unknown dimension `{atom}` in `{whole}` (known: {})",
            known.join(", ")
        )
    })
}

/// The first name in `sym` that `dims` does not define, if any (a literal defines itself).
pub fn unknown<'a>(sym: &'a Sym, dims: &Dims) -> Option<&'a str> {
    match sym {
        Sym::Lit(_) => None,
        Sym::Name(expr) => expr
            .split(['+', '-', '*', '/'])
            .map(str::trim)
            .find(|a| !a.is_empty() && a.parse::<usize>().is_err() && !dims.contains_key(*a)),
    }
}

/// Splits `s` at any of `seps`, returning each piece with the separator that preceded it
/// (`'+'`/`'*'` for the first piece).
fn split_keep<'a>(s: &'a str, seps: &[char]) -> Vec<(char, &'a str)> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut sep = seps[0];
    for (i, c) in s.char_indices() {
        if seps.contains(&c) {
            out.push((sep, &s[start..i]));
            sep = c;
            start = i + c.len_utf8();
        }
    }
    out.push((sep, &s[start..]));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims() -> Dims {
        [("H", 32), ("C", 4), ("Kc", 4)]
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect()
    }

    #[test]
    fn overflow_is_an_error() {
        let mut d = dims();
        d.insert("Big".into(), 1 << 31);
        let e = eval(&Sym::Name("Big*Big*Big".into()), &d).unwrap_err();
        assert_eq!(e, "dimension `Big*Big*Big` overflows");
        assert_eq!(eval(&Sym::Name("Big*Big".into()), &d), Ok(1 << 62));
    }

    #[test]
    fn evaluates_sums_of_products() {
        let d = dims();
        assert_eq!(eval(&Sym::Name("C*H".into()), &d), Ok(128));
        assert_eq!(eval(&Sym::Name("Kc-1".into()), &d), Ok(3));
        assert_eq!(eval(&Sym::Name("2*H+C".into()), &d), Ok(68));
        assert_eq!(eval(&Sym::Name("H/C".into()), &d), Ok(8));
        assert_eq!(eval(&Sym::Lit(7), &d), Ok(7));
    }

    #[test]
    fn rejects_unknown_and_inexact() {
        let d = dims();
        assert!(eval(&Sym::Name("X".into()), &d)
            .unwrap_err()
            .contains("unknown dimension `X`"));
        assert!(eval(&Sym::Name("H/5".into()), &d)
            .unwrap_err()
            .contains("not divisible"));
        assert!(eval(&Sym::Name("C-H".into()), &d)
            .unwrap_err()
            .contains("negative"));
        assert!(eval(&Sym::Name("C*".into()), &d)
            .unwrap_err()
            .contains("malformed"));
    }

    #[test]
    fn names_an_unknown_dimension() {
        let d = dims();
        assert_eq!(unknown(&Sym::Name("C*H-2".into()), &d), None);
        assert_eq!(unknown(&Sym::Lit(3), &d), None);
        assert_eq!(unknown(&Sym::Name("kp*n - n".into()), &d), Some("kp"));
        assert_eq!(unknown(&Sym::Name("H/X".into()), &d), Some("X"));
    }
}
