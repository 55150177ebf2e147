//! Python's formatting of template values, which Hugging Face's renderer inherits: `json.dumps`
//! (behind `tojson`), `str()` (behind `string` and printing) and `repr()` (inside containers),
//! plus `datetime.strftime` for `strftime_now`.

use std::fmt::Write;

use minijinja::value::ValueKind;
use minijinja::{Error, ErrorKind, Value};

/// The keyword arguments of Python's `json.dumps` that chat templates use.
#[derive(Debug, Clone, Default)]
pub struct JsonOptions {
    /// Pretty-print with this indent string per level.
    pub indent: Option<String>,
    /// `(item_separator, key_separator)`; Python's default is `(", ", ": ")`, or `(",", ": ")`
    /// with an indent.
    pub separators: Option<(String, String)>,
    pub sort_keys: bool,
    /// Escape non-ASCII as `\uXXXX` (Hugging Face's `tojson` defaults to false).
    pub ensure_ascii: bool,
}

/// `json.dumps(value, **opts)`: keys in insertion order, no HTML escaping.
pub fn json_dumps(value: &Value, opts: &JsonOptions) -> Result<String, Error> {
    let (item_sep, key_sep) = match &opts.separators {
        Some((i, k)) => (i.as_str(), k.as_str()),
        None if opts.indent.is_some() => (",", ": "),
        None => (", ", ": "),
    };
    let w = JsonWriter {
        opts,
        item_sep,
        key_sep,
    };
    let mut out = String::new();
    w.write(&mut out, value, 0)?;
    Ok(out)
}

struct JsonWriter<'a> {
    opts: &'a JsonOptions,
    item_sep: &'a str,
    key_sep: &'a str,
}

impl JsonWriter<'_> {
    fn newline(&self, out: &mut String, depth: usize) {
        if let Some(ind) = &self.opts.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(ind);
            }
        }
    }

    fn write(&self, out: &mut String, value: &Value, depth: usize) -> Result<(), Error> {
        match value.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => write_number(out, value, true),
            ValueKind::String => self.string(out, value.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                if items.is_empty() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(self.item_sep);
                    }
                    self.newline(out, depth + 1);
                    self.write(out, item, depth + 1)?;
                }
                self.newline(out, depth);
                out.push(']');
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = value.try_iter()?.collect();
                if self.opts.sort_keys {
                    keys.sort();
                }
                if keys.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                out.push('{');
                for (i, key) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push_str(self.item_sep);
                    }
                    self.newline(out, depth + 1);
                    // json.dumps turns non-string keys into strings.
                    match key.kind() {
                        ValueKind::String => self.string(out, key.as_str().unwrap_or_default()),
                        _ => {
                            let mut k = String::new();
                            self.write(&mut k, key, depth + 1)?;
                            self.string(out, k.trim_matches('"'));
                        }
                    }
                    out.push_str(self.key_sep);
                    self.write(out, &value.get_item(key)?, depth + 1)?;
                }
                self.newline(out, depth);
                out.push('}');
            }
            ValueKind::Undefined => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: an undefined value is not JSON serializable",
                ))
            }
            _ => self.string(out, &value.to_string()),
        }
        Ok(())
    }

    fn string(&self, out: &mut String, s: &str) {
        // serde_json escapes exactly what Python does with ensure_ascii=False: `"`, `\`, and the
        // C0 controls (\b \f \n \r \t by name, the rest as \u00XX).
        let escaped = serde_json::Value::from(s).to_string();
        if !self.opts.ensure_ascii {
            out.push_str(&escaped);
            return;
        }
        for c in escaped.chars() {
            if c.is_ascii() {
                out.push(c);
            } else {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
        }
    }
}

/// Python's `repr(float)`: shortest round-trip digits, exponent form outside 1e-4 ≤ |x| < 1e16.
pub fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let sci = format!("{f:e}"); // e.g. "-1.5e-10", "1e16", "0e0"
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        if point <= 0 {
            format!("{sign}0.{}{digits}", "0".repeat((-point) as usize))
        } else if digits.len() as i32 <= point {
            format!(
                "{sign}{digits}{}.0",
                "0".repeat((point - digits.len() as i32) as usize)
            )
        } else {
            let (a, b) = digits.split_at(point as usize);
            format!("{sign}{a}.{b}")
        }
    } else {
        let m = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{m}e{esign}{:02}", exp.abs())
    }
}

fn write_number(out: &mut String, value: &Value, json: bool) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
    } else {
        let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
        let s = py_float(f);
        if json {
            out.push_str(&s);
        } else {
            // repr/str spell the non-finite values differently from json.dumps.
            out.push_str(match s.as_str() {
                "NaN" => "nan",
                "Infinity" => "inf",
                "-Infinity" => "-inf",
                other => other,
            });
        }
    }
}

/// Python's `str(value)`.
pub fn py_str(value: &Value) -> String {
    match value.kind() {
        ValueKind::String => value.as_str().unwrap_or_default().to_owned(),
        ValueKind::Undefined => String::new(),
        _ => py_repr(value),
    }
}

/// Python's `repr(value)` for the types JSON messages carry.
pub fn py_repr(value: &Value) -> String {
    let mut out = String::new();
    write_repr(&mut out, value);
    out
}

fn write_repr(out: &mut String, value: &Value) {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => write_number(out, value, false),
        ValueKind::String => write_repr_str(out, value.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            if let Ok(iter) = value.try_iter() {
                for (i, item) in iter.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_repr(out, &item);
                }
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(iter) = value.try_iter() {
                for (i, key) in iter.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_repr(out, &key);
                    out.push_str(": ");
                    write_repr(out, &value.get_item(&key).unwrap_or_default());
                }
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

/// Python's string repr: single quotes unless the text has `'` and no `"`.
fn write_repr_str(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// A broken-down UTC time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DateTime {
    pub year: i64,
    pub month: u32, // 1..=12
    pub day: u32,   // 1..=31
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    pub weekday: u32, // 0 = Monday
    pub yday: u32,    // 1..=366
}

impl DateTime {
    pub fn from_unix(secs: i64) -> DateTime {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        // Civil date from days since 1970-01-01 (proleptic Gregorian).
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
        const CUM: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let yday = CUM[(month - 1) as usize] + day + u32::from(leap && month > 2);
        DateTime {
            year,
            month,
            day,
            hour: (rem / 3600) as u32,
            minute: (rem / 60 % 60) as u32,
            second: (rem % 60) as u32,
            weekday: (days + 3).rem_euclid(7) as u32,
            yday,
        }
    }

    pub fn now_utc() -> DateTime {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        DateTime::from_unix(secs)
    }
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// `strftime` in the C locale for the common directives (`%-d` style unpadded forms included);
/// anything else is copied through.
pub fn strftime(t: &DateTime, fmt: &str) -> String {
    let mut out = String::new();
    let mut chars = fmt.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let unpadded = chars.peek() == Some(&'-');
        if unpadded {
            chars.next();
        }
        let Some(d) = chars.next() else {
            out.push('%');
            break;
        };
        let num = |out: &mut String, v: u32, width: usize| {
            if unpadded {
                let _ = write!(out, "{v}");
            } else {
                let _ = write!(out, "{v:0width$}");
            }
        };
        let hour12 = match t.hour % 12 {
            0 => 12,
            h => h,
        };
        match d {
            'Y' => {
                let _ = write!(out, "{}", t.year);
            }
            'y' => num(&mut out, (t.year.rem_euclid(100)) as u32, 2),
            'm' => num(&mut out, t.month, 2),
            'd' => num(&mut out, t.day, 2),
            'e' => {
                let _ = write!(out, "{:>2}", t.day);
            }
            'H' => num(&mut out, t.hour, 2),
            'I' => num(&mut out, hour12, 2),
            'M' => num(&mut out, t.minute, 2),
            'S' => num(&mut out, t.second, 2),
            'j' => num(&mut out, t.yday, 3),
            'p' => out.push_str(if t.hour < 12 { "AM" } else { "PM" }),
            'B' => out.push_str(MONTHS[(t.month - 1) as usize]),
            'b' | 'h' => out.push_str(&MONTHS[(t.month - 1) as usize][..3]),
            'A' => out.push_str(DAYS[t.weekday as usize]),
            'a' => out.push_str(&DAYS[t.weekday as usize][..3]),
            'u' => num(&mut out, t.weekday + 1, 1),
            'w' => num(&mut out, (t.weekday + 1) % 7, 1),
            'F' => {
                let _ = write!(out, "{}-{:02}-{:02}", t.year, t.month, t.day);
            }
            'T' => {
                let _ = write!(out, "{:02}:{:02}:{:02}", t.hour, t.minute, t.second);
            }
            'Z' => out.push_str("UTC"),
            'z' => out.push_str("+0000"),
            '%' => out.push('%'),
            other => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                out.push(other);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_dumps_honours_separators_and_ensure_ascii() {
        let v = Value::from_serialize(serde_json::json!({"k": ["é", "😀"]}));
        let opts = JsonOptions {
            separators: Some((",".into(), ":".into())),
            ensure_ascii: true,
            ..JsonOptions::default()
        };
        assert_eq!(
            json_dumps(&v, &opts).unwrap(),
            r#"{"k":["\u00e9","\ud83d\ude00"]}"#
        );
    }

    #[test]
    fn floats_print_like_python_repr() {
        for (f, s) in [
            (0.7, "0.7"),
            (100.0, "100.0"),
            (1e-5, "1e-05"),
            (1e16, "1e+16"),
            (1.5e20, "1.5e+20"),
            (-0.0001, "-0.0001"),
            (123456.789, "123456.789"),
            (0.0, "0.0"),
        ] {
            assert_eq!(py_float(f), s, "{f}");
        }
    }

    #[test]
    fn json_dumps_matches_python_separators_and_escapes() {
        let v = Value::from_serialize(serde_json::json!({
            "b": [1, 2.5, true, null], "a": "<tag> & 'q' \"dq\" é\n\u{1}"
        }));
        assert_eq!(
            json_dumps(&v, &JsonOptions::default()).unwrap(),
            r#"{"b": [1, 2.5, true, null], "a": "<tag> & 'q' \"dq\" é\n\u0001"}"#
        );
        let pretty = JsonOptions {
            indent: Some("  ".into()),
            sort_keys: true,
            ..JsonOptions::default()
        };
        assert_eq!(
            json_dumps(&v, &pretty).unwrap(),
            "{\n  \"a\": \"<tag> & 'q' \\\"dq\\\" é\\n\\u0001\",\n  \"b\": [\n    1,\n    2.5,\n    true,\n    null\n  ]\n}"
        );
    }

    #[test]
    fn str_and_repr_follow_python() {
        let v = Value::from_serialize(serde_json::json!({"k": [true, null, "it's"], "n": 1.0}));
        assert_eq!(py_str(&v), r#"{'k': [True, None, "it's"], 'n': 1.0}"#);
        assert_eq!(py_str(&Value::from(false)), "False");
    }

    #[test]
    fn strftime_formats_a_known_instant() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = DateTime::from_unix(1_709_211_909);
        assert_eq!(t.weekday, 3);
        assert_eq!(
            strftime(&t, "%Y-%m-%d %H:%M:%S %a %A %b %B %-d %j %I%p %%"),
            "2024-02-29 13:05:09 Thu Thursday Feb February 29 060 01PM %"
        );
        assert_eq!(strftime(&DateTime::from_unix(0), "%d %b %Y"), "01 Jan 1970");
    }
}
