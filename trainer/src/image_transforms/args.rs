//! A transform's keyword arguments (LeRobot's `kwargs`) read as Python reads them: a number or
//! a pair, integers where the class asks for `int`.

use serde_json::Value;

/// A keyword argument given as one number or as `[min, max]`.
pub(crate) enum Given {
    Number(f64),
    Range((f64, f64)),
}

/// A transform's keyword arguments.
pub(crate) struct Args<'a>(pub &'a serde_json::Map<String, Value>);

impl Args<'_> {
    /// Refuses an argument not in `known`.
    pub fn only(&self, known: &[&str]) -> Result<(), String> {
        match self.0.keys().find(|k| !known.contains(&k.as_str())) {
            Some(k) if known.is_empty() => Err(format!("takes no arguments, and `{k}` is given")),
            Some(k) => Err(format!("unknown argument `{k}` (expected {})", known.join(", "))),
            None => Ok(()),
        }
    }

    /// The argument `name` as a list of finite numbers.
    pub fn numbers(&self, name: &str) -> Result<Option<Vec<f64>>, String> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(items)) => {
                let numbers: Option<Vec<f64>> = items.iter().map(Value::as_f64).collect();
                numbers.filter(|n| n.iter().all(|v| v.is_finite())).map(Some).ok_or_else(|| format!("{name}: expected numbers"))
            }
            Some(other) => Err(format!("{name} {other}: expected a list of numbers")),
        }
    }

    /// The argument `name` as one number or as `[min, max]`.
    pub fn number_or_range(&self, name: &str) -> Result<Option<Given>, String> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => {
                n.as_f64().filter(|v| v.is_finite()).map(|v| Some(Given::Number(v))).ok_or_else(|| format!("{name}: not a number"))
            }
            Some(_) => match self.numbers(name)?.as_deref() {
                Some([lo, hi]) => Ok(Some(Given::Range((*lo, *hi)))),
                _ => Err(format!("{name}: expected a number or [min, max]")),
            },
        }
    }

    /// The argument `name` as `[min, max]`, or `default` when it is not given.
    pub fn pair_or(&self, name: &str, default: (f64, f64)) -> Result<(f64, f64), String> {
        match self.number_or_range(name)? {
            None => Ok(default),
            Some(Given::Range(r)) => Ok(r),
            Some(Given::Number(_)) => Err(format!("{name}: expected [min, max]")),
        }
    }

    /// The argument `name` as one number, or `default` when it is not given.
    pub fn number_or(&self, name: &str, default: f64) -> Result<f64, String> {
        match self.number_or_range(name)? {
            None => Ok(default),
            Some(Given::Number(v)) => Ok(v),
            Some(Given::Range(_)) => Err(format!("{name}: expected a number")),
        }
    }

    /// The argument `name` as an integer (a JSON number without a fraction), or `default`.
    pub fn integer_or(&self, name: &str, default: i64) -> Result<i64, String> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Number(n)) => n.as_i64().ok_or_else(|| format!("{name} {n}: expected an integer")),
            Some(other) => Err(format!("{name} {other}: expected an integer")),
        }
    }

    /// The argument `name` as an integer `n` (`[n, n]`) or a pair whose items Python's `int`
    /// truncates, or `default` when it is not given.
    pub fn integers_or(&self, name: &str, default: (i64, i64)) -> Result<(i64, i64), String> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Number(n)) => n.as_i64().map(|v| (v, v)).ok_or_else(|| format!("{name} {n}: expected an integer or a pair")),
            Some(_) => match self.numbers(name)?.as_deref() {
                Some([lo, hi]) if lo.abs() < 1e15 && hi.abs() < 1e15 => Ok((lo.trunc() as i64, hi.trunc() as i64)),
                _ => Err(format!("{name}: expected an integer or a pair")),
            },
        }
    }

    /// A `ColorJitter` factor as torchvision reads it: a number `v` is `[center - v, center +
    /// v]` (its low end at least 0 where `clip`), a pair is `[min, max]`, both within `bound`;
    /// a range that is only `center` does nothing.
    pub fn factor_range(&self, name: &str, center: f64, bound: (f64, f64), clip: bool) -> Result<Option<(f64, f64)>, String> {
        let range = match self.number_or_range(name)? {
            None => return Ok(None),
            Some(Given::Number(v)) if v < 0.0 => return Err(format!("{name} {v}: a single number must not be negative")),
            Some(Given::Number(v)) => ((if clip { (center - v).max(0.0) } else { center - v }), center + v),
            Some(Given::Range(r)) => r,
        };
        if !(bound.0 <= range.0 && range.0 <= range.1 && range.1 <= bound.1) {
            return Err(format!("{name} {range:?}: expected {} <= min <= max <= {}", bound.0, bound.1));
        }
        Ok((range != (center, center)).then_some(range))
    }
}
