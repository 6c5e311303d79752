//! Whole numbers as JSON Schema counts them: where the API document says `integer`, `5`, `5.0`
//! and `5e0` are the same number, so a request field of an integer type reads all three
//! (`#[serde(deserialize_with = "crate::whole::number")]`, or [`optional`] for an
//! `Option`). A number with a fraction (`1.5`), a negative one or one past the type's range is
//! still refused. A number written with a decimal point or an exponent reaches serde as a JSON
//! double, exact up to 2^53: past that, as in any JSON reader working in doubles, it is the
//! nearest double that is read.

use std::fmt;
use std::marker::PhantomData;

use serde::Deserializer;
use serde::de::{Error, Unexpected, Visitor};

/// An unsigned integer type a request field may hold.
pub trait Whole: TryFrom<u64> {
    /// The largest value of the type.
    const MAX: u64;
}

impl Whole for u16 {
    const MAX: u64 = u16::MAX as u64;
}

impl Whole for u32 {
    const MAX: u64 = u32::MAX as u64;
}

impl Whole for u64 {
    const MAX: u64 = u64::MAX;
}

/// `value` as a whole number from 0 to `u64::MAX`, if it is one (finite, no fraction, not
/// negative, below 2^64).
#[must_use]
pub fn from_f64(value: f64) -> Option<u64> {
    // 2^64 is exact as a double, and a whole double below it converts to u64 exactly.
    const TWO_TO_64: f64 = 18_446_744_073_709_551_616.0;
    let whole = value.is_finite() && value.fract() == 0.0 && (0.0..TWO_TO_64).contains(&value);
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    whole.then_some(value as u64)
}

/// Reads a field of integer type `T` written as a JSON integer or as a whole number with a
/// fraction or exponent (`833155.0`).
///
/// # Errors
///
/// A number with a fraction, a negative number, one past `T`'s range, or anything but a
/// number.
pub fn number<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Whole,
{
    d.deserialize_any(Number(PhantomData))
}

/// As [`number`], for an optional field: absent or `null` is `None`.
///
/// # Errors
///
/// As [`number`].
pub fn optional<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Whole,
{
    d.deserialize_option(Optional(PhantomData))
}

struct Number<T>(PhantomData<T>);

impl<'de, T: Whole> Visitor<'de> for Number<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a whole number from 0 to {}", T::MAX)
    }

    fn visit_u64<E: Error>(self, v: u64) -> Result<T, E> {
        T::try_from(v).map_err(|_| E::invalid_value(Unexpected::Unsigned(v), &self))
    }

    fn visit_i64<E: Error>(self, v: i64) -> Result<T, E> {
        match u64::try_from(v) {
            Ok(v) => self.visit_u64(v),
            Err(_) => Err(E::invalid_value(Unexpected::Signed(v), &self)),
        }
    }

    fn visit_f64<E: Error>(self, v: f64) -> Result<T, E> {
        match from_f64(v) {
            Some(whole) => {
                T::try_from(whole).map_err(|_| E::invalid_value(Unexpected::Float(v), &self))
            }
            None => Err(E::invalid_value(Unexpected::Float(v), &self)),
        }
    }
}

struct Optional<T>(PhantomData<T>);

impl<'de, T: Whole> Visitor<'de> for Optional<T> {
    type Value = Option<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "null or a whole number from 0 to {}", T::MAX)
    }

    fn visit_none<E: Error>(self) -> Result<Option<T>, E> {
        Ok(None)
    }

    fn visit_unit<E: Error>(self) -> Result<Option<T>, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<T>, D::Error> {
        number(d).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    struct Body {
        #[serde(deserialize_with = "number")]
        n: u64,
        #[serde(default, deserialize_with = "optional")]
        small: Option<u16>,
    }

    fn read(json: &str) -> Result<(u64, Option<u16>), String> {
        serde_json::from_str::<Body>(json)
            .map(|b| (b.n, b.small))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_whole_number_reads_with_or_without_a_fraction_or_exponent() {
        assert_eq!(read(r#"{"n": 833155}"#), Ok((833_155, None)));
        assert_eq!(read(r#"{"n": 833155.0}"#), Ok((833_155, None)));
        assert_eq!(
            read(r#"{"n": 8.33155e5, "small": 7.0}"#),
            Ok((833_155, Some(7)))
        );
        assert_eq!(read(r#"{"n": -0.0, "small": null}"#), Ok((0, None)));
        assert_eq!(
            read(&format!(r#"{{"n": {}}}"#, u64::MAX)),
            Ok((u64::MAX, None))
        );
    }

    #[test]
    fn a_fraction_a_negative_number_or_one_out_of_range_is_refused() {
        for bad in [
            r#"{"n": 1.5}"#,
            r#"{"n": -1}"#,
            r#"{"n": -1.0}"#,
            r#"{"n": 18446744073709551616}"#,
            r#"{"n": 1.8446744073709552e19}"#,
            r#"{"n": "5"}"#,
            r#"{"n": 1, "small": 65536.0}"#,
        ] {
            let error = read(bad).unwrap_err();
            assert!(error.contains("a whole number from 0 to"), "{bad}: {error}");
        }
    }

    #[test]
    fn from_f64_takes_whole_doubles_in_range_only() {
        assert_eq!(from_f64(5.0), Some(5));
        assert_eq!(from_f64(0.5), None);
        assert_eq!(from_f64(f64::NAN), None);
        assert_eq!(from_f64(f64::INFINITY), None);
        assert_eq!(from_f64(-3.0), None);
        assert_eq!(from_f64(2f64.powi(63)), Some(1 << 63));
        assert_eq!(from_f64(2f64.powi(64)), None);
    }
}
